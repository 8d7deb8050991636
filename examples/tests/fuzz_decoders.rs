//! Fuzz targets for what the example programs decode of a peer's bytes: rping's buffer
//! advertisement (sideway's `RemoteBuffer`, fuzzed there too) and ping data, xsrq_pingpong's
//! endpoint message, and cmtime's
//! one-byte steps (tried exhaustively: there
//! are only 256 bytes). The harness, and why it is proptest, is in sideway's
//! `tests/support/fuzz.rs`.
//!
//! Every target holds to: no input panics; every error's text is harmless on a terminal;
//! valid encodings decode to what was encoded; the exchange ends, in far less than its
//! timeout, when the peer closes.

#[path = "../../sideway/tests/support/fuzz.rs"]
mod fuzz;

use fuzz::harmless;

use proptest::prelude::*;
use sideway::connection::{RemoteBuffer, REMOTE_BUFFER_LEN};
use sideway_examples::cmtime_wire::{check_announced, check_answer, STEPS, SYNC_STEPS};
use sideway_examples::rping_wire::{fill_ping, ping_text};
use sideway_examples::xsrq_wire::{XsrqDest, MSG_SIZE};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn check_text(what: &str, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(harmless(text), "{what} is not harmless: {text:?}");
    Ok(())
}

/// The rping target: any message is a buffer advertisement exactly when it is 16 bytes,
/// which read back to what they say; ping data of any bytes shows harmless text, cut where
/// asked.
#[test]
fn rping_advert() {
    let advert = RemoteBuffer {
        addr: 0x7f12_3456_7000,
        rkey: 0x1234,
        len: 64,
    };
    let mut ping = vec![0u8; 64];
    fill_ping(&mut ping, 7);
    let valid = vec![
        advert.to_bytes().to_vec(),
        [0xff; REMOTE_BUFFER_LEN].to_vec(),
        ping,
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "rping-advert", valid, |bytes| {
        match RemoteBuffer::from_bytes(bytes) {
            Ok(a) => {
                prop_assert_eq!(bytes.len(), REMOTE_BUFFER_LEN);
                prop_assert_eq!(a.to_bytes().to_vec(), bytes.to_vec());
            }
            Err(e) => {
                prop_assert_ne!(bytes.len(), REMOTE_BUFFER_LEN);
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
        .prop_map(|(addr, rkey, len)| RemoteBuffer { addr, rkey, len });
    fuzz::fuzz_values("rping-advert-round-trip", advert, |a| {
        prop_assert_eq!(RemoteBuffer::from_bytes(&a.to_bytes()), Ok(a));
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

/// xsrq_pingpong's endpoint message: any 66 bytes (shorter inputs padded with NULs, longer
/// ones cut) decode to an endpoint that encodes back to a message decoding to the same, or
/// to an error whose text is harmless.
#[test]
fn xsrq_dest() {
    let dest = XsrqDest {
        lid: 0x12,
        recv_qpn: 0x11,
        send_qpn: 0x12,
        psn: 0xabcdef,
        srqn: 0x2a5,
        gid: "::ffff:198.18.0.1".parse().unwrap(),
    };
    let valid = vec![dest.encode().to_vec(), b"1:2:3:4:5:".to_vec()];
    fuzz::fuzz_bytes(MANIFEST_DIR, "xsrq-dest", valid, |bytes| {
        let mut msg = [0u8; MSG_SIZE];
        let n = bytes.len().min(MSG_SIZE);
        msg[..n].copy_from_slice(&bytes[..n]);
        match XsrqDest::decode(&msg) {
            Ok(d) => {
                prop_assert_eq!(XsrqDest::decode(&d.encode()), Ok(d));
                check_text("an endpoint line", &d.line("remote"))?;
            }
            Err(e) => check_text("an endpoint message error", &e)?,
        }
        Ok(())
    });
}
