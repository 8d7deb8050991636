//! `rping`: RDMA ping over a connection made with rdma_cm, with the flags and the wire
//! protocol of rdma-core's `rping` (see [`sideway_examples::rping_wire`]), so either side
//! may be theirs. The client advertises a buffer of ping data, the server RDMA READs it and
//! RDMA WRITEs it back into a second buffer of the client's; `-v` prints the data, `-V`
//! checks it.
//!
//! As there, the QP is rdma_cm's (`rdma_create_qp`, moved through its states by librdmacm)
//! unless `-q` asks for one of the program's own (`ibv_create_qp`, moved to Init, RTR and RTS
//! with `rdma_init_qp_attr` and `ibv_modify_qp`, named in the connection's `qp_num`, and moved
//! to Error before `rdma_disconnect`). rdma-core 56's rping lists `-t` among its options
//! (with an argument) but handles it nowhere: the run ends with the usage and exit status
//! 22 (EINVAL), here as there.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use sideway::connection::{RemoteBuffer, RemoteBufferError, REMOTE_BUFFER_LEN};
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::peer_text::PEER_TEXT_MAX;
use sideway::queue_pair::SendFlags;
use sideway::rdmacm::{CmId, ConnParam, Event, EventChannel, EventType, PortSpace};
use sideway_examples::cli::{exit_status, log_to_stderr, select_devices, CliError};
use sideway_examples::cm_connection::{socket_addr, CmConnection, QpOwner, Waited};
use sideway_examples::rping_wire::{fill_ping, ping_text, MAX_SIZE, MIN_SIZE};

/// RDMA ping over rdma_cm: the client's ping data travels to the server by RDMA READ and
/// back by RDMA WRITE, as rdma-core's rping does it.
#[derive(Debug, Parser)]
#[command(name = "rping")]
#[command(group = clap::ArgGroup::new("role").required(true).args(["server", "client"]))]
struct Args {
    /// Run as the server
    #[arg(short = 's', long = "server")]
    server: bool,

    /// Run as the client
    #[arg(short = 'c', long = "client")]
    client: bool,

    /// Server: the address to listen on (default: every address). Client: the server's
    /// address (required)
    #[arg(short = 'a', long = "addr", value_name = "ADDRESS")]
    addr: Option<String>,

    /// Client: the local address to connect from
    #[arg(short = 'I', long = "src-addr", value_name = "ADDRESS")]
    src_addr: Option<String>,

    /// The server's port
    #[arg(short = 'p', long = "port", default_value_t = 7174)]
    port: u16,

    /// Client: pings to exchange (default: until interrupted). A server takes it and ignores
    /// it, as rdma-core's does: it serves until the client disconnects
    #[arg(short = 'C', long = "count", value_name = "COUNT")]
    count: Option<u64>,

    /// Bytes of ping data, the terminating NUL included
    #[arg(short = 'S', long = "size", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(MIN_SIZE as i64..=MAX_SIZE as i64))]
    size: u32,

    /// Print the ping data
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,

    /// Check that the data that came back is the data sent (the server checks what it read)
    #[arg(short = 'V', long = "validate")]
    validate: bool,

    /// Print each protocol step on stderr
    #[arg(short = 'd', long = "debug")]
    debug: bool,

    /// Server: serve one client after another until killed
    #[arg(short = 'P', long = "persistent")]
    persistent: bool,

    /// Use a QP of the program's own (ibv_create_qp, modified through its states here and
    /// named in the connection request or reply) instead of rdma_cm's (rdma_create_qp)
    #[arg(short = 'q', long = "self-created-qp")]
    self_created_qp: bool,

    /// Accepted with an argument and refused, as rdma-core 56's rping does (its option
    /// string still lists -t, its code no longer handles it): prints the usage and exits
    /// with status 22 (EINVAL)
    #[arg(short = 't', value_name = "ARG", num_args = 0..=1, allow_hyphen_values = true)]
    retired_t: Option<Option<String>>,

    /// Seconds any step may take once connected (address resolution, each completion, the
    /// peer's next message) before the run fails
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

/// Work request ids: which of the protocol's operations a completion belongs to.
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_RDMA: u64 = 3;

/// How long `rdma_resolve_addr` and `rdma_resolve_route` may take (rping's 2 s).
const RESOLVE: Duration = Duration::from_secs(2);

/// The exit status of rdma-core's rping for a usage error: EINVAL.
const USAGE_STATUS: u8 = 22;

/// What rping asks of the connection: one outstanding RDMA READ each way, retries 7 (the
/// client always; the server with `-q`, which otherwise leaves them to librdmacm).
fn rping_conn_param() -> ConnParam {
    let mut param = ConnParam::new();
    param
        .responder_resources(1)
        .initiator_depth(1)
        .retry_count(7)
        .rnr_retry_count(7);
    param
}

/// Whose QP a connection uses: rdma_cm's, or with `-q` the program's own.
fn qp_owner(args: &Args) -> QpOwner {
    if args.self_created_qp {
        QpOwner::Program
    } else {
        QpOwner::RdmaCm
    }
}

struct Run<'a> {
    args: &'a Args,
    out: io::StdoutLock<'static>,
}

impl Run<'_> {
    fn debug(&self, msg: impl FnOnce() -> String) {
        if self.args.debug {
            // Debug output is best effort; a closed stderr must not stop the ping.
            let _ = writeln!(io::stderr(), "{}", msg());
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.args.timeout)
    }

    /// Waits for `event` on `id` (see [`CmId::wait_for`]); with `-d`, a wait longer than
    /// [`SAY_WAIT_OVER`] first says what it waits for (`what`) and how long it may take.
    fn wait_for(
        &self,
        id: &CmId,
        event: EventType,
        timeout: Option<Duration>,
        what: impl FnOnce() -> String,
    ) -> Result<Event, CliError> {
        if timeout.is_none_or(|t| t > SAY_WAIT_OVER) {
            self.debug(|| match timeout {
                Some(t) => format!("waiting up to {} s for {}", t.as_secs(), what()),
                None => format!("waiting for {}", what()),
            });
        }
        id.wait_for(event, timeout).map_err(CliError::run)
    }
}

/// Waits longer than this are announced with `-d`.
const SAY_WAIT_OVER: Duration = Duration::from_secs(2);

/// The buffers the SENDs and RECVs use: one advertisement each way.
struct MessageBuffers {
    send: RegisteredBuffer,
    recv: RegisteredBuffer,
}

impl MessageBuffers {
    fn new(conn: &CmConnection) -> Result<Self, CliError> {
        let reg = |len| {
            conn.pd
                .reg_buffer(len, AccessFlags::LOCAL_WRITE)
                .map_err(CliError::run)
        };
        Ok(MessageBuffers {
            send: reg(REMOTE_BUFFER_LEN)?,
            recv: reg(REMOTE_BUFFER_LEN)?,
        })
    }

    /// Posts the receive for the peer's next message.
    fn post_recv(&self, conn: &mut CmConnection) -> Result<(), CliError> {
        let sge = self
            .recv
            .sge(0..REMOTE_BUFFER_LEN)
            .ok_or_else(short_buffer)?;
        let mut guard = conn.qp.start_post_recv();
        guard.recv(WR_RECV, &[sge]);
        guard.post().map_err(CliError::run)
    }

    /// Posts a SEND of `advert`; wait for [`WR_SEND`] to know it went.
    fn post_send(&mut self, conn: &mut CmConnection, advert: RemoteBuffer) -> Result<(), CliError> {
        self.send
            .write_at(0, &advert.to_bytes())
            .map_err(CliError::run)?;
        let sge = self
            .send
            .sge(0..REMOTE_BUFFER_LEN)
            .ok_or_else(short_buffer)?;
        let mut guard = conn.qp.start_post_send();
        guard.wr(WR_SEND, SendFlags::SIGNALED).send(sge);
        guard.post().map_err(CliError::run)
    }

    /// The advertisement the last receive brought, `len` bytes long.
    fn received(&self, len: u32) -> Result<RemoteBuffer, CliError> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len != REMOTE_BUFFER_LEN {
            return Err(CliError::run(RemoteBufferError {
                got: len,
                exact: true,
            }));
        }
        let bytes = self.recv.to_vec(0..len).map_err(|_| short_buffer())?;
        RemoteBuffer::from_bytes(&bytes).map_err(CliError::run)
    }
}

fn short_buffer() -> CliError {
    // Every buffer is registered with at least the length asked of it here.
    CliError::run("internal error: a registered buffer is shorter than its use")
}

fn advert(buf: &RegisteredBuffer) -> RemoteBuffer {
    RemoteBuffer {
        addr: buf.addr(),
        rkey: buf.rkey(),
        len: u32::try_from(buf.len()).unwrap_or(u32::MAX),
    }
}

fn client(run: &mut Run<'_>) -> Result<(), CliError> {
    let args = run.args;
    let host = args
        .addr
        .as_deref()
        .ok_or_else(|| CliError::run("the client needs the server's address: -a ADDRESS"))?;
    let dst = socket_addr(host, args.port)?;
    let src = args
        .src_addr
        .as_deref()
        .map(|h| socket_addr(h, 0))
        .transpose()?;
    let wait = Some(run.timeout());

    let channel = EventChannel::new().map_err(CliError::run)?;
    let id = channel.create_id(PortSpace::Tcp).map_err(CliError::run)?;
    id.resolve_addr(src, dst, RESOLVE).map_err(CliError::run)?;
    run.wait_for(&id, EventType::AddrResolved, wait, || {
        format!("address resolution of {dst}")
    })?;
    id.resolve_route(RESOLVE).map_err(CliError::run)?;
    run.wait_for(&id, EventType::RouteResolved, wait, || {
        format!("route resolution to {dst}")
    })?;
    run.debug(|| format!("resolved {dst} on port {} of its device", id.port_num()));

    let mut conn = CmConnection::new(&id, 4, run.timeout(), qp_owner(args))?;
    let size = args.size as usize;
    let mut msgs = MessageBuffers::new(&conn)?;
    // The server READs the ping data from `start` and WRITEs it back into `sink`.
    let mut start = conn
        .pd
        .reg_buffer(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .map_err(CliError::run)?;
    let mut sink = conn
        .pd
        .reg_buffer(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .map_err(CliError::run)?;
    msgs.post_recv(&mut conn)?;

    run.debug(|| format!("connecting to {dst}, waiting up to {:?}", run.timeout()));
    // rdma_cm's QP is moved to RTR and RTS by librdmacm; our own (-q) by connect_qp, once
    // the server has answered, which then sends the RTU (rdma_establish).
    id.connect_qp(&conn.qp, &rping_conn_param(), wait)
        .map_err(CliError::run)?;
    run.debug(|| format!("connected to {dst}, QP {:#x}", conn.qp.qp_num()));

    let mut ping = 0u64;
    // The ping data, built here and copied in: the NIC may touch both buffers at any time.
    let mut sent = vec![0; size];
    let mut got = vec![0; size];
    while args.count.is_none_or(|c| ping < c) {
        fill_ping(&mut sent, ping);
        start.write_at(0, &sent).map_err(CliError::run)?;
        sink.fill(0..size, 0).map_err(CliError::run)?;
        for (what, buf) in [("source", &start), ("sink", &sink)] {
            let a = advert(buf);
            run.debug(|| {
                format!(
                    "ping {ping}: {what} buffer at {:#x} rkey {:#x} len {}",
                    a.addr, a.rkey, a.len
                )
            });
            msgs.post_send(&mut conn, a)?;
            conn.wait(
                &[WR_SEND, WR_RECV],
                "the advertisement and the server's go-ahead",
            )?;
            msgs.post_recv(&mut conn)?;
        }
        sink.read_at(0, &mut got).map_err(CliError::run)?;
        if args.verbose {
            writeln!(run.out, "ping data: {}", ping_text(&got, MAX_SIZE))?;
        }
        if args.validate && got != sent {
            return Err(CliError::run(format!(
                "ping {ping}: data mismatch: sent \"{}\", got back \"{}\"",
                ping_text(&sent, PEER_TEXT_MAX),
                ping_text(&got, PEER_TEXT_MAX)
            )));
        }
        ping += 1;
    }
    run.out.flush()?;
    conn.disconnect()?;
    run.debug(|| format!("disconnected after {ping} pings"));
    Ok(())
}

fn server(run: &mut Run<'_>) -> Result<(), CliError> {
    let args = run.args;
    let bind = match args.addr.as_deref() {
        Some(host) => socket_addr(host, args.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port),
    };
    let channel = EventChannel::new().map_err(CliError::run)?;
    let listener = channel.create_id(PortSpace::Tcp).map_err(CliError::run)?;
    listener.bind_addr(bind).map_err(CliError::run)?;
    listener.listen(8).map_err(CliError::run)?;
    run.debug(|| format!("listening on {bind}"));
    loop {
        // Waiting for a client has no limit: that is what a server does.
        let request = listener
            .wait_for(EventType::ConnectRequest, None)
            .map_err(CliError::run)?;
        let id = Arc::clone(request.id());
        drop(request);
        if !args.persistent {
            return serve(run, &id);
        }
        // A persistent server outlives a client that fails; it says so and goes on.
        if let Err(e) = serve(run, &id) {
            let _ = writeln!(io::stderr(), "rping: client {:?}: {e}", id.peer_addr());
        }
    }
}

/// Serves one client, from its connection request to its disconnect.
fn serve(run: &mut Run<'_>, id: &Arc<sideway::rdmacm::CmId>) -> Result<(), CliError> {
    let args = run.args;
    let peer = id.peer_addr();
    run.debug(|| format!("connection request from {peer:?}"));
    // The id shares the listener's channel: requests from other clients that come while
    // this one is served are refused (see CmConnection).
    let mut conn = CmConnection::new(id, 4, run.timeout(), qp_owner(args))?;
    let size = args.size as usize;
    let mut msgs = MessageBuffers::new(&conn)?;
    let rdma_buf = conn
        .pd
        .reg_buffer(size, AccessFlags::LOCAL_WRITE)
        .map_err(CliError::run)?;
    msgs.post_recv(&mut conn)?;
    // accept_qp moves our own QP (-q) to RTR and RTS first; rdma_cm's moves with the
    // accept. Either way it accepts and waits for the connection.
    let param = if args.self_created_qp {
        rping_conn_param()
    } else {
        ConnParam::new()
    };
    id.accept_qp(&conn.qp, &param, Some(run.timeout()))
        .map_err(CliError::run)?;
    run.debug(|| format!("connection from {peer:?} established"));

    let mut ping = 0u64;
    // -C is the client's: as rdma-core's server, this one serves until the client
    // disconnects, however many pings it asked for. Each ping is two steps, each opened by the client's advertisement: its source buffer
    // (READ from it), then its sink (WRITE what was read into it).
    let mut read_len = None;
    loop {
        let wc = match conn.wait_or_disconnect(&[WR_RECV], "the client's next advertisement")? {
            Waited::Done(wcs) => wcs[0],
            Waited::Disconnected => break,
        };
        let adv = msgs.received(wc.byte_len())?;
        msgs.post_recv(&mut conn)?;
        let len = usize::try_from(adv.len).unwrap_or(usize::MAX);
        if len > size {
            return Err(CliError::run(format!(
                "the client advertised {len} bytes, more than this server's -S {size}"
            )));
        }
        match read_len {
            None => {
                run.debug(|| format!("ping {ping}: RDMA READ of {len} bytes at {:#x}", adv.addr));
                let local = rdma_buf.sge(0..len).ok_or_else(short_buffer)?;
                let mut guard = conn.qp.start_post_send();
                guard
                    .wr(WR_RDMA, SendFlags::SIGNALED)
                    .rdma_read(adv.rkey, adv.addr, local);
                guard.post().map_err(CliError::run)?;
                conn.wait(&[WR_RDMA], "the RDMA READ")?;
                read_len = Some(len);
                let data = &rdma_buf.to_vec(0..len).map_err(|_| short_buffer())?;
                if args.verbose {
                    writeln!(run.out, "server ping data: {}", ping_text(data, MAX_SIZE))?;
                    run.out.flush()?;
                }
                if args.validate {
                    let mut want = vec![0; len];
                    fill_ping(&mut want, ping);
                    if data != want.as_slice() {
                        return Err(CliError::run(format!(
                            "ping {ping}: data mismatch: expected \"{}\", read \"{}\"",
                            ping_text(&want, PEER_TEXT_MAX),
                            ping_text(data, PEER_TEXT_MAX)
                        )));
                    }
                }
            }
            Some(read) => {
                let len = len.min(read);
                run.debug(|| format!("ping {ping}: RDMA WRITE of {len} bytes to {:#x}", adv.addr));
                let local = rdma_buf.sge(0..len).ok_or_else(short_buffer)?;
                let mut guard = conn.qp.start_post_send();
                guard
                    .wr(WR_RDMA, SendFlags::SIGNALED)
                    .rdma_write(adv.rkey, adv.addr, local);
                guard.post().map_err(CliError::run)?;
                conn.wait(&[WR_RDMA], "the RDMA WRITE")?;
                read_len = None;
                ping += 1;
            }
        }
        // The go-ahead: the client waits for it before its next step.
        msgs.post_send(&mut conn, advert(&rdma_buf))?;
        // A client that has its last go-ahead may disconnect before the SEND's
        // acknowledgement makes it here: that is the end of the run, not a failure.
        if let Waited::Disconnected = conn.wait_or_disconnect(&[WR_SEND], "the go-ahead")? {
            break;
        }
    }
    // Answer the client's disconnect request; it has already left, so nothing to wait for.
    // Our own QP (-q) is moved to Error first, as librdmacm does with its own.
    let _ = conn.error_own_qp();
    let _ = id.disconnect();
    run.debug(|| format!("client {peer:?} disconnected after {ping} pings"));
    Ok(())
}

fn run(args: &Args) -> Result<(), CliError> {
    // Without a device, say so (and how to get one) before rdma_cm says something vaguer.
    select_devices(None)?;
    let mut run = Run {
        args,
        out: io::stdout().lock(),
    };
    if args.server {
        server(&mut run)
    } else {
        client(&mut run)
    }
}

/// rdma-core 56's usage text for rping.
fn usage() -> String {
    let lines = [
        "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]",
        "rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]",
        "\t-c\t\tclient side",
        "\t-I\t\tSource address to bind to for client.",
        "\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0",
        "\t-v\t\tdisplay ping data to stdout",
        "\t-V\t\tvalidate ping data",
        "\t-d\t\tdebug printfs",
        "\t-S size \tping data size",
        "\t-C count\tping count times",
        "\t-a addr\t\taddress",
        "\t-p port\t\tport",
        "\t-P\t\tpersistent server mode allowing multiple connections",
        "\t-q\t\tuse self-created, self-modified QP",
    ];
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn main() -> ExitCode {
    log_to_stderr("rping");
    let args = Args::parse();
    if args.retired_t.is_some() {
        // rdma-core 56 prints its usage on stdout and returns EINVAL; say why on stderr.
        print!("{}", usage());
        let _ = io::stdout().flush();
        eprintln!(
            "rping: -t is listed by rdma-core 56's rping but not handled there; it ends the \
             run with the usage, as here"
        );
        return ExitCode::from(USAGE_STATUS);
    }
    exit_status("rping", run(&args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_takes_an_argument_and_q_none() {
        let a = Args::try_parse_from(["rping", "-c", "-a", "h", "-q", "-t", "4"]).unwrap();
        assert!(a.self_created_qp);
        assert_eq!(a.retired_t, Some(Some("4".to_owned())));
        let a = Args::try_parse_from(["rping", "-s"]).unwrap();
        assert!(!a.self_created_qp);
        assert!(a.retired_t.is_none());
        // Without its argument, as rdma-core's getopt reports it: refused the same way.
        let a = Args::try_parse_from(["rping", "-s", "-t"]).unwrap();
        assert_eq!(a.retired_t, Some(None));
    }

    #[test]
    fn usage_is_rdma_cores() {
        let u = usage();
        assert!(u.starts_with("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]\n"));
        assert!(u.ends_with("\t-q\t\tuse self-created, self-modified QP\n"));
        assert_eq!(u.lines().count(), 14);
    }

    #[test]
    fn conn_param_is_rpings() {
        let mut want = ConnParam::new();
        want.responder_resources(1)
            .initiator_depth(1)
            .retry_count(7)
            .rnr_retry_count(7);
        assert_eq!(rping_conn_param(), want);
    }
}
