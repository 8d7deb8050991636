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

mod lend;
