//! How a failed work completion reads in an error: the operation, the QP and message, the
//! status with its likely cause, and for a transport retry failure how long the transport
//! tried.

use super::error::RunError;
use super::link;
use crate::cli::Verb;
use crate::oob::OobError;

/// The operation a verb's work requests carry, as a person names it.
pub(crate) fn op_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Send => "SEND",
        Verb::Write => "RDMA WRITE",
        Verb::Read => "RDMA READ",
        Verb::Atomic => "atomic",
    }
}

/// A failed completion as stride reports it: `what` failed on QP `qp` (its index in this
/// run, 0 to -q - 1) at message `message` of that QP (counted from 1), with the status and
/// its likely cause. Never the wr_id: stride packs the QP index and batch counts into it,
/// which means nothing to a reader.
/// A transport retry failure also says how long the transport tried (`qp_timeout`, `-u`).
pub(crate) fn wc_failed(
    e: &sideway::completion_queue::WorkCompletionError,
    what: &str,
    qp: usize,
    message: u64,
    qp_timeout: u8,
) -> RunError {
    let hint = e.status.hint();
    let tried = if e.status == sideway::completion_queue::WcStatus::RetryExcErr {
        format!(
            "; no acknowledgement came for {}: the peer or the link is gone",
            link::retry_budget_text(qp_timeout)
        )
    } else {
        String::new()
    };
    RunError::Completion {
        status: e.status,
        text: format!(
            "{what} on QP {qp} (QPN {:#x}) failed at message {message} of that QP: {}{}{hint}{tried}",
            e.qp_num,
            e.status,
            if hint.is_empty() { "" } else { ": " }
        ),
    }
}

/// Who a failed completion is blamed on, given what the peer's out-of-band channel said
/// when it was looked at just after (`peer`, as [`crate::oob::OobChannel::peer_spoke`]
/// returns it). A peer that died (SIGTERM, SIGKILL, an exit after an error) takes its
/// memory and QPs with it, so this side's work fails with whatever status the dead peer's
/// NIC or the kernel happens to give (a remote access error, a too-long send): that status
/// says nothing of the cause. So a closed channel names the peer first
/// ([`RunError::PeerGone`]), a peer that sent its reason gives it
/// ([`RunError::PeerAborted`]), and the status only follows; a peer still there leaves
/// the completion's own message. Errors other than a failed completion pass unchanged.
pub(crate) fn blame(failed: RunError, peer: Result<bool, OobError>) -> RunError {
    let RunError::Completion { status, .. } = &failed else {
        return failed;
    };
    match peer {
        Err(e @ (OobError::Closed { .. } | OobError::PeerAborted(_))) => {
            let status = *status;
            RunError::from(e).map_text(|t| {
                format!("{t}; this side's work then failed with {status}, which follows from that")
            })
        }
        _ => failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_completions_show_the_qp_and_message_not_the_wr_id() {
        let e = sideway::completion_queue::WorkCompletionError {
            status: sideway::completion_queue::WcStatus::RemAccessErr,
            wr_id: 4_294_967_296,
            qp_num: 0x11,
            vendor_err: 0,
        };
        let failed = wc_failed(&e, op_name(Verb::Write), 0, 1, 14);
        assert!(
            matches!(
                failed,
                RunError::Completion {
                    status: sideway::completion_queue::WcStatus::RemAccessErr,
                    ..
                }
            ),
            "{failed:?}"
        );
        let text = failed.to_string();
        assert!(
            text.starts_with("RDMA WRITE on QP 0 (QPN 0x11) failed at message 1 of that QP: "),
            "{text}"
        );
        assert!(
            text.contains("(10)")
                && text.contains(
                    "the peer process is gone or deregistered its memory: check the peer's output"
                ),
            "{text}"
        );
        assert!(!text.contains("4294967296"), "{text}");
        let gone = sideway::completion_queue::WorkCompletionError {
            status: sideway::completion_queue::WcStatus::RetryExcErr,
            ..e
        };
        let text = wc_failed(&gone, "SEND", 1, 7, 14).to_string();
        assert!(
            text.ends_with(
                "no acknowledgement came for about 536 ms (the first try and 7 resends, each \
                 after a 67 ms ack timeout: -u 14): the peer or the link is gone"
            ),
            "{text}"
        );
    }

    fn remote_access_error() -> RunError {
        let e = sideway::completion_queue::WorkCompletionError {
            status: sideway::completion_queue::WcStatus::RemAccessErr,
            wr_id: 1,
            qp_num: 0x11,
            vendor_err: 0,
        };
        wc_failed(&e, op_name(Verb::Read), 0, 5, 14)
    }

    #[test]
    fn a_failed_completion_names_a_closed_peer_first() {
        let closed = Err(OobError::Closed {
            what: "watching the peer during the run".into(),
        });
        let e = blame(remote_access_error(), closed);
        assert!(matches!(e, RunError::PeerGone(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with("watching the peer during the run: the peer closed the connection"),
            "{text}"
        );
        assert!(text.contains("(10), which follows from that"), "{text}");
        assert!(!text.contains("remote key"), "{text}");

        let aborted = Err(OobError::PeerAborted("its device died".into()));
        let e = blame(remote_access_error(), aborted);
        assert!(matches!(e, RunError::PeerAborted(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("the peer stopped: its device died; "),
            "{e}"
        );
    }

    #[test]
    fn a_failed_completion_with_the_peer_still_there_keeps_its_status() {
        for peer in [Ok(false), Ok(true), Err(OobError::Garbage("x".into()))] {
            let e = blame(remote_access_error(), peer);
            assert_eq!(e, remote_access_error());
        }
        let other = RunError::timeout("no progress");
        let closed = Err(OobError::Closed { what: "w".into() });
        assert_eq!(blame(other.clone(), closed), other);
    }
}
