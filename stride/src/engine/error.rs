//! Why a run failed: [`RunError`], a sentence saying what happened and what to do, and how
//! the errors of the layers below become one.

use std::fmt;

use crate::bandwidth::BandwidthError;
use crate::buffer::BufferError;
use crate::latency::TooFewSamples;
use crate::oob::OobError;
use crate::params::ParamError;

/// Why a run failed. Every variant holds the sentence stride prints, saying what happened
/// and what to do (`Display` writes it as it is); the variant says which kind of failure it
/// was, for callers that act on it (the cluster mode, a report, a test).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunError {
    /// The peer is not there, or no longer: connecting to it failed, it closed the
    /// connection, or it died (the other side of a pair, rank 0 or another rank of a
    /// cluster run, a stream's server or client).
    PeerGone(String),
    /// The peer stopped with an error of its own and sent its reason.
    PeerAborted(String),
    /// The peer sent something this side cannot accept (garbage, another protocol version, a
    /// message out of turn, numbers no run has); the text says what came.
    PeerInvalid(String),
    /// A work request completed with an error.
    Completion {
        /// The completion's status.
        status: sideway::completion_queue::WcStatus,
        /// What failed where, the status and its likely cause.
        text: String,
    },
    /// Nothing happened within a bound: the peer went silent, a measured loop made no
    /// progress, a wait ran out.
    Timeout(String),
    /// Setting up failed: the device, memory (huge pages, a GPU), protection domains,
    /// regions, queues, QPs, CPU pinning, the connection's listener.
    Setup(String),
    /// The device or its link failed during the run: a fatal device event, a queue's error
    /// event, a port that stayed down.
    Link(String),
    /// The options ask for what this run cannot do, or the two sides' options differ.
    Usage(String),
    /// Anything else.
    Other(String),
}

impl RunError {
    /// An error of no particular kind ([`RunError::Other`]) with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        RunError::Other(msg.into())
    }

    /// [`RunError::PeerGone`] with this message.
    pub fn peer_gone(msg: impl Into<String>) -> Self {
        RunError::PeerGone(msg.into())
    }

    /// [`RunError::PeerAborted`] with this message.
    pub fn peer_aborted(msg: impl Into<String>) -> Self {
        RunError::PeerAborted(msg.into())
    }

    /// [`RunError::PeerInvalid`] with this message.
    pub fn peer_invalid(msg: impl Into<String>) -> Self {
        RunError::PeerInvalid(msg.into())
    }

    /// [`RunError::Timeout`] with this message.
    pub fn timeout(msg: impl Into<String>) -> Self {
        RunError::Timeout(msg.into())
    }

    /// [`RunError::Setup`] with this message.
    pub fn setup(msg: impl Into<String>) -> Self {
        RunError::Setup(msg.into())
    }

    /// [`RunError::Link`] with this message.
    pub fn link(msg: impl Into<String>) -> Self {
        RunError::Link(msg.into())
    }

    /// [`RunError::Usage`] with this message.
    pub fn usage(msg: impl Into<String>) -> Self {
        RunError::Usage(msg.into())
    }

    /// The sentence this error prints.
    pub fn text(&self) -> &str {
        match self {
            RunError::PeerGone(t)
            | RunError::PeerAborted(t)
            | RunError::PeerInvalid(t)
            | RunError::Completion { text: t, .. }
            | RunError::Timeout(t)
            | RunError::Setup(t)
            | RunError::Link(t)
            | RunError::Usage(t)
            | RunError::Other(t) => t,
        }
    }

    /// The kind in one word, as a report or a script would name it: `peer-gone`,
    /// `peer-aborted`, `peer-invalid`, `completion`, `timeout`, `setup`, `link`, `usage`, `other`.
    pub fn kind(&self) -> &'static str {
        match self {
            RunError::PeerGone(_) => "peer-gone",
            RunError::PeerAborted(_) => "peer-aborted",
            RunError::PeerInvalid(_) => "peer-invalid",
            RunError::Completion { .. } => "completion",
            RunError::Timeout(_) => "timeout",
            RunError::Setup(_) => "setup",
            RunError::Link(_) => "link",
            RunError::Usage(_) => "usage",
            RunError::Other(_) => "other",
        }
    }

    /// The same kind of error with its sentence rewritten by `f` (more context added).
    pub fn map_text(self, f: impl FnOnce(&str) -> String) -> Self {
        let mut e = self;
        let t = match &mut e {
            RunError::PeerGone(t)
            | RunError::PeerAborted(t)
            | RunError::PeerInvalid(t)
            | RunError::Completion { text: t, .. }
            | RunError::Timeout(t)
            | RunError::Setup(t)
            | RunError::Link(t)
            | RunError::Usage(t)
            | RunError::Other(t) => t,
        };
        *t = f(t);
        e
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

impl std::error::Error for RunError {}

impl From<OobError> for RunError {
    fn from(e: OobError) -> Self {
        let text = e.to_string();
        match e {
            OobError::Connect { .. } | OobError::Closed { .. } => RunError::PeerGone(text),
            OobError::PeerAborted(_) => RunError::PeerAborted(text),
            OobError::Timeout { .. } => RunError::Timeout(text),
            OobError::Listen { .. } => RunError::Setup(text),
            OobError::Mismatch(_) => RunError::Usage(text),
            OobError::Garbage(_)
            | OobError::Version { .. }
            | OobError::Unexpected { .. }
            | OobError::PartialFrame { .. }
            | OobError::EndpointCount { .. }
            | OobError::EndpointAddress { .. }
            | OobError::PeerNumber { .. }
            | OobError::EndpointField { .. } => RunError::PeerInvalid(text),
            OobError::Io { .. } => RunError::Other(text),
        }
    }
}

impl From<sideway::completion_queue::WorkCompletionError> for RunError {
    fn from(e: sideway::completion_queue::WorkCompletionError) -> Self {
        RunError::Completion {
            status: e.status,
            text: e.to_string(),
        }
    }
}

/// `From` conversions that keep the error's text, as the given kind.
macro_rules! run_error_from {
    ($($kind:ident: $($t:ty),+ ;)*) => {$($(
        impl From<$t> for RunError {
            fn from(e: $t) -> Self {
                RunError::$kind(e.to_string())
            }
        }
    )+)*};
}

run_error_from!(
    Usage: ParamError;
    Setup:
        BufferError,
        crate::cuda::CudaError,
        sideway::device::DeviceError,
        sideway::protection_domain::AllocPdError,
        sideway::memory_region::MemoryRegionError,
        sideway::completion_queue::CompletionQueueError,
        sideway::queue_pair::QueuePairError,
        sideway::queue_pair::ConnectError,
        sideway::rdmacm::CmError,
        sideway::address_handle::AddressHandleError,
        sideway::shared_receive_queue::SharedReceiveQueueError,
        sideway::queue_pair::ModifyQpError,
        sideway::dv::DvError;
    Other:
        BandwidthError,
        TooFewSamples,
        sideway::queue_pair::PostError,
        sideway::async_event::EventError;
);

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use super::*;

    /// The error an `OobError` becomes: its kind, and its text unchanged.
    fn from_oob(e: OobError) -> RunError {
        let text = e.to_string();
        let run = RunError::from(e);
        assert_eq!(run.to_string(), text);
        run
    }

    #[test]
    fn channel_errors_become_the_kind_of_failure_they_are() {
        let closed = from_oob(OobError::Closed {
            what: "barrier".into(),
        });
        assert!(matches!(closed, RunError::PeerGone(_)), "{closed:?}");
        let refused = from_oob(OobError::Connect {
            addr: "h:1".into(),
            port: 1,
            limit: Duration::from_secs(1),
            source: io::ErrorKind::ConnectionRefused.into(),
        });
        assert!(matches!(refused, RunError::PeerGone(_)), "{refused:?}");
        let aborted = from_oob(OobError::PeerAborted("device lost".into()));
        assert_eq!(
            aborted,
            RunError::PeerAborted("the peer stopped: device lost".into())
        );
        let silent = from_oob(OobError::Timeout {
            what: "results".into(),
            peer: "h:1".into(),
            limit: Duration::from_secs(15),
        });
        assert!(matches!(silent, RunError::Timeout(_)), "{silent:?}");
        for invalid in [
            OobError::Garbage("xyz".into()),
            OobError::Version { peer: 99 },
            OobError::EndpointCount {
                sent: 1,
                expected: 2,
            },
        ] {
            let e = from_oob(invalid);
            assert!(matches!(e, RunError::PeerInvalid(_)), "{e:?}");
        }
        let differ = from_oob(OobError::Mismatch(vec!["-s: here 8, peer 16".into()]));
        assert!(matches!(differ, RunError::Usage(_)), "{differ:?}");
        let busy = from_oob(OobError::Listen {
            port: 1,
            source: io::ErrorKind::AddrInUse.into(),
        });
        assert!(matches!(busy, RunError::Setup(_)), "{busy:?}");
    }

    #[test]
    fn a_failed_completion_keeps_its_status() {
        let wc = sideway::completion_queue::WorkCompletionError {
            status: sideway::completion_queue::WcStatus::RetryExcErr,
            wr_id: 7,
            qp_num: 0x11,
            vendor_err: 0,
        };
        let text = wc.to_string();
        let e = RunError::from(wc);
        assert_eq!(
            e,
            RunError::Completion {
                status: sideway::completion_queue::WcStatus::RetryExcErr,
                text
            }
        );
        assert_eq!(e.kind(), "completion");
    }

    #[test]
    fn each_kind_prints_its_text_and_added_context_keeps_the_kind() {
        let all = [
            RunError::peer_gone("a"),
            RunError::peer_aborted("a"),
            RunError::peer_invalid("a"),
            RunError::timeout("a"),
            RunError::setup("a"),
            RunError::link("a"),
            RunError::usage("a"),
            RunError::new("a"),
        ];
        let kinds: Vec<&str> = all.iter().map(RunError::kind).collect();
        assert_eq!(
            kinds,
            [
                "peer-gone",
                "peer-aborted",
                "peer-invalid",
                "timeout",
                "setup",
                "link",
                "usage",
                "other"
            ]
        );
        for e in all {
            assert_eq!(e.to_string(), "a");
            let kind = e.kind();
            let more = e.map_text(|t| format!("{t}; b"));
            assert_eq!((more.kind(), more.to_string().as_str()), (kind, "a; b"));
        }
        assert!(matches!(
            RunError::from(ParamError("-s 0 is not a size".into())),
            RunError::Usage(_)
        ));
    }
}
