//! `srq_pingpong`: rdma-core's `ibv_srq_pingpong` on sideway. Same flags, same defaults
//! (16 QPs), same TCP exchange (one `LID:QPN:PSN:GID` line per QP each way on port 18515)
//! and the same SEND/RECV ping-pong over RC QPs that all receive from one shared receive
//! queue, so it talks to rdma-core's program in either role.
//!
//! ```text
//! srq_pingpong -g 1              # server: waits for a client
//! srq_pingpong -g 1 -q 4 SERVER  # client with 4 QPs (the server must use -q 4 too)
//! ```

use std::process::ExitCode;

use clap::Parser;
use sideway_examples::cli::{exit_status, log_to_stderr};
use sideway_examples::pingpong::{run_srq, ChkArg, OdpArg, PingpongArgs};

/// Ping-pong SEND/RECV over RC queue pairs sharing one receive queue, wire-compatible with
/// ibv_srq_pingpong. Without SERVER, waits for a client; with it, connects to that server.
#[derive(Debug, Parser)]
#[command(name = "srq_pingpong", version)]
struct Args {
    #[command(flatten)]
    common: PingpongArgs,

    /// Number of QPs to use (both sides must agree)
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,

    #[command(flatten)]
    odp: OdpArg,

    #[command(flatten)]
    chk: ChkArg,
}

fn main() -> ExitCode {
    log_to_stderr("srq_pingpong");
    let mut args = Args::parse();
    args.common.validate = args.chk.chk;
    args.common.memory.odp = args.odp.odp;
    exit_status("srq_pingpong", run_srq(&args.common, args.num_qp))
}
