//! Keep-alive and failures: probes, silent peers, flushes, retries, overruns, the FIN's order.

use super::*;

// ------------------------------------------------------------------------- keep-alive

#[test]
fn keepalive_probes_after_a_quiet_period_and_the_peer_answers() {
    let period = Duration::from_millis(100);
    let ms = Duration::from_millis(1);
    let mut p = Pair::new(small(), small());
    assert_eq!(p.conn(A).poll_timeout(), None, "off by default");
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    assert_eq!(p.conn(A).poll_timeout(), Some(t0 + period));

    p.advance(period - ms);
    p.timeout(A);
    p.run();
    assert!(p.sides[A].log.is_empty(), "no probe before the period");

    p.advance(ms);
    p.timeout(A);
    p.hold_wire[A] = true;
    p.run();
    let log = &p.sides[A].log;
    assert_eq!(log.len(), 1);
    assert_eq!(imm_of(&log[0]), Imm::Control(Control::Ping));
    assert!(log[0].signaled);
    assert_eq!(
        p.conn(A).poll_timeout(),
        None,
        "a probe on the wire waits for its send completion, not for a clock"
    );

    // The peer answers a little later.
    p.advance(10 * ms);
    p.hold_wire[A] = false;
    p.run();
    assert_eq!(p.sides[B].imms(), vec![Imm::Control(Control::Pong)]);
    assert!(!p.conn(A).ping_outstanding);
    let heard = t0 + period + 10 * ms;
    assert_eq!(p.conn(A).poll_timeout(), Some(heard + period));
    p.advance(period - 10 * ms);
    p.timeout(A);
    assert!(
        p.conn(A).error().is_none(),
        "answered: no failure at t0 + 2p"
    );
    // And the next quiet period probes again.
    p.advance(10 * ms);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].imms().len(), 2);
    assert!(p.conn(A).error().is_none());
}

#[test]
fn keepalive_fails_when_the_peer_stays_silent() {
    let period = Duration::from_millis(100);
    let ms = Duration::from_millis(1);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    // The peer's NIC acknowledges the probe; its process never looks (stopped, hung).
    p.hold_recv_cq[B] = true;
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].imms(), vec![Imm::Control(Control::Ping)]);
    assert_eq!(p.conn(A).poll_timeout(), None, "not acknowledged yet");
    // The acknowledgement comes 30 ms later (retransmissions on a lossy link): the
    // deadline counts from it.
    p.advance(30 * ms);
    p.hold_wire[A] = false;
    p.run();
    let acked = t0 + period + 30 * ms;
    assert_eq!(p.conn(A).poll_timeout(), Some(acked + period));
    p.advance(period - ms);
    p.timeout(A);
    assert!(p.conn(A).error().is_none());
    p.advance(ms);
    p.timeout(A);
    assert_eq!(p.conn(A).error(), Some(&ConnError::KeepAlive(period)));
    assert_eq!(p.conn(A).poll_timeout(), None);
    assert!(p.conn_mut(A).poll_transmit().is_none());
    assert_eq!(
        p.conn_mut(A).commit_send(1, false),
        Err(ConnError::KeepAlive(period))
    );
}

#[test]
fn keepalive_stays_quiet_while_the_peer_talks() {
    let period = Duration::from_millis(100);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    for _ in 0..20 {
        p.advance(period / 2);
        p.write_stream(B, 10);
        p.run();
        p.timeout(A);
        p.run();
        p.read_stream(A, 100);
    }
    assert!(
        !p.sides[A].imms().contains(&Imm::Control(Control::Ping)),
        "no probe while data arrives"
    );
    assert_eq!(p.conn(A).poll_timeout(), Some(p.now + period));
    let now = p.now;
    p.conn_mut(A).set_keepalive(None, now);
    assert_eq!(p.conn(A).poll_timeout(), None);
}

#[test]
fn keepalive_leaves_a_probe_stuck_in_the_transport_to_the_transport() {
    // A lossy link holds the probe behind retransmissions for many periods: that is not
    // the peer's process failing to answer, and the transport's retries bound it.
    let period = Duration::from_millis(100);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].imms(), vec![Imm::Control(Control::Ping)]);
    for _ in 0..10 {
        p.advance(period);
        p.timeout(A);
        p.run();
        assert!(
            p.conn(A).error().is_none(),
            "no keep-alive failure while unacknowledged"
        );
        assert_eq!(p.conn(A).poll_timeout(), None);
    }
    assert_eq!(p.sides[A].imms().len(), 1, "one probe at a time");
    // The link finally delivers: the peer answers, all is well.
    p.hold_wire[A] = false;
    p.run();
    assert!(!p.conn(A).ping_outstanding);
    assert!(p.conn(A).error().is_none());
    assert_eq!(p.conn(A).poll_timeout(), Some(p.now + period));
}

#[test]
fn keepalive_times_a_stuck_probe_when_the_transport_retries_rnr_for_ever() {
    // The peer draws its receives from a shared pool and asked for RNR retries for ever:
    // its process stopped with the pool empty, so the probe neither completes nor fails.
    // The deadline runs from when the probe was wanted, not from its acknowledgement.
    let period = Duration::from_millis(100);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_rnr_forever(true);
    p.conn_mut(A).set_keepalive(Some(period), t0);
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].imms(), vec![Imm::Control(Control::Ping)]);
    assert_eq!(
        p.conn(A).poll_timeout(),
        Some(t0 + 2 * period),
        "a probe on the wire keeps the deadline it got when wanted"
    );
    p.advance(period - Duration::from_millis(1));
    p.timeout(A);
    assert!(p.conn(A).error().is_none());
    p.advance(Duration::from_millis(1));
    p.timeout(A);
    assert_eq!(p.conn(A).error(), Some(&ConnError::KeepAlive(period)));
}

#[test]
fn keepalive_with_rnr_for_ever_still_counts_from_an_acknowledged_probe() {
    // The probe is acknowledged late (the pool was refilled just in time): the peer's
    // process has another period to answer, as on any connection.
    let period = Duration::from_millis(100);
    let ms = Duration::from_millis(1);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_rnr_forever(true);
    p.conn_mut(A).set_keepalive(Some(period), t0);
    p.hold_recv_cq[B] = true;
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    p.advance(90 * ms);
    p.hold_wire[A] = false;
    p.run();
    assert_eq!(
        p.conn(A).poll_timeout(),
        Some(t0 + period + 90 * ms + period)
    );
    p.advance(period - ms);
    p.timeout(A);
    assert!(p.conn(A).error().is_none(), "the answer still has time");
    p.hold_recv_cq[B] = false;
    p.run();
    assert!(!p.conn(A).ping_outstanding);
    assert!(p.conn(A).error().is_none());
}

#[test]
fn keepalive_with_a_probe_the_transport_gives_up_on_is_unreachable() {
    let period = Duration::from_millis(100);
    let mut p = Pair::new(small(), small());
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    p.advance(5 * period);
    p.retry_exceeded(A);
    p.deliver_all();
    assert!(
        matches!(p.conn(A).broken(), Some(ConnError::Unreachable(_))),
        "{:?}",
        p.conn(A).broken()
    );
    assert!(p.conn(A).error().is_none(), "not a keep-alive failure");
    assert_eq!(p.conn(A).poll_timeout(), None);
}

#[test]
fn keepalive_fails_when_the_probe_cannot_even_be_posted() {
    // Every send queue entry is taken by writes the peer's NIC never acknowledges: the
    // probe never reaches the wire, so its deadline runs from when it was wanted.
    let period = Duration::from_millis(100);
    let mut p = Pair::new(limits(8192, 4096, 16, 8, 1500), small());
    let t0 = p.now;
    p.conn_mut(A).set_keepalive(Some(period), t0);
    p.hold_wire[A] = true;
    for _ in 0..8 {
        p.send_msg(A, vec![1]);
        p.run();
    }
    assert_eq!(p.conn(A).sq_free(), 0);
    let sent = p.sides[A].log.len();
    p.advance(period);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].log.len(), sent, "no room for the probe");
    assert_eq!(p.conn(A).poll_timeout(), Some(t0 + 2 * period));
    p.advance(period);
    p.timeout(A);
    assert_eq!(p.conn(A).error(), Some(&ConnError::KeepAlive(period)));
}

// ------------------------------------------------------------------------- failures

#[test]
fn a_flush_mid_transfer_lets_the_reader_drain_then_reports_the_reset() {
    let mut p = Pair::new(small(), small());
    assert_eq!(p.write_stream(A, 4096), 4096);
    p.pump(A);
    assert!(p.wire[A].len() >= 3, "three writes of at most 1500 bytes");
    p.land(A);
    p.land(A);
    p.deliver_recv(B);
    p.flush_all();
    for s in [A, B] {
        assert!(matches!(p.conn(s).broken(), Some(ConnError::Reset(_))));
        assert!(p.conn(s).error().is_none(), "not a protocol error");
        assert_eq!(p.conn(s).send_window().1, 0);
        assert!(p.conn_mut(s).poll_transmit().is_none());
        assert_eq!(p.conn(s).poll_timeout(), None);
    }
    // The two writes that landed are read; then nothing, and no end of stream.
    assert_eq!(p.read_stream(B, 1 << 20), 3000);
    assert!(!p.conn(B).is_eof());
    assert!(
        p.conn(B).is_readable(true),
        "a reader wakes to see the reset"
    );
    p.run();
    assert_eq!(p.read_stream(B, 1 << 20), 0);
}

#[test]
fn a_flush_after_the_fin_still_ends_the_stream_cleanly() {
    let mut p = Pair::new(small(), small());
    p.write_stream(A, 1000);
    p.conn_mut(A).shutdown_write();
    p.run();
    p.flush_all();
    assert!(p.conn(B).broken().is_some());
    assert_eq!(p.read_stream(B, 1 << 20), 1000);
    assert!(p.conn(B).is_eof());
}

#[test]
fn retry_exceeded_is_unreachable() {
    let mut p = Pair::new(small(), small());
    p.write_stream(A, 3000);
    p.pump(A);
    p.retry_exceeded(A);
    p.run();
    assert!(matches!(
        p.conn(A).broken(),
        Some(ConnError::Unreachable(_))
    ));
    assert_eq!(p.conn(A).send_window().1, 0);
    assert!(p.conn_mut(A).poll_transmit().is_none());
    // The peer learns it from the connection manager.
    p.flush_all();
    assert!(
        matches!(p.conn(A).broken(), Some(ConnError::Unreachable(_))),
        "first cause kept"
    );
    assert!(matches!(p.conn(B).broken(), Some(ConnError::Reset(_))));
}

#[test]
fn a_retry_exceeded_completion_of_a_landed_write_is_unreachable_too() {
    let mut p = Pair::new(small(), small());
    p.fail_next_send[A] = Some(Completion::RetryExceeded);
    p.write_stream(A, 4096);
    p.run();
    assert!(matches!(
        p.conn(A).broken(),
        Some(ConnError::Unreachable(_))
    ));
}

#[test]
fn a_cq_overrun_is_a_local_error() {
    let mut p = Pair::new(small(), small());
    p.write_stream(A, 100);
    p.run();
    p.conn_mut(A)
        .on_local_error("the completion queue overran".into());
    let e = p.conn(A).error().cloned();
    assert!(matches!(e, Some(ConnError::Local(_))), "{e:?}");
    assert!(p.conn_mut(A).poll_transmit().is_none());
    assert_eq!(p.conn_mut(A).commit_send(1, false), Err(e.clone().unwrap()));
    assert!(p.conn(A).is_readable(true) && p.conn(A).is_readable(false));
    // Sticky: a later failure does not replace it.
    p.conn_mut(A).on_local_error("another".into());
    assert_eq!(p.conn(A).error().cloned(), e);
}

#[test]
fn a_completion_for_a_request_not_in_flight_is_a_local_error() {
    let mut p = Pair::new(small(), small());
    p.conn_mut(A)
        .on_send_completion(7, Completion::Ok, Instant::now());
    assert!(matches!(p.conn(A).error(), Some(ConnError::Local(_))));
}

/// Where the FIN and the last message end are in side `s`'s log.
fn fin_and_last_end(p: &Pair, s: usize) -> (Option<usize>, Option<usize>) {
    let imms = p.sides[s].imms();
    let fin = imms.iter().position(|i| *i == Imm::Control(Control::Fin));
    let end = imms
        .iter()
        .rposition(|i| matches!(i, Imm::Data { eom: true, .. }));
    (fin, end)
}

#[test]
fn an_empty_message_before_shutdown_goes_before_the_fin() {
    // The reader's completions wait (its receives are not posted again): the writer is down
    // to the control reserve when the empty message and the shutdown come. The FIN, a
    // control message, could go; it must wait for the message.
    let la = limits(65536, 65536, 8, 32, 65536);
    let lb = limits(65536, 65536, 8, 32, 65536);
    let mut p = Pair::new(la, lb);
    p.hold_recv_cq[B] = true;
    for i in 0..4u8 {
        p.send_msg(A, vec![i]);
    }
    p.run();
    assert_eq!(p.conn(A).peer_recvs_free(), u64::from(CONTROL_RESERVE));
    p.send_msg(A, Vec::new());
    p.conn_mut(A).shutdown_write();
    p.run();
    assert_eq!(fin_and_last_end(&p, A).0, None, "no FIN before the message");
    p.hold_recv_cq[B] = false;
    let mut got = Vec::new();
    for _ in 0..20 {
        while let Some(m) = p.recv_msg(B) {
            got.push(m);
        }
        p.run();
    }
    assert!(p.conn(B).error().is_none(), "{:?}", p.conn(B).error());
    assert_eq!(got, vec![vec![0], vec![1], vec![2], vec![3], vec![]]);
    assert!(p.conn(B).is_eof());
    let (fin, end) = fin_and_last_end(&p, A);
    assert!(
        end < fin,
        "the message end ({end:?}) before the FIN ({fin:?})"
    );
}

#[test]
fn a_message_end_waiting_for_ring_credit_goes_before_the_fin() {
    // Stream bytes leave the reader's ring 32 units free: an empty message's end (64) must
    // wait for credit, the FIN (no ring units) could go, and must wait for the end.
    let la = limits(65536, 65536, 16, 32, 65536);
    let lb = limits(4096, 65536, 16, 32, 65536);
    let mut p = Pair::new(la, lb);
    assert_eq!(p.write_stream(A, 4096 - 32), 4096 - 32);
    p.send_msg(A, Vec::new());
    p.conn_mut(A).shutdown_write();
    p.run();
    assert_eq!(fin_and_last_end(&p, A), (None, None), "both wait");
    assert!(!p.conn(B).is_eof());
    assert_eq!(p.read_stream(B, 1 << 20), 4096 - 32);
    p.run();
    let (fin, end) = fin_and_last_end(&p, A);
    assert!(end.is_some() && end < fin, "end {end:?}, FIN {fin:?}");
    assert!(!p.conn(B).is_eof(), "the empty message is unread");
    assert_eq!(p.recv_msg(B), Some(Vec::new()));
    assert!(p.conn(B).is_eof());
    assert!(p.conn(B).error().is_none(), "{:?}", p.conn(B).error());
}

#[test]
fn nothing_can_be_committed_after_shutdown() {
    let mut p = Pair::new(small(), small());
    p.conn_mut(A).shutdown_write();
    assert!(p.conn_mut(A).commit_send(1, false).is_err());
    assert!(
        p.conn_mut(A).commit_send(0, true).is_err(),
        "an empty message after the FIN would break the peer"
    );
    p.run();
    assert!(p.conn(B).is_eof());
    assert!(p.conn(B).error().is_none());
}

#[test]
fn a_stream_longer_than_max_message_is_not_a_message() {
    // max_message bounds messages; a stream (no message ends) may be any length.
    let mut lb = small();
    lb.max_message = 5000;
    let mut p = Pair::new(small(), lb);
    let total = 50_000;
    while p.sides[B].inp < total {
        p.write_stream(A, total - p.sides[A].out);
        p.run();
        p.read_stream(B, 1 << 20);
    }
    p.conn_mut(A).shutdown_write();
    p.run();
    assert!(p.conn(B).error().is_none(), "{:?}", p.conn(B).error());
    assert!(p.conn(B).is_eof());
}
