//! The bytes that cross the wire: the 32-bit immediate of every RDMA WRITE with immediate,
//! and the hello each side puts in rdma_cm's private data. A leaf: it knows numbers and
//! byte order, nothing of verbs. Every decoder here takes bytes from the peer, so every
//! decoder checks every field and returns a typed [`WireError`] rather than panicking;
//! `tests/fuzz_decoders.rs` throws random bytes at them.
//!
//! `docs/trespass-protocol.md` is the specification; this module is its code.

use std::fmt;

/// The protocol version this crate speaks. A peer with another version is refused.
pub const VERSION: u16 = 1;

/// The first four bytes of every hello and every refusal: says that the peer is trespass.
pub const MAGIC: [u8; 4] = *b"TRSP";

/// Bytes of the hello in private data (the transport may pad it with zeros).
pub const HELLO_LEN: usize = 32;

/// Bytes of a refusal's private data: magic, version, a reserved byte, reason.
pub const REFUSAL_LEN: usize = 8;

/// The smallest receive ring a peer may advertise.
pub const MIN_RING: u32 = 4096;

/// The largest receive ring a peer may advertise: positions stay unambiguous in the 30-bit
/// credit field (credits are cumulative modulo 2^30, see [`Imm::CreditBytes`]).
pub const MAX_RING: u32 = 1 << 28;

/// The fewest receives a peer may advertise ([`Hello::recv_depth`]): the data path keeps
/// [`CONTROL_RESERVE`] of them for control messages and needs at least as many again.
pub const MIN_RECV_DEPTH: u16 = 8;

/// Receives a sender keeps for control messages (credits, close, keep-alive): data writes
/// stop while no more than this many of the peer's receives are known to be free, so a
/// credit return can always be sent and the two sides never wait on each other.
pub const CONTROL_RESERVE: u32 = 4;

/// Ring bytes a message's end costs on top of its bytes, in the sender's credit and the
/// receiver's accounting (no bytes are written for it). It bounds the unread messages a
/// ring holds (an empty message would otherwise cost nothing) to `ring_size / MSG_CHARGE`,
/// and it comes back with the byte credit once the message is read.
pub const MSG_CHARGE: u32 = 64;

/// The largest length a data immediate carries (28 bits).
pub const MAX_DATA_LEN: u32 = (1 << 28) - 1;

/// Cumulative counters travel modulo 2^30.
pub const COUNTER_MASK: u32 = (1 << 30) - 1;

const KIND_SHIFT: u32 = 30;
const KIND_DATA: u32 = 0;
const KIND_CREDIT_BYTES: u32 = 1;
const KIND_CREDIT_RECVS: u32 = 2;
const KIND_CONTROL: u32 = 3;
const EOM_BIT: u32 = 1 << 29;
const MSG_BIT: u32 = 1 << 28;

/// Hello flag bit 0: the sender lends buffers and fetches what it is lent (§5.1 of the
/// protocol page): it accepts [`Control::Lend`] and [`Control::Return`], and its QP takes
/// RDMA READs. Lending is used only when both hellos carry it.
pub const FLAG_LENDS: u16 = 1;

/// Bytes of a lent region's descriptor (the message that follows a [`Control::Lend`]).
pub const LEND_LEN: usize = 16;

/// A control message's operation (the low byte of a control immediate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The sender will write no more data (its write side is shut down): after the bytes
    /// before it, the reader sees end of stream.
    Fin,
    /// A keep-alive probe; the peer answers [`Control::Pong`].
    Ping,
    /// The answer to a [`Control::Ping`].
    Pong,
    /// The next message is a [`Lend`] descriptor: the sender lends a region of its memory
    /// for the receiver to fetch with RDMA READ. Only between peers that both set
    /// [`FLAG_LENDS`].
    Lend,
    /// The oldest region the receiver of this was lent has been fetched (or thrown away):
    /// its key may be revoked and its memory given back to its owner.
    Return,
}

impl Control {
    fn code(self) -> u32 {
        match self {
            Control::Fin => 1,
            Control::Ping => 2,
            Control::Pong => 3,
            Control::Lend => 4,
            Control::Return => 5,
        }
    }
}

/// What one RDMA WRITE with immediate says, decoded from its 32-bit immediate.
///
/// Layout (bit 31 first): 2 bits of kind, then 30 bits of value.
/// - kind 0, data: bit 29 ends a message, bit 28 marks the bytes as part of a message
///   (not of the byte stream), bits 27..0 the byte count written at the receiver's ring
///   tail. Bit 29 without bit 28 is malformed.
/// - kind 1, byte credit: the receiver's consumed-bytes counter, modulo 2^30.
/// - kind 2, receive credit: the count of receives the receiver has posted again, modulo 2^30.
/// - kind 3, control: bits 7..0 the operation, bits 29..8 zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// `len` bytes were written at the ring's tail; `msg` when they belong to a message,
    /// `eom` when they end it.
    Data {
        /// Bytes written (at most [`MAX_DATA_LEN`]).
        len: u32,
        /// A piece of a message (not stream bytes).
        msg: bool,
        /// The last piece of a message (only with `msg`).
        eom: bool,
    },
    /// The reader has consumed this many bytes in all (modulo 2^30).
    CreditBytes(u32),
    /// The reader has posted this many receives again in all (modulo 2^30).
    CreditRecvs(u32),
    /// A control message.
    Control(Control),
}

/// A value from the peer that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A control immediate with an unknown operation or non-zero reserved bits.
    #[error("unknown control message {0:#010x}")]
    UnknownControl(u32),
    /// A data immediate that ends a message without being part of one.
    #[error("a data immediate {0:#010x} ends a message but is not part of one")]
    EndWithoutMessage(u32),
    /// Private data shorter than a hello.
    #[error("private data of {len} bytes is shorter than a hello ({HELLO_LEN} bytes)")]
    ShortHello {
        /// Bytes received.
        len: usize,
    },
    /// Private data that does not start with the magic: the peer is not trespass.
    #[error("the peer is not speaking trespass (private data starts {found:02x?}, expected {MAGIC:02x?})")]
    NotTrespass {
        /// The first bytes received.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version.
    #[error("the peer speaks trespass protocol version {theirs}, this side speaks version {VERSION}; upgrade the older side")]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// A lent region's descriptor that no lender may send.
    #[error("{0}")]
    Lend(String),
    /// A hello field out of its range.
    #[error("the peer's hello has {field} = {value}, outside {allowed}")]
    Field {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The allowed range, in words.
        allowed: &'static str,
    },
}

impl Imm {
    /// The immediate's 32 bits.
    pub fn encode(self) -> u32 {
        match self {
            Imm::Data { len, msg, eom } => {
                debug_assert!(len <= MAX_DATA_LEN);
                (KIND_DATA << KIND_SHIFT)
                    | if eom { EOM_BIT } else { 0 }
                    | if msg { MSG_BIT } else { 0 }
                    | (len & MAX_DATA_LEN)
            }
            Imm::CreditBytes(v) => (KIND_CREDIT_BYTES << KIND_SHIFT) | (v & COUNTER_MASK),
            Imm::CreditRecvs(v) => (KIND_CREDIT_RECVS << KIND_SHIFT) | (v & COUNTER_MASK),
            Imm::Control(c) => (KIND_CONTROL << KIND_SHIFT) | c.code(),
        }
    }

    /// Decodes an immediate from the peer.
    ///
    /// # Errors
    ///
    /// [`WireError::UnknownControl`] for a control immediate this version does not define,
    /// [`WireError::EndWithoutMessage`] for a malformed data immediate.
    pub fn decode(raw: u32) -> Result<Imm, WireError> {
        let value = raw & COUNTER_MASK;
        Ok(match raw >> KIND_SHIFT {
            KIND_DATA => {
                let (msg, eom) = (raw & MSG_BIT != 0, raw & EOM_BIT != 0);
                if eom && !msg {
                    return Err(WireError::EndWithoutMessage(raw));
                }
                Imm::Data {
                    len: raw & MAX_DATA_LEN,
                    msg,
                    eom,
                }
            }
            KIND_CREDIT_BYTES => Imm::CreditBytes(value),
            KIND_CREDIT_RECVS => Imm::CreditRecvs(value),
            _ => Imm::Control(match value {
                1 => Control::Fin,
                2 => Control::Ping,
                3 => Control::Pong,
                4 => Control::Lend,
                5 => Control::Return,
                _ => return Err(WireError::UnknownControl(raw)),
            }),
        })
    }
}

/// What each side tells the other when connecting (in rdma_cm's private data, on connect
/// and on accept): where its receive ring is and how much it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The ring's address in the sender's registration.
    pub ring_addr: u64,
    /// The ring's remote key: the peer may RDMA WRITE the ring, and nothing else.
    pub ring_rkey: u32,
    /// The ring's length in bytes.
    pub ring_size: u32,
    /// Receives posted for the peer's writes with immediate.
    pub recv_depth: u16,
    /// The largest message (`send_msg`) the sender accepts.
    pub max_message: u32,
    /// The sender lends and fetches buffers ([`FLAG_LENDS`]).
    pub lends: bool,
}

impl fmt::Debug for Hello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hello")
            .field("ring_addr", &format_args!("{:#x}", self.ring_addr))
            .field("ring_rkey", &format_args!("{:#x}", self.ring_rkey))
            .field("ring_size", &self.ring_size)
            .field("recv_depth", &self.recv_depth)
            .field("max_message", &self.max_message)
            .field("lends", &self.lends)
            .finish()
    }
}

impl Hello {
    /// The hello's bytes (big-endian fields).
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        let flags = if self.lends { FLAG_LENDS } else { 0 };
        b[6..8].copy_from_slice(&flags.to_be_bytes());
        b[8..16].copy_from_slice(&self.ring_addr.to_be_bytes());
        b[16..20].copy_from_slice(&self.ring_rkey.to_be_bytes());
        b[20..24].copy_from_slice(&self.ring_size.to_be_bytes());
        b[24..26].copy_from_slice(&self.recv_depth.to_be_bytes());
        // 26..28: reserved (zero).
        b[28..32].copy_from_slice(&self.max_message.to_be_bytes());
        b
    }

    /// Decodes and checks the peer's hello. Bytes after the first [`HELLO_LEN`] (the
    /// transport's padding) are ignored.
    ///
    /// # Errors
    ///
    /// A [`WireError`] naming what is wrong: too short, not trespass, another version, or
    /// a field out of range.
    pub fn decode(bytes: &[u8]) -> Result<Hello, WireError> {
        check_magic_version(bytes, HELLO_LEN)?;
        let u16_at = |i: usize| u16::from_be_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let flags = u16_at(6);
        if flags & !FLAG_LENDS != 0 {
            return Err(field(
                "flags",
                flags.into(),
                "0 or 1 (bit 0, lends, is the one flag of version 1)",
            ));
        }
        let reserved = u16_at(26);
        if reserved != 0 {
            return Err(field("reserved", reserved.into(), "0"));
        }
        let hello = Hello {
            ring_addr: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
            ring_rkey: u32_at(16),
            ring_size: u32_at(20),
            recv_depth: u16_at(24),
            max_message: u32_at(28),
            lends: flags & FLAG_LENDS != 0,
        };
        if !(MIN_RING..=MAX_RING).contains(&hello.ring_size) {
            return Err(field(
                "ring_size",
                hello.ring_size.into(),
                "4096..=268435456 bytes",
            ));
        }
        if hello
            .ring_addr
            .checked_add(hello.ring_size.into())
            .is_none()
        {
            return Err(field(
                "ring_addr",
                hello.ring_addr,
                "addresses whose ring does not wrap past 2^64",
            ));
        }
        if hello.recv_depth < MIN_RECV_DEPTH {
            return Err(field("recv_depth", hello.recv_depth.into(), "8..=65535"));
        }
        Ok(hello)
    }
}

fn field(field: &'static str, value: u64, allowed: &'static str) -> WireError {
    WireError::Field {
        field,
        value,
        allowed,
    }
}

fn check_magic_version(bytes: &[u8], len: usize) -> Result<(), WireError> {
    if bytes.len() < 4 || bytes[0..4] != MAGIC {
        let mut found = [0u8; 4];
        let n = bytes.len().min(4);
        found[..n].copy_from_slice(&bytes[..n]);
        return Err(WireError::NotTrespass { found });
    }
    if bytes.len() < 6 {
        return Err(WireError::ShortHello { len: bytes.len() });
    }
    let theirs = u16::from_be_bytes([bytes[4], bytes[5]]);
    if theirs != VERSION {
        return Err(WireError::Version { theirs });
    }
    if bytes.len() < len {
        return Err(WireError::ShortHello { len: bytes.len() });
    }
    Ok(())
}

/// A lent region, as its descriptor says it (16 bytes, big-endian): `len` bytes at `addr`
/// of the lender's memory, readable with RDMA READ under `rkey` until the receiver returns
/// it ([`Control::Return`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Lend {
    /// The region's first byte, in the lender's registration.
    pub addr: u64,
    /// The key that opens the region for RDMA READ, and for nothing else.
    pub rkey: u32,
    /// The region's length in bytes: the message's length.
    pub len: u32,
}

impl fmt::Debug for Lend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lend")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("len", &self.len)
            .finish()
    }
}

impl Lend {
    /// The descriptor's bytes.
    pub fn encode(&self) -> [u8; LEND_LEN] {
        let mut b = [0u8; LEND_LEN];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes and checks a descriptor from the peer: `max_message` is the largest message
    /// this side accepts.
    ///
    /// # Errors
    ///
    /// [`WireError::Lend`] for a descriptor of another length, an empty region, one larger
    /// than `max_message`, or one whose end passes 2^64.
    pub fn decode(bytes: &[u8], max_message: u32) -> Result<Lend, WireError> {
        if bytes.len() != LEND_LEN {
            return Err(WireError::Lend(format!(
                "a lent region's descriptor of {} bytes (it has {LEND_LEN})",
                bytes.len()
            )));
        }
        let lend = Lend {
            addr: u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes")),
        };
        if lend.len == 0 {
            return Err(WireError::Lend("a lent region of 0 bytes".into()));
        }
        if lend.len > max_message {
            return Err(WireError::Lend(format!(
                "a lent region of {} bytes, larger than the {max_message} this side accepts",
                lend.len
            )));
        }
        if lend.addr.checked_add(lend.len.into()).is_none() {
            return Err(WireError::Lend(format!(
                "a lent region of {} bytes at {:#x} wraps past 2^64",
                lend.len, lend.addr
            )));
        }
        Ok(lend)
    }
}

/// Why a listener refused a connection (the last byte of a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client's hello could not be read (another version, not trespass, bad field).
    BadHello,
    /// The listener could not make the connection's resources (out of memory, device
    /// limits).
    NoResources,
    /// A reason this version does not know.
    Unknown(u8),
}

impl Refusal {
    /// The refusal's private data: magic, the listener's version, a reserved byte, the
    /// reason.
    pub fn encode(self) -> [u8; REFUSAL_LEN] {
        let mut b = [0u8; REFUSAL_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[7] = match self {
            Refusal::BadHello => 1,
            Refusal::NoResources => 2,
            Refusal::Unknown(code) => code,
        };
        b
    }

    /// Reads a refusal: `Ok` with the reason when the listener speaks this version,
    /// [`WireError::Version`] when it speaks another (which is then the reason).
    ///
    /// # Errors
    ///
    /// [`WireError::NotTrespass`] when the rejection did not come from trespass,
    /// [`WireError::Version`] when the listener speaks another version.
    pub fn decode(bytes: &[u8]) -> Result<Refusal, WireError> {
        check_magic_version(bytes, REFUSAL_LEN)?;
        Ok(match bytes[7] {
            1 => Refusal::BadHello,
            2 => Refusal::NoResources,
            code => Refusal::Unknown(code),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            ring_addr: 0x7f00_1234_5000,
            ring_rkey: 0xabcd,
            ring_size: 1 << 18,
            recv_depth: 128,
            max_message: 1 << 26,
            lends: true,
        }
    }

    #[test]
    fn a_hello_round_trips_and_padding_is_ignored() {
        let mut bytes = hello().encode().to_vec();
        bytes.extend_from_slice(&[0; 24]);
        assert_eq!(Hello::decode(&bytes).unwrap(), hello());
    }

    #[test]
    fn another_version_is_named_in_the_error() {
        let mut bytes = hello().encode();
        bytes[5] = 9;
        let err = Hello::decode(&bytes).unwrap_err();
        assert_eq!(err, WireError::Version { theirs: 9 });
        assert!(err.to_string().contains("version 9"), "{err}");
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        for (at, value, name) in [
            (20, 0u8, "ring_size"),
            (24, 0, "recv_depth"),
            (6, 1, "flags"),
        ] {
            let mut bytes = hello().encode();
            bytes[at..at + 2].fill(value);
            if name == "flags" {
                bytes[7] = 1;
            }
            match Hello::decode(&bytes) {
                Err(WireError::Field { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut wraps = hello();
        wraps.ring_addr = u64::MAX - 10;
        assert!(matches!(
            Hello::decode(&wraps.encode()),
            Err(WireError::Field {
                field: "ring_addr",
                ..
            })
        ));
    }

    #[test]
    fn short_or_foreign_private_data_is_refused() {
        assert!(matches!(
            Hello::decode(&[]),
            Err(WireError::NotTrespass { .. })
        ));
        assert!(matches!(
            Hello::decode(b"TRSP\0\x01"),
            Err(WireError::ShortHello { len: 6 })
        ));
        assert!(matches!(
            Hello::decode(b"GET / HTTP/1.1\r\n"),
            Err(WireError::NotTrespass { .. })
        ));
    }

    #[test]
    fn immediates_round_trip() {
        for imm in [
            Imm::Data {
                len: 0,
                msg: true,
                eom: true,
            },
            Imm::Data {
                len: MAX_DATA_LEN,
                msg: false,
                eom: false,
            },
            Imm::Data {
                len: 5,
                msg: true,
                eom: false,
            },
            Imm::CreditBytes(COUNTER_MASK),
            Imm::CreditRecvs(12345),
            Imm::Control(Control::Fin),
            Imm::Control(Control::Ping),
            Imm::Control(Control::Pong),
            Imm::Control(Control::Lend),
            Imm::Control(Control::Return),
        ] {
            assert_eq!(Imm::decode(imm.encode()), Ok(imm));
        }
        assert_eq!(
            Imm::decode(0xc000_0000),
            Err(WireError::UnknownControl(0xc000_0000))
        );
        assert_eq!(
            Imm::decode(EOM_BIT | 4),
            Err(WireError::EndWithoutMessage(EOM_BIT | 4))
        );
        assert_eq!(
            Imm::decode(0xc000_0006),
            Err(WireError::UnknownControl(0xc000_0006))
        );
        assert_eq!(
            Imm::decode(0xc000_0101),
            Err(WireError::UnknownControl(0xc000_0101))
        );
    }

    #[test]
    fn the_lends_flag_round_trips_and_other_flags_are_refused() {
        let mut quiet = hello();
        quiet.lends = false;
        assert_eq!(Hello::decode(&quiet.encode()).unwrap(), quiet);
        assert_eq!(&quiet.encode()[6..8], &[0, 0]);
        assert_eq!(&hello().encode()[6..8], &[0, 1]);
        let mut bytes = hello().encode();
        bytes[7] = 3;
        assert!(matches!(
            Hello::decode(&bytes),
            Err(WireError::Field { field: "flags", .. })
        ));
    }

    #[test]
    fn a_lend_round_trips_and_every_bad_descriptor_is_named() {
        let lend = Lend {
            addr: 0x7f00_0000_1000,
            rkey: 0x42,
            len: 1 << 20,
        };
        assert_eq!(Lend::decode(&lend.encode(), 1 << 20), Ok(lend));
        let too_big = Lend::decode(&lend.encode(), (1 << 20) - 1).unwrap_err();
        assert!(too_big.to_string().contains("larger than"), "{too_big}");
        let empty = Lend { len: 0, ..lend };
        let e = Lend::decode(&empty.encode(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("0 bytes"), "{e}");
        let wraps = Lend {
            addr: u64::MAX - 4,
            ..lend
        };
        let e = Lend::decode(&wraps.encode(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("wraps"), "{e}");
        let e = Lend::decode(&lend.encode()[..15], 1 << 20).unwrap_err();
        assert!(e.to_string().contains("15 bytes"), "{e}");
    }

    #[test]
    fn refusals_round_trip_and_name_the_version() {
        for r in [
            Refusal::BadHello,
            Refusal::NoResources,
            Refusal::Unknown(77),
        ] {
            assert_eq!(Refusal::decode(&r.encode()), Ok(r));
        }
        let mut old = Refusal::BadHello.encode();
        old[5] = 0;
        assert_eq!(Refusal::decode(&old), Err(WireError::Version { theirs: 0 }));
    }
}
