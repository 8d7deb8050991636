//! Global identifiers (`union ibv_gid`): the 128-bit port address of InfiniBand and RoCE.
//!
//! A [`Gid`] owns its 16 bytes in network order, exactly as the kernel and `ibv_query_gid`
//! report them. It prints the way sysfs and `ibv_devinfo` do (eight groups of four hex
//! digits), converts to and from [`Ipv6Addr`], recognises the IPv4-mapped GIDs that RoCE v2
//! uses, and reads and writes the 32-hex-digit form that rdma-core's pingpong programs put on
//! the wire.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// A 128-bit global identifier (`union ibv_gid`), bytes in network order.
#[doc(alias = "ibv_gid")]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid {
    raw: [u8; 16],
}

/// Why a string is not a GID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseGidError {
    input: String,
}

impl fmt::Display for ParseGidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a GID: expected an IPv6 address (fe80::1, ::ffff:192.0.2.1) \
             or 32 hex digits",
            self.input
        )
    }
}

impl std::error::Error for ParseGidError {}

impl Gid {
    /// The all-zero GID, which marks an unused GID table entry.
    pub const ZERO: Gid = Gid { raw: [0; 16] };

    /// Wraps 16 bytes in network order (the layout of `union ibv_gid`).
    pub const fn from_raw(raw: [u8; 16]) -> Self {
        Gid { raw }
    }

    /// The 16 bytes in network order, as `union ibv_gid::raw` holds them.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.raw
    }

    /// True for the all-zero GID (an empty GID table slot).
    pub fn is_zero(&self) -> bool {
        self.raw == [0; 16]
    }

    /// The subnet prefix (`global.subnet_prefix`), the first 8 bytes, as a number.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.raw[..8].try_into().expect("8 of 16 bytes"))
    }

    /// The interface id (`global.interface_id`), the last 8 bytes, as a number.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.raw[8..].try_into().expect("8 of 16 bytes"))
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, what RoCE v2 uses for an
    /// IPv4 interface), or `None` for any other GID.
    pub fn to_ipv4_mapped(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.raw).to_ipv4_mapped()
    }

    /// The GID in the form rdma-core's `ibv_*_pingpong` programs exchange: 32 lowercase hex
    /// digits, the bytes in network order.
    pub fn to_wire_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.raw {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        s
    }

    /// Parses the 32-hex-digit form of [`Gid::to_wire_hex`] (either case).
    pub fn from_wire_hex(s: &str) -> Result<Self, ParseGidError> {
        let err = || ParseGidError {
            input: s.to_owned(),
        };
        let bytes = s.as_bytes();
        if bytes.len() != 32 {
            return Err(err());
        }
        let mut raw = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = hex_value(pair[0]).ok_or_else(err)?;
            let lo = hex_value(pair[1]).ok_or_else(err)?;
            raw[i] = (hi << 4) | lo;
        }
        Ok(Gid { raw })
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid { raw: addr.octets() }
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.raw)
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID (`::ffff:a.b.c.d`) of a RoCE v2 interface address.
    fn from(addr: Ipv4Addr) -> Self {
        Gid::from(addr.to_ipv6_mapped())
    }
}

impl FromStr for Gid {
    type Err = ParseGidError;

    /// Accepts an IPv6 address in any standard notation or the 32-hex-digit wire form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = s.parse::<Ipv6Addr>() {
            return Ok(addr.into());
        }
        Gid::from_wire_hex(s)
    }
}

impl fmt::Display for Gid {
    /// Eight groups of four hex digits, as sysfs, `ibv_devinfo` and `show_gids` print GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, group) in self.raw.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", group[0], group[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK_LOCAL: [u8; 16] = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
    ];

    #[test]
    fn displays_like_sysfs() {
        let gid = Gid::from_raw(LINK_LOCAL);
        assert_eq!(gid.to_string(), "fe80:0000:0000:0000:5054:00ff:fe12:3456");
        assert_eq!(
            format!("{gid:?}"),
            "Gid(fe80:0000:0000:0000:5054:00ff:fe12:3456)"
        );
    }

    #[test]
    fn wire_hex_is_bytes_in_network_order() {
        let gid = Gid::from_raw(LINK_LOCAL);
        assert_eq!(gid.to_wire_hex(), "fe80000000000000505400fffe123456");
        assert_eq!(Gid::from_wire_hex(&gid.to_wire_hex()), Ok(gid));
        assert_eq!(
            Gid::from_wire_hex("FE80000000000000505400FFFE123456"),
            Ok(gid)
        );
    }

    #[test]
    fn wire_hex_rejects_bad_input() {
        for bad in [
            "",
            "fe80",
            "fe80000000000000505400fffe12345",
            "g".repeat(32).as_str(),
        ] {
            assert!(Gid::from_wire_hex(bad).is_err(), "{bad:?} accepted");
        }
        let msg = Gid::from_wire_hex("xyz").unwrap_err().to_string();
        assert!(
            msg.contains("\"xyz\"") && msg.contains("32 hex digits"),
            "{msg}"
        );
    }

    #[test]
    fn ipv4_mapped_round_trip() {
        let ip = Ipv4Addr::new(198, 18, 0, 1);
        let gid = Gid::from(ip);
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:c612:0001");
        assert_eq!(gid.to_ipv4_mapped(), Some(ip));
        assert_eq!(Gid::from_raw(LINK_LOCAL).to_ipv4_mapped(), None);
        assert_eq!("::ffff:198.18.0.1".parse::<Gid>(), Ok(gid));
    }

    #[test]
    fn prefix_interface_id_and_zero() {
        let gid = Gid::from_raw(LINK_LOCAL);
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x5054_00ff_fe12_3456);
        assert!(!gid.is_zero());
        assert!(Gid::ZERO.is_zero());
        assert_eq!(
            Ipv6Addr::from(gid),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
    }
}
