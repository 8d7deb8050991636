//! The endpoint line that rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`
//! and `ibv_srq_pingpong` exchange over TCP before they talk RDMA.
//!
//! Each side sends one fixed-size message: `LID:QPN:PSN:GID` formatted as
//! `%04x:%06x:%06x:%s`, where the GID is 32 hex digits in network byte order, followed by a
//! NUL, 52 bytes in all. The client sends first, the server answers with its own line, and at
//! the end the client sends `done`.

use std::fmt;

use sideway::Gid;

/// Size of one endpoint message on the wire, the terminating NUL included.
pub const MESSAGE_LEN: usize = 52;

/// What one side of a pingpong tells the other: enough to move a QP to RTR and to build an
/// address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Port LID (0 on RoCE, the real LID on InfiniBand).
    pub lid: u16,
    /// Queue pair number; 24 bits.
    pub qpn: u32,
    /// Initial packet sequence number; 24 bits.
    pub psn: u32,
    /// GID of the port at the chosen GID index (zero when no GID is used).
    pub gid: Gid,
}

/// A peer's message that is not an endpoint line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    reason: String,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed pingpong endpoint message from peer: {}",
            self.reason
        )
    }
}

impl std::error::Error for WireError {}

const MAX_24_BITS: u32 = 0x00ff_ffff;

impl Endpoint {
    /// Formats the endpoint as the 52-byte message; fails when QPN or PSN exceed 24 bits,
    /// which the peer could not read back.
    pub fn to_wire(&self) -> Result<[u8; MESSAGE_LEN], WireError> {
        for (name, value) in [("QPN", self.qpn), ("PSN", self.psn)] {
            if value > MAX_24_BITS {
                return Err(WireError {
                    reason: format!("{name} {value:#x} does not fit in 24 bits"),
                });
            }
        }
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            self.gid.to_wire_hex()
        );
        let mut out = [0u8; MESSAGE_LEN];
        // The format above is always 51 ASCII bytes: 4 + 1 + 6 + 1 + 6 + 1 + 32.
        out[..MESSAGE_LEN - 1].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// Parses a peer's 52-byte message.
    pub fn from_wire(msg: &[u8]) -> Result<Self, WireError> {
        let fail = |reason: String| WireError { reason };
        if msg.len() != MESSAGE_LEN {
            return Err(fail(format!(
                "expected {MESSAGE_LEN} bytes, got {}",
                msg.len()
            )));
        }
        let text_len = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text =
            std::str::from_utf8(&msg[..text_len]).map_err(|_| fail("not ASCII text".to_owned()))?;
        let mut fields = text.split(':');
        let mut field = |name: &str, width: usize| -> Result<&str, WireError> {
            match fields.next() {
                Some(f) if f.len() == width => Ok(f),
                Some(f) => Err(fail(format!(
                    "{name} field {f:?} is not {width} hex digits"
                ))),
                None => Err(fail(format!("{name} field missing in {text:?}"))),
            }
        };
        let lid = field("LID", 4)?;
        let qpn = field("QPN", 6)?;
        let psn = field("PSN", 6)?;
        let gid = field("GID", 32)?;
        if fields.next().is_some() {
            return Err(fail(format!("trailing fields in {text:?}")));
        }
        let hex = |name: &str, s: &str| {
            u32::from_str_radix(s, 16).map_err(|_| fail(format!("{name} {s:?} is not hex")))
        };
        Ok(Endpoint {
            lid: u16::try_from(hex("LID", lid)?).expect("4 hex digits fit in u16"),
            qpn: hex("QPN", qpn)?,
            psn: hex("PSN", psn)?,
            gid: Gid::from_wire_hex(gid).map_err(|e| fail(e.to_string()))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint {
            lid: 0x0001,
            qpn: 0x000011,
            psn: 0xabcdef,
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn formats_like_rdma_core() {
        let wire = sample().to_wire().unwrap();
        assert_eq!(
            &wire[..51],
            b"0001:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(wire[51], 0);
    }

    #[test]
    fn round_trips() {
        let wire = sample().to_wire().unwrap();
        assert_eq!(Endpoint::from_wire(&wire), Ok(sample()));
    }

    #[test]
    fn refuses_values_wider_than_24_bits() {
        let mut ep = sample();
        ep.qpn = 0x0100_0000;
        assert!(ep.to_wire().unwrap_err().to_string().contains("QPN"));
    }

    #[test]
    fn rejects_garbage_from_peer() {
        let good = sample().to_wire().unwrap();
        assert!(Endpoint::from_wire(&good[..51]).is_err(), "short message");
        assert!(
            Endpoint::from_wire(&[0xff; MESSAGE_LEN]).is_err(),
            "binary junk"
        );
        let mut bad = good;
        bad[4] = b'-';
        assert!(Endpoint::from_wire(&bad).is_err(), "missing separator");
        let mut bad = good;
        bad[7] = b'z';
        let err = Endpoint::from_wire(&bad).unwrap_err().to_string();
        assert!(err.contains("QPN"), "{err}");
        let mut done = [0u8; MESSAGE_LEN];
        done[..4].copy_from_slice(b"done");
        assert!(
            Endpoint::from_wire(&done).is_err(),
            "the closing word is not an endpoint"
        );
    }
}
