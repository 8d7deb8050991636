//! Hostile peers fed hand-made immediates: every lie ends the connection, and nothing else.

use super::*;

#[test]
fn a_lying_peer_gets_a_protocol_error_and_nothing_else() {
    type Case = (&'static str, &'static str, fn(&mut Connection));
    let cases: Vec<Case> = vec![
        ("data longer than the free ring", "free", |c| {
            feed(c, data(3000), 3000);
            feed(c, data(1500), 1500);
        }),
        ("data longer than the ring", "free", |c| {
            feed(c, data(4097), 4097)
        }),
        (
            "a write across the ring's end",
            "past the ring's end",
            |c| {
                feed(c, data(4000), 4000);
                c.consume(4000);
                feed(c, data(200), 200);
            },
        ),
        ("byte credit beyond what was written", "credited", |c| {
            c.commit_send(100, false).unwrap();
            let t = c.poll_transmit().unwrap();
            assert_eq!(t.len, 100);
            feed(c, Imm::CreditBytes(100).encode(), 0);
            assert!(c.error().is_none(), "all 100 bytes may be credited");
            feed(c, Imm::CreditBytes(101).encode(), 0);
        }),
        ("byte credit with nothing written", "credited", |c| {
            feed(c, Imm::CreditBytes(1).encode(), 0)
        }),
        ("receive credit beyond what was sent", "receives", |c| {
            c.commit_send(10, false).unwrap();
            c.poll_transmit().unwrap();
            feed(c, Imm::CreditRecvs(1).encode(), 0);
            assert!(c.error().is_none(), "one receive was used");
            feed(c, Imm::CreditRecvs(2).encode(), 0);
        }),
        ("a second FIN", "FIN", |c| {
            feed(c, Imm::Control(Control::Fin).encode(), 0);
            assert!(c.error().is_none());
            feed(c, Imm::Control(Control::Fin).encode(), 0);
        }),
        ("data after the FIN", "after its FIN", |c| {
            feed(c, Imm::Control(Control::Fin).encode(), 0);
            feed(c, data(10), 10);
        }),
        ("an empty message after the FIN", "after its FIN", |c| {
            feed(c, Imm::Control(Control::Fin).encode(), 0);
            feed(c, piece(0, true), 0);
        }),
        ("a pong nobody asked for", "keep-alive", |c| {
            feed(c, Imm::Control(Control::Pong).encode(), 0)
        }),
        ("an unknown control message", "unknown control", |c| {
            feed(c, 0xc000_0009, 0)
        }),
        (
            "a control message with reserved bits",
            "unknown control",
            |c| feed(c, 0xc000_0101, 0),
        ),
        ("a completion without immediate", "without immediate", |c| {
            c.on_recv_completion(None, 16, Completion::Ok, Instant::now())
        }),
        ("a control message with bytes", "carried", |c| {
            feed(c, Imm::CreditRecvs(0).encode(), 4)
        }),
        ("a FIN with bytes", "carried", |c| {
            feed(c, Imm::Control(Control::Fin).encode(), 1)
        }),
        ("a write longer than announced", "announced", |c| {
            feed(c, data(10), 11)
        }),
        ("a write shorter than announced", "announced", |c| {
            feed(c, piece(10, false), 9)
        }),
        ("a message end outside a message", "not part of one", |c| {
            feed(c, 1 << 29, 0)
        }),
        (
            "stream bytes inside a message",
            "in the middle of a message",
            |c| {
                feed(c, piece(10, false), 10);
                feed(c, data(10), 10);
            },
        ),
        (
            "a FIN inside a message",
            "in the middle of a message",
            |c| {
                feed(c, piece(10, false), 10);
                feed(c, Imm::Control(Control::Fin).encode(), 0);
            },
        ),
        (
            "a message longer than max_message",
            "most this side accepts",
            |c| {
                feed(c, piece(600, false), 600);
                feed(c, piece(600, true), 600);
            },
        ),
        (
            "a single piece longer than max_message",
            "most this side accepts",
            |c| feed(c, piece(1001, true), 1001),
        ),
        (
            "message ends beyond ring credit",
            "more than its credit",
            |c| {
                // 4096 / MSG_CHARGE = 64 unread empty messages fill the ring; unread
                // messages hold no receive.
                for _ in 0..4096 / MSG_CHARGE {
                    feed(c, piece(0, true), 0);
                }
                assert!(c.error().is_none(), "as many as the ring's credit is fine");
                assert_eq!(c.poll_recvs(), 4096 / MSG_CHARGE, "each receive goes back");
                feed(c, piece(0, true), 0);
            },
        ),
        (
            "more writes than receives granted",
            "granted only 128 receives",
            |c| {
                for _ in 0..128 {
                    feed(c, data(1), 1);
                    c.consume(1);
                }
                assert!(c.error().is_none(), "every promised receive may be used");
                // Posted again, but no credit reported them (the test drops its writes).
                assert_eq!(c.poll_recvs(), 128);
                feed(c, data(1), 1);
            },
        ),
        (
            "a message's bytes and end beyond the free ring",
            "more than its credit",
            |c| feed(c, piece(4096 - MSG_CHARGE + 1, true), 4096 - MSG_CHARGE + 1),
        ),
        (
            "a message end into a ring its bytes filled",
            "more than its credit",
            |c| {
                let mut exact = lone(1 << 20);
                feed(&mut exact, piece(4000, false), 4000);
                feed(&mut exact, piece(96 - MSG_CHARGE, true), 96 - MSG_CHARGE);
                assert!(
                    exact.error().is_none(),
                    "bytes and end exactly fill the ring"
                );
                feed(&mut exact, data(0), 0);
                assert!(exact.error().is_none(), "a zero-length write costs nothing");
                feed(c, piece(4000, false), 4000);
                feed(c, piece(97 - MSG_CHARGE, true), 97 - MSG_CHARGE);
            },
        ),
        (
            "stream bytes into a ring full of message charges",
            "more than its credit",
            |c| {
                for _ in 0..4096 / MSG_CHARGE - 1 {
                    feed(c, piece(0, true), 0);
                }
                feed(c, data(MSG_CHARGE), MSG_CHARGE);
                assert!(c.error().is_none(), "the last 64 bytes are free");
                feed(c, data(1), 1);
            },
        ),
        (
            "byte credit for a message end never sent",
            "credited",
            |c| {
                c.commit_send(100, true).unwrap();
                let t = c.poll_transmit().unwrap();
                assert_eq!(
                    Imm::decode(t.imm),
                    Ok(Imm::Data {
                        len: 100,
                        msg: true,
                        eom: true
                    })
                );
                feed(c, Imm::CreditBytes(100 + MSG_CHARGE).encode(), 0);
                assert!(c.error().is_none(), "its bytes and its end may be credited");
                feed(c, Imm::CreditBytes(101 + MSG_CHARGE).encode(), 0);
            },
        ),
        (
            "a fault only the application side sees",
            "longer than advertised",
            |c| c.on_peer_fault("a message longer than advertised".into()),
        ),
    ];
    for (case, mentions, lie) in cases {
        let mut c = lone(if mentions == "most this side accepts" {
            1000
        } else {
            1 << 20
        });
        lie(&mut c);
        assert_lied(&mut c, case, mentions);
    }
}

#[test]
fn a_pong_after_a_ping_is_fine_but_not_twice() {
    let mut c = lone(1 << 20);
    let t0 = Instant::now();
    let period = Duration::from_secs(1);
    c.set_keepalive(Some(period), t0);
    c.handle_timeout(t0 + period);
    let t = c.poll_transmit().unwrap();
    assert_eq!(Imm::decode(t.imm), Ok(Imm::Control(Control::Ping)));
    feed(&mut c, Imm::Control(Control::Pong).encode(), 0);
    assert!(c.error().is_none());
    feed(&mut c, Imm::Control(Control::Pong).encode(), 0);
    assert_lied(&mut c, "a second pong", "keep-alive");
}
