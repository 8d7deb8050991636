//! The core's tests: two [`Connection`]s wired together in memory (a [`Pair`], as
//! quinn-proto's tests have one), on a virtual clock, with knobs for delay, flushed
//! completions, retry-exceeded and CQ overrun; hostile-peer tests that feed hand-made
//! immediates; and property tests against a model (no byte lost or duplicated, nothing
//! posted without credit, the ring never overwritten, credits add up).
//!
//! The simulated network is strict where RDMA is: a write's bytes are copied out of the
//! sender's send buffer when it lands (so a sender that reused its buffer before the
//! completion would deliver wrong bytes), landing consumes one of the receiver's posted
//! receives (none posted is an RNR: an assertion), and a write lands exactly at the
//! receiver's ring tail, inside the ring's free space.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

use super::*;
use crate::wire::{Control, Hello, Imm};

const A: usize = 0;
const B: usize = 1;

// ------------------------------------------------------------------------- fixtures

fn limits(
    ring_size: u32,
    send_buffer: u32,
    recv_depth: u16,
    send_depth: u32,
    max_write: u32,
) -> Limits {
    Limits {
        ring_size,
        send_buffer,
        recv_depth,
        send_depth,
        max_write,
        max_message: 1 << 24,
    }
}

/// Small sizes that make every transfer wrap: an 8 KiB ring, a 4 KiB send buffer, writes
/// of at most 1500 bytes.
fn small() -> Limits {
    limits(8192, 4096, 16, 16, 1500)
}

fn hello_of(l: &Limits) -> Hello {
    Hello {
        ring_addr: 0,
        ring_rkey: 0x5eed,
        ring_size: l.ring_size,
        recv_depth: l.recv_depth,
        max_message: l.max_message,
    }
}

/// xorshift64*: the deterministic tests' random pace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 56) as u8).collect()
    }
}

/// A prime length, so the pattern does not repeat in step with any ring or buffer size.
const PATTERN_LEN: usize = 1_000_003;

fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| Rng(0x9e37_79b9_7f4a_7c15).bytes(PATTERN_LEN))
}

/// Where stream `stream`'s byte at `pos` is in the pattern.
fn pattern_start(stream: usize, pos: u64) -> usize {
    ((pos + stream as u64 * 500_009) % PATTERN_LEN as u64) as usize
}

/// Fills `out` with stream `stream`'s bytes from position `pos`.
fn fill_pattern(stream: usize, pos: u64, out: &mut [u8]) {
    let p = pattern();
    let mut at = pattern_start(stream, pos);
    let mut done = 0;
    while done < out.len() {
        let k = (out.len() - done).min(PATTERN_LEN - at);
        out[done..done + k].copy_from_slice(&p[at..at + k]);
        done += k;
        at = 0;
    }
}

/// True when `data` is stream `stream`'s bytes from position `pos`.
fn pattern_matches(stream: usize, pos: u64, data: &[u8]) -> bool {
    let p = pattern();
    let mut at = pattern_start(stream, pos);
    let mut done = 0;
    while done < data.len() {
        let k = (data.len() - done).min(PATTERN_LEN - at);
        if data[done..done + k] != p[at..at + k] {
            return false;
        }
        done += k;
        at = 0;
    }
    true
}

fn pattern_bytes(stream: usize, pos: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(stream, pos, &mut v);
    v
}

// ------------------------------------------------------------------------- the pair

/// One end: its connection, its memory, its queues, and the application's model.
struct Side {
    conn: Connection,
    /// The receive ring the peer writes into.
    ring: Vec<u8>,
    /// Where committed bytes wait for their RDMA WRITE.
    send_buf: Vec<u8>,
    /// Receives posted and not yet consumed by a landed write.
    recvs_posted: u64,
    /// Bytes landed in the ring in all (the NIC's tail).
    landed: u64,
    /// Completions waiting in this side's CQ.
    send_cq: VecDeque<(u64, Completion)>,
    recv_cq: VecDeque<(Option<u32>, u32, Completion)>,
    /// The send queue as the hardware sees it: requests whose slot is not yet freed (a
    /// completion at or after them not yet polled).
    sq: VecDeque<u64>,
    /// The next work request id expected from the core.
    next_wr: u64,
    /// Unsignalled requests posted since the last signalled one.
    unsignaled_run: u32,
    /// Every request posted, in order.
    log: Vec<Transmit>,
    /// After a flush or a transport failure: whatever is posted completes as flushed.
    dead: bool,
    /// Stream bytes this side's application wrote (pattern stream = this side's index).
    out: u64,
    /// Stream bytes this side's application read (checked against the peer's pattern).
    inp: u64,
    /// Messages waiting to be written, and bytes of the first already committed.
    msgs_out: VecDeque<Vec<u8>>,
    msg_written: usize,
    /// The first queued message was begun with `begin_message`.
    msg_begun: bool,
    /// The message being read.
    msg_in: Vec<u8>,
}

impl Side {
    fn new(mine: Limits, peer: Limits) -> Side {
        Side {
            conn: Connection::new(mine, hello_of(&peer)),
            ring: vec![0; mine.ring_size as usize],
            send_buf: vec![0; mine.send_buffer as usize],
            recvs_posted: u64::from(mine.recv_depth),
            landed: 0,
            send_cq: VecDeque::new(),
            recv_cq: VecDeque::new(),
            sq: VecDeque::new(),
            next_wr: 0,
            unsignaled_run: 0,
            log: Vec::new(),
            dead: false,
            out: 0,
            inp: 0,
            msgs_out: VecDeque::new(),
            msg_written: 0,
            msg_begun: false,
            msg_in: Vec::new(),
        }
    }

    /// The immediates posted, decoded.
    fn imms(&self) -> Vec<Imm> {
        self.log
            .iter()
            .map(|t| Imm::decode(t.imm).expect("posted immediates decode"))
            .collect()
    }
}

/// Two connections and a simulated RC network between them.
struct Pair {
    sides: [Side; 2],
    /// Writes posted by side `i` and not yet landed at the other, in order.
    wire: [VecDeque<Transmit>; 2],
    now: Instant,
    /// Knobs: hold what the run loop would otherwise move (a delay).
    hold_wire: [bool; 2],
    hold_send_cq: [bool; 2],
    hold_recv_cq: [bool; 2],
    /// The next signalled completion of side `i` comes back with this status.
    fail_next_send: [Option<Completion>; 2],
}

impl Pair {
    fn new(la: Limits, lb: Limits) -> Pair {
        Pair {
            sides: [Side::new(la, lb), Side::new(lb, la)],
            wire: [VecDeque::new(), VecDeque::new()],
            now: Instant::now(),
            hold_wire: [false; 2],
            hold_send_cq: [false; 2],
            hold_recv_cq: [false; 2],
            fail_next_send: [None; 2],
        }
    }

    fn conn(&self, s: usize) -> &Connection {
        &self.sides[s].conn
    }

    fn conn_mut(&mut self, s: usize) -> &mut Connection {
        &mut self.sides[s].conn
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    fn timeout(&mut self, s: usize) {
        let now = self.now;
        self.sides[s].conn.handle_timeout(now);
    }

    // ---------------------------------------------------------- the network

    /// The driver posts `t` for side `s`: checks what any NIC would refuse.
    fn post(&mut self, s: usize, t: Transmit) {
        let peer_ring = self.sides[1 - s].ring.len() as u64;
        let side = &mut self.sides[s];
        let l = *side.conn.limits();
        let imm = Imm::decode(t.imm).expect("the core posts only immediates it can decode");
        match imm {
            Imm::Data { len, .. } => {
                assert_eq!(len, t.len, "a data immediate announces its length");
                assert!(
                    u64::from(t.local_offset) + u64::from(t.len) <= u64::from(l.send_buffer),
                    "{t:?} reads past the send buffer ({})",
                    l.send_buffer
                );
                assert!(
                    u64::from(t.remote_offset) + u64::from(t.len) <= peer_ring,
                    "{t:?} writes past the peer's ring ({peer_ring})"
                );
                assert!(
                    t.len <= l.max_write,
                    "{t:?} is over max_write {}",
                    l.max_write
                );
            }
            _ => assert_eq!(t.len, 0, "control messages carry no bytes: {t:?}"),
        }
        assert_eq!(t.wr_id, side.next_wr, "work request ids are consecutive");
        side.next_wr += 1;
        side.sq.push_back(t.wr_id);
        assert!(
            side.sq.len() as u64 <= u64::from(l.send_depth),
            "send queue overrun: {} requests in a queue of {}",
            side.sq.len(),
            l.send_depth
        );
        assert!(side.conn.in_flight() <= u64::from(l.send_depth));
        let quarter = (l.send_depth / 4).max(1);
        if t.signaled {
            side.unsignaled_run = 0;
        } else {
            side.unsignaled_run += 1;
            assert!(
                side.unsignaled_run < quarter,
                "{} unsignalled requests in a row (send depth {})",
                side.unsignaled_run,
                l.send_depth
            );
        }
        side.log.push(t);
        if side.dead {
            side.send_cq.push_back((t.wr_id, Completion::Flushed));
        } else {
            self.wire[s].push_back(t);
        }
    }

    /// One driver round's posting for side `s`: receives, then every transmit.
    fn pump(&mut self, s: usize) -> bool {
        let mut progress = false;
        let n = self.sides[s].conn.poll_recvs();
        if n > 0 {
            progress = true;
            let side = &mut self.sides[s];
            if side.dead {
                for _ in 0..n {
                    side.recv_cq.push_back((None, 0, Completion::Flushed));
                }
            } else {
                side.recvs_posted += u64::from(n);
            }
        }
        while let Some(t) = self.sides[s].conn.poll_transmit() {
            self.post(s, t);
            progress = true;
        }
        progress
    }

    /// The oldest write from `from` lands at the other side.
    fn land(&mut self, from: usize) -> bool {
        let Some(t) = self.wire[from].pop_front() else {
            return false;
        };
        let to = 1 - from;
        let [a, b] = &mut self.sides;
        let (src, dst) = if from == A { (a, b) } else { (b, a) };
        assert!(
            dst.recvs_posted > 0,
            "RNR: {t:?} landed with no receive posted (posted without credit)"
        );
        dst.recvs_posted -= 1;
        if let Ok(Imm::Data { len, .. }) = Imm::decode(t.imm) {
            let ring = dst.ring.len() as u64;
            assert_eq!(
                u64::from(t.remote_offset),
                dst.landed % ring,
                "side {from}'s write does not land at side {to}'s ring tail"
            );
            let unread = dst.landed - dst.conn.head;
            assert!(
                unread + u64::from(len) <= ring,
                "side {from}'s write of {len} bytes overwrites unread data ({unread} of {ring} unread)"
            );
            let (l, r) = (t.local_offset as usize, t.remote_offset as usize);
            let n = len as usize;
            dst.ring[r..r + n].copy_from_slice(&src.send_buf[l..l + n]);
            dst.landed += u64::from(len);
        }
        dst.recv_cq.push_back((Some(t.imm), t.len, Completion::Ok));
        if t.signaled {
            let status = self.fail_next_send[from].take().unwrap_or(Completion::Ok);
            src.send_cq.push_back((t.wr_id, status));
        }
        true
    }

    /// Side `s` polls one send completion.
    fn deliver_send(&mut self, s: usize) -> bool {
        let side = &mut self.sides[s];
        let Some((wr, status)) = side.send_cq.pop_front() else {
            return false;
        };
        side.conn.on_send_completion(wr, status);
        while side.sq.front().is_some_and(|&id| id <= wr) {
            side.sq.pop_front();
        }
        true
    }

    /// Side `s` polls one receive completion.
    fn deliver_recv(&mut self, s: usize) -> bool {
        let now = self.now;
        let side = &mut self.sides[s];
        let Some((imm, len, status)) = side.recv_cq.pop_front() else {
            return false;
        };
        side.conn.on_recv_completion(imm, len, status, now);
        true
    }

    /// Every completion already in both CQs.
    fn deliver_all(&mut self) {
        for s in [A, B] {
            while self.deliver_recv(s) || self.deliver_send(s) {}
        }
    }

    /// Moves everything not held until nothing moves (the applications' pending messages
    /// included); checks the invariants after each round.
    fn run(&mut self) {
        for _ in 0..1_000_000 {
            let mut progress = false;
            for s in [A, B] {
                progress |= self.send_pending_msgs(s);
                progress |= self.pump(s);
            }
            for s in [A, B] {
                if !self.hold_wire[s] {
                    while self.land(s) {
                        progress = true;
                    }
                }
            }
            for s in [A, B] {
                if !self.hold_recv_cq[s] {
                    while self.deliver_recv(s) {
                        progress = true;
                    }
                }
                if !self.hold_send_cq[s] {
                    while self.deliver_send(s) {
                        progress = true;
                    }
                }
            }
            self.check();
            if !progress {
                return;
            }
        }
        panic!("the pair never settles (livelock)");
    }

    // ---------------------------------------------------------- faults

    /// The queue pairs go to the error state: every write still on the wire and every
    /// posted receive completes as flushed, then rdma_cm reports the disconnect.
    fn flush_all(&mut self) {
        for s in [A, B] {
            self.sides[s].dead = true;
            for t in self.wire[s].drain(..) {
                self.sides[s]
                    .send_cq
                    .push_back((t.wr_id, Completion::Flushed));
            }
        }
        for s in [A, B] {
            let side = &mut self.sides[s];
            for _ in 0..side.recvs_posted {
                side.recv_cq.push_back((None, 0, Completion::Flushed));
            }
            side.recvs_posted = 0;
        }
        self.deliver_all();
        for s in [A, B] {
            self.sides[s].conn.on_disconnected();
        }
    }

    /// Side `s`'s oldest write on the wire never gets acknowledged: it completes with
    /// retry-exceeded, the rest of its queue as flushed.
    fn retry_exceeded(&mut self, s: usize) {
        self.sides[s].dead = true;
        let mut first = true;
        for t in self.wire[s].drain(..) {
            let status = if first {
                Completion::RetryExceeded
            } else {
                Completion::Flushed
            };
            first = false;
            self.sides[s].send_cq.push_back((t.wr_id, status));
        }
    }

    // ---------------------------------------------------------- invariants

    fn check(&self) {
        for s in [A, B] {
            let (me, peer) = (&self.sides[s], &self.sides[1 - s]);
            let c = &me.conn;
            let l = c.limits;
            assert!(c.in_flight() <= u64::from(l.send_depth));
            assert!(me.sq.len() as u64 <= u64::from(l.send_depth));
            // The send buffer: [completed, posted, app_tail) in order, within its size.
            assert!(c.completed <= c.posted && c.posted <= c.app_tail);
            assert!(c.app_tail - c.completed <= u64::from(l.send_buffer));
            // Byte credit: never more consumed than the reader read, so the sender's view
            // of the peer's free space never exceeds the real one (nor the ring).
            assert!(
                c.peer_consumed.get() <= peer.conn.head,
                "side {s} believes {} bytes were read, the reader read {}",
                c.peer_consumed.get(),
                peer.conn.head
            );
            let in_peer_ring = c.posted - c.peer_consumed.get();
            assert!(in_peer_ring <= u64::from(c.peer.ring_size));
            assert!(peer.conn.tail <= peer.landed && peer.landed <= c.posted);
            assert!(peer.landed - peer.conn.head <= peer.ring.len() as u64);
            // Receive credit: the receives side `s` believes free are really posted, less
            // the writes already on their way.
            if !me.dead && !peer.dead {
                let real = peer.recvs_posted as i64 - self.wire[s].len() as i64;
                assert!(
                    c.peer_recvs_free() as i64 <= real,
                    "side {s} believes {} receives free at its peer, {} are",
                    c.peer_recvs_free(),
                    real
                );
            }
            assert!(peer.conn.boundaries.len() <= usize::from(peer.conn.limits.recv_depth));
            // Receives add up: each one used is posted again, or held by an unread
            // message, or due to the driver, or its completion is still in the CQ.
            if !me.dead && me.conn.error().is_none() {
                let used = u64::from(c.limits.recv_depth) - me.recvs_posted;
                let held =
                    c.boundaries.len() as u64 + u64::from(c.recvs_due) + me.recv_cq.len() as u64;
                assert_eq!(used, held, "side {s}'s receives do not add up");
            }
        }
    }

    // ---------------------------------------------------------- the applications

    /// Writes what fits of `data` into side `s`'s stream; returns how much.
    fn write(&mut self, s: usize, data: &[u8]) -> usize {
        let side = &mut self.sides[s];
        let mut done = 0;
        while done < data.len() {
            let (off, len) = side.conn.send_window();
            let k = (len as usize).min(data.len() - done);
            if k == 0 {
                break;
            }
            let off = off as usize;
            side.send_buf[off..off + k].copy_from_slice(&data[done..done + k]);
            side.conn
                .commit_send(k as u32, false)
                .expect("a commit within the window");
            done += k;
        }
        side.out += done as u64;
        done
    }

    /// Writes up to `max` bytes of side `s`'s pattern stream; returns how many.
    fn write_stream(&mut self, s: usize, max: u64) -> u64 {
        let side = &mut self.sides[s];
        let mut done = 0;
        while done < max {
            let (off, len) = side.conn.send_window();
            let k = u64::from(len).min(max - done);
            if k == 0 {
                break;
            }
            let off = off as usize;
            fill_pattern(s, side.out, &mut side.send_buf[off..off + k as usize]);
            side.conn
                .commit_send(k as u32, false)
                .expect("a commit within the window");
            side.out += k;
            done += k;
        }
        done
    }

    /// Reads up to `max` stream bytes at side `s`.
    fn read(&mut self, s: usize, max: usize) -> Vec<u8> {
        let side = &mut self.sides[s];
        let mut got = Vec::new();
        while got.len() < max {
            let w = side.conn.recv_window();
            let k = (w.len as usize).min(max - got.len());
            if k == 0 {
                if w.len == 0 && w.ends_message {
                    side.conn.consume(0);
                    continue;
                }
                break;
            }
            let off = w.offset as usize;
            got.extend_from_slice(&side.ring[off..off + k]);
            side.conn.consume(k as u32);
        }
        side.inp += got.len() as u64;
        got
    }

    /// Reads up to `max` stream bytes at side `s`, checking each against the peer's pattern.
    fn read_stream(&mut self, s: usize, max: u64) -> u64 {
        let side = &mut self.sides[s];
        let mut got = 0;
        while got < max {
            let w = side.conn.recv_window();
            let k = u64::from(w.len).min(max - got);
            if k == 0 {
                if w.len == 0 && w.ends_message {
                    side.conn.consume(0);
                    continue;
                }
                break;
            }
            let off = w.offset as usize;
            assert!(
                pattern_matches(1 - s, side.inp, &side.ring[off..off + k as usize]),
                "side {s} read {k} bytes at stream position {} that its peer did not write there",
                side.inp
            );
            side.conn.consume(k as u32);
            side.inp += k;
            got += k;
        }
        got
    }

    /// Queues a message at side `s` and writes what fits of it now.
    fn send_msg(&mut self, s: usize, bytes: Vec<u8>) {
        self.sides[s].msgs_out.push_back(bytes);
        self.send_pending_msgs(s);
    }

    /// Writes what fits of side `s`'s queued messages, as the front end does: a message
    /// that fits the window whole is one commit with its end; a longer one is begun with
    /// `begin_message`, then written in pieces, the last with its end.
    fn send_pending_msgs(&mut self, s: usize) -> bool {
        let side = &mut self.sides[s];
        let mut progress = false;
        while let Some(msg) = side.msgs_out.front() {
            if side.conn.error().is_some() {
                break;
            }
            let remaining = msg.len() - side.msg_written;
            let (off, len) = side.conn.send_window();
            if !side.msg_begun {
                if len == 0 {
                    break; // a full buffer, or as many messages waiting as receives
                }
                if remaining > len as usize {
                    side.conn
                        .begin_message()
                        .expect("a message begins in a window");
                    side.msg_begun = true;
                }
            }
            let k = (len as usize).min(remaining);
            let off = off as usize;
            side.send_buf[off..off + k]
                .copy_from_slice(&msg[side.msg_written..side.msg_written + k]);
            if k == remaining {
                side.conn
                    .commit_send(k as u32, true)
                    .expect("a message's end within the window");
                side.msgs_out.pop_front();
                side.msg_written = 0;
                side.msg_begun = false;
            } else if k > 0 {
                side.conn
                    .commit_send(k as u32, false)
                    .expect("within the window");
                side.msg_written += k;
            } else {
                break;
            }
            progress = true;
        }
        progress
    }

    /// The next whole message at side `s`, if one has arrived (its start may have been
    /// read by earlier calls).
    fn recv_msg(&mut self, s: usize) -> Option<Vec<u8>> {
        let side = &mut self.sides[s];
        loop {
            let w = side.conn.recv_window();
            if w.len == 0 && !w.ends_message {
                return None;
            }
            let off = w.offset as usize;
            side.msg_in
                .extend_from_slice(&side.ring[off..off + w.len as usize]);
            side.conn.consume_message(w.len, w.ends_message);
            if w.ends_message {
                return Some(std::mem::take(&mut side.msg_in));
            }
        }
    }
}

fn imm_of(t: &Transmit) -> Imm {
    Imm::decode(t.imm).expect("posted immediates decode")
}

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
fn messages_wait_for_receives_and_hold_one_each_until_read() {
    let la = limits(65536, 65536, 8, 32, 65536);
    let lb = limits(65536, 65536, 8, 32, 65536);
    let mut p = Pair::new(la, lb);
    for i in 0..10u8 {
        p.send_msg(A, vec![i; 3]);
    }
    p.run();
    // The reader holds one receive per unread message; the writer keeps CONTROL_RESERVE.
    assert_eq!(
        p.conn(B).boundaries.len(),
        usize::from(lb.recv_depth) - CONTROL_RESERVE as usize
    );
    assert_eq!(p.conn(A).peer_recvs_free(), u64::from(CONTROL_RESERVE));
    let mut got = Vec::new();
    for _ in 0..20 {
        while let Some(m) = p.recv_msg(B) {
            got.push(m);
        }
        p.run();
    }
    let want: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 3]).collect();
    assert_eq!(got, want);
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
    // Every receive went back to the writer in the end.
    assert!(p.conn(B).boundaries.is_empty());
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
    // Both directions start just below 2^30 bytes and 2^30 receives.
    let bytes = (1u64 << 30) - 3000;
    let imms = (1u64 << 30) - 5;
    for from in [A, B] {
        let [a, b] = &mut p.sides;
        let (s, r) = if from == A { (a, b) } else { (b, a) };
        s.conn.app_tail = bytes;
        s.conn.posted = bytes;
        s.conn.completed = bytes;
        s.conn
            .peer_consumed
            .advance(wire_value(bytes), bytes)
            .unwrap();
        s.conn.imm_sent = imms;
        s.conn
            .peer_reposted
            .advance(wire_value(imms), imms)
            .unwrap();
        s.out = bytes;
        r.conn.tail = bytes;
        r.conn.head = bytes;
        r.conn.credited = bytes;
        r.conn.reposted = imms;
        r.conn.reposted_reported = imms;
        r.landed = bytes;
        r.inp = bytes;
    }
    let total = 100_000;
    let mut rng = Rng(13);
    while p.sides[A].inp < bytes + total || p.sides[B].inp < bytes + total {
        for s in [A, B] {
            let left = bytes + total - p.sides[s].out;
            p.write_stream(s, left.min(rng.below(7000)));
        }
        p.run();
        p.read_stream(A, rng.below(5000));
        p.read_stream(B, rng.below(5000));
    }
    p.run();
    for s in [A, B] {
        assert!(p.conn(s).error().is_none(), "{:?}", p.conn(s).error());
        assert!(p.conn(s).peer_consumed.get() > 1 << 30);
        assert!(p.conn(s).peer_reposted.get() > 1 << 30);
    }
}

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
    assert_eq!(p.conn(A).poll_timeout(), Some(t0 + 2 * period));

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
    p.hold_wire[A] = true;
    p.advance(period);
    p.timeout(A);
    p.run();
    assert_eq!(p.sides[A].imms(), vec![Imm::Control(Control::Ping)]);
    assert_eq!(p.conn(A).poll_timeout(), Some(t0 + 2 * period));
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
    p.conn_mut(A).on_send_completion(7, Completion::Ok);
    assert!(matches!(p.conn(A).error(), Some(ConnError::Local(_))));
}

#[test]
fn an_empty_message_before_shutdown_goes_before_the_fin() {
    // The reader holds its receives (unread messages): the writer is down to the control
    // reserve when the empty message and the shutdown come.
    let la = limits(65536, 65536, 8, 32, 65536);
    let lb = limits(65536, 65536, 8, 32, 65536);
    let mut p = Pair::new(la, lb);
    for i in 0..4u8 {
        p.send_msg(A, vec![i]);
    }
    p.run();
    assert_eq!(p.conn(A).peer_recvs_free(), u64::from(CONTROL_RESERVE));
    p.send_msg(A, Vec::new());
    p.conn_mut(A).shutdown_write();
    p.run();
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

// ------------------------------------------------------------------------- hostile peers

/// A connection alone (a 4 KiB ring, 8 receives); its peer is the test.
fn lone(max_message: u32) -> Connection {
    let mut l = limits(4096, 4096, 8, 16, 4096);
    l.max_message = max_message;
    Connection::new(l, hello_of(&limits(4096, 4096, 8, 16, 4096)))
}

/// A stream data immediate.
fn data(len: u32) -> u32 {
    Imm::Data {
        len,
        msg: false,
        eom: false,
    }
    .encode()
}

/// A message piece's immediate.
fn piece(len: u32, eom: bool) -> u32 {
    Imm::Data {
        len,
        msg: true,
        eom,
    }
    .encode()
}

fn feed(c: &mut Connection, imm: u32, byte_len: u32) {
    c.on_recv_completion(Some(imm), byte_len, Completion::Ok, Instant::now());
}

/// `c` must have failed with a protocol error and refuse everything after.
fn assert_lied(c: &mut Connection, case: &str, mentions: &str) {
    let e = c.error().cloned();
    match &e {
        Some(ConnError::Protocol(what)) => {
            assert!(
                what.contains(mentions),
                "{case}: {what:?} should say {mentions:?}"
            );
        }
        other => panic!("{case}: expected a protocol error, got {other:?}"),
    }
    assert!(c.poll_transmit().is_none(), "{case}");
    assert_eq!(c.commit_send(0, false), Err(e.clone().unwrap()), "{case}");
    assert_eq!(c.send_window().1, 0, "{case}");
    assert!(
        c.is_readable(true),
        "{case}: a reader wakes to see the error"
    );
    // Sticky, and later input is ignored.
    feed(c, data(1), 1);
    feed(c, Imm::Control(Control::Fin).encode(), 0);
    assert_eq!(c.error().cloned(), e, "{case}");
    assert!(c.poll_transmit().is_none(), "{case}");
}

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
            "more message ends than receives",
            "more messages than receives",
            |c| {
                for _ in 0..8 {
                    feed(c, piece(0, true), 0);
                }
                assert!(c.error().is_none(), "one message per receive is fine");
                feed(c, piece(0, true), 0);
            },
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
                Fuzz::Send { wr_id, status } => c.on_send_completion(wr_id, status_of(status)),
                Fuzz::Consume(n) => c.consume(n),
                Fuzz::ConsumeMessage(n, e) => c.consume_message(n, e),
                Fuzz::Commit(n, e) => {
                    let _ = c.commit_send(n, e);
                }
                Fuzz::Transmit => {
                    while let Some(t) = c.poll_transmit() {
                        prop_assert!(c.error().is_none());
                        prop_assert!(c.in_flight() <= u64::from(c.limits().send_depth));
                        prop_assert!(Imm::decode(t.imm).is_ok());
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
            }
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

#[test]
fn consuming_a_message_past_its_end_stops_at_the_end() {
    // An empty message, then stream bytes; a reader that consumes more than the window.
    let mut c = lone(1 << 20);
    feed(&mut c, piece(0, true), 0);
    feed(&mut c, data(5), 5);
    c.consume_message(1, false);
    let w = c.recv_window();
    assert_eq!(
        (w.len, w.ends_message),
        (0, true),
        "still at the empty message"
    );
    c.consume_message(0, true);
    assert_eq!(c.recv_window().len, 5);
    c.consume_message(100, true);
    assert!(!c.has_unread());
}
