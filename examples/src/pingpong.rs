//! The ping-pong that rdma-core's `ibv_rc_pingpong` and `ibv_uc_pingpong` run, on sideway.
//!
//! Both sides post `rx_depth` receives, trade endpoints over TCP ([`crate::pingpong_wire`]),
//! and then bounce one `size`-byte SEND back and forth `iters` times: the client sends first;
//! each side sends its next message once its previous send and the peer's message have both
//! completed. Each side prints the two endpoints and the throughput and time per iteration,
//! in the same words as rdma-core's programs, so runs of the two can be compared line by line.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sideway::completion_queue::WcOpcode;
use sideway::device::Mtu;
use sideway::{
    AccessFlags, CompletionQueue, ConnectOptions, DeviceContext, Endpoint, Gid, QpType, QueuePair,
    RegisteredBuffer, SendFlags,
};

use crate::cli::CliError;
use crate::pingpong_wire::{self, Endpoint as WireEndpoint};

/// The options every pingpong shares, with rdma-core's letters and defaults.
#[derive(Debug, Clone, Args)]
pub struct PingpongArgs {
    /// The server to connect to; without it, wait for a client
    pub server: Option<String>,

    /// Listen on / connect to this TCP port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,

    /// Use this RDMA device (default: the first one found)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    pub ib_dev: Option<String>,

    /// Use this port of the device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,

    /// Size of the message to exchange, in bytes
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: u32,

    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096)
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,

    /// Number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,

    /// Number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u64,

    /// Service level
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,

    /// Local port GID index (needed on RoCE; without it the path is LID-routed)
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u8>,

    /// Use the extended work-request API (ibv_wr_*) and an extended CQ
    #[arg(short = 'N', long = "new_send")]
    pub new_send: bool,

    /// Give up when the peer sends nothing for this many seconds
    #[arg(long = "stall-timeout", default_value_t = 30)]
    pub stall_timeout: u64,
}

/// What the rest of the buffer holds, as in rdma-core's programs.
const FILL: u8 = 0x7b;

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

/// How long the TCP exchange may wait for the peer at each step.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

impl PingpongArgs {
    /// Checks what clap cannot: the MTU value and the depth.
    pub fn check(&self) -> Result<Mtu, CliError> {
        if self.rx_depth == 0 || self.iters == 0 || self.size == 0 {
            return Err(CliError::run("-r, -n and -s must be at least 1"));
        }
        Mtu::from_bytes(self.mtu).ok_or_else(|| {
            CliError::run(format!(
                "-m {} is not a path MTU: use 256, 512, 1024, 2048 or 4096",
                self.mtu
            ))
        })
    }
}

/// A pseudo-random 24-bit starting PSN, different per process and run.
fn random_psn() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(16)).wrapping_mul(0x9e37_79b1) >> 8
}

fn print_endpoint(which: &str, ep: &Endpoint) {
    let gid = std::net::Ipv6Addr::from(*ep.gid.as_bytes());
    println!(
        "  {which:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {gid}",
        ep.lid, ep.qp_num, ep.psn
    );
}

fn to_wire(ep: &Endpoint) -> WireEndpoint {
    WireEndpoint {
        lid: ep.lid,
        qpn: ep.qp_num,
        psn: ep.psn,
        gid: ep.gid,
    }
}

fn from_wire(ep: &WireEndpoint) -> Endpoint {
    Endpoint {
        lid: ep.lid,
        qp_num: ep.qpn,
        psn: ep.psn,
        gid: ep.gid,
    }
}

/// The resources of one side.
struct Side {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    buf: RegisteredBuffer,
    size: u32,
    inline: bool,
}

impl Side {
    fn post_recvs(&mut self, n: u32) -> Result<(), CliError> {
        let sge = self
            .buf
            .sge(0..self.size as usize)
            .ok_or_else(|| CliError::run("the receive buffer is smaller than -s"))?;
        let mut guard = self.qp.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self) -> Result<(), CliError> {
        let size = self.size as usize;
        let mut guard = self.qp.start_post_send();
        if self.inline {
            guard
                .wr(SEND_WRID, SendFlags::SIGNALED)
                .send(&self.buf.as_slice()[..size]);
        } else {
            let sge = self
                .buf
                .sge(0..size)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

fn open_side(
    ctx: &Arc<DeviceContext>,
    args: &PingpongArgs,
    qp_type: QpType,
) -> Result<Side, CliError> {
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let mut buf = pd
        .reg_buffer(args.size as usize, AccessFlags::LOCAL_WRITE)
        .map_err(CliError::run)?;
    buf.as_mut_slice().fill(FILL);
    let mut cq_builder = ctx.create_cq_builder();
    cq_builder.cqe(args.rx_depth + 1);
    let cq = if args.new_send {
        cq_builder.build_ex()
    } else {
        cq_builder.build()
    }
    .map_err(CliError::run)?;
    let mut qp_builder = pd.create_qp_builder();
    qp_builder
        .qp_type(qp_type)
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(1)
        .max_recv_wr(args.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1);
    let qp = if args.new_send {
        qp_builder.build_ex()
    } else {
        qp_builder.build()
    }
    .map_err(CliError::run)?;
    let inline = qp.cap().max_inline_data >= args.size;
    Ok(Side {
        qp,
        cq,
        buf,
        size: args.size,
        inline,
    })
}

/// Runs one side of an RC or UC pingpong (server when `args.server` is `None`) and prints
/// what rdma-core's programs print.
pub fn run_connected(args: &PingpongArgs, qp_type: QpType) -> Result<(), CliError> {
    let mtu = args.check()?;
    let ctx = sideway::open_device(args.ib_dev.as_deref())?;
    let port = ctx.query_port(u32::from(args.ib_port))?;
    if port.link_layer() == sideway::device::LinkLayer::Ethernet && args.gid_idx.is_none() {
        return Err(CliError::run(
            "this port is RoCE (Ethernet), which needs a GID: pass -g with a GID index \
             (show_gids lists them)",
        ));
    }
    let mut side = open_side(&ctx, args, qp_type)?;
    let psn = random_psn();
    let mut opts = ConnectOptions::new();
    opts.port_num(args.ib_port)
        .path_mtu(mtu)
        .sq_psn(psn)
        .sl(args.sl)
        .qp_access_flags(AccessFlags::empty());
    if let Some(g) = args.gid_idx {
        opts.gid_index(g);
    }
    let gid = match args.gid_idx {
        Some(g) => ctx.query_gid(u32::from(args.ib_port), u32::from(g))?.gid,
        None => Gid::ZERO,
    };
    let local = Endpoint {
        lid: port.lid(),
        qp_num: side.qp.qp_num(),
        psn,
        gid,
    };
    print_endpoint("local address:", &local);

    let remote = match &args.server {
        Some(host) => {
            let remote =
                pingpong_wire::client_exchange(host, args.port, &to_wire(&local), EXCHANGE_TIMEOUT)
                    .map_err(CliError::run)?;
            let remote = from_wire(&remote);
            side.qp.connect(&opts, &remote).map_err(CliError::run)?;
            side.post_recvs(args.rx_depth)?;
            remote
        }
        None => {
            let remote = pingpong_wire::server_exchange(
                args.port,
                &to_wire(&local),
                EXCHANGE_TIMEOUT,
                |peer| {
                    // The receives must be up before the client learns our endpoint.
                    side.qp
                        .connect(&opts, &from_wire(peer))
                        .map_err(CliError::run)
                        .and_then(|()| side.post_recvs(args.rx_depth))
                        .map_err(|e| e.to_string().into())
                },
            )
            .map_err(CliError::run)?;
            from_wire(&remote)
        }
    };
    print_endpoint("remote address:", &remote);

    let start = Instant::now();
    exchange(&mut side, args)?;
    let elapsed = start.elapsed();
    report(args, elapsed)?;
    Ok(())
}

/// The measured loop, as rdma-core's programs run it.
fn exchange(side: &mut Side, args: &PingpongArgs) -> Result<(), CliError> {
    let is_client = args.server.is_some();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    // Bits of SEND_WRID/RECV_WRID still outstanding before the next send may go.
    let mut pending = RECV_WRID;
    if is_client {
        side.post_send()?;
        pending |= SEND_WRID;
    }
    let stall = Duration::from_secs(args.stall_timeout);
    let mut last_progress = Instant::now();
    let mut wcs = [sideway::WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let n = side.cq.poll_into(&mut wcs).map_err(CliError::run)?;
        if n == 0 {
            if last_progress.elapsed() > stall {
                return Err(CliError::run(format!(
                    "no completion for {} s after {scnt} sends and {rcnt} receives: the peer \
                     stopped or is unreachable",
                    args.stall_timeout
                )));
            }
            std::hint::spin_loop();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            wc.ok().map_err(CliError::run)?;
            match (wc.wr_id(), wc.opcode()) {
                (SEND_WRID, _) => scnt += 1,
                (RECV_WRID, WcOpcode::Recv) => {
                    rcnt += 1;
                    routs -= 1;
                    if routs <= 1 {
                        side.post_recvs(args.rx_depth - routs)?;
                        routs = args.rx_depth;
                    }
                }
                (id, op) => {
                    return Err(CliError::run(format!(
                        "completion with unexpected wr_id {id} ({op:?})"
                    )))
                }
            }
            pending &= !wc.wr_id();
            if scnt < args.iters && pending == 0 {
                side.post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(())
}

fn report(args: &PingpongArgs, elapsed: Duration) -> Result<(), CliError> {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = u64::from(args.size) * args.iters * 2;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / args.iters as f64
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_fits_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0x00ff_ffff);
        }
    }

    #[test]
    fn wire_conversion_round_trips() {
        let ep = Endpoint {
            lid: 7,
            qp_num: 0x1234,
            psn: 0xabcdef,
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        };
        assert_eq!(from_wire(&to_wire(&ep)), ep);
    }
}
