//! What a run says: the stall and completion errors, `-c`'s page checks and the final
//! throughput line.

use super::*;

/// Why a side of a `transport` run of `iters` exchanges that waited `stall` for a completion
/// gives up, after `progress`: only the causes that transport can have. A peer with a
/// smaller `-n` is done early on every transport; a message that does not fit the peer's
/// receive buffer fails both sides on RC but is lost on UC and UD, as is one the link drops.
pub(super) fn stall_message(
    stall: Duration,
    progress: &str,
    transport: QpType,
    iters: u64,
) -> String {
    let lost = match transport {
        QpType::Uc => {
            ", or our message was lost (UC resends nothing, and drops a message longer than \
             the peer's -s)"
        }
        QpType::Ud => {
            ", or our message was dropped (UD resends nothing, and drops a message longer \
             than the peer's receive buffer)"
        }
        _ => "",
    };
    let same = match transport {
        QpType::Uc | QpType::Ud => "the same -n and the same message size (-s)",
        _ => "the same -n",
    };
    format!(
        "no completion for {} s after {progress} of -n {iters}: the peer stopped (with a \
         smaller -n it is done already), is unreachable{lost}; check the peer's output, and \
         that both sides use {same}",
        stall.as_secs()
    )
}

/// Checks a completion of the ping-pong: a failure, or a message of another size than
/// `-s` (`payload_len`: the received bytes without any GRH), ends the run with its likely
/// cause. rdma-core's endpoint line does not carry the size, so two sides with different
/// `-s` meet here: the smaller side's receive fails (or, on UD, the message is dropped),
/// the larger side's send fails, or it receives short messages.
pub(super) fn check_completion(
    wc: &WorkCompletion,
    size: u32,
    payload_len: u32,
) -> Result<(), CliError> {
    if let Err(e) = wc.ok() {
        return Err(CliError::run(match e.status {
            WcStatus::LocLenErr
            | WcStatus::LocQpOpErr
            | WcStatus::RemInvReqErr
            | WcStatus::RemOpErr => format!("{e} (this side runs with -s {size})"),
            _ => e.to_string(),
        }));
    }
    if wc.wr_id() == RECV_WRID && wc.opcode() == WcOpcode::Recv && payload_len != size {
        return Err(CliError::run(format!(
            "received a {payload_len}-byte message where this side expects {size} (-s {size}): \
             the peer runs with another message size; run both sides with the same -s"
        )));
    }
    Ok(())
}

/// What the rest of the buffer holds, as in rdma-core's rc, uc and ud programs.
pub(super) const FILL: u8 = 0x7b;

/// What `ibv_srq_pingpong`'s buffer holds: zeros, which is also `-c`'s stamp, so its server
/// finds every page stamped whether the client ran with `-c` or not.
pub(super) const SRQ_FILL: u8 = 0;

/// What `-c` writes to the first byte of every page of a client's buffer, and what the
/// server checks there after the run. rdma-core's programs compute it as
/// `i / page_size % sizeof(char)`, which is 0 for every page; the buffer around it holds
/// [`FILL`], so a page whose message never arrived keeps 0x7b there.
pub(super) const STAMP: u8 = 0;

/// `-c` on the client: stamps the first byte of every `page`-byte page of `buf`.
pub fn stamp_pages(buf: &mut [u8], page: usize) {
    for byte in buf.iter_mut().step_by(page.max(1)) {
        *byte = STAMP;
    }
}

/// `-c` on the server: the pages of `buf` whose first byte is not the client's stamp.
pub fn invalid_pages(buf: &[u8], page: usize) -> Vec<usize> {
    buf.iter()
        .step_by(page.max(1))
        .enumerate()
        .filter(|&(_, &b)| b != STAMP)
        .map(|(i, _)| i)
        .collect()
}

/// `-c` on the client: stamps the first byte of every page of the message, which starts at
/// `offset` of `buf`. Copied out and back: the device may write the buffer (receives are
/// posted).
pub(super) fn stamp_buffer(
    buf: &mut RegisteredBuffer,
    offset: usize,
    page: usize,
) -> Result<(), CliError> {
    let mut bytes = buf.to_vec(offset..buf.len()).map_err(CliError::run)?;
    stamp_pages(&mut bytes, page);
    buf.write_at(offset, &bytes).map_err(CliError::run)
}

/// `-c` on the server, after the run: a line per page of the message (from `offset` of
/// `buf`) without the client's stamp, as rdma-core's programs print them (the exit status
/// stays 0).
pub(super) fn report_invalid_pages(
    buf: &RegisteredBuffer,
    offset: usize,
    page: usize,
) -> Result<(), CliError> {
    let bytes = buf.to_vec(offset..buf.len()).map_err(CliError::run)?;
    let mut out = io::stdout().lock();
    for n in invalid_pages(&bytes, page) {
        writeln!(out, "invalid data in page {n}")?;
    }
    Ok(())
}

pub(super) fn report(args: &PingpongArgs, elapsed: Duration) -> Result<(), CliError> {
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
