//! Lending: a region announced with LEND and described in a 16-byte message, fetched by the
//! peer's RDMA READs, and returned; and every lie a peer can tell about it.

use super::*;
use crate::wire::{Lend, LEND_LEN};

/// Side `s` lends `mem` (its whole lendable memory) under `rkey`: begins the lent message
/// and commits its descriptor. Returns the descriptor.
fn lend(p: &mut Pair, s: usize, mem: Vec<u8>, rkey: u32) -> Lend {
    let side = &mut p.sides[s];
    let desc = Lend {
        addr: LEND_BASE,
        rkey,
        len: mem.len() as u32,
    };
    side.lend_mem = mem;
    side.lend_rkey = Some(rkey);
    side.conn.begin_lend().expect("both sides lend");
    let bytes = desc.encode();
    let mut sent = 0;
    while sent < LEND_LEN {
        let (off, room) = side.conn.send_window();
        let k = (room as usize).min(LEND_LEN - sent);
        assert!(k > 0, "no room for a descriptor");
        let off = off as usize;
        side.send_buf[off..off + k].copy_from_slice(&bytes[sent..sent + k]);
        sent += k;
        side.conn
            .commit_send(k as u32, sent == LEND_LEN)
            .expect("within the window");
    }
    desc
}

/// Side `s` consumes the descriptor at its ring's head (the window says `lent`) and
/// begins the fetch, its target sized for the region.
fn begin_fetch(p: &mut Pair, s: usize) -> Result<(), ConnError> {
    let side = &mut p.sides[s];
    let mut desc = Vec::new();
    loop {
        let w = side.conn.recv_window();
        assert!(w.lent, "the window names a descriptor: {w:?}");
        let off = w.offset as usize;
        desc.extend_from_slice(&side.ring[off..off + w.len as usize]);
        side.conn.consume_message(w.len, w.ends_message);
        if w.ends_message {
            break;
        }
    }
    side.conn.begin_fetch(&desc)?;
    let len = side.conn.fetching().expect("a fetch runs").len;
    side.fetch_target = vec![0; len as usize];
    Ok(())
}

/// The lender revokes its key once the peer returned the region (as the driver
/// deregisters it).
fn take_returns(p: &mut Pair, s: usize) -> u64 {
    let n = p.sides[s].conn.poll_returned();
    if n > 0 {
        p.sides[s].lend_rkey = None;
    }
    n
}

fn lending_pair() -> Pair {
    // A ring of 8 KiB and a send buffer of 4 KiB, as small() has, with room for big
    // messages: a region of several READ chunks.
    let mut l = small();
    l.max_message = 4 << 20;
    Pair::new(l, l)
}

#[test]
fn a_lent_region_is_announced_fetched_in_chunks_and_returned() {
    let mut p = lending_pair();
    let len = 2 * READ_CHUNK as usize + 12345;
    let mem = Rng(7).bytes(len);
    lend(&mut p, A, mem.clone(), 0xbeef);
    assert_eq!(p.conn(A).lent_outstanding(), 1);
    p.run();
    // The announcement goes just before the descriptor's bytes.
    let imms = p.sides[A].imms();
    let at = imms
        .iter()
        .position(|i| *i == Imm::Control(Control::Lend))
        .expect("a LEND was sent");
    assert_eq!(
        imms[at + 1],
        Imm::Data {
            len: LEND_LEN as u32,
            msg: true,
            eom: true
        }
    );
    assert!(p.conn(B).has_unread() && p.conn(B).is_readable(false));
    begin_fetch(&mut p, B).unwrap();
    assert!(
        !p.conn(B).has_unread(),
        "nothing is readable while the region is on its way"
    );
    p.run();
    let reads: Vec<Transmit> = p.sides[B].log.iter().filter(|t| t.read).copied().collect();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert_eq!(
        reads.iter().map(|t| t.len as usize).sum::<usize>(),
        len,
        "the READs cover the region"
    );
    assert!(reads.last().unwrap().signaled, "the last READ is signalled");
    assert!(p.conn(B).fetch_done() && p.conn(B).has_unread());
    assert_eq!(
        p.sides[B].fetch_target, mem,
        "the fetched bytes are the lent ones"
    );
    assert_eq!(p.conn_mut(B).finish_fetch(), Some(len as u32));
    assert!(p.conn(B).fetching().is_none());
    p.run();
    assert!(p.sides[B].imms().contains(&Imm::Control(Control::Return)));
    assert_eq!(p.conn(A).returned_total(), 1);
    assert_eq!(take_returns(&mut p, A), 1);
    assert_eq!(p.conn(A).lent_outstanding(), 0);
    assert_eq!(take_returns(&mut p, A), 0, "each return is taken once");
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());
}

#[test]
fn stream_bytes_around_a_lent_message_keep_their_order() {
    let mut p = lending_pair();
    assert_eq!(p.write(A, b"before"), 6);
    lend(&mut p, A, vec![9; 1000], 1);
    assert_eq!(p.write(A, b"after"), 5);
    p.run();
    let w = p.conn(B).recv_window();
    assert!(
        !w.lent && w.len == 6,
        "bytes before the descriptor stop at it: {w:?}"
    );
    assert_eq!(p.read(B, 100), b"before");
    begin_fetch(&mut p, B).unwrap();
    assert!(
        p.read(B, 100).is_empty(),
        "nothing passes a region being fetched"
    );
    p.run();
    assert_eq!(p.conn_mut(B).finish_fetch(), Some(1000));
    assert_eq!(p.sides[B].fetch_target, vec![9; 1000]);
    assert_eq!(p.read(B, 100), b"after");
}

#[test]
fn an_empty_message_before_a_lent_one_is_not_taken_for_it() {
    let mut p = lending_pair();
    p.send_msg(A, Vec::new());
    lend(&mut p, A, vec![1; 64], 2);
    p.run();
    assert_eq!(p.recv_msg(B), Some(Vec::new()));
    begin_fetch(&mut p, B).unwrap();
    p.run();
    assert_eq!(p.conn_mut(B).finish_fetch(), Some(64));
}

#[test]
fn a_descriptor_split_at_the_rings_end_arrives_whole() {
    let mut p = lending_pair();
    // Leave 10 bytes before the end of B's 8 KiB ring.
    let fill = 8192 - 10;
    let mut sent = 0;
    while sent < fill {
        sent += p.write(A, &vec![0; fill - sent]);
        p.run();
        let got = p.read(B, fill);
        assert!(!got.is_empty() || sent == fill);
    }
    p.run();
    p.read(B, fill);
    lend(&mut p, A, vec![5; 300], 3);
    p.run();
    let w = p.conn(B).recv_window();
    assert!(w.lent && w.len == 10 && !w.ends_message, "{w:?}");
    begin_fetch(&mut p, B).unwrap();
    p.run();
    assert_eq!(p.conn_mut(B).finish_fetch(), Some(300));
    assert_eq!(p.sides[B].fetch_target, vec![5; 300]);
}

#[test]
fn a_reader_that_shut_down_returns_what_it_was_lent() {
    let mut p = lending_pair();
    p.conn_mut(B).shutdown_read();
    lend(&mut p, A, vec![1; 100], 4);
    p.run();
    assert!(p.sides[B].log.iter().all(|t| !t.read), "nothing is fetched");
    assert!(p.sides[B].imms().contains(&Imm::Control(Control::Return)));
    assert_eq!(take_returns(&mut p, A), 1);
}

#[test]
fn the_end_of_stream_waits_for_the_region_being_fetched() {
    let mut p = lending_pair();
    lend(&mut p, A, vec![3; 100], 5);
    p.conn_mut(A).shutdown_write();
    p.hold_wire[B] = true; // B's READs stay on the wire
    p.run();
    begin_fetch(&mut p, B).unwrap();
    p.run();
    assert!(!p.conn(B).is_eof(), "the region comes before the end");
    p.hold_wire[B] = false;
    p.run();
    assert!(!p.conn(B).is_eof());
    assert_eq!(p.conn_mut(B).finish_fetch(), Some(100));
    assert!(p.conn(B).is_eof());
}

#[test]
fn lending_needs_both_hellos() {
    let mut l = small();
    l.lends = false;
    let mut p = Pair::new(small(), l);
    assert!(!p.conn(A).can_lend() && !p.conn(B).can_lend());
    assert!(matches!(
        p.conn_mut(A).begin_lend(),
        Err(ConnError::Local(what)) if what.contains("does not take lent buffers")
    ));
    assert_eq!(p.conn(A).lent_outstanding(), 0);
}

#[test]
fn a_read_the_lenders_nic_refuses_is_the_lenders_lie() {
    let mut p = lending_pair();
    lend(&mut p, A, vec![1; 100], 6);
    p.run();
    // The lender revokes its key before the peer fetched (or never had it right).
    p.sides[A].lend_rkey = None;
    begin_fetch(&mut p, B).unwrap();
    p.run();
    match p.conn(B).error() {
        Some(ConnError::Protocol(what)) => {
            assert!(what.contains("could not be read"), "{what}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(!p.conn(B).fetch_done());
}

/// A lone connection that takes lent regions, fed `imm`s.
fn lone_lender() -> Connection {
    lone(1 << 20)
}

fn lend_imm() -> u32 {
    Imm::Control(Control::Lend).encode()
}

fn return_imm() -> u32 {
    Imm::Control(Control::Return).encode()
}

#[test]
fn every_lie_about_lending_ends_the_liars_connection() {
    type Case = (&'static str, &'static str, fn(&mut Connection));
    let cases: Vec<Case> = vec![
        (
            "a return of nothing lent",
            "returned 1 lent regions, but was lent only 0",
            |c| feed(c, return_imm(), 0),
        ),
        (
            "a lend in the middle of a message",
            "in the middle of a message",
            |c| {
                feed(c, piece(5, false), 5);
                feed(c, lend_imm(), 0);
            },
        ),
        ("two lends in a row", "another announcement", |c| {
            feed(c, lend_imm(), 0);
            feed(c, lend_imm(), 0);
        }),
        ("stream bytes after a lend", "stream bytes where", |c| {
            feed(c, lend_imm(), 0);
            feed(c, data(16), 16);
        }),
        ("a short descriptor", "descriptor of 15 bytes", |c| {
            feed(c, lend_imm(), 0);
            feed(c, piece(15, true), 15);
        }),
        (
            "a long descriptor",
            "descriptor of more than 17 bytes",
            |c| {
                feed(c, lend_imm(), 0);
                feed(c, piece(17, false), 17);
            },
        ),
        ("an empty descriptor", "descriptor of 0 bytes", |c| {
            feed(c, lend_imm(), 0);
            feed(c, piece(0, true), 0);
        }),
        ("a lend after the FIN", "after its FIN", |c| {
            feed(c, Imm::Control(Control::Fin).encode(), 0);
            feed(c, lend_imm(), 0);
        }),
        ("a lend with bytes", "carried 4 bytes", |c| {
            feed(c, lend_imm(), 4);
        }),
    ];
    for (case, mentions, lie) in cases {
        let mut c = lone_lender();
        lie(&mut c);
        assert_lied(&mut c, case, mentions);
    }
}

#[test]
fn a_lend_to_a_side_that_did_not_offer_is_a_lie() {
    let mut l = limits(4096, 4096, 128, 16, 4096);
    l.lends = false;
    let mut c = Connection::new(l, hello_of(&limits(4096, 4096, 8, 16, 4096)));
    feed(&mut c, lend_imm(), 0);
    assert_lied(&mut c, "a lend not offered", "did not offer");
}

#[test]
fn a_bad_descriptor_ends_the_connection_when_the_fetch_begins() {
    for (case, lend, mentions) in [
        (
            "too large",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: (1 << 20) + 1,
            },
            "larger than",
        ),
        (
            "empty",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: 0,
            },
            "0 bytes",
        ),
        (
            "wrapping",
            Lend {
                addr: u64::MAX - 10,
                rkey: 1,
                len: 100,
            },
            "wraps",
        ),
    ] {
        let mut c = lone_lender();
        feed(&mut c, lend_imm(), 0);
        feed(&mut c, piece(16, true), 16);
        let w = c.recv_window();
        assert!(w.lent && w.len == 16 && w.ends_message, "{case}: {w:?}");
        c.consume_message(w.len, w.ends_message);
        let e = c.begin_fetch(&lend.encode()).unwrap_err();
        assert!(matches!(e, ConnError::Protocol(_)), "{case}: {e:?}");
        assert!(c.fetching().is_none(), "{case}");
        assert_lied(&mut c, case, mentions);
    }
}

#[test]
fn a_descriptor_still_arriving_is_not_readable() {
    let mut c = lone_lender();
    feed(&mut c, lend_imm(), 0);
    feed(&mut c, piece(10, false), 10);
    assert!(!c.has_unread(), "half a descriptor is nothing to read");
    let w = c.recv_window();
    assert_eq!((w.len, w.ends_message), (0, false), "{w:?}");
    feed(&mut c, piece(6, true), 6);
    assert!(c.has_unread());
    let w = c.recv_window();
    assert!(w.lent && w.len == 16 && w.ends_message, "{w:?}");
}
