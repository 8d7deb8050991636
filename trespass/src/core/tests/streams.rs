//! Streams and messages between two honest sides: echoes, wrapping, credit, signalling,
//! coalescing, half-close.

use super::*;

// ------------------------------------------------------------------------- streams

#[test]
fn small_echo() {
    let mut p = Pair::new(small(), small());
    assert_eq!(p.write(A, b"hello"), 5);
    p.run();
    assert_eq!(p.read(B, 100), b"hello");
    assert!(!p.conn(B).has_unread());
    assert_eq!(p.write(B, b"hello back"), 10);
    p.run();
    assert_eq!(p.read(A, 100), b"hello back");
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());
}

#[test]
fn large_echo_wraps_ring_and_send_buffer_many_times() {
    // Odd sizes on purpose: offsets wrap at different places on each side.
    let la = limits(4096, 5000, 8, 8, 1000);
    let lb = limits(6000, 4096, 12, 16, 4096);
    let mut p = Pair::new(la, lb);
    let mut rng = Rng(7);
    let payload = rng.bytes(300_000);
    let (mut sent, mut echoed) = (0, Vec::new());
    let mut at_b: VecDeque<u8> = VecDeque::new();
    for _ in 0..100_000 {
        if echoed.len() == payload.len() {
            break;
        }
        let chunk = (rng.below(9000) as usize).min(payload.len() - sent);
        sent += p.write(A, &payload[sent..sent + chunk]);
        p.run();
        at_b.extend(p.read(B, rng.below(12_000) as usize));
        let back: Vec<u8> = at_b.iter().copied().collect();
        let n = p.write(B, &back);
        at_b.drain(..n);
        p.run();
        echoed.extend(p.read(A, rng.below(12_000) as usize));
        assert_eq!(echoed[..], payload[..echoed.len()]);
    }
    assert_eq!(echoed, payload);
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());
}

#[test]
fn half_close_delivers_every_byte_then_eof() {
    let mut p = Pair::new(small(), small());
    let data = Rng(3).bytes(30_000);
    let mut sent = 0;
    let mut got = Vec::new();
    while sent < data.len() {
        sent += p.write(A, &data[sent..]);
        p.run();
        got.extend(p.read(B, 5000));
    }
    p.conn_mut(A).shutdown_write();
    assert!(p.conn(A).write_shut());
    assert_eq!(p.conn(A).send_window().1, 0, "nothing more can be written");
    for _ in 0..100 {
        p.run();
        assert!(!p.conn(B).is_eof() || got.len() == data.len());
        got.extend(p.read(B, 3000));
    }
    assert_eq!(got, data);
    assert!(p.conn(B).is_eof());
    assert!(p.conn(B).is_readable(true) && p.conn(B).is_readable(false));
    assert!(p.conn(A).fin_done(), "the FIN completed");
    assert_eq!(p.conn(A).unacknowledged(), 0);
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());

    // The other direction still works, and closes the same way.
    assert_eq!(p.write(B, b"still here"), 10);
    p.conn_mut(B).shutdown_write();
    p.run();
    assert!(!p.conn(A).is_eof(), "not before the bytes are read");
    assert_eq!(p.read(A, 100), b"still here");
    assert!(p.conn(A).is_eof());
    assert!(p.conn(B).fin_done());
}

#[test]
fn a_fast_writer_never_overruns_and_resumes_when_the_reader_reads() {
    let la = limits(4096, 65536, 16, 32, 65536);
    let lb = limits(4096, 4096, 16, 32, 4096);
    let ring = u64::from(lb.ring_size);
    let mut p = Pair::new(la, lb);
    // The reader does not read: the writer fills the ring, then its own send buffer.
    while p.write_stream(A, 1 << 20) > 0 {
        p.run();
    }
    p.run();
    assert!(!p.conn(A).is_writable());
    assert_eq!(p.sides[A].out, ring + u64::from(la.send_buffer));
    assert_eq!(p.conn(B).tail - p.conn(B).head, ring, "the ring is full");
    assert_eq!(p.conn(A).posted, ring, "and nothing was posted beyond it");

    // Less than a credit's worth read: nothing moves.
    assert_eq!(p.read_stream(B, ring / 4 - 1), ring / 4 - 1);
    p.run();
    assert!(!p.conn(A).is_writable());
    assert_eq!(p.conn(A).posted, ring);
    // One byte more: the credit goes back, the writer posts and can write again.
    assert_eq!(p.read_stream(B, 1), 1);
    p.run();
    assert_eq!(p.conn(A).posted, ring + ring / 4);
    assert!(p.conn(A).is_writable());

    // The reader at its own slow, random pace: everything arrives, in order.
    let mut rng = Rng(11);
    let total = 1 << 20;
    while p.sides[B].inp < total {
        let room = total - p.sides[A].out;
        p.write_stream(A, room.min(rng.below(70_000)));
        p.run();
        p.read_stream(B, rng.below(3000));
        p.run();
    }
    assert_eq!(p.sides[B].inp, total);
}

#[test]
fn messages_larger_than_the_ring_and_empty_messages_arrive_whole() {
    let la = limits(4096, 8192, 8, 16, 3000);
    let lb = limits(4096, 4096, 8, 16, 4096);
    let mut p = Pair::new(la, lb);
    let mut rng = Rng(5);
    let sizes = [0, 1, 4095, 4096, 4097, 20_000, 0, 0, 70_000, 5, 8192, 0];
    let sent: Vec<Vec<u8>> = sizes.iter().map(|&n| rng.bytes(n)).collect();
    for m in &sent {
        p.send_msg(A, m.clone());
    }
    p.run();
    assert!(
        p.conn(B).is_readable(false),
        "a whole message, or half a ring of a long one"
    );
    let mut got = Vec::new();
    for _ in 0..10_000 {
        p.run();
        while let Some(m) = p.recv_msg(B) {
            got.push(m);
        }
        if got.len() == sent.len() {
            break;
        }
    }
    assert_eq!(got.len(), sent.len());
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(
            g == s,
            "message {i}: {} bytes received, {} sent",
            g.len(),
            s.len()
        );
    }
    assert!(!p.conn(B).has_unread());
    assert!(p.conn(B).boundaries.is_empty());
}

#[test]
fn unread_messages_are_bounded_by_ring_credit_not_by_receives() {
    // The reader's 4 KiB ring holds ring / MSG_CHARGE = 64 unread empty messages; it has
    // only 8 receives, and holds none of them.
    let la = limits(65536, 65536, 8, 32, 65536);
    let lb = limits(4096, 65536, 8, 32, 65536);
    let ring = u64::from(lb.ring_size);
    let quarter = ring / BYTE_CREDIT_DIVISOR;
    for size in [0usize, 3] {
        let cost = size as u64 + CHARGE;
        let most = ring / cost;
        let total = most + 40;
        let mut p = Pair::new(la, lb);
        let want: Vec<Vec<u8>> = (0..total).map(|i| vec![i as u8; size]).collect();
        for m in &want {
            p.send_msg(A, m.clone());
        }
        p.run();
        // The writer stops when the ring's credit is spent...
        assert_eq!(p.conn(B).boundaries.len() as u64, most, "size {size}");
        assert_eq!(p.conn(A).msgs_sent, most);
        assert!(p.conn(A).charged() - p.conn(A).peer_consumed.get() > ring - cost);
        // ...not when the receives are: each went back as soon as its write arrived.
        assert_eq!(p.sides[B].recvs_posted, u64::from(lb.recv_depth));
        assert!(p.conn(A).peer_recvs_free() > u64::from(CONTROL_RESERVE));
        assert!(p.conn(B).is_readable(false));

        // Reading: less than a quarter of the ring's units returns nothing...
        let per_credit = quarter.div_ceil(cost);
        let mut got = Vec::new();
        for _ in 0..per_credit - 1 {
            got.push(p.recv_msg(B).expect("a message waits"));
        }
        p.run();
        assert_eq!(p.conn(A).msgs_sent, most, "size {size}: no credit yet");
        // ...one more message's worth, and the writer resumes.
        got.push(p.recv_msg(B).expect("a message waits"));
        p.run();
        assert!(
            p.conn(A).msgs_sent > most,
            "size {size}: the writer resumed"
        );
        // The rest at the reader's pace: all arrive, in order.
        for _ in 0..1000 {
            while let Some(m) = p.recv_msg(B) {
                got.push(m);
            }
            p.run();
            if got.len() as u64 == total {
                break;
            }
        }
        assert_eq!(got, want, "size {size}");
        assert!(p.sides[A].msgs_out.is_empty());
        assert_eq!(p.conn(B).consumed_units(), p.conn(A).charged());
    }
}

#[test]
fn unread_messages_do_not_stop_their_holder_returning_byte_credit() {
    // The deadlock of holding a receive per unread message: with 16 receives (a credit
    // report every 4) and 4 kept for control, a reader holding 16 - 16/4 unread messages
    // left its peer 4 receives for credit returns, used 3 of them and never heard that
    // they were posted again (3 < 4): its byte credits stopped, and with them a large
    // stream the other way. Now receives go back at once and the messages wait in ring
    // credit: the stream flows while the messages stay unread.
    let la = limits(8192, 65536, 16, 32, 4096);
    let lb = limits(65536, 65536, 16, 32, 4096);
    let mut p = Pair::new(la, lb);
    let msgs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 3]).collect();
    for m in &msgs {
        p.send_msg(A, m.clone());
    }
    p.run();
    let held = usize::from(lb.recv_depth) - usize::from(lb.recv_depth) / 4;
    assert!(
        p.conn(B).boundaries.len() >= held,
        "the scenario: B holds unread messages"
    );
    assert_eq!(p.conn(B).boundaries.len(), msgs.len());

    // B streams to A through A's small ring: A must return byte credit again and again.
    let total = 1 << 20;
    let mut rng = Rng(17);
    for _ in 0..100_000 {
        if p.sides[A].inp == total {
            break;
        }
        let left = total - p.sides[B].out;
        p.write_stream(B, left.min(rng.below(20_000)));
        p.run();
        p.read_stream(A, rng.below(6000));
        p.run();
    }
    assert_eq!(
        p.sides[A].inp, total,
        "the stream stalled behind unread messages"
    );
    let credits = p.sides[A]
        .imms()
        .into_iter()
        .filter(|i| matches!(i, Imm::CreditBytes(_)))
        .count() as u64;
    assert!(
        credits >= total / u64::from(la.ring_size),
        "{credits} byte credits"
    );
    // The messages waited all along, and are all there.
    assert_eq!(p.conn(B).boundaries.len(), msgs.len());
    let got: Vec<Vec<u8>> = std::iter::from_fn(|| p.recv_msg(B)).collect();
    assert_eq!(got, msgs);
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());
}

#[test]
fn byte_credit_counts_a_message_charge_per_message_read() {
    // A quarter of a 4 KiB ring is 1024 units: 16 empty messages read.
    let la = limits(65536, 65536, 16, 32, 65536);
    let lb = limits(4096, 65536, 16, 32, 65536);
    let mut p = Pair::new(la, lb);
    for _ in 0..40 {
        p.send_msg(A, Vec::new());
    }
    p.send_msg(A, vec![7; 100]);
    p.run();
    let byte_credits = |p: &Pair| -> Vec<Imm> {
        p.sides[B]
            .imms()
            .into_iter()
            .filter(|i| matches!(i, Imm::CreditBytes(_)))
            .collect()
    };
    for _ in 0..15 {
        assert_eq!(p.recv_msg(B), Some(Vec::new()));
    }
    p.run();
    assert!(byte_credits(&p).is_empty());
    assert_eq!(p.recv_msg(B), Some(Vec::new()));
    p.run();
    assert_eq!(byte_credits(&p), vec![Imm::CreditBytes(16 * MSG_CHARGE)]);
    assert_eq!(p.conn(A).peer_consumed.get(), 16 * CHARGE);
    // A stream reader passes over message ends and is charged for them the same way.
    assert_eq!(p.read(B, 1 << 20), vec![7; 100]);
    p.run();
    assert_eq!(p.conn(B).consumed_units(), 100 + 41 * CHARGE);
    assert_eq!(
        byte_credits(&p).last(),
        Some(&Imm::CreditBytes(100 + 41 * MSG_CHARGE))
    );
    assert_eq!(p.conn(A).peer_consumed.get(), p.conn(A).charged());
}

#[test]
fn a_message_end_without_room_for_its_charge_follows_its_bytes() {
    // A 4 KiB ring, writes as large as it: (stream bytes before, message length) -> the
    // message's writes before anything is read, then after.
    let la = limits(65536, 65536, 16, 32, 65536);
    let lb = limits(4096, 65536, 16, 32, 65536);
    type Writes = &'static [(u32, bool, bool)];
    let cases: [(u64, usize, Writes, Writes); 6] = [
        // Its bytes and its charge fill the ring exactly: one write with the end.
        (0, 4032, &[(4032, true, true)], &[]),
        (4000, 32, &[(32, true, true)], &[]),
        // Room for its bytes, not for its end: the end follows as a zero-length write.
        (0, 4033, &[(4033, true, false)], &[(0, true, true)]),
        (0, 4096, &[(4096, true, false)], &[(0, true, true)]),
        (4000, 33, &[(33, true, false)], &[(0, true, true)]),
        // Longer than the ring: its end goes with its last bytes, where it fits.
        (0, 5000, &[(4096, true, false)], &[(904, true, true)]),
    ];
    for (i, (before, len, first, then)) in cases.into_iter().enumerate() {
        let mut p = Pair::new(la, lb);
        assert_eq!(p.write_stream(A, before), before);
        let m = Rng(21 + i as u64).bytes(len);
        p.send_msg(A, m.clone());
        p.run();
        let msg_writes = |p: &Pair| -> Vec<(u32, bool, bool)> {
            p.sides[A]
                .data_writes()
                .into_iter()
                .filter(|w| w.1)
                .collect()
        };
        assert_eq!(msg_writes(&p), first, "case {i}: before reading");
        let ended = first.last().is_some_and(|w| w.2);
        assert_eq!(p.conn(A).msgs_sent, u64::from(ended), "case {i}");
        assert_eq!(p.conn(B).msg_open, !ended, "case {i}");
        assert!(p.conn(A).charged() - p.conn(A).peer_consumed.get() <= 4096);
        // The reader reads: credit goes back, the rest of the message follows.
        assert_eq!(p.read(B, before as usize).len() as u64, before);
        let mut got = None;
        for _ in 0..10 {
            got = p.recv_msg(B);
            if got.is_some() {
                break;
            }
            p.run();
        }
        assert_eq!(got, Some(m), "case {i}");
        assert_eq!(msg_writes(&p), [first, then].concat(), "case {i}: in all");
        assert_eq!(p.conn(A).msgs_sent, 1);
    }
}

#[test]
fn a_stream_reader_passes_over_message_ends() {
    let mut p = Pair::new(small(), small());
    p.send_msg(A, b"ab".to_vec());
    p.send_msg(A, Vec::new());
    p.send_msg(A, b"cd".to_vec());
    p.run();
    assert_eq!(p.read(B, 100), b"abcd");
    assert!(!p.conn(B).has_unread());
    p.run();
    // Every message end was passed over and charged for.
    assert!(p.conn(B).boundaries.is_empty());
    assert_eq!(p.conn(B).msgs_read, 3);
    assert_eq!(p.conn(B).consumed_units(), 4 + 3 * CHARGE);
    assert_eq!(p.conn(B).consumed_units(), p.conn(A).charged());
}

#[test]
fn byte_credit_is_returned_at_a_quarter_of_the_ring() {
    // Pinned: a change of the ratio is a protocol change, and must change this test.
    assert_eq!(BYTE_CREDIT_DIVISOR, 4);
    let la = limits(65536, 65536, 64, 64, 4096);
    let lb = limits(16384, 4096, 64, 64, 4096);
    let ring = u64::from(lb.ring_size);
    let quarter = ring / BYTE_CREDIT_DIVISOR;
    let mut p = Pair::new(la, lb);
    assert_eq!(p.write_stream(A, ring), ring);
    p.run();
    assert_eq!(p.conn(B).tail, ring);
    let byte_credits = |p: &Pair| -> Vec<u32> {
        p.sides[B]
            .imms()
            .into_iter()
            .filter_map(|i| match i {
                Imm::CreditBytes(v) => Some(v),
                _ => None,
            })
            .collect()
    };
    for round in 1..=3u64 {
        p.read_stream(B, quarter - 1);
        p.run();
        assert_eq!(
            byte_credits(&p).len() as u64,
            round - 1,
            "not before a quarter"
        );
        p.read_stream(B, 1);
        p.run();
        assert_eq!(
            byte_credits(&p).last().copied(),
            Some((round * quarter) as u32),
            "a byte credit once exactly a quarter of the ring was read"
        );
        assert_eq!(byte_credits(&p).len() as u64, round);
        assert_eq!(p.conn(A).peer_consumed.get(), round * quarter);
    }
}

#[test]
fn receive_credit_is_returned_at_a_quarter_of_the_receives() {
    assert_eq!(RECV_CREDIT_DIVISOR, 4);
    let la = limits(65536, 65536, 32, 64, 4096);
    let lb = limits(65536, 65536, 32, 64, 4096);
    let threshold = u64::from(lb.recv_depth) / u64::from(RECV_CREDIT_DIVISOR);
    let mut p = Pair::new(la, lb);
    let recv_credits = |p: &Pair| -> Vec<u32> {
        p.sides[B]
            .imms()
            .into_iter()
            .filter_map(|i| match i {
                Imm::CreditRecvs(v) => Some(v),
                _ => None,
            })
            .collect()
    };
    for round in 1..=3u64 {
        for _ in 0..threshold - 1 {
            p.write_stream(A, 1);
            p.run();
        }
        assert_eq!(
            recv_credits(&p).len() as u64,
            round - 1,
            "not before a quarter"
        );
        p.write_stream(A, 1);
        p.run();
        assert_eq!(
            recv_credits(&p).last().copied(),
            Some((round * threshold) as u32)
        );
        assert_eq!(recv_credits(&p).len() as u64, round);
        // The writer knows all of the reader's receives free again.
        assert_eq!(p.conn(A).peer_recvs_free(), u64::from(lb.recv_depth));
    }
}

#[test]
fn signalling_bounds_the_send_queue() {
    // 16: a signal every 4th request; 13: every 3rd, and the 13th is signalled because it
    // fills the queue.
    for depth in [16, 13] {
        let la = limits(65536, 65536, 64, depth, 4096);
        let lb = limits(65536, 65536, 128, 64, 4096);
        let mut p = Pair::new(la, lb);
        p.hold_send_cq[A] = true;
        for _ in 0..40 {
            p.write_stream(A, 1);
            p.run();
        }
        // No completion came back: the queue is full and the rest waits.
        assert_eq!(p.conn(A).in_flight(), u64::from(depth));
        assert_eq!(p.sides[A].sq.len(), depth as usize);
        assert_eq!(p.conn(A).posted, u64::from(depth));
        assert!(p.conn_mut(A).poll_transmit().is_none());
        let log = &p.sides[A].log;
        assert!(
            log.last().unwrap().signaled,
            "the request that fills the queue is signalled"
        );
        let quarter = (depth / 4) as usize;
        for w in log.windows(quarter) {
            assert!(
                w.iter().any(|t| t.signaled),
                "a quarter of the queue without a signal"
            );
        }
        // The completions come back: everything goes out.
        p.hold_send_cq[A] = false;
        p.run();
        assert_eq!(p.read_stream(B, 100), 40);
        assert!(p.conn(A).in_flight() < u64::from(depth / 4));
    }
}

#[test]
fn a_full_send_buffer_is_signalled_so_it_empties() {
    let la = limits(65536, 4096, 64, 64, 512);
    let mut p = Pair::new(la, small());
    // Small writes: unsignalled while the buffer is less than half full, so at most half
    // of it ever waits for a completion once everything is out.
    for _ in 0..64 {
        p.write_stream(A, 256);
        p.run();
        p.read_stream(B, 1 << 20);
        p.run();
        assert!(p.conn(A).send_free() >= u64::from(la.send_buffer) / 2);
    }
    assert_eq!(p.sides[B].inp, 64 * 256);
    // A writer that fills the buffer and waits sees it empty.
    while p.write_stream(A, 1 << 20) > 0 {
        p.run();
    }
    assert!(!p.conn(A).is_writable());
    for _ in 0..100 {
        p.read_stream(B, 1 << 20);
        p.run();
    }
    assert_eq!(p.sides[B].inp, p.sides[A].out);
    assert!(p.conn(A).send_free() >= u64::from(la.send_buffer) / 2);
}

#[test]
fn request_signal_posts_one_plain_signalled_write_when_the_newest_is_unsignalled() {
    // A large send buffer and a deep queue: small writes go unsignalled.
    let la = limits(65536, 65536, 16, 64, 65536);
    let mut p = Pair::new(la, la);
    // Nothing in flight: nothing to signal.
    p.conn_mut(A).request_signal();
    p.run();
    assert!(p.sides[A].log.is_empty());

    p.write_stream(A, 100);
    p.run();
    assert_eq!(p.sides[A].log.len(), 1);
    assert!(!p.sides[A].log[0].signaled);
    assert_eq!(
        p.conn(A).unacknowledged(),
        100,
        "no completion comes for it"
    );
    assert_eq!(p.conn(A).in_flight(), 1);

    let recvs_free = p.conn(A).peer_recvs_free();
    let (imm_sent, charged) = (p.conn(A).imm_sent, p.conn(A).charged());
    p.conn_mut(A).request_signal();
    p.hold_wire[A] = true;
    p.pump(A);
    let plains = p.sides[A].plains();
    assert_eq!(plains.len(), 1, "exactly one");
    let t = plains[0];
    assert!(t.plain && t.signaled && t.len == 0, "{t:?}");
    assert_eq!(p.sides[A].log.last(), Some(&t));
    // It uses none of the peer's receives and no ring credit.
    assert_eq!(p.conn(A).peer_recvs_free(), recvs_free);
    assert_eq!(p.conn(A).imm_sent, imm_sent);
    assert_eq!(p.conn(A).charged(), charged);
    // Asking again: the newest request is signalled now.
    p.conn_mut(A).request_signal();
    assert!(p.conn_mut(A).poll_transmit().is_none());
    // It lands: no receive consumed at the peer, no receive completion there.
    let at_b = |p: &Pair| (p.sides[B].recvs_posted, p.sides[B].recv_cq.len());
    let before = at_b(&p);
    assert!(p.land(A));
    assert_eq!(at_b(&p), before);
    p.hold_wire[A] = false;
    p.run();
    assert_eq!(
        p.conn(A).unacknowledged(),
        0,
        "its completion frees what came before"
    );
    assert_eq!(p.conn(A).in_flight(), 0);
    assert!(
        p.sides[B].log.is_empty(),
        "the peer noticed nothing to answer"
    );
    assert_eq!(p.read_stream(B, 1000), 100);

    // Asked for while more waits to be posted: it goes after the newest write.
    p.write_stream(A, 10);
    p.run();
    p.write_stream(A, 20);
    p.conn_mut(A).request_signal();
    p.run();
    let log = &p.sides[A].log[2..];
    assert_eq!(log.len(), 3);
    assert!(log[..2].iter().all(|t| !t.plain && !t.signaled));
    assert_eq!((log[0].len, log[1].len), (10, 20));
    assert!(log[2].plain && log[2].signaled);
    assert_eq!(p.conn(A).unacknowledged(), 0);

    // The newest request signalled (a write filling half the buffer): none.
    p.write_stream(A, 40_000);
    p.run();
    assert!(p.sides[A].log.last().unwrap().signaled);
    let n = p.sides[A].log.len();
    p.conn_mut(A).request_signal();
    p.run();
    assert_eq!(p.sides[A].log.len(), n, "nothing to signal");
    assert_eq!(p.sides[A].plains().len(), 2);
    assert_eq!(p.conn(A).unacknowledged(), 0);
    assert_eq!(p.read_stream(B, 1 << 20), 40_030);
    assert!(p.conn(A).error().is_none() && p.conn(B).error().is_none());
}

#[test]
fn request_signal_acknowledges_what_was_posted_while_the_rest_waits_for_credit() {
    // The writer waits for the peer's ring credit with its posted bytes unsignalled: the
    // plain write goes out anyway (it needs no credit) and they complete.
    let la = limits(65536, 65536, 16, 64, 65536);
    let lb = limits(4096, 65536, 16, 64, 65536);
    let mut p = Pair::new(la, lb);
    p.write_stream(A, 8192);
    p.run();
    assert_eq!(p.conn(A).posted, 4096);
    assert!(p.sides[A].log.iter().all(|t| !t.signaled));
    assert_eq!(p.conn(A).unacknowledged(), 8192);
    p.conn_mut(A).request_signal();
    p.run();
    assert_eq!(p.sides[A].plains().len(), 1);
    assert_eq!(
        p.conn(A).unacknowledged(),
        4096,
        "only what waits for credit"
    );
    p.read_stream(B, 1 << 20);
    p.run();
    p.read_stream(B, 1 << 20);
    p.run();
    assert_eq!(p.sides[B].inp, 8192);
}

#[test]
fn shutdown_read_discards_and_returns_credit_so_a_blocked_writer_resumes() {
    let la = limits(4096, 65536, 16, 32, 65536);
    let lb = limits(4096, 4096, 16, 32, 4096);
    let ring = u64::from(lb.ring_size);
    let mut p = Pair::new(la, lb);
    // Unread messages, a message half arrived, then a stream that fills the writer's
    // buffer: the reader's ring is full and the writer blocked.
    p.send_msg(A, b"one".to_vec());
    p.send_msg(A, Vec::new());
    p.send_msg(A, vec![9; 10_000]);
    p.run();
    while p.write_stream(A, 1 << 20) > 0 {
        p.run();
    }
    p.run();
    assert!(!p.conn(A).is_writable());
    assert_eq!(p.conn(A).charged() - p.conn(A).peer_consumed.get(), ring);
    assert_eq!(p.conn(B).boundaries.len(), 2);
    assert!(p.conn(B).msg_open);

    p.conn_mut(B).shutdown_read();
    assert!(!p.conn(B).has_unread());
    assert!(p.conn(B).boundaries.is_empty());
    assert_eq!(p.conn(B).recv_window().len, 0);
    assert_eq!(
        p.conn(B).consumed_units(),
        p.conn(A).charged(),
        "all of it consumed at once"
    );
    p.run();
    assert!(p.conn(A).is_writable(), "the credit came back");

    // The reader never reads again: ten rings of stream and messages go out, and are thrown
    // away as they arrive.
    let target = p.sides[A].out + 10 * ring;
    for i in 0..1000u32 {
        if p.sides[A].out >= target {
            break;
        }
        p.write_stream(A, target - p.sides[A].out);
        if i % 3 == 0 {
            p.send_msg(A, vec![i as u8; (i as usize * 37) % 700]);
        }
        p.run();
    }
    p.run();
    assert!(
        p.sides[A].out >= target,
        "the writer blocked on a reader that left"
    );
    assert!(p.sides[A].msgs_out.is_empty());
    p.conn_mut(A).request_signal();
    p.run();
    assert_eq!(p.conn(A).posted, p.conn(A).app_tail);
    assert_eq!(p.conn(A).unacknowledged(), 0);
    assert!(!p.conn(B).has_unread());
    assert_eq!(p.read(B, 1 << 20), Vec::<u8>::new());
    assert_eq!(p.recv_msg(B), None);
    // The end of the stream still arrives; the other direction is untouched.
    p.conn_mut(A).shutdown_write();
    assert_eq!(p.write(B, b"still here"), 10);
    p.run();
    assert!(p.conn(B).is_eof());
    assert_eq!(p.read(A, 100), b"still here");
    assert!(p.conn(A).error().is_none(), "{:?}", p.conn(A).error());
    assert!(p.conn(B).error().is_none(), "{:?}", p.conn(B).error());
}

#[test]
fn nodelay_off_holds_small_writes_until_flush_or_a_message_end() {
    let la = limits(65536, 65536, 16, 16, 65536);
    let mut p = Pair::new(la, la);
    p.conn_mut(A).set_nodelay(false);
    assert!(!p.conn(A).nodelay());
    p.write_stream(A, 100);
    p.run();
    assert_eq!(p.conn(B).tail, 0, "held");
    p.conn_mut(A).flush();
    p.run();
    assert_eq!(p.conn(B).tail, 100, "flushed");
    p.write_stream(A, COALESCE_BYTES - 1);
    p.run();
    assert_eq!(p.conn(B).tail, 100, "held below the threshold");
    p.write_stream(A, 1);
    p.run();
    assert_eq!(
        p.conn(B).tail,
        100 + COALESCE_BYTES,
        "posted at the threshold"
    );
    p.read_stream(B, 1 << 20);
    p.send_msg(A, vec![1, 2, 3]);
    p.run();
    assert_eq!(p.recv_msg(B), Some(vec![1, 2, 3]), "a message end posts");
}

#[test]
fn nodelay_off_with_a_send_buffer_below_the_threshold_does_not_stall() {
    // A buffer smaller than COALESCE_BYTES can never hold that many pending bytes: a writer
    // that fills it and waits for room must still see its bytes go out.
    let la = limits(65536, 8192, 16, 16, 65536);
    let mut p = Pair::new(la, la);
    p.conn_mut(A).set_nodelay(false);
    let total = 100_000;
    for _ in 0..1000 {
        p.write_stream(A, total - p.sides[A].out);
        p.run();
        p.read_stream(B, 1 << 20);
        if p.sides[A].out == total {
            break;
        }
    }
    assert_eq!(
        p.sides[A].out, total,
        "the writer stalled on its full buffer"
    );
    p.conn_mut(A).flush();
    p.run();
    p.read_stream(B, 1 << 20);
    assert_eq!(p.sides[B].inp, total);
}

#[test]
fn counters_wrap_past_two_to_the_thirty() {
    let la = limits(4096, 4096, 8, 16, 1500);
    let lb = limits(6000, 5000, 8, 16, 4000);
    let mut p = Pair::new(la, lb);
    // Both directions start just below 2^30 credit units (bytes, and message ends read)
    // and 2^30 receives.
    let bytes = (1u64 << 30) - 4000;
    let msgs = 20;
    let units = bytes + msgs * CHARGE;
    let imms = (1u64 << 30) - 5;
    for from in [A, B] {
        let [a, b] = &mut p.sides;
        let (s, r) = if from == A { (a, b) } else { (b, a) };
        s.conn.app_tail = bytes;
        s.conn.posted = bytes;
        s.conn.completed = bytes;
        s.conn.msgs_sent = msgs;
        s.conn
            .peer_consumed
            .advance(wire_value(units), units)
            .unwrap();
        s.conn.imm_sent = imms;
        s.conn
            .peer_reposted
            .advance(wire_value(imms), imms)
            .unwrap();
        s.out = bytes;
        r.conn.tail = bytes;
        r.conn.head = bytes;
        r.conn.msgs_read = msgs;
        r.conn.credited = units;
        r.conn.reposted = imms;
        r.conn.reposted_reported = imms;
        r.landed = bytes;
        r.landed_msgs = msgs;
        r.inp = bytes;
    }
    p.check();
    // Stream bytes with empty messages among them (a stream reader passes over them).
    let total = 100_000;
    let mut rng = Rng(13);
    let mut empties = [0u64; 2];
    while p.sides[A].inp < bytes + total || p.sides[B].inp < bytes + total {
        for s in [A, B] {
            let left = bytes + total - p.sides[s].out;
            p.write_stream(s, left.min(rng.below(7000)));
            if rng.below(3) == 0 {
                p.send_msg(s, Vec::new());
                empties[s] += 1;
            }
        }
        p.run();
        p.read_stream(A, rng.below(5000));
        p.read_stream(B, rng.below(5000));
    }
    for _ in 0..10 {
        p.run();
        p.read_stream(A, u64::MAX);
        p.read_stream(B, u64::MAX);
    }
    for s in [A, B] {
        assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
        assert!(p.conn(s).peer_consumed.get() > 1 << 30);
        assert!(p.conn(s).peer_reposted.get() > 1 << 30);
        assert_eq!(p.conn(1 - s).msgs_read, msgs + empties[s]);
        assert_eq!(p.conn(1 - s).consumed_units(), p.conn(s).charged());
    }
}
