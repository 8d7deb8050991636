//! `uc_pingpong`: rdma-core's `ibv_uc_pingpong` on sideway. Same flags, same defaults, same
//! TCP exchange (`LID:QPN:PSN:GID` lines on port 18515) and the same SEND/RECV ping-pong over
//! an unreliable connection, so it talks to rdma-core's program in either role.
//!
//! ```text
//! uc_pingpong -g 1              # server: waits for a client
//! uc_pingpong -g 1 SERVER       # client
//! uc_pingpong -g 1 -e SERVER    # client, sleeping on completion events
//! ```

use std::process::ExitCode;

use clap::Parser;
use sideway::queue_pair::QpType;
use sideway_examples::cli::{exit_status, log_to_stderr};
use sideway_examples::pingpong::{run_connected, ChkArg, PingpongArgs};

/// Ping-pong SEND/RECV over a UC queue pair, wire-compatible with ibv_uc_pingpong. Without
/// SERVER, waits for a client; with it, connects to that server.
#[derive(Debug, Parser)]
#[command(name = "uc_pingpong", version)]
struct Args {
    #[command(flatten)]
    common: PingpongArgs,

    #[command(flatten)]
    chk: ChkArg,
}

fn main() -> ExitCode {
    log_to_stderr("uc_pingpong");
    let mut args = Args::parse();
    args.common.validate = args.chk.chk;
    exit_status("uc_pingpong", run_connected(&args.common, QpType::Uc))
}
