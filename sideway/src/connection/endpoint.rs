//! The text and byte forms of an `Endpoint` (see the [module docs](super)).

use std::fmt;
use std::str::FromStr;

use crate::gid::Gid;
use crate::peer_text::{printable, PEER_TEXT_MAX};
use crate::verbs::queue_pair::Endpoint;

/// Size of one pingpong endpoint line on the wire, the terminating NUL included.
pub const PINGPONG_LINE_LEN: usize = 52;
/// Size of an endpoint's byte form.
pub const ENDPOINT_BYTES_LEN: usize = 28;
/// The version byte of the byte form this crate writes.
pub const ENDPOINT_BYTES_VERSION: u8 = 1;

const MAX_24_BITS: u32 = 0x00ff_ffff;

/// Text or bytes (usually a peer's) that are not an endpoint, or an endpoint that does not
/// fit the form asked for. The message quotes what it refuses, made safe to print.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed endpoint: {reason}")]
pub struct EndpointError {
    reason: String,
}

impl EndpointError {
    fn new(reason: String) -> Self {
        EndpointError { reason }
    }
}

impl fmt::Display for Endpoint {
    /// `LID:QPN:PSN:GID`, as rdma-core's pingpong programs print it (see the module docs).
    /// A QP number or PSN over 24 bits (not a valid endpoint) prints wider and does not
    /// parse back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qp_num,
            self.psn,
            self.gid.to_wire_hex()
        )
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    /// Parses `LID:QPN:PSN:GID` (see the module docs).
    fn from_str(text: &str) -> Result<Self, EndpointError> {
        // Every piece of the text that an error quotes goes through `printable`.
        let quote = |s: &str| format!("\"{}\"", printable(s, PEER_TEXT_MAX));
        let mut fields = text.split(':');
        // Exactly `width` hex digits and nothing else: rdma-core prints them zero-padded.
        let mut field = |name: &str, width: usize| -> Result<&str, EndpointError> {
            match fields.next() {
                Some(f) if f.len() == width && f.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(f),
                Some(f) => Err(EndpointError::new(format!(
                    "{name} field {} is not {width} hex digits",
                    quote(f)
                ))),
                None => Err(EndpointError::new(format!(
                    "{name} field missing in {}",
                    quote(text)
                ))),
            }
        };
        let lid = field("LID", 4)?;
        let qpn = field("QPN", 6)?;
        let psn = field("PSN", 6)?;
        let gid = field("GID", 32)?;
        if fields.next().is_some() {
            return Err(EndpointError::new(format!(
                "trailing fields in {}",
                quote(text)
            )));
        }
        // The fields are all hex digits and at most 8 of them (checked above).
        let hex = |s: &str| hex_value(s).unwrap_or_default();
        Ok(Endpoint {
            // 4 hex digits always fit in 16 bits.
            lid: u16::try_from(hex(lid)).unwrap_or_default(),
            qp_num: hex(qpn),
            psn: hex(psn),
            gid: Gid::from_wire_hex(gid).map_err(|_| {
                EndpointError::new(format!("GID {} is not 32 hex digits", quote(gid)))
            })?,
        })
    }
}

/// The value of `s`, when every byte of it is a hex digit `[0-9a-fA-F]` (and it fits in
/// 32 bits). Not `from_str_radix`: that also takes a leading `+`.
fn hex_value(s: &str) -> Option<u32> {
    s.bytes().try_fold(0u32, |value, b| {
        let digit = char::from(b).to_digit(16)?;
        value.checked_mul(16)?.checked_add(digit)
    })
}

impl Endpoint {
    fn check_24_bits(&self) -> Result<(), EndpointError> {
        for (name, value) in [("QPN", self.qp_num), ("PSN", self.psn)] {
            if value > MAX_24_BITS {
                return Err(EndpointError::new(format!(
                    "{name} {value:#x} does not fit in 24 bits"
                )));
            }
        }
        Ok(())
    }

    /// The 52-byte line rdma-core's pingpong programs send: the text form and a NUL. Fails
    /// when the QP number or PSN is over 24 bits, which the peer could not read back.
    pub fn to_pingpong_line(&self) -> Result<[u8; PINGPONG_LINE_LEN], EndpointError> {
        self.check_24_bits()?;
        let text = self.to_string();
        let mut out = [0u8; PINGPONG_LINE_LEN];
        // 24-bit fields make the text exactly 51 ASCII bytes: 4 + 1 + 6 + 1 + 6 + 1 + 32.
        out[..PINGPONG_LINE_LEN - 1].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// Reads a peer's 52-byte pingpong line: the text form up to the first NUL (what
    /// follows it is ignored, as rdma-core's `sscanf` ignores it).
    pub fn from_pingpong_line(msg: &[u8]) -> Result<Self, EndpointError> {
        if msg.len() != PINGPONG_LINE_LEN {
            return Err(EndpointError::new(format!(
                "a pingpong line is {PINGPONG_LINE_LEN} bytes, got {}",
                msg.len()
            )));
        }
        let text_len = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..text_len]).map_err(|_| {
            EndpointError::new(format!(
                "not ASCII text: \"{}\"",
                printable(&String::from_utf8_lossy(msg), PEER_TEXT_MAX)
            ))
        })?;
        text.parse()
    }

    /// The byte form (see the module docs for the layout). Fails when the QP number or PSN
    /// is over 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; ENDPOINT_BYTES_LEN], EndpointError> {
        self.check_24_bits()?;
        let mut out = [0u8; ENDPOINT_BYTES_LEN];
        out[0] = ENDPOINT_BYTES_VERSION;
        out[2..4].copy_from_slice(&self.lid.to_be_bytes());
        out[4..8].copy_from_slice(&self.qp_num.to_be_bytes());
        out[8..12].copy_from_slice(&self.psn.to_be_bytes());
        out[12..28].copy_from_slice(self.gid.as_bytes());
        Ok(out)
    }

    /// Reads the byte form: exactly [`ENDPOINT_BYTES_LEN`] bytes of version 1 with the
    /// reserved byte 0 and 24-bit QP number and PSN.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EndpointError> {
        let b: &[u8; ENDPOINT_BYTES_LEN] = bytes.try_into().map_err(|_| {
            EndpointError::new(format!(
                "the byte form is {ENDPOINT_BYTES_LEN} bytes, got {}",
                bytes.len()
            ))
        })?;
        if b[0] != ENDPOINT_BYTES_VERSION {
            return Err(EndpointError::new(format!(
                "byte form version {} (this library reads version {ENDPOINT_BYTES_VERSION})",
                b[0]
            )));
        }
        if b[1] != 0 {
            return Err(EndpointError::new(format!(
                "reserved byte is {:#04x}, not 0",
                b[1]
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let ep = Endpoint {
            lid: u16::from_be_bytes([b[2], b[3]]),
            qp_num: u32_at(4),
            psn: u32_at(8),
            gid: Gid::from_raw(gid),
        };
        ep.check_24_bits()?;
        Ok(ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint {
            lid: 0x0001,
            qp_num: 0x000011,
            psn: 0xabcdef,
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn the_line_is_rdma_cores() {
        let line = sample().to_pingpong_line().unwrap();
        assert_eq!(
            &line[..51],
            b"0001:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(line[51], 0);
        assert_eq!(Endpoint::from_pingpong_line(&line), Ok(sample()));
    }

    #[test]
    fn text_round_trips_and_takes_upper_case() {
        let text = sample().to_string();
        assert_eq!(text.parse::<Endpoint>(), Ok(sample()));
        assert_eq!(text.to_uppercase().parse::<Endpoint>(), Ok(sample()));
    }

    #[test]
    fn bytes_have_the_documented_layout() {
        let b = sample().to_bytes().unwrap();
        assert_eq!(b[0], 1);
        assert_eq!(b[1], 0);
        assert_eq!(&b[2..4], &[0, 1]);
        assert_eq!(&b[4..8], &[0, 0, 0, 0x11]);
        assert_eq!(&b[8..12], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(&b[12..28], sample().gid.as_bytes());
        assert_eq!(Endpoint::from_bytes(&b), Ok(sample()));
    }

    #[test]
    fn refuses_what_it_cannot_carry_or_read() {
        let mut ep = sample();
        ep.qp_num = 0x0100_0000;
        assert!(ep
            .to_pingpong_line()
            .unwrap_err()
            .to_string()
            .contains("QPN"));
        assert!(ep.to_bytes().is_err());
        let mut b = sample().to_bytes().unwrap();
        b[0] = 2;
        assert!(Endpoint::from_bytes(&b)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
        assert!(Endpoint::from_bytes(&b[..27]).is_err());
        for bad in [
            "",
            "+001:000011:abcdef:00000000000000000000ffffc6120001",
            "0001:000011:abcdef:00000000000000000000ffffc6120001:",
            "0001:000011:abcdef",
            "0001:0000111:abcdef:00000000000000000000ffffc6120001",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad:?} parsed");
        }
        let err = "\u{1b}[2J:0:0:0"
            .parse::<Endpoint>()
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\u{1b}'), "{err:?}");
    }
}
