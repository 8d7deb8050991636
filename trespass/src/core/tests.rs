//! The core's tests: two [`Connection`]s wired together in memory (a [`Pair`], as
//! quinn-proto's tests have one), on a virtual clock, with knobs for delay, flushed
//! completions, retry-exceeded and CQ overrun; hostile-peer tests that feed hand-made
//! immediates; and property tests against a model (no byte lost or duplicated, nothing
//! posted without credit, the ring never overwritten, credits add up).
//!
//! The simulated network is strict where RDMA is: a write's bytes are copied out of the
//! sender's send buffer when it lands (so a sender that reused its buffer before the
//! completion would deliver wrong bytes), a write with immediate consumes one of the
//! receiver's posted receives (none posted is an RNR: an assertion), and a write lands
//! exactly at the receiver's ring tail, inside the ring's free space (its unread bytes plus
//! [`MSG_CHARGE`] per unread message end). A plain write (no immediate, posted only to be
//! signalled) consumes no receive and completes only at the sender.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

use super::*;
use crate::wire::{Control, Hello, Imm, MSG_CHARGE};

/// [`MSG_CHARGE`] as the core counts it.
const CHARGE: u64 = MSG_CHARGE as u64;

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
        lends: true,
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
        lends: l.lends,
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
    /// Message ends landed in the ring in all.
    landed_msgs: u64,
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
    /// Memory this side lends, at [`LEND_BASE`] of its address space, and the key that
    /// opens it for the peer's READs (`None` once revoked).
    lend_mem: Vec<u8>,
    lend_rkey: Option<u32>,
    /// Where this side's fetch READs land.
    fetch_target: Vec<u8>,
}

/// Where a side's lendable memory starts, in the simulated address space.
const LEND_BASE: u64 = 0x7000_0000_0000;

impl Side {
    fn new(mine: Limits, peer: Limits) -> Side {
        Side {
            conn: Connection::new(mine, hello_of(&peer)),
            ring: vec![0; mine.ring_size as usize],
            send_buf: vec![0; mine.send_buffer as usize],
            recvs_posted: u64::from(mine.recv_depth),
            landed: 0,
            landed_msgs: 0,
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
            lend_mem: Vec::new(),
            lend_rkey: None,
            fetch_target: Vec::new(),
        }
    }

    /// The immediates posted, decoded (plain writes carry none and are left out).
    fn imms(&self) -> Vec<Imm> {
        self.log
            .iter()
            .filter(|t| !t.plain && !t.read)
            .map(|t| Imm::decode(t.imm).expect("posted immediates decode"))
            .collect()
    }

    /// The plain (signal-only) writes posted.
    fn plains(&self) -> Vec<Transmit> {
        self.log.iter().filter(|t| t.plain).copied().collect()
    }

    /// The data writes posted: (len, msg, eom) each.
    fn data_writes(&self) -> Vec<(u32, bool, bool)> {
        self.imms()
            .into_iter()
            .filter_map(|i| match i {
                Imm::Data { len, msg, eom } => Some((len, msg, eom)),
                _ => None,
            })
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
        if t.plain {
            // A signal-only write: nothing to write, nothing to tell the peer.
            assert!(
                t.signaled,
                "a plain write is posted only to be signalled: {t:?}"
            );
            assert_eq!(t.len, 0, "a plain write carries no bytes: {t:?}");
        }
        if t.read {
            let lend = side
                .conn
                .fetching()
                .copied()
                .expect("a READ is posted only while a fetch runs");
            assert!(t.len > 0 && t.len <= READ_CHUNK, "{t:?}");
            assert!(
                u64::from(t.local_offset) + u64::from(t.len) <= u64::from(lend.len)
                    && t.local_offset == t.remote_offset,
                "{t:?} reads outside the region {lend:?}"
            );
        }
        let imm = if t.plain || t.read {
            None
        } else {
            Some(Imm::decode(t.imm).expect("the core posts only immediates it can decode"))
        };
        match imm {
            None => {}
            Some(Imm::Data { len, .. }) => {
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
            Some(_) => assert_eq!(t.len, 0, "control messages carry no bytes: {t:?}"),
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
        if t.read {
            // An RDMA READ: the peer's NIC reads its lent memory, if the key still opens
            // it, into this side's fetch target. No receive is used.
            let lend = src.conn.fetching().copied().expect("a fetch runs");
            let at = (lend.addr + u64::from(t.remote_offset)).checked_sub(LEND_BASE);
            let range = at.map(|a| a as usize..a as usize + t.len as usize);
            let status = match range {
                Some(r) if dst.lend_rkey == Some(lend.rkey) && r.end <= dst.lend_mem.len() => {
                    let l = t.local_offset as usize;
                    src.fetch_target[l..l + t.len as usize].copy_from_slice(&dst.lend_mem[r]);
                    Completion::Ok
                }
                _ => Completion::RemoteAccess,
            };
            if t.signaled || status != Completion::Ok {
                src.send_cq.push_back((t.wr_id, status));
            }
            return true;
        }
        if !t.plain {
            assert!(
                dst.recvs_posted > 0,
                "RNR: {t:?} landed with no receive posted (posted without credit)"
            );
            dst.recvs_posted -= 1;
        }
        if let (false, Ok(Imm::Data { len, eom, .. })) = (t.plain, Imm::decode(t.imm)) {
            let ring = dst.ring.len() as u64;
            assert_eq!(
                u64::from(t.remote_offset),
                dst.landed % ring,
                "side {from}'s write does not land at side {to}'s ring tail"
            );
            // What the ring holds as the NIC sees it: bytes not yet consumed, and message
            // ends landed and not yet read (or discarded), MSG_CHARGE each.
            let unread = dst.landed - dst.conn.head;
            let unread_msgs = dst.landed_msgs - dst.conn.msgs_read;
            let charge = if eom { CHARGE } else { 0 };
            assert!(
                unread + CHARGE * unread_msgs + u64::from(len) + charge <= ring,
                "side {from}'s write of {len} bytes (end: {eom}) is beyond its credit: \
                 {unread} bytes and {unread_msgs} messages unread in a ring of {ring}"
            );
            let (l, r) = (t.local_offset as usize, t.remote_offset as usize);
            let n = len as usize;
            dst.ring[r..r + n].copy_from_slice(&src.send_buf[l..l + n]);
            dst.landed += u64::from(len);
            dst.landed_msgs += u64::from(eom);
        }
        if !t.plain {
            dst.recv_cq.push_back((Some(t.imm), t.len, Completion::Ok));
        }
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
        let now = self.now;
        let side = &mut self.sides[s];
        side.conn.on_send_completion(wr, status, now);
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
            // Byte credit, in units (bytes plus MSG_CHARGE per message end): never more
            // consumed than the reader consumed, so the sender's view of the peer's free
            // space never exceeds the real one (nor the ring).
            let ring = peer.ring.len() as u64;
            assert_eq!(u64::from(c.peer.ring_size), ring);
            assert!(
                c.peer_consumed.get() <= peer.conn.consumed_units(),
                "side {s} believes {} units were consumed, the reader consumed {}",
                c.peer_consumed.get(),
                peer.conn.consumed_units()
            );
            assert!(c.msgs_sent * CHARGE + c.posted == c.charged());
            assert!(
                c.charged() - c.peer_consumed.get() <= ring,
                "side {s} charged {} units to a ring of {ring} with {} consumed",
                c.charged(),
                c.peer_consumed.get()
            );
            assert!(peer.conn.tail <= peer.landed && peer.landed <= c.posted);
            assert!(peer.conn.msgs_read <= peer.landed_msgs && peer.landed_msgs <= c.msgs_sent);
            assert!(peer.conn.consumed_units() <= c.charged());
            // The ring as the NIC sees it, and as the reader counts it: unread bytes plus
            // MSG_CHARGE per unread message end, never more than the ring.
            let unread_msgs = peer.landed_msgs - peer.conn.msgs_read;
            assert!(
                peer.landed - peer.conn.head + CHARGE * unread_msgs <= ring,
                "side {s}'s peer holds {} bytes and {unread_msgs} messages in a ring of {ring}",
                peer.landed - peer.conn.head
            );
            let pc = &peer.conn;
            assert!(pc.tail - pc.head + CHARGE * pc.boundaries.len() as u64 <= ring);
            assert!(pc.boundaries.len() as u64 <= ring / CHARGE);
            // Every unit charged landed, or is on its way.
            if !me.dead {
                let on_wire: u64 = self.wire[s]
                    .iter()
                    .filter(|t| !t.plain && !t.read)
                    .map(|t| match Imm::decode(t.imm) {
                        Ok(Imm::Data { len, eom, .. }) => u64::from(len) + CHARGE * u64::from(eom),
                        _ => 0,
                    })
                    .sum();
                assert_eq!(
                    peer.landed + CHARGE * peer.landed_msgs + on_wire,
                    c.charged(),
                    "side {s}'s charged units do not add up"
                );
            }
            // Receive credit: the receives side `s` believes free are really posted, less
            // the writes with immediate already on their way (plain writes use none).
            if !me.dead && !peer.dead {
                let imm_on_wire = self.wire[s].iter().filter(|t| !t.plain && !t.read).count();
                let real = peer.recvs_posted as i64 - imm_on_wire as i64;
                assert!(
                    c.peer_recvs_free() as i64 <= real,
                    "side {s} believes {} receives free at its peer, {} are",
                    c.peer_recvs_free(),
                    real
                );
            }
            // Receives add up: each one used is posted again, or due to the driver, or its
            // completion is still in the CQ. No unread message holds one.
            if !me.dead && me.conn.error().is_none() {
                let used = u64::from(c.limits.recv_depth) - me.recvs_posted;
                let held = u64::from(c.recvs_due) + me.recv_cq.len() as u64;
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
            if w.lent {
                break; // a descriptor is the driver's, never the application's bytes
            }
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
            if w.lent {
                break;
            }
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

// ------------------------------------------------------------------------- hostile peers

/// A connection alone (a 4 KiB ring, 128 receives; its peer 8); its peer is the test, which
/// never sees the receive credits this side sends.
fn lone(max_message: u32) -> Connection {
    let mut l = limits(4096, 4096, 128, 16, 4096);
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

mod failures;
mod lend;
mod lies;
mod props;
mod streams;
