//! The steps of a run: barriers that keep the two sides in step, and the trade of results.

use super::channel::OobChannel;
use super::error::OobError;
use super::message::Message;
use crate::report::SideReport;
use sideway::peer_text::{printable, PEER_TEXT_MAX};

impl OobChannel {
    /// A barrier: both sides send `step` and wait for the other's, which must match.
    pub fn barrier(&mut self, step: &str) -> Result<(), OobError> {
        self.send_ready(step)?;
        self.expect_ready(step)
    }

    /// The first half of a barrier: tells the peer this side reached `step`.
    pub fn send_ready(&mut self, step: &str) -> Result<(), OobError> {
        self.send(&Message::Ready { step: step.into() })
    }

    /// The second half of a barrier: waits for the peer's `step`, which must match.
    pub fn expect_ready(&mut self, step: &str) -> Result<(), OobError> {
        match self.recv(step)? {
            Message::Ready { step: theirs } if theirs == step => Ok(()),
            Message::Ready { step: theirs } => Err(OobError::Garbage(format!(
                "out of step: we reached \"{step}\", the peer \"{}\"",
                printable(&theirs, PEER_TEXT_MAX)
            ))),
            other => Err(OobError::Unexpected {
                expected: "ready",
                got: other.name(),
            }),
        }
    }

    /// Trades this side's results for the peer's.
    pub fn exchange_results(&mut self, ours: &SideReport) -> Result<SideReport, OobError> {
        self.send(&Message::Results {
            report: ours.for_peer(),
        })?;
        match self.recv("results")? {
            Message::Results { report } => {
                report
                    .check_numbers()
                    .map_err(|source| OobError::PeerNumber {
                        peer: self.peer.clone(),
                        source,
                    })?;
                Ok(report.printable())
            }
            other => Err(OobError::Unexpected {
                expected: "results",
                got: other.name(),
            }),
        }
    }
}
