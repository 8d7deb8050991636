//! Fuzz targets for what trespass decodes of its peer's bytes: the hello in rdma_cm's private
//! data, a listener's refusal, and the 32-bit immediate of every write (fed to a connection's
//! protocol core too). The harness, and why it is proptest, is in sideway's
//! `tests/support/fuzz.rs` (shared with the other crates' targets).
//!
//! Every target holds to: no input panics; every error's text is printable; valid encodings
//! decode to what was encoded.

#[path = "../../sideway/tests/support/fuzz.rs"]
mod fuzz;

use std::time::Instant;

use proptest::prelude::*;

use trespass::core::{Completion, Connection, Limits};
use trespass::wire::{Control, Hello, Imm, Lend, Refusal, LEND_LEN, MIN_RECV_DEPTH, MIN_RING};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn hello() -> Hello {
    Hello {
        ring_addr: 0x7f12_3456_7000,
        ring_rkey: 0x1234,
        ring_size: 1 << 18,
        recv_depth: 128,
        max_message: 1 << 26,
        lends: true,
    }
}

fn printable(what: &str, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(fuzz::harmless(text), "{what} is not printable: {text:?}");
    Ok(())
}

/// The hello: any bytes decode to a hello whose fields are in range, or are refused with a
/// printable error; a decoded hello encodes back to the same first 32 bytes.
#[test]
fn hello_in_private_data() {
    let mut padded = hello().encode().to_vec();
    padded.extend_from_slice(&[0; 24]);
    let valid = vec![hello().encode().to_vec(), padded];
    fuzz::fuzz_bytes(MANIFEST_DIR, "hello", valid, |bytes| {
        match Hello::decode(bytes) {
            Ok(h) => {
                prop_assert!(h.ring_size >= MIN_RING && h.recv_depth >= MIN_RECV_DEPTH);
                prop_assert!(h.ring_addr.checked_add(h.ring_size.into()).is_some());
                prop_assert_eq!(&h.encode()[..], &bytes[..32]);
                Ok(())
            }
            Err(e) => printable("a hello error", &e.to_string()),
        }
    });
}

/// The refusal: any bytes decode to a reason or a printable error.
#[test]
fn refusal() {
    let valid = vec![
        Refusal::BadHello.encode().to_vec(),
        Refusal::NoResources.encode().to_vec(),
    ];
    fuzz::fuzz_bytes(
        MANIFEST_DIR,
        "refusal",
        valid,
        |bytes| match Refusal::decode(bytes) {
            Ok(r) => {
                prop_assert_eq!(Refusal::decode(&r.encode()), Ok(r));
                Ok(())
            }
            Err(e) => printable("a refusal error", &e.to_string()),
        },
    );
}

/// A lent region's descriptor: any bytes decode to a region that is not empty, fits the
/// limit and does not wrap, or are refused with a printable error; a decoded one encodes
/// back to the same bytes. Fed to a connection that was announced a lent region, as the
/// descriptor's bytes, the fetch begins only for a good one, and a bad one is a sticky
/// protocol error.
#[test]
fn lend_descriptor() {
    let good = Lend {
        addr: 0x7f00_0000_1000,
        rkey: 0x99,
        len: 4096,
    };
    let valid = vec![good.encode().to_vec()];
    fuzz::fuzz_bytes(MANIFEST_DIR, "lend", valid, |bytes| {
        const MAX: u32 = 1 << 20;
        match Lend::decode(bytes, MAX) {
            Ok(l) => {
                prop_assert!(l.len > 0 && l.len <= MAX);
                prop_assert!(l.addr.checked_add(l.len.into()).is_some());
                prop_assert_eq!(&l.encode()[..], bytes);
            }
            Err(e) => printable("a descriptor error", &e.to_string())?,
        }
        let limits = Limits {
            ring_size: 4096,
            send_buffer: 4096,
            recv_depth: 8,
            send_depth: 8,
            max_write: 4096,
            max_message: MAX,
            lends: true,
        };
        let mut c = Connection::new(limits, hello());
        let now = Instant::now();
        c.on_recv_completion(
            Some(Imm::Control(Control::Lend).encode()),
            0,
            Completion::Ok,
            now,
        );
        let piece = Imm::Data {
            len: LEND_LEN as u32,
            msg: true,
            eom: true,
        };
        c.on_recv_completion(Some(piece.encode()), LEND_LEN as u32, Completion::Ok, now);
        let w = c.recv_window();
        prop_assert!(w.lent && w.ends_message && w.len as usize == LEND_LEN);
        c.consume_message(w.len, true);
        match c.begin_fetch(bytes) {
            Ok(()) => prop_assert!(Lend::decode(bytes, MAX).is_ok() && c.fetching().is_some()),
            Err(e) => {
                printable("a fetch error", &e.to_string())?;
                prop_assert!(c.error().is_some() && c.fetching().is_none());
                prop_assert!(c.poll_transmit().is_none(), "a failed connection posted");
            }
        }
        Ok(())
    });
}

/// Immediates: four bytes (big-endian) decode to an immediate that encodes back, or a
/// printable error; fed to a fresh connection as the peer's first write (with the byte
/// count the input's tail gives), the core never panics, and a lie leaves a sticky error
/// with nothing more to post.
#[test]
fn immediate() {
    let valid = vec![
        Imm::Data {
            len: 100,
            msg: false,
            eom: false,
        }
        .encode()
        .to_be_bytes()
        .to_vec(),
        Imm::CreditBytes(5).encode().to_be_bytes().to_vec(),
        Imm::Control(Control::Fin).encode().to_be_bytes().to_vec(),
    ];
    let limits = Limits {
        ring_size: 4096,
        send_buffer: 4096,
        recv_depth: 8,
        send_depth: 8,
        max_write: 4096,
        max_message: 1000,
        lends: true,
    };
    fuzz::fuzz_bytes(MANIFEST_DIR, "immediate", valid, |bytes| {
        let mut word = [0u8; 4];
        let n = bytes.len().min(4);
        word[..n].copy_from_slice(&bytes[..n]);
        let raw = u32::from_be_bytes(word);
        match Imm::decode(raw) {
            Ok(imm) => prop_assert_eq!(Imm::decode(imm.encode()), Ok(imm)),
            Err(e) => printable("an immediate error", &e.to_string())?,
        }
        let byte_len = bytes.get(4..8).map_or(0, |b| {
            u32::from_be_bytes(b.try_into().expect("4 bytes")) % 8192
        });
        let mut c = Connection::new(limits, hello());
        c.on_recv_completion(Some(raw), byte_len, Completion::Ok, Instant::now());
        if let Some(e) = c.error() {
            printable("a connection error", &e.to_string())?;
            prop_assert!(c.poll_transmit().is_none(), "a failed connection posted");
        }
        Ok(())
    });
}
