//! The measured loop every transport runs, over what it needs of a side ([`PingSide`]).

use super::*;

/// The resources of one side.
/// What the ping-pong loop needs of a side, whatever its transport.
pub(super) trait PingSide {
    /// Posts the next message.
    fn post_send(&mut self) -> Result<(), CliError>;
    /// Posts `n` more receives.
    fn post_recvs(&mut self, n: u32) -> Result<(), CliError>;
    /// Waits until at least one completion is in `wcs` ([`Waiter::wait`]).
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError>;
    /// `-t`: the timestamp of the `i`-th completion the last wait returned.
    fn stamp(&mut self, i: usize) -> u64;
    /// The message bytes of a receive that wrote `byte_len` bytes (UD's include the GRH).
    fn payload_len(&self, byte_len: u32) -> u32 {
        byte_len
    }
    /// `-t`: a receive completed at device time `ts`.
    fn received_at(&mut self, _ts: u64) {}
}

/// The measured loop, as rdma-core's programs run it (RC, UC and UD alike).
pub(super) fn exchange(side: &mut impl PingSide, args: &PingpongArgs) -> Result<(), CliError> {
    let is_client = args.server.is_some();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    // Bits of SEND_WRID/RECV_WRID still outstanding before the next send may go.
    let mut pending = RECV_WRID;
    if is_client {
        side.post_send()?;
        pending |= SEND_WRID;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let n = side.wait(&mut wcs, &|| format!("{scnt} sends and {rcnt} receives"))?;
        for (i, wc) in wcs[..n].iter().enumerate() {
            if let Err(e) = check_completion(wc, args.size, side.payload_len(wc.byte_len())) {
                if wc.wr_id() == RECV_WRID && wc.ok().is_ok() && scnt < args.iters {
                    // A short message: the peer runs with a smaller -s and waits for our
                    // reply. Send it (ours is longer, so the peer's receive fails and it
                    // names -s too, as two rdma-core programs do) before giving up; else the
                    // peer would wait for it until its stall timeout, or forever.
                    answer_once(side, pending & !RECV_WRID);
                }
                return Err(e);
            }
            match (wc.wr_id(), wc.opcode()) {
                (SEND_WRID, _) => scnt += 1,
                (RECV_WRID, WcOpcode::Recv) => {
                    if args.memory.timestamps {
                        let ts = side.stamp(i);
                        side.received_at(ts);
                    }
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

/// Sends the one reply a peer waits for before this side gives up on a size mismatch, and
/// waits (at most the stall timeout) for its completion, so that the message leaves before
/// the queue pair is destroyed. `pending` holds SEND_WRID while a send of ours is still in
/// flight: the peer then gets that one instead. Whatever fails here is dropped: the caller
/// reports the mismatch.
pub(super) fn answer_once(side: &mut impl PingSide, pending: u64) {
    if pending & SEND_WRID == 0 && side.post_send().is_err() {
        return;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while let Ok(n) = side.wait(&mut wcs, &|| "the reply to a short message".to_owned()) {
        if wcs[..n].iter().any(|wc| wc.wr_id() == SEND_WRID) {
            return;
        }
    }
}
