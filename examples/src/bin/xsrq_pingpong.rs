//! `xsrq_pingpong`: rdma-core's `ibv_xsrq_pingpong` on sideway. Same flags and defaults, the
//! same TCP exchange (one 66-byte `LID:QPN:QPN:PSN:SRQN:GID` message each way per client,
//! `END` at the end, port 18515) and the same SEND ping-pong over XRC: each side has an XRC
//! domain (bound to `/tmp/xrc_domain`), an XRC SRQ, and per client an XRC receive QP and an
//! XRC send QP; every send names the peer's SRQ number. So it talks to rdma-core's program
//! in either role, prints the same lines and fails with the same messages; on a device
//! without XRC (rxe, siw) it ends as rdma-core's does, with "Couldn't Open the XRC Domain 95"
//! and exit status 1.
//!
//! ```text
//! xsrq_pingpong -g 1 -c 2        # server for two clients
//! xsrq_pingpong -g 1 SERVER      # a client
//! ```

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use sideway::completion_channel::CompletionChannel;
use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::device::{DeviceContext, LinkLayer, Mtu};
use sideway::gid::Gid;
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::queue_pair::{QpType, QueuePair, SendFlags, XrcRecvQueuePair};
use sideway::shared_receive_queue::SharedReceiveQueue;
use sideway::xrc_domain::XrcDomain;
use sideway_examples::cli::log_to_stderr;
use sideway_examples::xsrq_wire::{self, XsrqDest, MSG_SIZE, TERMINATION};

/// Ping-pong SEND over XRC: one shared receive queue per side that every peer's sends name
/// by number, wire-compatible with ibv_xsrq_pingpong. Without SERVER, waits for the clients;
/// with it, connects to that server.
#[derive(Debug, Parser)]
#[command(name = "xsrq_pingpong", version)]
struct Args {
    /// The server to connect to; without it, wait for the clients
    server: Option<String>,

    /// Listen on / connect to this TCP port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,

    /// Use this RDMA device (default: the first one found)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    ib_dev: Option<String>,

    /// Use this port of the device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,

    /// Size of the message to exchange, in bytes
    #[arg(short = 's', long = "size", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    size: u32,

    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096)
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,

    /// Number of clients (on the server only; a client is one)
    #[arg(short = 'c', long = "clients", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    clients: u32,

    /// Number of messages each client and the server send each other
    #[arg(short = 'n', long = "num_tests", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    num_tests: u32,

    /// Service level
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,

    /// Sleep on CQ events instead of polling
    #[arg(short = 'e', long = "events")]
    events: bool,

    /// Register the buffer with on-demand paging (the device must do ODP on XRC)
    #[arg(short = 'o', long = "odp")]
    odp: bool,

    /// Local port GID index (needed on RoCE; without it the path is LID-routed)
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,

    /// Give up when the peer sends nothing for this many seconds (also bounds each step of
    /// the TCP exchange)
    #[arg(long = "stall-timeout", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    stall_timeout: u64,
}

/// Where the XRC domain is bound, as in rdma-core's program: both programs on one node share
/// it.
const XRC_DOMAIN_FILE: &str = "/tmp/xrc_domain";

/// Why the run stopped: rdma-core's message for the step, and what sideway said, if
/// anything more (printed on a second line, so the first reads as rdma-core's).
struct Fail {
    message: String,
    detail: Option<String>,
}

fn fail(message: impl Into<String>) -> Fail {
    Fail {
        message: message.into(),
        detail: None,
    }
}

/// rdma-core's `message`, with the error behind it as the detail.
fn because(message: impl Into<String>) -> impl FnOnce(&dyn std::fmt::Display) -> Fail {
    let message = message.into();
    move |e| Fail {
        message,
        detail: Some(e.to_string()),
    }
}

fn main() -> ExitCode {
    log_to_stderr("xsrq_pingpong");
    let mut args = Args::parse();
    if args.server.is_some() {
        args.clients = 1;
    }
    match run(&args) {
        Ok(()) => {
            println!("success");
            ExitCode::SUCCESS
        }
        Err(f) => {
            let _ = std::io::stdout().flush();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{}", f.message);
            if let Some(detail) = f.detail {
                let _ = writeln!(err, "xsrq_pingpong: {detail}");
            }
            ExitCode::FAILURE
        }
    }
}

/// One connection: the peer's endpoint, our PSN for it, its socket, and how many messages
/// went to it (`pp_cnt`).
struct Peer {
    dest: XsrqDest,
    local_psn: u32,
    stream: TcpStream,
    sent: u32,
}

/// One side's resources, dropped in reverse order of creation: the QPs, then the SRQ, the
/// XRC domain, the CQs, the buffer, the PD.
struct Side {
    ctx: Arc<DeviceContext>,
    args_port: u8,
    lid: u16,
    mtu: Mtu,
    buf: RegisteredBuffer,
    _xrcd: Arc<XrcDomain>,
    recv_cq: Arc<CompletionQueue>,
    send_cq: Arc<CompletionQueue>,
    channel: Option<Arc<CompletionChannel>>,
    srq: Arc<SharedReceiveQueue>,
    recv_qps: Vec<XrcRecvQueuePair>,
    send_qps: Vec<QueuePair>,
}

fn run(args: &Args) -> Result<(), Fail> {
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| {
        fail(format!(
            "-m {} is not a path MTU: use 256, 512, 1024, 2048 or 4096",
            args.mtu
        ))
    })?;
    let mut side = init(args, mtu)?;
    side.post_recvs(args.clients, args.size)?;
    let timeout = Duration::from_secs(args.stall_timeout);
    let mut peers = match &args.server {
        Some(host) => vec![client_connect(&mut side, args, host, timeout)?],
        None => server_connect(&mut side, args, timeout)?,
    };
    if args.server.is_none() {
        for i in 0..peers.len() {
            side.post_send(&mut peers, i, args)?;
        }
    }
    pingpong(&mut side, &mut peers, args, timeout)?;
    if args.server.is_some() {
        send_end(&mut peers[0])?;
        recv_end(&mut peers[0])?;
    } else {
        for p in peers.iter_mut() {
            recv_end(p)?;
        }
        for p in peers.iter_mut() {
            send_end(p)?;
        }
    }
    drop(peers);
    drop(side);
    Ok(())
}

fn init(args: &Args, mtu: Mtu) -> Result<Side, Fail> {
    let ctx = match sideway::open_device(args.ib_dev.as_deref()) {
        Ok(ctx) => ctx,
        Err(
            e @ (sideway::device::DeviceError::NotFound { .. }
            | sideway::device::DeviceError::NoDevice),
        ) => {
            return Err(because(format!(
                "IB device {} not found\nFailed to open device",
                args.ib_dev.as_deref().unwrap_or("")
            ))(&e))
        }
        Err(e) => return Err(because("Failed to open device")(&e)),
    };
    let mut access = AccessFlags::LOCAL_WRITE;
    if args.odp {
        let attr = ctx
            .query_device()
            .map_err(|e| because("Couldn't query device for its features")(&e))?;
        let raw = attr.as_raw();
        let xrc_caps = sideway::sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SEND
            | sideway::sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SRQ_RECV;
        let general = u64::from(sideway::sys::ibv_odp_general_caps::IBV_ODP_SUPPORT);
        if raw.odp_caps.general_caps & general == 0 || raw.xrc_odp_caps & xrc_caps != xrc_caps {
            return Err(fail(
                "The device isn't ODP capable or does not support XRC send, receive and srq \
                 with ODP",
            ));
        }
        access |= AccessFlags::ON_DEMAND;
    }
    let port = ctx
        .query_port(args.ib_port)
        .map_err(|e| because("Failed to get port info")(&e))?;
    let lid = port.lid();
    if port.link_layer() != LinkLayer::Ethernet && lid == 0 {
        return Err(fail("Couldn't get local LID"));
    }
    let channel = if args.events {
        Some(
            ctx.create_comp_channel()
                .map_err(|e| because("Couldn't create completion channel")(&e))?,
        )
    } else {
        None
    };
    let pd = ctx
        .alloc_pd()
        .map_err(|e| because("Couldn't allocate PD")(&e))?;
    let buf = pd
        .reg_buffer(args.size as usize, access)
        .map_err(|e| because("Couldn't register MR")(&e))?;
    // Read-only, created if missing (mode 0440), as rdma-core opens it; a failure is not
    // fatal, the domain is then this process's own.
    let file = OpenOptions::new()
        .read(true)
        .write(false)
        .custom_flags(libc::O_CREAT)
        .mode(0o440)
        .open(XRC_DOMAIN_FILE);
    let file = match file {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "Couldn't create the file for the XRC Domain but not stopping {}",
                e.raw_os_error().unwrap_or(libc::EIO)
            );
            None
        }
    };
    let xrcd = ctx
        .open_xrcd(file.as_ref().map(|f| f.as_fd()), libc::O_CREAT)
        .map_err(|e| fail(format!("Couldn't Open the XRC Domain {}", e.errno())))?;
    // The kernel holds the file's inode for the domain now.
    drop(file);
    let mut cq = ctx.create_cq_builder();
    cq.cqe(args.clients);
    if let Some(ch) = &channel {
        cq.channel(ch);
    }
    let recv_cq = cq
        .build()
        .map_err(|e| because("Couldn't create recv CQ")(&e))?;
    if channel.is_some() {
        recv_cq
            .req_notify(false)
            .map_err(|e| because("Couldn't request CQ notification")(&e))?;
    }
    let send_cq = ctx
        .create_cq_builder()
        .cqe(args.clients)
        .build()
        .map_err(|e| because("Couldn't create send CQ")(&e))?;
    let srq = pd
        .create_srq_builder()
        .xrcd(&xrcd)
        .cq(&recv_cq)
        .max_wr(args.clients)
        .max_sge(1)
        .build()
        .map_err(|e| because("Couldn't create SRQ")(&e))?;
    let mut recv_qps = Vec::new();
    let mut send_qps = Vec::new();
    for i in 0..args.clients {
        let recv = xrcd.create_recv_qp().map_err(|e| {
            because(format!(
                "Couldn't create recv QP[{i}] errno {}",
                errno_of(&e)
            ))(&e)
        })?;
        recv.modify(&xsrq_wire::init(
            args.ib_port,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ))
        .map_err(|e| because(format!("Failed to modify recv QP[{i}] to INIT"))(&e))?;
        recv_qps.push(recv);
        let send = pd
            .create_qp_builder()
            .qp_type(QpType::XrcSend)
            .send_cq(&send_cq)
            .max_send_wr(args.clients.saturating_mul(args.num_tests))
            .max_send_sge(1)
            .build()
            .map_err(|e| {
                because(format!(
                    "Couldn't create send QP[{i}] errno {}",
                    errno_of(&e)
                ))(&e)
            })?;
        send.modify(&xsrq_wire::init(args.ib_port, AccessFlags::empty()))
            .map_err(|e| because(format!("Failed to modify send QP[{i}] to INIT"))(&e))?;
        send_qps.push(send);
    }
    Ok(Side {
        ctx,
        args_port: args.ib_port,
        lid,
        mtu,
        buf,
        _xrcd: xrcd,
        recv_cq,
        send_cq,
        channel,
        srq,
        recv_qps,
        send_qps,
    })
}

/// The errno of a failed create, as rdma-core prints it.
fn errno_of(e: &sideway::queue_pair::QueuePairError) -> i32 {
    match e {
        sideway::queue_pair::QueuePairError::Create { source, .. } => {
            source.raw_os_error().unwrap_or(0)
        }
        _ => libc::EINVAL,
    }
}

impl Side {
    /// Posts `n` receives of the whole buffer to the SRQ (`pp_post_recv`).
    fn post_recvs(&self, n: u32, size: u32) -> Result<(), Fail> {
        let sge = self
            .buf
            .sge(0..size as usize)
            .ok_or_else(|| fail("Failed to post receive to SRQ"))?;
        let mut batch = self.srq.start_post_recv();
        for _ in 0..n {
            batch.recv(0, &[sge]);
        }
        batch
            .post()
            .map_err(|e| because("Failed to post receive to SRQ")(&e))
    }

    /// Sends the next message to peer `index`, on the send QP whose turn it is, naming the
    /// peer's SRQ; the last of its messages is signaled (`pp_post_send`).
    fn post_send(&mut self, peers: &mut [Peer], index: usize, args: &Args) -> Result<(), Fail> {
        let peer = &mut peers[index];
        let qpi = (index + peer.sent as usize) % self.send_qps.len();
        peer.sent += 1;
        let flags = if peer.sent >= args.num_tests {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        let sge = self
            .buf
            .sge(0..args.size as usize)
            .ok_or_else(|| fail("Couldn't post send"))?;
        self.send_qps[qpi]
            .start_post_send()
            .wr(index as u64, flags)
            .xrc_remote_srqn(peer.dest.srqn)
            .send(sge)
            .post()
            .map_err(|e| because("Couldn't post send")(&e))
    }

    fn local_dest(&self, index: usize, psn: u32, gid: Gid) -> Result<XsrqDest, Fail> {
        let srqn = self
            .srq
            .srq_num()
            .map_err(|e| because("Couldn't get SRQ num")(&e))?;
        Ok(XsrqDest {
            lid: self.lid,
            recv_qpn: self.recv_qps[index].qp_num(),
            send_qpn: self.send_qps[index].qp_num(),
            psn,
            srqn,
            gid,
        })
    }

    /// Moves connection `index`'s receive QP to RTR and RTS toward the peer's send QP, and
    /// its send QP toward the peer's receive QP (`connect_qps`).
    fn connect(&self, index: usize, peer: &Peer, args: &Args) -> Result<(), Fail> {
        let rem = &peer.dest;
        let av = xsrq_wire::path(rem, args.sl, self.args_port, args.gid_idx.unwrap_or(0));
        self.recv_qps[index]
            .modify(&xsrq_wire::recv_rtr(rem, self.mtu, av))
            .map_err(|e| because(format!("Failed to modify recv QP[{index}] to RTR"))(&e))?;
        self.recv_qps[index]
            .modify(&xsrq_wire::recv_rts(peer.local_psn))
            .map_err(|e| because(format!("Failed to modify recv QP[{index}] to RTS"))(&e))?;
        self.send_qps[index]
            .modify(&xsrq_wire::send_rtr(rem, self.mtu, av))
            .map_err(|e| because(format!("Failed to modify send QP[{index}] to RTR"))(&e))?;
        self.send_qps[index]
            .modify(&xsrq_wire::send_rts(peer.local_psn))
            .map_err(|e| because(format!("Failed to modify send QP[{index}] to RTS"))(&e))
    }

    fn gid(&self, args: &Args) -> Result<Gid, Fail> {
        match args.gid_idx {
            Some(g) => Ok(self
                .ctx
                .query_gid(args.ib_port, g)
                .map_err(|e| because(format!("can't read sgid of index {g}"))(&e))?
                .gid),
            None => Ok(Gid::ZERO),
        }
    }
}

/// A pseudo-random 24-bit PSN, different per process and call (`lrand48() & 0xffffff`).
fn random_psn() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    ((nanos ^ std::process::id().rotate_left(16) ^ n.rotate_left(7)).wrapping_mul(0x9e37_79b1) >> 8)
        & 0xff_ffff
}

fn send_local(side: &Side, stream: &mut TcpStream, index: usize, args: &Args) -> Result<u32, Fail> {
    let psn = random_psn();
    let local = side.local_dest(index, psn, side.gid(args)?)?;
    println!("{}", local.line("local"));
    stream
        .write_all(&local.encode())
        .map_err(|e| because("Couldn't send local address")(&e))?;
    Ok(psn)
}

fn recv_remote(stream: &mut TcpStream, index: usize) -> Result<XsrqDest, Fail> {
    let mut msg = [0u8; MSG_SIZE];
    stream.read_exact(&mut msg).map_err(|e| {
        because(format!(
            "0/{MSG_SIZE}: Couldn't read remote address [{index}]"
        ))(&e)
    })?;
    let dest = XsrqDest::decode(&msg)
        .map_err(|e| because(format!("Couldn't read remote address [{index}]"))(&e))?;
    println!("{}", dest.line("remote"));
    Ok(dest)
}

fn client_connect(
    side: &mut Side,
    args: &Args,
    host: &str,
    timeout: Duration,
) -> Result<Peer, Fail> {
    let couldnt = || format!("Couldn't connect to {host}:{}", args.port);
    let addrs = (host, args.port)
        .to_socket_addrs()
        .map_err(|e| because(couldnt())(&e))?;
    let mut stream = None;
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        return Err(match last {
            Some(e) => because(couldnt())(&e),
            None => fail(couldnt()),
        });
    };
    set_timeouts(&stream, timeout)?;
    let local_psn = send_local(side, &mut stream, 0, args)?;
    let dest = recv_remote(&mut stream, 0)?;
    let peer = Peer {
        dest,
        local_psn,
        stream,
        sent: 0,
    };
    side.connect(0, &peer, args)?;
    Ok(peer)
}

fn server_connect(side: &mut Side, args: &Args, timeout: Duration) -> Result<Vec<Peer>, Fail> {
    let listener = TcpListener::bind(("::", args.port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", args.port)))
        .map_err(|e| because(format!("Couldn't listen to port {}", args.port))(&e))?;
    let mut peers = Vec::new();
    for i in 0..args.clients as usize {
        let (mut stream, _) = listener
            .accept()
            .map_err(|e| because(format!("accept() failed for client {i}"))(&e))?;
        set_timeouts(&stream, timeout)?;
        let dest = recv_remote(&mut stream, i)?;
        let local_psn = send_local(side, &mut stream, i, args)?;
        let peer = Peer {
            dest,
            local_psn,
            stream,
            sent: 0,
        };
        side.connect(i, &peer, args)?;
        peers.push(peer);
    }
    Ok(peers)
}

fn set_timeouts(stream: &TcpStream, timeout: Duration) -> Result<(), Fail> {
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| because("Couldn't set the socket's timeouts")(&e))
}

/// The peer whose receive QP a completion came through (`find_qp`).
fn find_qp(side: &Side, qp_num: u32) -> usize {
    if side.recv_qps.len() == 1 {
        return 0;
    }
    match side.recv_qps.iter().position(|qp| qp.qp_num() == qp_num) {
        Some(i) => i,
        None => {
            eprintln!("Unable to find qp {qp_num:x}");
            0
        }
    }
}

/// The measured part: every message received is answered until each peer got
/// `num_tests`, then the signaled last sends are reaped.
fn pingpong(side: &mut Side, peers: &mut [Peer], args: &Args, stall: Duration) -> Result<(), Fail> {
    let total = u64::from(args.clients) * u64::from(args.num_tests);
    let mut cnt = 0u64;
    let mut wcs = [WorkCompletion::default(); 1];
    let recv_cq = Arc::clone(&side.recv_cq);
    let mut waited = Instant::now();
    while cnt < total {
        if let Some(ch) = &side.channel {
            let left = stall.saturating_sub(waited.elapsed());
            let cq = ch
                .get_cq_event(Some(left))
                .map_err(|e| because("Failed to get cq_event")(&e))?;
            if !Arc::ptr_eq(&cq, &recv_cq) {
                return Err(fail("CQ event for unknown CQ"));
            }
            cq.req_notify(false)
                .map_err(|e| because("Couldn't request CQ notification")(&e))?;
        }
        loop {
            let n = recv_cq
                .poll_into(&mut wcs)
                .map_err(|e| because("Error polling cq")(&e))?;
            if n == 0 {
                break;
            }
            waited = Instant::now();
            let wc = &wcs[0];
            if let Err(e) = wc.ok() {
                return Err(because(format!(
                    "Work completion error {}",
                    u32::from(wc.status())
                ))(&e));
            }
            side.post_recvs(1, args.size)?;
            let qpi = find_qp(side, wc.qp_num());
            if peers[qpi].sent < args.num_tests {
                side.post_send(peers, qpi, args)?;
            }
            cnt += 1;
        }
        if side.channel.is_none() {
            if waited.elapsed() >= stall {
                return Err(stalled(stall, cnt, total));
            }
            std::hint::spin_loop();
        }
    }
    let mut reaped = 0;
    let started = Instant::now();
    while reaped < args.clients {
        let n = side
            .send_cq
            .poll_into(&mut wcs)
            .map_err(|e| because("Error polling cq")(&e))?;
        reaped += n as u32;
        if n == 0 && started.elapsed() >= stall {
            return Err(stalled(stall, cnt, total));
        }
    }
    if let Some(_ch) = &side.channel {
        recv_cq.ack_events();
    }
    Ok(())
}

fn stalled(stall: Duration, cnt: u64, total: u64) -> Fail {
    Fail {
        message: format!("Error polling cq: no completion for {} s", stall.as_secs()),
        detail: Some(format!(
            "{cnt} of {total} messages arrived: the peer stopped or is unreachable"
        )),
    }
}

fn send_end(peer: &mut Peer) -> Result<(), Fail> {
    peer.stream
        .write_all(TERMINATION)
        .map_err(|e| because("Couldn't send termination ack")(&e))
}

fn recv_end(peer: &mut Peer) -> Result<(), Fail> {
    let mut msg = [0u8; TERMINATION.len()];
    peer.stream.read_exact(&mut msg).map_err(|e| {
        because(format!(
            "0/{}: Couldn't read remote termination ack",
            TERMINATION.len()
        ))(&e)
    })?;
    if &msg != TERMINATION {
        return Err(fail("Invalid termination ack was accepted"));
    }
    Ok(())
}
