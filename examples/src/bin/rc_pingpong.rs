//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong` on sideway. Same flags, same defaults, same
//! TCP exchange (`LID:QPN:PSN:GID` lines on port 18515) and the same SEND/RECV ping-pong over
//! a reliable connection, so it talks to rdma-core's program in either role.
//!
//! ```text
//! rc_pingpong -g 1              # server: waits for a client
//! rc_pingpong -g 1 SERVER       # client
//! rc_pingpong -g 1 -o -P SERVER # client, buffer on demand and prefetched
//! ```

use std::process::ExitCode;

use clap::Parser;
use sideway::queue_pair::QpType;
use sideway_examples::cli::{exit_status, log_to_stderr};
use sideway_examples::pingpong::{
    run_connected, ChkArg, DmArg, MemoryFlags, OdpArg, PingpongArgs, RcMemoryArgs,
};

/// Ping-pong SEND/RECV over an RC queue pair, wire-compatible with ibv_rc_pingpong. Without
/// SERVER, waits for a client; with it, connects to that server.
#[derive(Debug, Parser)]
#[command(name = "rc_pingpong", version)]
struct Args {
    #[command(flatten)]
    common: PingpongArgs,

    #[command(flatten)]
    chk: ChkArg,

    #[command(flatten)]
    dm: DmArg,

    #[command(flatten)]
    odp: OdpArg,

    #[command(flatten)]
    memory: RcMemoryArgs,
}

fn main() -> ExitCode {
    log_to_stderr("rc_pingpong");
    let mut args = Args::parse();
    args.common.validate = args.chk.chk;
    args.common.use_dm = args.dm.dm;
    let run = MemoryFlags::rc(&args.odp, &args.memory, args.dm.dm).and_then(|memory| {
        args.common.memory = memory;
        run_connected(&args.common, QpType::Rc)
    });
    exit_status("rc_pingpong", run)
}
