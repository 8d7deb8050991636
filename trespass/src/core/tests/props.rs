//! Property tests against a model: no byte lost or duplicated, nothing posted without
//! credit, the ring never overwritten, credits add up; arbitrary input never panics.

use super::*;

// ------------------------------------------------------------------------- properties

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (
        4096u32..=65536,
        4096u32..=65536,
        8u16..=64,
        8u32..=64,
        any::<u32>(),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(ring, send, recv_depth, send_depth, mw, tiny)| {
            // Mostly writes of hundreds of bytes and more; sometimes tiny ones.
            let max_write = if tiny {
                1 + mw % 256
            } else {
                256 + mw % (ring - 255)
            };
            limits(ring, send, recv_depth, send_depth, max_write)
        })
}

/// One step of the stream model. Doubles as a fuzz target: any sequence is legal.
#[derive(Debug, Clone)]
enum Op {
    /// The application writes up to `len % (3 * ring + 1)` bytes (what fits).
    Write {
        side: usize,
        len: u32,
    },
    /// The application reads up to `max % (2 * ring + 1)` bytes.
    Read {
        side: usize,
        max: u32,
    },
    /// The driver reposts receives and posts what the core asks.
    Pump {
        side: usize,
    },
    /// Up to `n` writes land at the peer.
    Land {
        from: usize,
        n: u8,
    },
    /// Up to `n` send completions are polled.
    DeliverSend {
        side: usize,
        n: u8,
    },
    /// Up to `n` receive completions are polled.
    DeliverRecv {
        side: usize,
        n: u8,
    },
    /// Everything moves until nothing does.
    Run,
    Nodelay {
        side: usize,
        on: bool,
    },
    Flush {
        side: usize,
    },
    /// The application sends an empty message (a stream reader passes over its end; it
    /// costs MSG_CHARGE of the peer's ring until then).
    EmptyMsg {
        side: usize,
    },
    /// A writer about to wait asks for the newest request to be signalled.
    RequestSignal {
        side: usize,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let side = || 0usize..2;
    prop_oneof![
        4 => (side(), any::<u32>()).prop_map(|(side, len)| Op::Write { side, len }),
        4 => (side(), any::<u32>()).prop_map(|(side, max)| Op::Read { side, max }),
        3 => side().prop_map(|side| Op::Pump { side }),
        3 => (side(), 1u8..16).prop_map(|(from, n)| Op::Land { from, n }),
        2 => (side(), 1u8..16).prop_map(|(side, n)| Op::DeliverSend { side, n }),
        2 => (side(), 1u8..16).prop_map(|(side, n)| Op::DeliverRecv { side, n }),
        1 => Just(Op::Run),
        1 => (side(), any::<bool>()).prop_map(|(side, on)| Op::Nodelay { side, on }),
        1 => side().prop_map(|side| Op::Flush { side }),
        1 => side().prop_map(|side| Op::EmptyMsg { side }),
        1 => side().prop_map(|side| Op::RequestSignal { side }),
    ]
}

impl Pair {
    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { side, len } => {
                let ring = u64::from(self.sides[1 - side].conn.limits.ring_size);
                self.write_stream(side, u64::from(len) % (3 * ring + 1));
            }
            Op::Read { side, max } => {
                let ring = u64::from(self.sides[side].conn.limits.ring_size);
                self.read_stream(side, u64::from(max) % (2 * ring + 1));
            }
            Op::Pump { side } => {
                self.pump(side);
            }
            Op::Land { from, n } => {
                for _ in 0..n {
                    self.land(from);
                }
            }
            Op::DeliverSend { side, n } => {
                for _ in 0..n {
                    self.deliver_send(side);
                }
            }
            Op::DeliverRecv { side, n } => {
                for _ in 0..n {
                    self.deliver_recv(side);
                }
            }
            Op::Run => self.run(),
            Op::Nodelay { side, on } => self.conn_mut(side).set_nodelay(on),
            Op::Flush { side } => self.conn_mut(side).flush(),
            Op::EmptyMsg { side } => self.send_msg(side, Vec::new()),
            Op::RequestSignal { side } => self.conn_mut(side).request_signal(),
        }
    }

    /// Flushes held bytes and moves and reads everything until nothing moves.
    fn drain_streams(&mut self) {
        for _ in 0..10_000 {
            for s in [A, B] {
                self.conn_mut(s).flush();
            }
            self.run();
            let read = self.read_stream(A, u64::MAX) + self.read_stream(B, u64::MAX);
            if read == 0 {
                self.run();
                if self.read_stream(A, u64::MAX) + self.read_stream(B, u64::MAX) == 0 {
                    return;
                }
            }
        }
        panic!("the streams never drain");
    }
}

/// A fault injected at some step of a property run.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Flush,
    RetryExceeded(usize),
    CqOverrun(usize),
}

fn fault_strategy() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::Flush),
        (0usize..2).prop_map(Fault::RetryExceeded),
        (0usize..2).prop_map(Fault::CqOverrun),
    ]
}

/// One step of the message model.
#[derive(Debug, Clone)]
enum MsgOp {
    Send { side: usize, size: usize },
    Recv { side: usize },
    Pump { side: usize },
    Land { from: usize, n: u8 },
    DeliverSend { side: usize, n: u8 },
    DeliverRecv { side: usize, n: u8 },
    Run,
    RequestSignal { side: usize },
}

fn msg_size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        4 => 1usize..64,
        3 => 64usize..5000,
        2 => 5000usize..200_000,
    ]
}

fn msg_op_strategy() -> impl Strategy<Value = MsgOp> {
    let side = || 0usize..2;
    prop_oneof![
        3 => (side(), msg_size_strategy()).prop_map(|(side, size)| MsgOp::Send { side, size }),
        3 => side().prop_map(|side| MsgOp::Recv { side }),
        3 => side().prop_map(|side| MsgOp::Pump { side }),
        3 => (side(), 1u8..16).prop_map(|(from, n)| MsgOp::Land { from, n }),
        2 => (side(), 1u8..16).prop_map(|(side, n)| MsgOp::DeliverSend { side, n }),
        2 => (side(), 1u8..16).prop_map(|(side, n)| MsgOp::DeliverRecv { side, n }),
        1 => Just(MsgOp::Run),
        1 => side().prop_map(|side| MsgOp::RequestSignal { side }),
    ]
}

/// What the message property expects: the messages each side sent, and how many of them
/// the other side received.
struct MsgModel {
    sent: [Vec<Vec<u8>>; 2],
    received: [usize; 2],
}

impl MsgModel {
    fn recv_all(&mut self, p: &mut Pair, side: usize) -> usize {
        let mut n = 0;
        while let Some(m) = p.recv_msg(side) {
            let from = 1 - side;
            let i = self.received[from];
            let want = self.sent[from]
                .get(i)
                .unwrap_or_else(|| panic!("side {side} received message {i}, never sent"));
            assert!(
                &m == want,
                "side {side}'s message {i}: {} bytes received, {} sent",
                m.len(),
                want.len()
            );
            self.received[from] += 1;
            n += 1;
        }
        n
    }
}

/// A raw input for the fuzz property: anything a peer or a driver could hand the core.
#[derive(Debug, Clone)]
enum Fuzz {
    Recv {
        imm: Option<u32>,
        byte_len: u32,
        status: u8,
    },
    /// A data immediate whose byte_len matches (to get past the first check).
    Data {
        len: u32,
        msg: bool,
        eom: bool,
    },
    Send {
        wr_id: u64,
        status: u8,
    },
    Consume(u32),
    ConsumeMessage(u32, bool),
    Commit(u32, bool),
    Transmit,
    Recvs,
    Timeout(u16),
    Keepalive(Option<u16>),
    Shutdown,
    Disconnected,
    Nodelay(bool),
    Flush,
    ShutdownRead,
    RequestSignal,
    PeerFault,
}

fn status_of(code: u8) -> Completion {
    match code % 8 {
        0..=3 => Completion::Ok,
        4 => Completion::Flushed,
        5 => Completion::RetryExceeded,
        6 => Completion::RemoteAccess,
        _ => Completion::Other(u32::from(code), "fuzzed"),
    }
}

fn fuzz_strategy() -> impl Strategy<Value = Fuzz> {
    let imm = prop_oneof![
        any::<u32>(),
        (0u32..4, 0u32..10_000, any::<bool>())
            .prop_map(|(kind, v, eom)| (kind << 30) | (u32::from(eom) << 29) | v),
        (0u32..4).prop_map(|c| (3 << 30) | c),
    ];
    let byte_len = prop_oneof![any::<u32>(), 0u32..10_000, Just(0u32)];
    prop_oneof![
        4 => (prop::option::weighted(0.95, imm), byte_len, any::<u8>())
            .prop_map(|(imm, byte_len, status)| Fuzz::Recv { imm, byte_len, status }),
        4 => (0u32..5000, any::<bool>(), any::<bool>())
            .prop_map(|(len, msg, eom)| Fuzz::Data { len, msg, eom }),
        2 => (prop_oneof![any::<u64>(), 0u64..64], any::<u8>())
            .prop_map(|(wr_id, status)| Fuzz::Send { wr_id, status }),
        2 => prop_oneof![any::<u32>(), 0u32..5000].prop_map(Fuzz::Consume),
        1 => (any::<u32>(), any::<bool>()).prop_map(|(n, e)| Fuzz::ConsumeMessage(n, e)),
        2 => (prop_oneof![any::<u32>(), 0u32..5000], any::<bool>())
            .prop_map(|(n, e)| Fuzz::Commit(n, e)),
        3 => Just(Fuzz::Transmit),
        1 => Just(Fuzz::Recvs),
        1 => any::<u16>().prop_map(Fuzz::Timeout),
        1 => prop::option::of(1u16..1000).prop_map(Fuzz::Keepalive),
        1 => Just(Fuzz::Shutdown),
        1 => Just(Fuzz::Disconnected),
        1 => any::<bool>().prop_map(Fuzz::Nodelay),
        1 => Just(Fuzz::Flush),
        1 => Just(Fuzz::ShutdownRead),
        1 => Just(Fuzz::RequestSignal),
        1 => Just(Fuzz::PeerFault),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    /// Random writes, reads, deliveries in any order between the two directions, delays,
    /// nodelay on and off: after every step nothing was posted without credit, the ring was
    /// never overwritten, the send queue never overran, credits add up, and every byte read
    /// is the next byte written; at the end every byte written was read, and a shutdown
    /// ends both streams cleanly.
    #[test]
    fn streams_lose_nothing_and_respect_credit(
        la in limits_strategy(),
        lb in limits_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..250),
    ) {
        let mut p = Pair::new(la, lb);
        for op in &ops {
            p.apply(op);
            p.check();
        }
        p.drain_streams();
        prop_assert_eq!(p.sides[B].inp, p.sides[A].out);
        prop_assert_eq!(p.sides[A].inp, p.sides[B].out);
        for s in [A, B] {
            prop_assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
            let empties = ops
                .iter()
                .filter(|op| matches!(op, Op::EmptyMsg { side } if *side == s))
                .count() as u64;
            prop_assert!(p.sides[s].msgs_out.is_empty());
            prop_assert_eq!(p.conn(1 - s).msgs_read, empties);
            prop_assert_eq!(p.conn(1 - s).consumed_units(), p.conn(s).charged());
            p.conn_mut(s).shutdown_write();
        }
        p.run();
        for s in [A, B] {
            prop_assert!(p.conn(s).is_eof());
            prop_assert!(p.conn(s).fin_done());
            prop_assert_eq!(p.conn(s).unacknowledged(), 0);
            prop_assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
        }
    }

    /// The same with a fault at a random step: no panic, no invariant broken, what is read
    /// is still a prefix of what was written, and both ends learn the connection is gone.
    #[test]
    fn faults_break_the_connection_and_nothing_else(
        la in limits_strategy(),
        lb in limits_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..80),
        at in any::<prop::sample::Index>(),
        fault in fault_strategy(),
    ) {
        let mut p = Pair::new(la, lb);
        let at = at.index(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if i == at {
                match fault {
                    Fault::Flush => {}
                    Fault::RetryExceeded(s) => p.retry_exceeded(s),
                    Fault::CqOverrun(s) => p.conn_mut(s).on_local_error("CQ overrun".into()),
                }
                p.flush_all();
            }
            p.apply(op);
            p.check();
        }
        p.run();
        p.read_stream(A, u64::MAX);
        p.read_stream(B, u64::MAX);
        for s in [A, B] {
            let c = p.conn(s);
            prop_assert!(c.broken().is_some() || c.error().is_some());
            prop_assert!(!c.is_eof(), "no FIN was sent");
            prop_assert!(c.is_readable(true));
            prop_assert!(!c.has_unread(), "the ring was drained");
            prop_assert!(p.conn_mut(s).poll_transmit().is_none());
            prop_assert!(p.sides[1 - s].inp <= p.sides[s].out);
        }
        if let Fault::CqOverrun(s) = fault {
            prop_assert!(matches!(p.conn(s).error(), Some(ConnError::Local(_))));
        }
    }

    /// A reader that shuts its read side down at a random step: nothing it held or gets
    /// afterwards blocks its peer (which writes three of its rings more and empty messages
    /// without a read), the other direction loses nothing, and both streams end cleanly.
    #[test]
    fn a_reader_that_shuts_down_never_blocks_its_peer(
        la in limits_strategy(),
        lb in limits_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..120),
        at in any::<prop::sample::Index>(),
    ) {
        let mut p = Pair::new(la, lb);
        let at = at.index(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if i == at {
                p.conn_mut(B).shutdown_read();
                prop_assert!(!p.conn(B).has_unread());
            }
            p.apply(op);
            p.check();
        }
        p.drain_streams();
        let more = p.sides[A].out + 3 * u64::from(lb.ring_size);
        for i in 0..10_000 {
            if p.sides[A].out >= more && p.sides[A].msgs_out.is_empty() {
                break;
            }
            p.write_stream(A, more.saturating_sub(p.sides[A].out));
            if i < 50 {
                p.send_msg(A, Vec::new());
            }
            p.conn_mut(A).flush();
            p.run();
        }
        prop_assert!(p.sides[A].out >= more, "the writer is blocked");
        prop_assert!(p.sides[A].msgs_out.is_empty());
        p.conn_mut(A).request_signal();
        p.run();
        prop_assert_eq!(p.conn(A).posted, p.conn(A).app_tail);
        prop_assert_eq!(p.conn(A).unacknowledged(), 0);
        prop_assert_eq!(p.conn(B).consumed_units(), p.conn(A).charged());
        prop_assert!(!p.conn(B).has_unread());
        prop_assert!(p.sides[B].inp <= p.sides[A].out);
        prop_assert_eq!(p.sides[A].inp, p.sides[B].out);
        for s in [A, B] {
            p.conn_mut(s).shutdown_write();
        }
        p.run();
        for s in [A, B] {
            prop_assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
            prop_assert!(p.conn(s).is_eof());
            prop_assert!(p.conn(s).fin_done());
        }
    }

    /// Random message sizes, including empty ones and ones larger than the peer's ring and
    /// the sender's buffer, both ways: exactly the messages sent arrive, in order, with
    /// their boundaries.
    #[test]
    fn messages_arrive_whole_and_in_order(
        la in limits_strategy(),
        lb in limits_strategy(),
        ops in prop::collection::vec(msg_op_strategy(), 1..150),
    ) {
        let mut p = Pair::new(la, lb);
        let mut model = MsgModel { sent: [Vec::new(), Vec::new()], received: [0, 0] };
        for op in &ops {
            match *op {
                MsgOp::Send { side, size } => {
                    let seq = model.sent[side].len() as u64;
                    let m = pattern_bytes(side, seq * 7919, size);
                    model.sent[side].push(m.clone());
                    p.send_msg(side, m);
                }
                MsgOp::Recv { side } => {
                    model.recv_all(&mut p, side);
                }
                MsgOp::Pump { side } => {
                    p.send_pending_msgs(side);
                    p.pump(side);
                }
                MsgOp::Land { from, n } => {
                    for _ in 0..n {
                        p.land(from);
                    }
                }
                MsgOp::DeliverSend { side, n } => {
                    for _ in 0..n {
                        p.deliver_send(side);
                    }
                }
                MsgOp::DeliverRecv { side, n } => {
                    for _ in 0..n {
                        p.deliver_recv(side);
                    }
                }
                MsgOp::Run => p.run(),
                MsgOp::RequestSignal { side } => p.conn_mut(side).request_signal(),
            }
            p.check();
        }
        // Drain: read (whole messages and the start of long ones) until nothing moves.
        let marker = |p: &Pair, m: &MsgModel| (p.conn(A).head, p.conn(B).head, m.received);
        for _ in 0..100_000 {
            let before = marker(&p, &model);
            p.run();
            model.recv_all(&mut p, A);
            model.recv_all(&mut p, B);
            if marker(&p, &model) == before {
                break;
            }
        }
        for s in [A, B] {
            prop_assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
            prop_assert_eq!(model.received[s], model.sent[s].len());
            prop_assert!(p.sides[s].msgs_out.is_empty());
            // Every unit charged was consumed: the ring holds nothing, and charges nothing.
            prop_assert_eq!(p.conn(1 - s).consumed_units(), p.conn(s).charged());
            prop_assert_eq!(p.conn(s).msgs_sent, model.sent[s].len() as u64);
            prop_assert!(p.conn(1 - s).boundaries.is_empty());
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Anything at all fed to a connection: no panic, and once failed it stays failed and
    /// posts nothing.
    #[test]
    fn arbitrary_input_never_panics(
        ops in prop::collection::vec(fuzz_strategy(), 1..200),
    ) {
        let mut c = lone(1000);
        let t0 = Instant::now();
        let mut now = t0;
        for op in ops {
            match op {
                Fuzz::Recv { imm, byte_len, status } => {
                    c.on_recv_completion(imm, byte_len, status_of(status), now)
                }
                Fuzz::Data { len, msg, eom } => {
                    let imm = Imm::Data { len, msg: msg || eom, eom }.encode();
                    c.on_recv_completion(Some(imm), len, Completion::Ok, now)
                }
                Fuzz::Send { wr_id, status } => {
                    c.on_send_completion(wr_id, status_of(status), now)
                }
                Fuzz::Consume(n) => c.consume(n),
                Fuzz::ConsumeMessage(n, e) => c.consume_message(n, e),
                Fuzz::Commit(n, e) => {
                    let _ = c.commit_send(n, e);
                }
                Fuzz::Transmit => {
                    while let Some(t) = c.poll_transmit() {
                        prop_assert!(c.error().is_none());
                        prop_assert!(c.in_flight() <= u64::from(c.limits().send_depth));
                        if t.plain {
                            prop_assert!(t.signaled && t.len == 0, "{:?}", t);
                        } else {
                            prop_assert!(Imm::decode(t.imm).is_ok());
                        }
                    }
                }
                Fuzz::Recvs => {
                    c.poll_recvs();
                }
                Fuzz::Timeout(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    c.handle_timeout(now);
                }
                Fuzz::Keepalive(ms) => {
                    c.set_keepalive(ms.map(|ms| Duration::from_millis(u64::from(ms))), now)
                }
                Fuzz::Shutdown => c.shutdown_write(),
                Fuzz::Disconnected => c.on_disconnected(),
                Fuzz::Nodelay(on) => c.set_nodelay(on),
                Fuzz::Flush => c.flush(),
                Fuzz::ShutdownRead => {
                    c.shutdown_read();
                    prop_assert!(!c.has_unread());
                }
                Fuzz::RequestSignal => c.request_signal(),
                Fuzz::PeerFault => {
                    let before = c.error().cloned();
                    c.on_peer_fault("fuzzed".into());
                    match before {
                        Some(e) => prop_assert_eq!(c.error(), Some(&e), "sticky"),
                        None => prop_assert!(matches!(c.error(), Some(ConnError::Protocol(_)))),
                    }
                }
            }
            // Whatever the peer sent, the ring never holds more than its size in units,
            // and the peer is never credited more than it was charged.
            let ring = u64::from(c.limits().ring_size);
            prop_assert!(c.tail - c.head + CHARGE * c.boundaries.len() as u64 <= ring);
            prop_assert!(c.credited <= c.consumed_units());
            prop_assert!(c.peer_consumed.get() <= c.charged());
            prop_assert!(c.charged() - c.peer_consumed.get() <= ring);
            // What the application sees stays consistent whatever happened.
            let w = c.recv_window();
            prop_assert!(u64::from(w.offset) + u64::from(w.len) <= u64::from(c.limits().ring_size));
            let (off, len) = c.send_window();
            prop_assert!(u64::from(off) + u64::from(len) <= u64::from(c.limits().send_buffer));
            let _ = (c.is_readable(true), c.is_readable(false), c.is_eof(), c.poll_timeout());
            if c.error().is_some() {
                prop_assert!(c.poll_transmit().is_none());
            }
        }
    }
}
