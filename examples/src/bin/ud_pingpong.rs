//! `ud_pingpong`: rdma-core's `ibv_ud_pingpong` on sideway. Same flags, same defaults
//! (2048-byte messages, at most the port's MTU), same TCP exchange (`LID:QPN:PSN:GID` lines
//! on port 18515), Q_Key 0x11111111, an address handle built from the peer's GID and LID,
//! and receive buffers with 40 bytes of room for the GRH, so it talks to rdma-core's program
//! in either role.
//!
//! ```text
//! ud_pingpong -g 1              # server: waits for a client
//! ud_pingpong -g 1 SERVER       # client
//! ```

use std::process::ExitCode;

use clap::Parser;
use sideway_examples::cli::{exit_status, log_to_stderr};
use sideway_examples::pingpong::{run_ud, ChkArg, MemoryFlags, PingpongArgs};

/// Ping-pong SEND/RECV over a UD queue pair, wire-compatible with ibv_ud_pingpong. Without
/// SERVER, waits for a client; with it, connects to that server.
#[derive(Debug, Parser)]
#[command(name = "ud_pingpong", version)]
struct Args {
    /// The server to connect to; without it, wait for a client
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

    /// Size of the message to exchange, in bytes (default 2048, or the port's MTU if
    /// smaller; at most the port's MTU)
    #[arg(short = 's', long = "size")]
    size: Option<u32>,

    /// Number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,

    /// Number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u64,

    /// Send messages with this service level
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,

    /// Sleep on CQ events instead of polling
    #[arg(short = 'e', long = "events")]
    events: bool,

    /// Local port GID index (needed on RoCE; without it the path is LID-routed)
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,

    /// Use the extended work-request API (ibv_wr_*) and an extended CQ
    #[arg(short = 'N', long = "new_send")]
    new_send: bool,

    /// Give up when the peer sends nothing for this many seconds (also bounds each step of
    /// the TCP exchange of endpoints, the client's connect included)
    #[arg(long = "stall-timeout", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    stall_timeout: u64,

    #[command(flatten)]
    chk: ChkArg,
}

fn main() -> ExitCode {
    log_to_stderr("ud_pingpong");
    let a = Args::parse();
    let common = PingpongArgs {
        server: a.server,
        port: a.port,
        ib_dev: a.ib_dev,
        ib_port: a.ib_port,
        size: a.size.unwrap_or(2048),
        // UD has no path MTU to set; the size is checked against the port's MTU instead.
        mtu: 1024,
        rx_depth: a.rx_depth,
        iters: a.iters,
        sl: a.sl,
        gid_idx: a.gid_idx,
        new_send: a.new_send,
        events: a.events,
        stall_timeout: a.stall_timeout,
        validate: a.chk.chk,
        use_dm: false,
        memory: MemoryFlags::default(),
    };
    exit_status("ud_pingpong", run_ud(&common, a.size.is_some()))
}
