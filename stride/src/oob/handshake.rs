//! The opening of a run: the handshake on the test's parameters (and the refusal when they
//! differ), and the trade of port profiles and queue-pair endpoints, checked.

use super::channel::OobChannel;
use super::error::OobError;
use super::message::{Message, QpEndpoint, MAX_24_BITS, PATH_MTUS};
use crate::params::TestParams;
use crate::preflight::PortProfile;
use sideway::peer_text::{printable, PEER_TEXT_MAX};

/// The most lines of a refusal shown (the two sides agree on a dozen settings).
pub const MISMATCH_LINES_MAX: usize = 32;

/// Checks the peer's endpoints: `expected` of them, each buffer of `buffer_len` bytes ending
/// within the 64-bit address space.
pub fn check_endpoints(
    theirs: &[QpEndpoint],
    expected: usize,
    buffer_len: u64,
) -> Result<(), OobError> {
    if theirs.len() != expected {
        return Err(OobError::EndpointCount {
            sent: theirs.len(),
            expected,
        });
    }
    for (qp, ep) in theirs.iter().enumerate() {
        let over_24_bits = "over 24 bits (at most 16777215)";
        let mut fields = vec![("QP number", ep.qpn), ("PSN", ep.psn)];
        if let Some(dc) = ep.dc {
            fields.push(("DCT number", dc.dctn));
        }
        for (field, value) in fields {
            if value > MAX_24_BITS {
                return Err(OobError::EndpointField {
                    qp,
                    field,
                    value,
                    rule: over_24_bits,
                });
            }
        }
        if !PATH_MTUS.contains(&ep.mtu) {
            return Err(OobError::EndpointField {
                qp,
                field: "MTU",
                value: ep.mtu,
                rule: "which is not a path MTU (256, 512, 1024, 2048 or 4096)",
            });
        }
        if ep.addr.checked_add(buffer_len).is_none() {
            return Err(OobError::EndpointAddress {
                qp,
                addr: ep.addr,
                len: buffer_len,
            });
        }
    }
    Ok(())
}

/// The error for the server's refusal lines, which say "here" for the server and "peer"
/// for the client: turned round for either side's reader, made printable (a client's refusal
/// came from the server) and cut to [`MISMATCH_LINES_MAX`] lines.
pub fn mismatch_error(lines: &[String]) -> OobError {
    let mut shown: Vec<String> = lines
        .iter()
        .take(MISMATCH_LINES_MAX)
        .map(|m| {
            printable(
                &m.replace("here ", "server ").replace("peer ", "client "),
                PEER_TEXT_MAX,
            )
        })
        .collect();
    if lines.len() > MISMATCH_LINES_MAX {
        shown.push(format!(
            "... and {} more lines not shown",
            lines.len() - MISMATCH_LINES_MAX
        ));
    }
    OobError::Mismatch(shown)
}

impl OobChannel {
    /// Client side of the opening: sends the parameters, returns when the server agrees.
    pub fn client_handshake(&mut self, params: &TestParams) -> Result<(), OobError> {
        self.send(&Message::Hello {
            params: params.clone(),
        })?;
        match self.recv("agreement to the test parameters")? {
            Message::Agree => Ok(()),
            Message::Refuse { mismatches } => Err(mismatch_error(&mismatches)),
            other => Err(OobError::Unexpected {
                expected: "agree",
                got: other.name(),
            }),
        }
    }

    /// Server side of the opening: checks the client's parameters against ours; refuses
    /// (telling the client why) when they differ.
    pub fn server_handshake(&mut self, params: &TestParams) -> Result<(), OobError> {
        let theirs = match self.recv("test parameters")? {
            Message::Hello { params } => params,
            other => {
                return Err(OobError::Unexpected {
                    expected: "hello",
                    got: other.name(),
                })
            }
        };
        let mismatches = params.mismatches(&theirs);
        if mismatches.is_empty() {
            return self.send(&Message::Agree);
        }
        // Best effort: the refusal is for the client's benefit; our error says it all.
        let _ = self.send(&Message::Refuse {
            mismatches: mismatches.clone(),
        });
        Err(mismatch_error(&mismatches))
    }

    /// Trades endpoints: sends ours, returns the peer's, checked: one per QP of ours (the two
    /// sides agreed on `-q`), and each buffer, `buffer_len` bytes long on both sides, within
    /// the address space, so that no address computed from them can overflow.
    pub fn exchange_endpoints(
        &mut self,
        ours: &[QpEndpoint],
        buffer_len: u64,
    ) -> Result<Vec<QpEndpoint>, OobError> {
        self.send(&Message::Endpoints { qps: ours.to_vec() })?;
        let theirs = match self.recv("queue pair endpoints")? {
            Message::Endpoints { qps } => qps,
            other => {
                return Err(OobError::Unexpected {
                    expected: "endpoints",
                    got: other.name(),
                })
            }
        };
        check_endpoints(&theirs, ours.len(), buffer_len)?;
        Ok(theirs)
    }

    /// Trades port profiles for the pre-flight diagnosis: sends ours, returns the peer's
    /// with its text made printable and its role set to the one opposite ours (the peer
    /// does not get to name it).
    pub fn exchange_profiles(&mut self, ours: &PortProfile) -> Result<PortProfile, OobError> {
        self.send(&Message::Preflight {
            profile: ours.clone(),
        })?;
        let theirs = match self.recv("port description")? {
            Message::Preflight { profile } => profile,
            other => {
                return Err(OobError::Unexpected {
                    expected: "preflight",
                    got: other.name(),
                })
            }
        };
        Ok(theirs.from_peer(&ours.role))
    }
}
