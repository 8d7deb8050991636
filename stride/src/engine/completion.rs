//! How a failed work completion reads in an error: the operation, the QP and message, the
//! status with its likely cause, and for a transport retry failure how long the transport
//! tried.

use super::error::RunError;
use super::link;
use crate::cli::Verb;

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
    e: &sideway::WorkCompletionError,
    what: &str,
    qp: usize,
    message: u64,
    qp_timeout: u8,
) -> RunError {
    let hint = e.status.hint();
    let tried = if e.status == sideway::WcStatus::RetryExcErr {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_completions_show_the_qp_and_message_not_the_wr_id() {
        let e = sideway::WorkCompletionError {
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
                    status: sideway::WcStatus::RemAccessErr,
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
        let gone = sideway::WorkCompletionError {
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
}
