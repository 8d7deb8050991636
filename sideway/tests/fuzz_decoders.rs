//! Fuzz targets for what sideway decodes of a peer's bytes: the GRH in front of every UD
//! receive (written by the peer's packet headers), GIDs in text (the peer's endpoint line),
//! endpoints (text, bytes, the pingpong line alone and in the TCP exchange against a peer
//! that sends anything), `RemoteBuffer` (rkey/address/length, as a message and as private
//! data), and the sanitising of peer text before it reaches a terminal. The harness, and why it is
//! proptest, is in `support/fuzz.rs`.
//!
//! Every target holds to: no input panics; errors are printable; what decodes encodes back to
//! the same bytes.

mod support {
    pub mod fuzz;
}

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use sideway::address_handle::{Grh, GrhKind, GRH_LEN};
use sideway::connection::exchange::client_exchange_many;
use sideway::connection::{RemoteBuffer, PINGPONG_LINE_LEN, REMOTE_BUFFER_LEN};
use sideway::gid::Gid;
use sideway::peer_text::{printable, PEER_TEXT_MAX};
use sideway::queue_pair::Endpoint;

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

fn check_text(what: &str, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(harmless(text), "{what} is not harmless: {text:?}");
    Ok(())
}

fn endpoints() -> Vec<Endpoint> {
    let gid = |last: u8| {
        let mut raw = [0u8; 16];
        raw[..2].copy_from_slice(&[0xfe, 0x80]);
        raw[15] = last;
        Gid::from_raw(raw)
    };
    vec![
        Endpoint {
            lid: 0,
            qp_num: 0x11,
            psn: 0x12_3456,
            gid: gid(1),
        },
        Endpoint {
            lid: 0xffff,
            qp_num: 0xff_ffff,
            psn: 0,
            gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 1, 2)),
        },
        Endpoint {
            lid: 7,
            qp_num: 1,
            psn: 0xab_cdef,
            gid: Gid::from_raw([0; 16]),
        },
    ]
}

fn wire(ep: &Endpoint) -> Vec<u8> {
    ep.to_pingpong_line()
        .expect("a sample endpoint fits")
        .to_vec()
}

/// The endpoint line target: any bytes decode or are refused with harmless text, and a line
/// that decodes is the line its endpoint encodes to, up to the case of its hex digits and
/// whatever follows the NUL.
#[test]
fn pingpong_line() {
    let valid: Vec<Vec<u8>> = endpoints().iter().map(wire).collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "pingpong-line", valid, |bytes| {
        match Endpoint::from_pingpong_line(bytes) {
            Ok(ep) => {
                prop_assert_eq!(bytes.len(), PINGPONG_LINE_LEN);
                prop_assert!(ep.qp_num <= 0xff_ffff && ep.psn <= 0xff_ffff);
                let again = ep
                    .to_pingpong_line()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let text_len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                prop_assert_eq!(
                    bytes[..text_len].to_ascii_lowercase(),
                    again[..PINGPONG_LINE_LEN - 1].to_vec()
                );
                prop_assert_eq!(Endpoint::from_pingpong_line(&again), Ok(ep));
            }
            Err(e) => check_text("a line error", &e.to_string())?,
        }
        Ok(())
    });
}

/// Every endpoint that fits encodes to a line that decodes back to it.
#[test]
fn pingpong_line_round_trip() {
    let endpoint = (
        any::<u16>(),
        0u32..=0xff_ffff,
        0u32..=0xff_ffff,
        any::<[u8; 16]>(),
    )
        .prop_map(|(lid, qp_num, psn, gid)| Endpoint {
            lid,
            qp_num,
            psn,
            gid: Gid::from_raw(gid),
        });
    fuzz::fuzz_values("pingpong-line-round-trip", endpoint, |ep| {
        let line = ep
            .to_pingpong_line()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(line[PINGPONG_LINE_LEN - 1], 0);
        prop_assert_eq!(Endpoint::from_pingpong_line(&line), Ok(ep));
        Ok(())
    });
}

/// How long the exchange may wait for one step: never reached when the peer closes.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The exchange target: a client meets a "server" on loopback that sends `bytes` and
/// closes. The client gets the server's endpoints exactly when the first lines of `bytes`
/// are good lines; otherwise a harmless error; and either way at once, not after the
/// timeout. (A TCP connection per case: a fixed number of cases, not a timed run.)
#[test]
fn pingpong_exchange() {
    let eps = endpoints();
    let valid = vec![
        wire(&eps[0]),
        [wire(&eps[1]), wire(&eps[2]), b"trailing bytes".to_vec()].concat(),
        wire(&eps[0])[..PINGPONG_LINE_LEN - 7].to_vec(),
    ];
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    fuzz::fuzz_bytes_with(MANIFEST_DIR, "pingpong-exchange", valid, false, |bytes| {
        // As many lines as the client sends: one to three, from the input.
        let lines = 1 + bytes.first().map_or(0, |b| usize::from(b % 3));
        let ours: Vec<Endpoint> = eps.iter().cycle().take(lines).copied().collect();
        let server = thread::scope(|s| {
            let server = s.spawn(|| -> std::io::Result<Vec<u8>> {
                let (mut stream, _) = listener.accept()?;
                stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
                // A client that refused the first line closes at once, and its unread bytes
                // reset the connection: writing and shutting down may fail, harmlessly.
                let _ = stream.write_all(bytes);
                let _ = stream.shutdown(Shutdown::Write);
                let mut heard = Vec::new();
                let _ = stream.read_to_end(&mut heard);
                Ok(heard)
            });
            let started = Instant::now();
            let got = client_exchange_many("127.0.0.1", port, &ours, EXCHANGE_TIMEOUT);
            let took = started.elapsed();
            (got, took, server.join())
        });
        let (got, took, heard) = server;
        prop_assert!(
            took < EXCHANGE_TIMEOUT / 2,
            "the exchange took {took:?} with a closed peer"
        );
        let heard = match heard {
            Ok(Ok(heard)) => heard,
            Ok(Err(e)) => return Err(TestCaseError::fail(format!("the fake server: {e}"))),
            Err(_) => return Err(TestCaseError::fail("the fake server panicked")),
        };
        let mut ours_on_wire: Vec<u8> = ours.iter().flat_map(wire).collect();
        let expected: Option<Vec<Endpoint>> = (0..lines)
            .map(|i| {
                bytes
                    .get(i * PINGPONG_LINE_LEN..(i + 1) * PINGPONG_LINE_LEN)
                    .and_then(|line| Endpoint::from_pingpong_line(line).ok())
            })
            .collect();
        match (got, expected) {
            (Ok(theirs), Some(expected)) => {
                prop_assert_eq!(theirs, expected);
                // The client's lines, then its closing word. (After a refusal the client
                // closes with bytes unread, the connection is reset, and what the fake
                // server heard may be cut short: nothing to check then.)
                ours_on_wire.extend_from_slice(b"done\0");
                prop_assert_eq!(heard, ours_on_wire, "what the client sent");
            }
            (Err(e), None) => check_text("an exchange error", &e.to_string())?,
            (Ok(theirs), None) => {
                prop_assert!(false, "accepted {theirs:?} from bad lines");
            }
            (Err(e), Some(_)) => prop_assert!(false, "refused good lines: {e}"),
        }
        Ok(())
    });
}

/// The endpoint text target (`FromStr`): any text parses or is refused with harmless text,
/// and what parses prints back the same, up to the case of its hex digits.
#[test]
fn endpoint_text() {
    let valid: Vec<Vec<u8>> = endpoints()
        .iter()
        .map(|ep| ep.to_string().into_bytes())
        .collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "endpoint-text", valid, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        match text.parse::<Endpoint>() {
            Ok(ep) => prop_assert_eq!(ep.to_string(), text.to_ascii_lowercase()),
            Err(e) => check_text("an endpoint text error", &e.to_string())?,
        }
        Ok(())
    });
}

/// The endpoint byte-form target: any bytes decode or are refused with harmless text, and
/// what decodes encodes back to the same bytes.
#[test]
fn endpoint_bytes() {
    let valid: Vec<Vec<u8>> = endpoints()
        .iter()
        .map(|ep| ep.to_bytes().expect("a sample endpoint fits").to_vec())
        .collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "endpoint-bytes", valid, |bytes| {
        match Endpoint::from_bytes(bytes) {
            Ok(ep) => {
                let again = ep
                    .to_bytes()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(again.to_vec(), bytes.to_vec());
            }
            Err(e) => check_text("an endpoint bytes error", &e.to_string())?,
        }
        Ok(())
    });
}

/// Every endpoint that fits goes through its text and byte forms unchanged.
#[test]
fn endpoint_forms_round_trip() {
    let endpoint = (
        any::<u16>(),
        0u32..=0xff_ffff,
        0u32..=0xff_ffff,
        any::<[u8; 16]>(),
    )
        .prop_map(|(lid, qp_num, psn, gid)| Endpoint {
            lid,
            qp_num,
            psn,
            gid: Gid::from_raw(gid),
        });
    fuzz::fuzz_values("endpoint-forms-round-trip", endpoint, |ep| {
        prop_assert_eq!(ep.to_string().parse::<Endpoint>(), Ok(ep));
        let bytes = ep
            .to_bytes()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Endpoint::from_bytes(&bytes), Ok(ep));
        Ok(())
    });
}

/// The private-data target: any bytes are a `RemoteBuffer` message exactly when they are 16
/// bytes, and private data exactly when at least 16; either reads back what it says; every
/// refusal is harmless text.
#[test]
fn remote_buffer() {
    let b = RemoteBuffer {
        addr: 0x7f12_3456_7000,
        rkey: 0x1234,
        len: 64,
    };
    let mut padded = b.to_bytes().to_vec();
    padded.resize(56, 0);
    let valid = vec![
        b.to_bytes().to_vec(),
        [0xff; REMOTE_BUFFER_LEN].to_vec(),
        padded,
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "remote-buffer", valid, |bytes| {
        match RemoteBuffer::from_bytes(bytes) {
            Ok(r) => {
                prop_assert_eq!(bytes.len(), REMOTE_BUFFER_LEN);
                prop_assert_eq!(r.to_bytes().to_vec(), bytes.to_vec());
            }
            Err(e) => {
                prop_assert_ne!(bytes.len(), REMOTE_BUFFER_LEN);
                check_text("a remote buffer error", &e.to_string())?;
            }
        }
        match RemoteBuffer::from_private_data(bytes) {
            Ok(r) => prop_assert_eq!(&r.to_bytes()[..], &bytes[..REMOTE_BUFFER_LEN]),
            Err(e) => {
                prop_assert!(bytes.len() < REMOTE_BUFFER_LEN);
                check_text("a private data error", &e.to_string())?;
            }
        }
        Ok(())
    });
}

/// Every `RemoteBuffer` goes out and comes back the same, alone or padded as private data.
#[test]
fn remote_buffer_round_trip() {
    let buffer = (any::<u64>(), any::<u32>(), any::<u32>(), 0usize..200)
        .prop_map(|(addr, rkey, len, pad)| (RemoteBuffer { addr, rkey, len }, pad));
    fuzz::fuzz_values("remote-buffer-round-trip", buffer, |(b, pad)| {
        prop_assert_eq!(RemoteBuffer::from_bytes(&b.to_bytes()), Ok(b));
        let mut data = b.to_bytes().to_vec();
        data.resize(REMOTE_BUFFER_LEN + pad, 0);
        prop_assert_eq!(RemoteBuffer::from_private_data(&data), Ok(b));
        Ok(())
    });
}
