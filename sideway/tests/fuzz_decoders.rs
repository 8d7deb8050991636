//! Fuzz targets for what sideway decodes of a peer's bytes: the GRH in front of every UD
//! receive (written by the peer's packet headers), GIDs in text (the peer's endpoint line),
//! and the sanitising of peer text before it reaches a terminal. The harness, and why it is
//! proptest, is in `support/fuzz.rs`.
//!
//! Every target holds to: no input panics; errors are printable; what decodes encodes back to
//! the same bytes.

mod support {
    pub mod fuzz;
}

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use sideway::peer_text::{printable, PEER_TEXT_MAX};
use sideway::{Gid, Grh, GrhKind, GRH_LEN};

use support::fuzz;
use support::fuzz::harmless;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The 16-bit ones'-complement checksum of an IPv4 header (its checksum field zero).
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The GRH area of a RoCE v2 IPv4 packet: 20 unused bytes, then the IPv4 header.
fn grh_ipv4(src: Ipv4Addr, dst: Ipv4Addr, tos: u8, ttl: u8, unused: u8) -> Vec<u8> {
    let mut b = vec![unused; 20];
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[1] = tos;
    ip[2..4].copy_from_slice(&60u16.to_be_bytes());
    ip[8] = ttl;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    b.extend_from_slice(&ip);
    b
}

/// An IB GRH (or RoCE v2 IPv6 header).
fn grh_ipv6(sgid: [u8; 16], dgid: [u8; 16], tclass: u8, flow: u32, hops: u8) -> Vec<u8> {
    let vtf = (6u32 << 28) | (u32::from(tclass) << 20) | (flow & 0xf_ffff);
    let mut b = vtf.to_be_bytes().to_vec();
    b.extend_from_slice(&1024u16.to_be_bytes());
    b.push(0x1b);
    b.push(hops);
    b.extend_from_slice(&sgid);
    b.extend_from_slice(&dgid);
    b
}

/// The GRH target: any bytes parse or are refused, never panic; a parsed IPv4 GRH names
/// the header's addresses, a parsed IPv6 one the GIDs, whatever else the bytes hold.
#[test]
fn grh() {
    let valid = vec![
        grh_ipv4(
            Ipv4Addr::new(198, 18, 1, 1),
            Ipv4Addr::new(198, 18, 1, 2),
            0,
            64,
            0,
        ),
        // Version 6 in the unused bytes in front of a good IPv4 header.
        grh_ipv4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            0x60,
            1,
            0x60,
        ),
        grh_ipv6(
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe12, 0x3456).octets(),
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe65, 0x4321).octets(),
            0x12,
            0xabcde,
            255,
        ),
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "grh", valid, |bytes| {
        let parsed = match Grh::parse(bytes) {
            Ok(grh) => grh,
            Err(e) => {
                prop_assert!(harmless(&e.to_string()));
                prop_assert!(bytes.len() >= GRH_LEN || e.to_string().contains("got"));
                return Ok(());
            }
        };
        prop_assert!(bytes.len() >= GRH_LEN, "parsed {} bytes", bytes.len());
        let b = &bytes[..GRH_LEN];
        match parsed.kind() {
            GrhKind::Ipv4 => {
                let src = Ipv4Addr::new(b[32], b[33], b[34], b[35]);
                let dst = Ipv4Addr::new(b[36], b[37], b[38], b[39]);
                prop_assert_eq!(parsed.sgid(), Gid::from(src));
                prop_assert_eq!(parsed.dgid(), Gid::from(dst));
                prop_assert_eq!(parsed.sgid().to_ipv4_mapped(), Some(src));
                prop_assert_eq!(parsed.hop_limit(), b[28]);
            }
            GrhKind::Ipv6 => {
                prop_assert_eq!(b[0] >> 4, 6);
                let (sgid, dgid) = (parsed.sgid(), parsed.dgid());
                prop_assert_eq!(&sgid.as_bytes()[..], &b[8..24]);
                prop_assert_eq!(&dgid.as_bytes()[..], &b[24..40]);
                prop_assert!(parsed.flow_label() <= 0xf_ffff);
                prop_assert_eq!(parsed.hop_limit(), b[7]);
            }
            other => prop_assert!(false, "unexpected kind {other:?}"),
        }
        let _ = format!("{parsed:?}");
        Ok(())
    });
}

/// Every header a sender can build parses back to what it was built from.
#[test]
fn grh_round_trip() {
    let v4 = (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(s, d, tos, ttl, unused)| {
            let (s, d) = (Ipv4Addr::from(s), Ipv4Addr::from(d));
            (
                grh_ipv4(s, d, tos, ttl, unused),
                Gid::from(s),
                Gid::from(d),
                ttl,
            )
        });
    fuzz::fuzz_values("grh-round-trip-ipv4", v4, |(bytes, s, d, ttl)| {
        let grh = Grh::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(grh.kind(), GrhKind::Ipv4);
        prop_assert_eq!((grh.sgid(), grh.dgid(), grh.hop_limit()), (s, d, ttl));
        Ok(())
    });
    let v6 = (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        0u32..=0xf_ffff,
        any::<u8>(),
    );
    fuzz::fuzz_values("grh-round-trip-ipv6", v6, |(s, d, tclass, flow, hops)| {
        let bytes = grh_ipv6(s, d, tclass, flow, hops);
        let grh = Grh::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // 20 bytes after a version-6 word may by chance be a good IPv4 header: then IPv4 wins,
        // as on the wire, where only RoCE v2 over IPv4 has one.
        if grh.kind() == GrhKind::Ipv6 {
            prop_assert_eq!(grh.sgid(), Gid::from_raw(s));
            prop_assert_eq!(grh.dgid(), Gid::from_raw(d));
            prop_assert_eq!(grh.traffic_class(), tclass);
            prop_assert_eq!(grh.flow_label(), flow);
            prop_assert_eq!(grh.hop_limit(), hops);
        }
        Ok(())
    });
}

/// The GID text target: the wire form of the pingpong line and any IPv6 notation parse or
/// are refused with printable text; what parses prints back to a form that parses the same.
#[test]
fn gid_text() {
    let gid = Gid::from(Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe12, 0x3456));
    let valid = vec![
        gid.to_wire_hex().into_bytes(),
        gid.to_string().into_bytes(),
        b"::ffff:198.18.1.2".to_vec(),
        b"FE800000000000005054FFFFFE123456".to_vec(),
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "gid-text", valid, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        for parsed in [text.parse::<Gid>(), Gid::from_wire_hex(&text)] {
            match parsed {
                Ok(gid) => {
                    prop_assert_eq!(Gid::from_wire_hex(&gid.to_wire_hex()), Ok(gid));
                    prop_assert_eq!(gid.to_string().parse::<Gid>(), Ok(gid));
                }
                Err(e) => {
                    // The error quotes the input: shown through `printable` it is harmless.
                    let shown = printable(&e.to_string(), PEER_TEXT_MAX);
                    prop_assert!(harmless(&shown), "{shown:?}");
                }
            }
        }
        Ok(())
    });
}

/// The peer-text target: whatever a peer sends comes out harmless, no longer than asked
/// (plus the note of what was cut), and unchanged when it was harmless and short.
#[test]
fn peer_text() {
    let valid = vec![
        b"device lost".to_vec(),
        "\u{1b}[2J\u{1b}]0;owned\u{7}".as_bytes().to_vec(),
        "a\u{202e}txt.exe\u{9b}31m".as_bytes().to_vec(),
        "Grüße, ½ µs, שלום".as_bytes().to_vec(),
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "peer-text", valid, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        for max in [0, 1, 7, 64, PEER_TEXT_MAX] {
            let shown = printable(&text, max);
            prop_assert!(harmless(&shown), "{shown:?}");
            let n = text.chars().count();
            if n > max {
                let note = format!("... ({} more characters not shown)", n - max);
                prop_assert!(shown.ends_with(&note), "{shown:?} lacks {note:?}");
            } else if harmless(&text) && !text.contains('\n') {
                prop_assert_eq!(&shown, &*text);
            }
        }
        Ok(())
    });
}
