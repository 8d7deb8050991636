//! The protocol core: one connection's state machine, with no I/O at all.
//!
//! It calls no verb, owns no fd and reads no clock. The driver feeds it what happened
//! (completions, the connection manager's disconnect, the time, the application's reads and
//! writes) and asks it what to do, in this order each round:
//!
//! 1. [`Connection::on_send_completion`] / [`Connection::on_recv_completion`] for every
//!    completion polled, then [`Connection::on_disconnected`] if rdma_cm said so, and
//!    [`Connection::handle_timeout`] when [`Connection::poll_timeout`] has passed;
//! 2. [`Connection::poll_recvs`]: post that many receives (zero-length) again;
//! 3. [`Connection::poll_transmit`] until `None`: post each, all in one doorbell.
//!
//! The application side copies bytes itself, into the ranges the core names:
//! [`Connection::send_window`] then [`Connection::commit_send`] to write;
//! [`Connection::recv_window`] then [`Connection::consume`] (streams) or
//! [`Connection::consume_message`] (messages) to read.
//!
//! Lending (zero-copy, both hellos with [`crate::wire::FLAG_LENDS`]): the lender begins a
//! message with [`Connection::begin_lend`] and commits the region's 16-byte
//! [`Lend`](crate::wire::Lend) descriptor as its bytes; the core announces it with a LEND control message, and
//! [`Connection::poll_returned`] counts the regions the peer returned. The receiver sees the
//! descriptor as a message with [`RecvWindow::lent`] set, consumes it, hands its bytes to
//! [`Connection::begin_fetch`], posts the RDMA READs [`Connection::poll_transmit`] names
//! (`read` set, into its own registration of the target memory), and once
//! [`Connection::fetch_done`] calls [`Connection::finish_fetch`], which sends the RETURN.
//!
//! The rules it keeps (`docs/trespass-protocol.md` says why):
//! - nothing is written into the peer's ring beyond the bytes it has credited, and no
//!   write with immediate is posted without one of the peer's receives known to be free,
//!   the last [`CONTROL_RESERVE`] of which only control messages use;
//! - every value the peer sends is checked before use; a lie ends the connection with
//!   [`ConnError::Protocol`] and nothing else;
//! - the send queue never holds more than its depth, and one request in every quarter of
//!   it is signalled, so completions always come back to free it.

mod credit;
mod lend;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use credit::{wire_value, Cumulative};

use crate::wire::{Control, Hello, Imm, CONTROL_RESERVE, LEND_LEN, MSG_CHARGE};

use lend::Fetch;

/// Coalescing threshold with `nodelay` off: held bytes go out once this many are pending
/// (or half the send buffer, when that is less: a full buffer must always drain).
pub const COALESCE_BYTES: u64 = 16 * 1024;

/// The ring fraction at which consumed bytes are reported back: a byte credit goes out
/// once a quarter of the ring has been read since the last one.
pub const BYTE_CREDIT_DIVISOR: u64 = 4;

/// The receive fraction at which reposted receives are reported back: once a quarter of
/// the receives have been posted again since the last report.
pub const RECV_CREDIT_DIVISOR: u32 = 4;

/// The largest RDMA READ a fetch posts: a lent region is read in pieces of this size (well
/// under any port's largest message), the last signalled.
pub const READ_CHUNK: u32 = 1 << 20;

/// One connection's sizes, fixed when it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// This side's receive ring, in bytes.
    pub ring_size: u32,
    /// This side's send buffer (where written bytes wait for their RDMA WRITE), in bytes.
    pub send_buffer: u32,
    /// Receives this side posts for the peer's writes with immediate.
    pub recv_depth: u16,
    /// Send queue depth.
    pub send_depth: u32,
    /// The largest single RDMA WRITE.
    pub max_write: u32,
    /// The largest message this side accepts.
    pub max_message: u32,
    /// This side takes lent regions (it told the peer so in its hello).
    pub lends: bool,
}

/// Why a connection ended badly. Sticky: once set, every later call returns it again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// The peer broke the protocol (a length, offset, credit or message it had no right to
    /// send). The connection is closed; other connections are untouched.
    #[error("the peer broke the trespass protocol: {0}")]
    Protocol(String),
    /// The peer went away without closing (its process died, or it disconnected with its
    /// write side still open).
    #[error("the connection was reset: {0}")]
    Reset(String),
    /// The transport gave up: the peer's NIC stopped answering within the retry budget
    /// (link down, host down).
    #[error("the peer is unreachable: {0}")]
    Unreachable(String),
    /// The peer answered no keep-alive probe within the keep-alive period.
    #[error("the peer did not answer a keep-alive probe within {0:?} (process stopped or hung?)")]
    KeepAlive(Duration),
    /// A local failure (a verb failed, the device went away).
    #[error("local failure: {0}")]
    Local(String),
}

/// How a work request completed, as the core needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Success.
    Ok,
    /// Flushed: the QP went to the error state (a disconnect, or an earlier failure).
    Flushed,
    /// The transport's retries ran out: the peer's NIC did not answer.
    RetryExceeded,
    /// The peer's NIC refused the access (bad key, address, or length): a local bug or the
    /// peer deregistered its ring.
    RemoteAccess,
    /// Any other failure; the status code and its text.
    Other(u32, &'static str),
}

/// What to post: an RDMA WRITE with immediate into the peer's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The work request id to post it with.
    pub wr_id: u64,
    /// Where its bytes are in the send buffer (unused when `len` is 0).
    pub local_offset: u32,
    /// Bytes to write (0 for control messages).
    pub len: u32,
    /// Where in the peer's ring they go (an offset from the ring's start).
    pub remote_offset: u32,
    /// The immediate, already encoded.
    pub imm: u32,
    /// Ask for a completion.
    pub signaled: bool,
    /// A zero-length RDMA WRITE without immediate (it uses no receive at the peer): posted
    /// only to be signalled, so that the requests before it complete.
    pub plain: bool,
    /// An RDMA READ of the region being fetched ([`Connection::fetching`]): `len` bytes
    /// from `remote_offset` of the lent region into `local_offset` of the fetch's target.
    /// No immediate, no receive used at the peer.
    pub read: bool,
}

/// What the read side holds next: `len` contiguous bytes at `offset` in the ring, and
/// whether the last of them ends a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWindow {
    /// Offset in the ring.
    pub offset: u32,
    /// Bytes readable there (may be 0 for an empty message).
    pub len: u32,
    /// The last of these bytes ends a message.
    pub ends_message: bool,
    /// These bytes are a lent region's descriptor (all of it, or its first part when it
    /// wraps at the ring's end): consume them with
    /// [`consume_message`](Connection::consume_message) and hand them to
    /// [`begin_fetch`](Connection::begin_fetch), never to the application.
    pub lent: bool,
}

/// One connection's protocol state. See the [module docs](self) for the order of calls.
#[derive(Debug)]
pub struct Connection {
    limits: Limits,
    peer: Hello,

    // Send buffer: [completed, posted) is in flight, [posted, app_tail) waits to be posted.
    app_tail: u64,
    posted: u64,
    completed: u64,
    /// Messages not yet wholly posted, as send-buffer (start, end) positions; `end` is
    /// `u64::MAX` while the message is still being written.
    msgs: VecDeque<(u64, u64)>,
    /// Starts of lent messages (descriptors) not yet announced with a LEND. A lent message
    /// is never empty, so the message at such a start that is not empty is the lent one.
    lend_starts: VecDeque<u64>,
    /// Lent messages begun, announced, and returned by the peer; returns the driver has
    /// taken ([`poll_returned`](Self::poll_returned)).
    lends_begun: u64,
    lends_announced: u64,
    returned: u64,
    returned_taken: u64,
    nodelay: bool,
    flush: bool,

    // The peer's ring: this side has written `posted` bytes and ended `msgs_sent` messages
    // into it (`charged`); it has consumed (in the same units):
    msgs_sent: u64,
    peer_consumed: Cumulative,
    // The peer's receives: this side has used `imm_sent`, it has posted again:
    imm_sent: u64,
    peer_reposted: Cumulative,

    // Send queue: ids below `wr_done` are complete; `signaled` holds (id, send-buffer
    // position after it) for each signalled request in flight.
    wr_next: u64,
    wr_done: u64,
    signaled: VecDeque<(u64, u64)>,
    unsignaled_run: u32,
    /// A signalled request is wanted after the unsignalled ones in flight.
    signal_wanted: bool,

    // Receive ring: [head, tail) holds unread bytes. Credit counts ring bytes plus
    // MSG_CHARGE per message read (`consumed_units`); `credited` is what was last reported.
    tail: u64,
    head: u64,
    credited: u64,
    msgs_read: u64,
    /// Ring positions where unread messages end (each costs MSG_CHARGE of ring credit).
    boundaries: VecDeque<u64>,
    /// Arrivals are thrown away (the read side is shut down).
    discard: bool,
    /// Bytes of the message being received so far.
    msg_bytes: u64,
    /// A message's first piece arrived and its last has not.
    msg_open: bool,
    recvs_due: u32,
    reposted: u64,
    reposted_reported: u64,
    /// Writes with immediate data received (successful receive completions).
    received: u64,
    /// A LEND arrived: the next message is a descriptor.
    lend_next: bool,
    /// The message arriving now is a descriptor.
    msg_lent: bool,
    /// Descriptors in the ring, as (start, end) ring positions; `end` is `u64::MAX` while
    /// the descriptor is still arriving.
    lent_in: VecDeque<(u64, u64)>,
    /// RETURNs to send (regions fetched or thrown away).
    returns_due: u64,
    fetch: Option<Fetch>,
    /// The READs in flight, by work request id (oldest first).
    read_wrs: VecDeque<u64>,

    // Control.
    fin_wanted: bool,
    fin_sent: bool,
    fin_wr: Option<u64>,
    fin_done: bool,
    peer_fin: bool,
    pong_due: bool,
    ping_wanted: bool,
    ping_outstanding: bool,
    /// The outstanding probe's work request, until the peer's NIC acknowledged it.
    ping_wr: Option<u64>,

    // Keep-alive.
    keepalive: Option<Duration>,
    /// The peer asked this side's NIC to retry receiver-not-ready for ever (it draws its
    /// receives from a shared pool): a probe on the wire may wait for a stopped process.
    rnr_forever: bool,
    last_heard: Option<Instant>,
    ping_deadline: Option<Instant>,

    // Failure.
    error: Option<ConnError>,
    /// The transport is gone (disconnected or flushed): reads drain the ring, then end.
    broken: Option<ConnError>,
}

impl Connection {
    /// A connection with this side's `limits`, to a peer that said `peer`.
    ///
    /// The driver has already posted `limits.recv_depth` receives.
    pub fn new(limits: Limits, peer: Hello) -> Connection {
        let depth = usize::from(limits.recv_depth);
        Connection {
            limits,
            peer,
            app_tail: 0,
            posted: 0,
            completed: 0,
            msgs: VecDeque::with_capacity(usize::from(peer.recv_depth)),
            lend_starts: VecDeque::new(),
            lends_begun: 0,
            lends_announced: 0,
            returned: 0,
            returned_taken: 0,
            nodelay: true,
            flush: false,
            msgs_sent: 0,
            peer_consumed: Cumulative::default(),
            imm_sent: 0,
            peer_reposted: Cumulative::default(),
            wr_next: 0,
            wr_done: 0,
            signaled: VecDeque::with_capacity(limits.send_depth as usize),
            unsignaled_run: 0,
            signal_wanted: false,
            tail: 0,
            head: 0,
            credited: 0,
            msgs_read: 0,
            boundaries: VecDeque::with_capacity(depth),
            discard: false,
            msg_bytes: 0,
            msg_open: false,
            recvs_due: 0,
            reposted: 0,
            reposted_reported: 0,
            received: 0,
            lend_next: false,
            msg_lent: false,
            lent_in: VecDeque::new(),
            returns_due: 0,
            fetch: None,
            read_wrs: VecDeque::new(),
            fin_wanted: false,
            fin_sent: false,
            fin_wr: None,
            fin_done: false,
            peer_fin: false,
            pong_due: false,
            ping_wanted: false,
            ping_outstanding: false,
            ping_wr: None,
            keepalive: None,
            rnr_forever: false,
            last_heard: None,
            ping_deadline: None,
            error: None,
            broken: None,
        }
    }

    /// This side's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the peer said when connecting.
    pub fn peer(&self) -> &Hello {
        &self.peer
    }

    // ---------------------------------------------------------------- settings

    /// With `nodelay` on (the default) every committed byte is posted as soon as credit
    /// allows; off, bytes are held until [`COALESCE_BYTES`] are pending, a message ends,
    /// or [`flush`](Self::flush) is called.
    pub fn set_nodelay(&mut self, nodelay: bool) {
        self.nodelay = nodelay;
    }

    /// Whether `nodelay` is on.
    pub fn nodelay(&self) -> bool {
        self.nodelay
    }

    /// Posts every held byte on the next [`poll_transmit`](Self::poll_transmit).
    pub fn flush(&mut self) {
        self.flush = true;
    }

    /// Probes the peer after `period` without hearing from it, and fails the connection
    /// with [`ConnError::KeepAlive`] when another `period` passes without an answer after
    /// the peer's NIC acknowledged the probe. Until that acknowledgement the transport's
    /// own retries bound the wait (a lossy link delays the probe behind retransmissions;
    /// a link that is down exhausts the retries and fails the connection as unreachable),
    /// so the probe judges only whether the peer's process answers (unless the transport
    /// retries receiver-not-ready for ever: [`set_rnr_forever`](Self::set_rnr_forever)).
    /// `None` turns keep-alive off. Takes effect from `now`.
    pub fn set_keepalive(&mut self, period: Option<Duration>, now: Instant) {
        self.keepalive = period;
        self.last_heard = Some(now);
        self.ping_deadline = None;
    }

    /// Tells the core that the transport retries receiver-not-ready for ever on this
    /// connection (the peer's receives come from a shared pool that may be overcommitted,
    /// and it asked for `rnr_retry_count` 7). A write to a peer whose process stopped with
    /// its pool empty then never completes nor fails, so the transport no longer bounds a
    /// probe on the wire: its keep-alive deadline runs from when the probe was wanted, and
    /// a probe still unacknowledged a `period` later fails the connection with
    /// [`ConnError::KeepAlive`]. Off by default.
    pub fn set_rnr_forever(&mut self, on: bool) {
        self.rnr_forever = on;
    }

    // ---------------------------------------------------------------- state

    /// The connection's fatal error, if any (sticky).
    pub fn error(&self) -> Option<&ConnError> {
        self.error.as_ref()
    }

    /// Why the transport is gone, if it is (reads may still drain the ring).
    pub fn broken(&self) -> Option<&ConnError> {
        self.broken.as_ref()
    }

    /// True once the peer shut its write side down and every byte before that was read
    /// (a region being fetched included).
    pub fn is_eof(&self) -> bool {
        self.peer_fin
            && self.head == self.tail
            && self.boundaries.is_empty()
            && self.fetch.is_none()
    }

    /// True while bytes (or an empty message) wait to be read, or a fetched region waits
    /// to be taken. A descriptor still arriving, with nothing before it, is not yet
    /// readable.
    pub fn has_unread(&self) -> bool {
        if self.fetch.is_some() {
            // The fetched region is the next thing to read; nothing after it counts yet.
            return self.fetch_done();
        }
        let incomplete_lend = self.lent_in.front() == Some(&(self.head, u64::MAX));
        (self.head != self.tail || !self.boundaries.is_empty()) && !incomplete_lend
    }

    /// True once this side's write side is shut down.
    pub fn write_shut(&self) -> bool {
        self.fin_wanted
    }

    /// True once the FIN was posted and completed: the peer's NIC has every byte.
    pub fn fin_done(&self) -> bool {
        self.fin_done
    }

    /// Bytes committed but not yet known to be in the peer's ring.
    pub fn unacknowledged(&self) -> u64 {
        self.app_tail - self.completed
    }

    /// Work requests posted and not known to be complete.
    pub fn in_flight(&self) -> u64 {
        self.wr_next - self.wr_done
    }

    /// True when a write could take at least one byte now.
    pub fn is_writable(&self) -> bool {
        self.send_window().1 > 0
    }

    /// A complete message (or, with `stream`, any byte or end of stream) is waiting.
    pub fn is_readable(&self, stream: bool) -> bool {
        if self.error.is_some() || self.is_eof() {
            return true;
        }
        if self.fetch.is_some() {
            return self.fetch_done() || self.broken.is_some();
        }
        if stream {
            self.has_unread() || self.broken.is_some()
        } else {
            !self.boundaries.is_empty()
                || self.tail - self.head >= u64::from(self.limits.ring_size) / 2
                || self.broken.is_some()
        }
    }

    fn fail(&mut self, e: ConnError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    fn protocol(&mut self, what: String) {
        self.fail(ConnError::Protocol(what));
    }

    fn check(&self) -> Result<(), ConnError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- writing

    /// Contiguous free room in the send buffer: `(offset, len)`. `len` is 0 while the buffer
    /// is full, or while as many messages wait unposted as the peer has receives.
    pub fn send_window(&self) -> (u32, u32) {
        if self.error.is_some() || self.fin_wanted || self.broken.is_some() {
            return (0, 0);
        }
        let size = u64::from(self.limits.send_buffer);
        let free = size - (self.app_tail - self.completed);
        let offset = self.app_tail % size;
        let len = free.min(size - offset);
        if self.msgs_full() {
            return (offset as u32, 0);
        }
        (offset as u32, len as u32)
    }

    /// As many messages wait unposted as the peer has receives: no new one may start.
    fn msgs_full(&self) -> bool {
        let open = self.msgs.back().is_some_and(|&(_, end)| end == u64::MAX);
        !open && self.msgs.len() >= usize::from(self.peer.recv_depth)
    }

    /// Free bytes in the send buffer in all (not only contiguous).
    pub fn send_free(&self) -> u64 {
        u64::from(self.limits.send_buffer) - (self.app_tail - self.completed)
    }

    /// Starts a message at the next committed byte: what is committed from here up to a
    /// commit with `ends_message` is one message. Without it, a commit with `ends_message`
    /// is a message on its own.
    ///
    /// # Errors
    ///
    /// The connection's error; [`ConnError::Local`] when a message is already open or as
    /// many messages wait as the peer has receives (check [`send_window`](Self::send_window)
    /// first).
    pub fn begin_message(&mut self) -> Result<(), ConnError> {
        self.check()?;
        if self.msgs_full() || self.msgs.back().is_some_and(|&(_, e)| e == u64::MAX) {
            return Err(ConnError::Local(
                "a message begun while another is open, or too many waiting".into(),
            ));
        }
        self.msgs.push_back((self.app_tail, u64::MAX));
        Ok(())
    }

    /// Records that the application copied `n` bytes into the send window: stream bytes,
    /// or the next piece of the message begun with [`begin_message`](Self::begin_message).
    /// `ends_message` marks the last of them (or, with `n` 0, an empty message) as a
    /// message's end.
    ///
    /// # Errors
    ///
    /// The connection's error, or [`ConnError::Local`] when `n` exceeds the window or a
    /// message is ended after [`shutdown_write`](Self::shutdown_write) (bugs in the caller).
    pub fn commit_send(&mut self, n: u32, ends_message: bool) -> Result<(), ConnError> {
        self.check()?;
        let (_, room) = self.send_window();
        if ends_message && self.fin_wanted {
            // It would go after the FIN, which the peer must refuse.
            return Err(ConnError::Local(
                "a message ended after shutdown_write".into(),
            ));
        }
        let open = self.msgs.back().is_some_and(|&(_, e)| e == u64::MAX);
        if n > room || (ends_message && !open && self.msgs_full()) {
            return Err(ConnError::Local(format!(
                "committed {n} bytes into a send window of {room}"
            )));
        }
        let start = self.app_tail;
        self.app_tail += u64::from(n);
        if ends_message {
            match self.msgs.back_mut() {
                Some((_, end)) if *end == u64::MAX => *end = self.app_tail,
                _ => self.msgs.push_back((start, self.app_tail)),
            }
        }
        Ok(())
    }

    /// Bytes the application committed since the connection began (stream bytes and
    /// messages' bytes, lent ones' descriptors included).
    pub fn committed(&self) -> u64 {
        self.app_tail
    }

    /// Shuts the write side down: once every committed byte is posted, a FIN follows.
    pub fn shutdown_write(&mut self) {
        self.fin_wanted = true;
        self.flush = true;
    }

    // ---------------------------------------------------------------- reading

    /// The next contiguous readable bytes in the ring (stopping at a message's end, at a
    /// lent region's descriptor, and empty while a region is being fetched).
    pub fn recv_window(&self) -> RecvWindow {
        let size = u64::from(self.limits.ring_size);
        let avail = self.tail - self.head;
        let offset = self.head % size;
        let mut len = avail.min(size - offset);
        let mut ends_message = false;
        if self.fetch.is_some() {
            // The region being fetched comes first; what follows it waits.
            return RecvWindow {
                offset: offset as u32,
                len: 0,
                ends_message: false,
                lent: false,
            };
        }
        let mut lent = false;
        match self.lent_in.front() {
            // Bytes before a descriptor stop at its start.
            Some(&(start, _)) if start > self.head => len = len.min(start - self.head),
            // A descriptor is handed over only whole.
            Some(&(_, u64::MAX)) => len = 0,
            Some(_) => lent = true,
            None => {}
        }
        if let Some(&end) = self.boundaries.front() {
            if end - self.head <= len {
                len = end - self.head;
                ends_message = true;
            }
        }
        RecvWindow {
            offset: offset as u32,
            len: len as u32,
            ends_message,
            lent,
        }
    }

    /// Records that the application read `n` bytes as a stream: message ends they reach are
    /// passed over.
    pub fn consume(&mut self, n: u32) {
        self.advance_head(n);
        while self.boundaries.front().is_some_and(|&end| end <= self.head) {
            self.boundaries.pop_front();
            self.msgs_read += 1;
        }
        // A descriptor read as stream bytes (the driver stops before them) would leave its
        // region unfetched: it goes back to the peer as thrown away.
        while self
            .lent_in
            .front()
            .is_some_and(|&(_, end)| end <= self.head)
        {
            self.lent_in.pop_front();
            self.returns_due += 1;
        }
    }

    /// Records that the application read `n` bytes of a message; `ends_message` when they
    /// end it (as [`recv_window`](Self::recv_window) said).
    pub fn consume_message(&mut self, n: u32, ends_message: bool) {
        // Never past the message's end: the head would pass its boundary, which then stays
        // first for good (and `end - head` underflows in `recv_window`).
        let to_end = self
            .boundaries
            .front()
            .map_or(u64::MAX, |&end| end - self.head);
        self.advance_head(n.min(u32::try_from(to_end).unwrap_or(u32::MAX)));
        if ends_message && self.boundaries.front() == Some(&self.head) {
            self.boundaries.pop_front();
            self.msgs_read += 1;
            // A descriptor read whole: its region is the driver's to fetch now.
            if self
                .lent_in
                .front()
                .is_some_and(|&(_, end)| end == self.head)
            {
                self.lent_in.pop_front();
            }
        }
    }

    /// Ring credit units consumed so far: bytes read, plus [`MSG_CHARGE`] per message end
    /// passed.
    fn consumed_units(&self) -> u64 {
        self.head + u64::from(MSG_CHARGE) * self.msgs_read
    }

    /// Ring credit units the peer used so far: bytes written, plus [`MSG_CHARGE`] per
    /// message ended.
    fn charged(&self) -> u64 {
        self.posted + u64::from(MSG_CHARGE) * self.msgs_sent
    }

    /// Shuts the read side down: what is unread and what arrives from now on is thrown
    /// away as it comes (its credit returns at once), so the peer is never blocked by a
    /// reader that stopped reading.
    pub fn shutdown_read(&mut self) {
        self.discard = true;
        self.discard_unread();
    }

    fn discard_unread(&mut self) {
        self.head = self.tail;
        while self.boundaries.pop_front().is_some() {
            self.msgs_read += 1;
        }
        // Regions lent and thrown away go back at once; one whose descriptor is still
        // arriving goes when it is whole.
        while self
            .lent_in
            .front()
            .is_some_and(|&(_, end)| end != u64::MAX)
        {
            self.lent_in.pop_front();
            self.returns_due += 1;
        }
    }

    /// Asks for the newest request in flight to be signalled (a zero-length write without
    /// immediate follows it if it was not), so that its completion frees the send buffer:
    /// for a writer about to wait for more room than a signal is due at.
    pub fn request_signal(&mut self) {
        if self.unsignaled_run > 0 {
            self.signal_wanted = true;
        }
    }

    fn advance_head(&mut self, n: u32) {
        let n = u64::from(n).min(self.tail - self.head);
        self.head += n;
    }

    // ---------------------------------------------------------------- events

    /// A send completion for `wr_id`.
    pub fn on_send_completion(&mut self, wr_id: u64, status: Completion, now: Instant) {
        let read = self.read_wrs.contains(&wr_id);
        match status {
            Completion::Ok => {}
            // The peer's NIC refused a READ of the region the peer itself named: its lie
            // (or its bug), not the network's.
            Completion::RemoteAccess if read => {
                return self.protocol(
                    "the region it lent could not be read: its NIC refused the RDMA READ (wrong key, address or length)"
                        .into(),
                );
            }
            other => {
                self.transport_failed(
                    other,
                    if read {
                        "an RDMA READ"
                    } else {
                        "an RDMA WRITE"
                    },
                );
                return;
            }
        }
        if wr_id < self.wr_done || wr_id >= self.wr_next {
            self.fail(ConnError::Local(format!(
                "a completion for work request {wr_id}, which is not in flight ({}..{})",
                self.wr_done, self.wr_next
            )));
            return;
        }
        while let Some(&(id, pos)) = self.signaled.front() {
            if id > wr_id {
                break;
            }
            self.signaled.pop_front();
            self.completed = self.completed.max(pos);
        }
        self.wr_done = wr_id + 1;
        while self.read_wrs.front().is_some_and(|&id| id <= wr_id) {
            self.read_wrs.pop_front();
        }
        if self.fin_wr.is_some_and(|fin| fin <= wr_id) {
            self.fin_done = true;
        }
        if self.ping_wr.is_some_and(|ping| ping <= wr_id) {
            // The peer's NIC has the probe: from now on only its process can be late.
            self.ping_wr = None;
            if self.ping_outstanding {
                if let Some(period) = self.keepalive {
                    self.ping_deadline = Some(now + period);
                }
            }
        }
    }

    fn transport_failed(&mut self, status: Completion, what: &str) {
        let err = match status {
            Completion::Ok => return,
            Completion::Flushed => ConnError::Reset(format!(
                "{what} was flushed: the connection's queue pair is in the error state"
            )),
            Completion::RetryExceeded => ConnError::Unreachable(format!(
                "{what} was not acknowledged within the transport's retries (link down, or the peer's host is gone)"
            )),
            Completion::RemoteAccess => ConnError::Reset(format!(
                "the peer's NIC refused {what} (remote access error): its ring is gone"
            )),
            Completion::Other(code, text) => {
                ConnError::Local(format!("{what} failed: {text} (status {code})"))
            }
        };
        if self.broken.is_none() {
            self.broken = Some(err);
        }
    }

    /// A receive completion: `imm` is its immediate (`None` when it had none) and
    /// `byte_len` the bytes the peer wrote.
    pub fn on_recv_completion(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        status: Completion,
        now: Instant,
    ) {
        if status == Completion::RemoteAccess {
            // The responder side of a refused access: the peer wrote outside the ring it
            // was given (or with a wrong key). Its fault, not the network's.
            return self.protocol(
                "it wrote outside the ring it was given (this side's NIC refused the access)"
                    .into(),
            );
        }
        if status != Completion::Ok {
            self.transport_failed(status, "a receive");
            return;
        }
        if self.error.is_some() {
            return;
        }
        self.received += 1;
        // The peer may use the receives promised in the hello and those reported posted
        // again; a credit still on its way only makes its view smaller. With receives of
        // its own an overdrawing peer meets an empty queue; in the shared mode it would
        // take receives meant for other connections.
        let granted = u64::from(self.limits.recv_depth) + self.reposted_reported;
        if self.received > granted {
            return self.protocol(format!(
                "it wrote {} times with immediate data, but was granted only {granted} receives",
                self.received
            ));
        }
        self.last_heard = Some(now);
        self.ping_deadline = None;
        let Some(raw) = imm else {
            self.protocol(format!(
                "a message without immediate data ({byte_len} bytes): trespass peers only RDMA WRITE with immediate"
            ));
            return;
        };
        let imm = match Imm::decode(raw) {
            Ok(imm) => imm,
            Err(e) => return self.protocol(e.to_string()),
        };
        if !matches!(imm, Imm::Data { .. }) && byte_len != 0 {
            return self.protocol(format!(
                "a control message ({imm:?}) carried {byte_len} bytes"
            ));
        }
        match imm {
            Imm::Data { len, msg, eom } => self.on_data(len, byte_len, msg, eom),
            Imm::CreditBytes(v) => {
                let charged = self.charged();
                if let Err(e) = self.peer_consumed.advance(v, charged) {
                    return self.protocol(format!(
                        "it credited {} bytes read, but only {} were written to it",
                        e.claimed, e.limit
                    ));
                }
                self.recvs_due += 1;
            }
            Imm::CreditRecvs(v) => {
                if let Err(e) = self.peer_reposted.advance(v, self.imm_sent) {
                    return self.protocol(format!(
                        "it reported {} receives posted again, but only {} were used",
                        e.claimed, e.limit
                    ));
                }
                self.recvs_due += 1;
            }
            Imm::Control(Control::Fin) => {
                if self.peer_fin {
                    return self.protocol("a second FIN".into());
                }
                if self.msg_open {
                    return self.protocol(format!(
                        "a FIN in the middle of a message ({} bytes into it)",
                        self.msg_bytes
                    ));
                }
                self.peer_fin = true;
                self.recvs_due += 1;
            }
            Imm::Control(Control::Ping) => {
                self.pong_due = true;
                self.recvs_due += 1;
            }
            Imm::Control(Control::Pong) => {
                if !self.ping_outstanding {
                    return self.protocol("a keep-alive answer that nobody asked for".into());
                }
                self.ping_outstanding = false;
                self.ping_deadline = None;
                self.recvs_due += 1;
            }
            Imm::Control(Control::Lend) => {
                if !self.limits.lends {
                    return self.protocol(
                        "it lent a region, but this side's hello did not offer to take any".into(),
                    );
                }
                if self.peer_fin {
                    return self.protocol("it lent a region after its FIN".into());
                }
                if self.msg_open || self.lend_next {
                    return self.protocol(format!(
                        "it announced a lent region in the middle of {}",
                        if self.lend_next {
                            "another announcement"
                        } else {
                            "a message"
                        }
                    ));
                }
                self.lend_next = true;
                self.recvs_due += 1;
            }
            Imm::Control(Control::Return) => {
                if self.returned >= self.lends_announced {
                    return self.protocol(format!(
                        "it returned {} lent regions, but was lent only {}",
                        self.returned + 1,
                        self.lends_announced
                    ));
                }
                self.returned += 1;
                self.recvs_due += 1;
            }
        }
    }

    fn on_data(&mut self, len: u32, byte_len: u32, msg: bool, eom: bool) {
        if self.peer_fin {
            return self.protocol(format!("{len} bytes after its FIN"));
        }
        if byte_len != len {
            return self.protocol(format!(
                "a write of {byte_len} bytes announced as {len} bytes"
            ));
        }
        let size = u64::from(self.limits.ring_size);
        let len64 = u64::from(len);
        let charge = if eom { u64::from(MSG_CHARGE) } else { 0 };
        let used = (self.tail - self.head) + u64::from(MSG_CHARGE) * self.boundaries.len() as u64;
        let free = size.saturating_sub(used);
        if len64 + charge > free {
            return self.protocol(format!(
                "it wrote {len} bytes into a ring with {free} bytes free (more than its credit)"
            ));
        }
        let offset = self.tail % size;
        if offset + len64 > size {
            return self.protocol(format!(
                "a write of {len} bytes at ring offset {offset} runs past the ring's end ({size} bytes)"
            ));
        }
        if msg {
            self.msg_bytes += len64;
            if self.msg_bytes > u64::from(self.limits.max_message) {
                return self.protocol(format!(
                    "a message of more than {} bytes, the most this side accepts",
                    self.limits.max_message
                ));
            }
        } else if self.msg_open {
            return self.protocol(format!(
                "{len} stream bytes in the middle of a message ({} bytes into it)",
                self.msg_bytes
            ));
        }
        if self.lend_next {
            if !msg {
                return self.protocol(format!(
                    "{len} stream bytes where the lent region's descriptor was announced"
                ));
            }
            self.lend_next = false;
            self.msg_lent = true;
            self.lent_in.push_back((self.tail, u64::MAX));
        }
        if self.msg_lent
            && (self.msg_bytes > LEND_LEN as u64 || (eom && self.msg_bytes != LEND_LEN as u64))
        {
            return self.protocol(format!(
                "a lent region's descriptor of {}{} bytes (it has {LEND_LEN})",
                if eom { "" } else { "more than " },
                self.msg_bytes
            ));
        }
        self.tail += len64;
        if eom && self.msg_lent {
            self.msg_lent = false;
            if let Some(last) = self.lent_in.back_mut() {
                last.1 = self.tail;
            }
        }
        // The receive goes back at once: unread messages are bounded by their ring charge.
        self.recvs_due += 1;
        if eom {
            self.boundaries.push_back(self.tail);
            self.msg_bytes = 0;
            self.msg_open = false;
        } else {
            self.msg_open = msg;
        }
        if self.discard {
            self.discard_unread();
        }
    }

    /// rdma_cm reported the connection gone (`RDMA_CM_EVENT_DISCONNECTED`): what is in the
    /// ring can still be read; then the reader sees end of stream if the peer had shut its
    /// write side down, or a reset if not.
    pub fn on_disconnected(&mut self) {
        if self.broken.is_none() {
            self.broken = Some(ConnError::Reset(
                "the peer disconnected without shutting down its write side".into(),
            ));
        }
    }

    /// The peer broke the protocol in a way only the application side sees (a message
    /// longer than advertised, counting stream bytes before it).
    pub fn on_peer_fault(&mut self, what: String) {
        self.protocol(what);
    }

    /// A local failure the driver met (a verb failed).
    pub fn on_local_error(&mut self, what: String) {
        self.fail(ConnError::Local(what));
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) must be called, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let period = self.keepalive?;
        if self.error.is_some() || self.broken.is_some() {
            return None;
        }
        match self.ping_deadline {
            Some(deadline) => Some(deadline),
            // The probe is on the wire: its send completion (or the transport running out of
            // retries) comes next, not a clock.
            None if self.ping_wr.is_some() => None,
            None => self.last_heard.map(|t| t + period),
        }
    }

    /// The time is `now`: sends a keep-alive probe when due, fails the connection when one
    /// went unanswered.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(period) = self.keepalive else { return };
        if self.error.is_some() || self.broken.is_some() {
            return;
        }
        if let Some(deadline) = self.ping_deadline {
            if now >= deadline {
                self.fail(ConnError::KeepAlive(period));
            }
            return;
        }
        let last = *self.last_heard.get_or_insert(now);
        if now >= last + period {
            if !self.ping_outstanding {
                self.ping_outstanding = true;
                self.ping_wanted = true;
            }
            // A probe on the wire gets its deadline when its send completes; one not yet
            // posted (the peer returns no receive credit, or the send queue is full) or one
            // already acknowledged gets it now.
            if self.ping_wr.is_none() {
                self.ping_deadline = Some(now + period);
            }
        }
    }

    // ---------------------------------------------------------------- what to post

    /// Receives to post again now; the driver posts exactly this many.
    pub fn poll_recvs(&mut self) -> u32 {
        let n = self.recvs_due;
        self.recvs_due = 0;
        self.reposted += u64::from(n);
        n
    }

    fn peer_recvs_free(&self) -> u64 {
        u64::from(self.peer.recv_depth) + self.peer_reposted.get() - self.imm_sent
    }

    fn sq_free(&self) -> u64 {
        u64::from(self.limits.send_depth) - (self.wr_next - self.wr_done)
    }

    /// The next work request to post, or `None`.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(t) = self.poll_imm_transmit() {
            return Some(t);
        }
        if let Some(t) = self.read_transmit() {
            return Some(t);
        }
        self.signal_transmit()
    }

    fn poll_imm_transmit(&mut self) -> Option<Transmit> {
        if self.error.is_some() || self.broken.is_some() || self.sq_free() == 0 {
            return None;
        }
        let recvs = self.peer_recvs_free();
        if recvs == 0 {
            return None;
        }
        // Receive credit first: it is what lets the peer send anything at all.
        let unreported = self.reposted - self.reposted_reported;
        let threshold = u64::from((u32::from(self.limits.recv_depth) / RECV_CREDIT_DIVISOR).max(1));
        if unreported >= threshold {
            self.reposted_reported = self.reposted;
            return Some(self.control(Imm::CreditRecvs(wire_value(self.reposted)), false));
        }
        if recvs < 2 {
            return None;
        }
        let ring = u64::from(self.limits.ring_size);
        let consumed = self.consumed_units();
        if consumed - self.credited >= ring / BYTE_CREDIT_DIVISOR {
            self.credited = consumed;
            return Some(self.control(Imm::CreditBytes(wire_value(consumed)), false));
        }
        if self.pong_due {
            self.pong_due = false;
            return Some(self.control(Imm::Control(Control::Pong), false));
        }
        if self.returns_due > 0 {
            self.returns_due -= 1;
            return Some(self.control(Imm::Control(Control::Return), false));
        }
        if recvs > u64::from(CONTROL_RESERVE) {
            if let Some(t) = self.data_transmit() {
                return Some(t);
            }
        }
        // A message end still to post (an empty message) goes before the FIN.
        let end_unposted = self.msgs.front().is_some_and(|&(_, end)| end != u64::MAX);
        if self.fin_wanted && !self.fin_sent && self.posted == self.app_tail && !end_unposted {
            self.fin_sent = true;
            let t = self.control(Imm::Control(Control::Fin), true);
            self.fin_wr = Some(t.wr_id);
            return Some(t);
        }
        if self.ping_wanted {
            self.ping_wanted = false;
            let t = self.control(Imm::Control(Control::Ping), true);
            self.ping_wr = Some(t.wr_id);
            // The transport bounds the probe's time on the wire, unless it retries an
            // empty receive queue for ever: then the deadline set when it was wanted stays.
            if !self.rnr_forever {
                self.ping_deadline = None;
            }
            return Some(t);
        }
        None
    }

    /// A signalled zero-length write without immediate, when one was asked for and the
    /// newest request is unsignalled; it uses no receive at the peer and no credit.
    fn signal_transmit(&mut self) -> Option<Transmit> {
        if !self.signal_wanted || self.error.is_some() || self.broken.is_some() {
            return None;
        }
        self.signal_wanted = false;
        if self.unsignaled_run == 0 || self.sq_free() == 0 {
            return None;
        }
        let wr_id = self.wr_next;
        self.wr_next += 1;
        self.unsignaled_run = 0;
        self.signaled.push_back((wr_id, self.posted));
        Some(Transmit {
            wr_id,
            local_offset: 0,
            len: 0,
            remote_offset: 0,
            imm: 0,
            signaled: true,
            plain: true,
            read: false,
        })
    }

    fn data_transmit(&mut self) -> Option<Transmit> {
        // A lent message is announced just before its first piece.
        if let (Some(&lend), Some(&(start, end))) = (self.lend_starts.front(), self.msgs.front()) {
            if lend == start && start == self.posted && end != start {
                self.lend_starts.pop_front();
                self.lends_announced += 1;
                return Some(self.control(Imm::Control(Control::Lend), false));
            }
        }
        let pending = self.app_tail - self.posted;
        // Where the next piece must stop: the next message's start (stream bytes before
        // it), or the current message's end.
        let (stop, msg) = match self.msgs.front() {
            Some(&(start, _)) if self.posted < start => (start, false),
            Some(&(_, end)) => (end, true),
            None => (u64::MAX, false),
        };
        let ends_here = msg && stop == self.posted;
        if pending == 0 && !ends_here {
            self.flush = false;
            return None;
        }
        if !self.nodelay
            && !self.flush
            && !self.fin_wanted
            && stop == u64::MAX
            && pending < COALESCE_BYTES.min(u64::from(self.limits.send_buffer) / 2)
        {
            return None;
        }
        // The piece: up to that stop, the peer's credit, the end of either ring, and the
        // largest write.
        let peer_size = u64::from(self.peer.ring_size);
        let peer_free = peer_size.saturating_sub(self.charged() - self.peer_consumed.get());
        let remote_offset = self.posted % peer_size;
        let send_size = u64::from(self.limits.send_buffer);
        let local_offset = self.posted % send_size;
        let mut len = pending
            .min(peer_free)
            .min(peer_size - remote_offset)
            .min(send_size - local_offset)
            .min(u64::from(self.limits.max_write));
        let mut eom = false;
        if stop != u64::MAX && stop - self.posted <= len {
            let rest = stop - self.posted;
            len = rest;
            // A message's end costs MSG_CHARGE of the peer's ring on top of its bytes:
            // without room for both, its bytes go now and the end follows later.
            eom = msg && rest + u64::from(MSG_CHARGE) <= peer_free;
        }
        if len == 0 && !eom {
            return None;
        }
        self.posted += len;
        if eom {
            self.msgs.pop_front();
            self.msgs_sent += 1;
        }
        let used_after = self.app_tail - self.completed;
        let signal = used_after >= send_size / 2;
        let imm = Imm::Data {
            len: len as u32,
            msg,
            eom,
        }
        .encode();
        let mut t = self.next_wr(imm, signal);
        t.local_offset = local_offset as u32;
        t.len = len as u32;
        t.remote_offset = remote_offset as u32;
        Some(t)
    }

    fn control(&mut self, imm: Imm, signal: bool) -> Transmit {
        self.next_wr(imm.encode(), signal)
    }

    fn next_wr(&mut self, imm: u32, signaled: bool) -> Transmit {
        self.imm_sent += 1;
        let mut t = self.alloc_wr(signaled);
        t.imm = imm;
        t
    }

    /// The next work request id, signalled when asked or when the quarter rule wants it.
    fn alloc_wr(&mut self, mut signaled: bool) -> Transmit {
        let quarter = (self.limits.send_depth / 4).max(1);
        if self.unsignaled_run + 1 >= quarter || self.sq_free() == 1 {
            signaled = true;
        }
        let wr_id = self.wr_next;
        self.wr_next += 1;
        if signaled {
            self.unsignaled_run = 0;
            self.signaled.push_back((wr_id, self.posted));
        } else {
            self.unsignaled_run += 1;
        }
        Transmit {
            wr_id,
            local_offset: 0,
            len: 0,
            remote_offset: 0,
            imm: 0,
            signaled,
            plain: false,
            read: false,
        }
    }
}

#[cfg(test)]
mod tests;
