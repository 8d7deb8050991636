//! Fuzz targets for what the example programs decode of a peer's bytes: the pingpong
//! endpoint line (alone, and in the TCP exchange against a peer that sends anything), rping's
//! buffer advertisement and ping data, and cmtime's one-byte steps (tried exhaustively: there
//! are only 256 bytes). The harness, and why it is proptest, is in sideway's
//! `tests/support/fuzz.rs`.
//!
//! Every target holds to: no input panics; every error's text is harmless on a terminal;
//! valid encodings decode to what was encoded; the exchange ends, in far less than its
//! timeout, when the peer closes.

#[path = "../../sideway/tests/support/fuzz.rs"]
mod fuzz;

use std::io::{Read, Write};

use fuzz::harmless;
use std::net::{Shutdown, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use sideway::Gid;
use sideway_examples::cmtime_wire::{check_announced, check_answer, STEPS, SYNC_STEPS};
use sideway_examples::pingpong_wire::{client_exchange_many, Endpoint, MESSAGE_LEN};
use sideway_examples::rping_wire::{fill_ping, ping_text, BufferAdvert, ADVERT_LEN};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

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
            qpn: 0x11,
            psn: 0x12_3456,
            gid: gid(1),
        },
        Endpoint {
            lid: 0xffff,
            qpn: 0xff_ffff,
            psn: 0,
            gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 1, 2)),
        },
        Endpoint {
            lid: 7,
            qpn: 1,
            psn: 0xab_cdef,
            gid: Gid::from_raw([0; 16]),
        },
    ]
}

fn wire(ep: &Endpoint) -> Vec<u8> {
    ep.to_wire().expect("a sample endpoint fits").to_vec()
}

/// The endpoint line target: any bytes decode or are refused with harmless text, and a line
/// that decodes is the line its endpoint encodes to, up to the case of its hex digits and
/// whatever follows the NUL.
#[test]
fn pingpong_line() {
    let valid: Vec<Vec<u8>> = endpoints().iter().map(wire).collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "pingpong-line", valid, |bytes| {
        match Endpoint::from_wire(bytes) {
            Ok(ep) => {
                prop_assert_eq!(bytes.len(), MESSAGE_LEN);
                prop_assert!(ep.qpn <= 0xff_ffff && ep.psn <= 0xff_ffff);
                let again = ep
                    .to_wire()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let text_len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                prop_assert_eq!(
                    bytes[..text_len].to_ascii_lowercase(),
                    again[..MESSAGE_LEN - 1].to_vec()
                );
                prop_assert_eq!(Endpoint::from_wire(&again), Ok(ep));
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
        .prop_map(|(lid, qpn, psn, gid)| Endpoint {
            lid,
            qpn,
            psn,
            gid: Gid::from_raw(gid),
        });
    fuzz::fuzz_values("pingpong-line-round-trip", endpoint, |ep| {
        let line = ep
            .to_wire()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(line[MESSAGE_LEN - 1], 0);
        prop_assert_eq!(Endpoint::from_wire(&line), Ok(ep));
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
        wire(&eps[0])[..MESSAGE_LEN - 7].to_vec(),
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
                    .get(i * MESSAGE_LEN..(i + 1) * MESSAGE_LEN)
                    .and_then(|line| Endpoint::from_wire(line).ok())
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

/// The rping target: any message is a buffer advertisement exactly when it is 16 bytes,
/// which read back to what they say; ping data of any bytes shows harmless text, cut where
/// asked.
#[test]
fn rping_advert() {
    let advert = BufferAdvert {
        addr: 0x7f12_3456_7000,
        rkey: 0x1234,
        len: 64,
    };
    let mut ping = vec![0u8; 64];
    fill_ping(&mut ping, 7);
    let valid = vec![
        advert.to_bytes().to_vec(),
        [0xff; ADVERT_LEN].to_vec(),
        ping,
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "rping-advert", valid, |bytes| {
        match BufferAdvert::from_bytes(bytes) {
            Ok(a) => {
                prop_assert_eq!(bytes.len(), ADVERT_LEN);
                prop_assert_eq!(a.to_bytes().to_vec(), bytes.to_vec());
            }
            Err(e) => {
                prop_assert_ne!(bytes.len(), ADVERT_LEN);
                check_text("an advertisement error", &e.to_string())?;
            }
        }
        for max in [0, 16, 4096] {
            let shown = ping_text(bytes, max);
            check_text("ping data", &shown)?;
            let before_nul = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            if before_nul == 0 {
                prop_assert_eq!(shown, "");
            }
        }
        Ok(())
    });
}

/// Any advertisement goes out and comes back the same; every ping's data shows as text that
/// starts with its number.
#[test]
fn rping_round_trip() {
    let advert = (any::<u64>(), any::<u32>(), any::<u32>())
        .prop_map(|(addr, rkey, len)| BufferAdvert { addr, rkey, len });
    fuzz::fuzz_values("rping-advert-round-trip", advert, |a| {
        prop_assert_eq!(BufferAdvert::from_bytes(&a.to_bytes()), Ok(a));
        Ok(())
    });
    fuzz::fuzz_values(
        "rping-ping-data",
        (any::<u64>(), 24usize..=4096),
        |(n, size)| {
            let mut buf = vec![0u8; size];
            fill_ping(&mut buf, n);
            let shown = ping_text(&buf, usize::MAX);
            let prefix = format!("rdma-ping-{n}: ");
            prop_assert_eq!(shown.len(), size - 1);
            prop_assert!(prefix.starts_with(&shown[..prefix.len().min(size - 1)]));
            prop_assert!(harmless(&shown));
            Ok(())
        },
    );
}

/// cmtime's steps: one byte each way, so every byte is tried for every step on both sides
/// rather than sampled. Only the step's own number is accepted; every other byte is refused
/// with a message that names both numbers and the step.
#[test]
fn cmtime_steps_every_byte() {
    for (step, name) in STEPS {
        for got in 0..=u8::MAX {
            let announced = check_announced(got, step);
            let answered = check_answer(step, got);
            if got == step.byte() {
                assert_eq!(announced, Ok(()));
                assert_eq!(answered, Ok(()));
                continue;
            }
            for e in [announced.unwrap_err(), answered.unwrap_err()] {
                let text = e.to_string();
                assert!(harmless(&text), "{text:?}");
                assert!(
                    text.contains(&format!("step {got}")) || text.contains(&format!("with {got}")),
                    "{text:?} does not name the byte {got}"
                );
                assert!(
                    text.contains(&format!("step {} ({name})", step.byte())),
                    "{text:?} does not name step {name}"
                );
            }
        }
    }
    assert!(SYNC_STEPS.iter().all(|s| STEPS.iter().any(|(t, _)| t == s)));
}
