//! The direct data path: the program's own `read`, `write` and their relatives reach the
//! trespass stream of a carried connection without the pump, when that keeps the bytes in
//! order.
//!
//! The program's fd stays the kernel socket the pump carries (poll, select, epoll, fork,
//! `sendfile` and every call this library does not interpose keep their meaning through it),
//! and the pump stays the one that waits on the stream. A data call on a carried fd first
//! tries the stream through a [`trespass::TryHandle`], which takes what is there now and
//! never waits or takes the pump's wake-ups; whenever that cannot keep TCP's meaning it does
//! the kernel's call instead, which the pump carries as before. So the direct path is only
//! ever a shortcut:
//!
//! - A write goes to the stream only when nothing the program wrote before is still on its
//!   way through the pump: the program's socket has no unsent bytes (`SIOCOUTQ`), the
//!   pump's end has none unread (`FIONREAD`), and the pump holds none it read but has not
//!   written ([`State::out_held`], counted under the same lock as the pump's reads of its
//!   end). Then the bytes go in at the same place in the stream as through the pump.
//! - A read takes bytes from the stream only when nothing that came before them is on its way
//!   to the program through its socket: none unread there (`FIONREAD`), none unsent at the
//!   pump's end (`SIOCOUTQ`), none the pump read from the stream but has not written
//!   ([`State::in_held`], counted under the lock around the pump's stream reads).
//! - Nothing waits here: no bytes or no room, an end of stream or an error, a flag the
//!   kernel would have to interpret (`MSG_PEEK`, `MSG_WAITALL`, ...), a process that is not
//!   the one whose pump carries the connection (a forked child), a shut-down side: each goes
//!   to the kernel's call, where the pump's carrying gives the answer TCP would.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::stats::{count, Event};

/// A carried connection's direct path, shared by the program's fds for it and the pump.
pub(crate) struct Direct {
    /// The process whose pump carries the connection: only its threads use the stream.
    owner: u32,
    /// A duplicate of the stream's readiness fd, for a blocking read to wait on beside the
    /// program's socket. Open as long as this lives, so its number is never another file's.
    ready: Arc<OwnedFd>,
    state: Mutex<State>,
}

/// What the direct path and the pump agree on, under one lock.
pub(crate) struct State {
    /// `None` once the pump stopped carrying: every call is the kernel's from then on.
    handle: Option<trespass::TryHandle>,
    /// A duplicate of the pump's end of the program's socket, for its queue sizes.
    pump_end: Option<OwnedFd>,
    /// Bytes the pump read from the program's socket and has not written to the stream.
    out_held: usize,
    /// Bytes the pump read from the stream and has not written to the program's socket.
    in_held: usize,
    /// The pump read bytes from the stream since the program's socket and the pump's end
    /// were last seen empty that way: until they are seen empty again, a direct read asks
    /// the kernel (two `ioctl`s) whether bytes that came before are still queued there.
    /// Only the pump puts bytes into the program's socket, and it counts each read here
    /// first, under this lock: while this is false, those queues are known to be empty.
    in_queued: bool,
    /// A poll or epoll wait told the program this stream has bytes (`wait`): the program's
    /// next read of it, or its next such wait, hands what is still unread to the pump.
    lent: bool,
    /// A read of the program's went to the kernel while bytes a wait reported were in the
    /// stream (a flag the kernel answers, such as `MSG_PEEK`): the pump carries them into
    /// the socket, and waits do not report this stream's bytes again until it has taken some
    /// (else a program whose reads all go to the kernel would be told "readable" forever
    /// while its socket stays empty).
    no_report: bool,
    /// The program shut its write side (through this process's `shutdown`).
    write_shut: bool,
    /// The program shut its read side.
    read_shut: bool,
}

impl Direct {
    /// The direct path of a connection this process's pump carries through `pump_end`.
    pub(crate) fn new(handle: trespass::TryHandle, pump_end: &OwnedFd) -> io::Result<Arc<Direct>> {
        let pump_end = pump_end.try_clone()?;
        let ready = Arc::new(handle.as_fd().try_clone_to_owned()?);
        Ok(Arc::new(Direct {
            owner: std::process::id(),
            ready,
            state: Mutex::new(State {
                handle: Some(handle),
                pump_end: Some(pump_end),
                out_held: 0,
                in_held: 0,
                in_queued: false,
                lent: false,
                no_report: false,
                write_shut: false,
                read_shut: false,
            }),
        }))
    }

    /// The lock the pump takes around its reads and the counts it keeps.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pump stopped carrying: the stream is not touched here again.
    pub(crate) fn finish(&self) {
        let mut s = self.lock();
        s.handle = None;
        s.pump_end = None;
    }
}

/// The program's fds with a direct path, and the accepted connections waiting for the
/// program's accept (by the pump's loopback source address).
#[derive(Default)]
pub(crate) struct Registry {
    fds: HashMap<c_int, Arc<Direct>>,
    unaccepted: HashMap<SocketAddr, Arc<Direct>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Entries in `fds`: the data calls look no further while it is 0.
static FDS: AtomicUsize = AtomicUsize::new(0);

/// The registry's lock, also for the fork handlers.
pub(crate) fn lock() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut r = lock();
    let r = r.get_or_insert_with(Registry::default);
    let out = f(r);
    FDS.store(r.fds.len(), Ordering::Release);
    out
}

/// Gives the program's `fd` the direct path `d`.
pub(crate) fn insert(fd: c_int, d: Arc<Direct>) {
    keep_if_foreign(with(|r| r.fds.insert(fd, d)));
}

/// Gives `new` the direct path of `old` (dup).
pub(crate) fn copy(old: c_int, new: c_int) {
    if FDS.load(Ordering::Acquire) == 0 {
        return;
    }
    keep_if_foreign(with(|r| {
        let d = r.fds.get(&old).cloned();
        match d {
            Some(d) => r.fds.insert(new, d),
            None => r.fds.remove(&new),
        }
    }));
}

/// Forgets `fd` (closed, or replaced by dup2).
pub(crate) fn remove(fd: c_int) {
    if FDS.load(Ordering::Acquire) == 0 {
        return;
    }
    keep_if_foreign(with(|r| r.fds.remove(&fd)));
}

/// A forked child's copies of its parent's direct paths are only memory: the parent's
/// threads hold the other references, which nothing in the child ever drops, so dropping
/// the child's would never reach the stream; forgetting them says so.
/// (The entry an insert replaced or a remove took, if any; dropped here, outside the
/// registry's lock.)
fn keep_if_foreign(d: Option<Arc<Direct>>) {
    if let Some(d) = d.filter(|d| d.owner != std::process::id()) {
        std::mem::forget(d);
    }
}

/// The pump made the loopback connection from `source` for `d`: the program's accept of it
/// takes `d` (see [`take_unaccepted`]).
pub(crate) fn add_unaccepted(source: SocketAddr, d: Arc<Direct>) {
    with(|r| r.unaccepted.insert(source, d));
}

/// The direct path of the pump's connection from `source`, once.
pub(crate) fn take_unaccepted(source: SocketAddr) -> Option<Arc<Direct>> {
    with(|r| r.unaccepted.remove(&source))
}

/// Whether any fd has a direct path: in a program with no carried connection open, a data
/// call costs one atomic load more than the C library's.
pub(crate) fn any() -> bool {
    FDS.load(Ordering::Relaxed) != 0
}

/// The direct path of the program's `fd`, when this process's pump carries it.
pub(crate) fn get(fd: c_int) -> Option<Arc<Direct>> {
    if FDS.load(Ordering::Acquire) == 0 {
        return None;
    }
    let d = lock().as_ref()?.fds.get(&fd).cloned()?;
    if d.owner != std::process::id() {
        std::mem::forget(d);
        return None;
    }
    Some(d)
}

/// `shutdown` on `fd`: the direct path stops taking that side before the kernel's call.
pub(crate) fn shutdown(fd: c_int, how: c_int) {
    let Some(d) = get(fd) else { return };
    let mut s = d.lock();
    if matches!(how, libc::SHUT_WR | libc::SHUT_RDWR) {
        s.write_shut = true;
    }
    if matches!(how, libc::SHUT_RD | libc::SHUT_RDWR) {
        s.read_shut = true;
    }
}

/// The bytes of `fd`'s queue that `req` (`FIONREAD`: unread; `SIOCOUTQ`: unsent) counts;
/// `None` when the kernel will not say.
fn queued(fd: c_int, req: libc::c_ulong) -> Option<c_int> {
    let mut n: c_int = 0;
    // SAFETY: both requests write one int through the pointer, which is valid for it.
    let r = unsafe { libc::ioctl(fd, req as _, &raw mut n) };
    (r == 0).then_some(n)
}

/// `SIOCOUTQ` (linux/sockios.h), which the libc crate does not name: the bytes a socket
/// has not sent (a Unix stream socket's: not yet read by its peer; TCP's: not acked).
const SIOCOUTQ: libc::c_ulong = libc::TIOCOUTQ as libc::c_ulong;

/// A direction of a carried connection's bytes.
#[derive(Clone, Copy)]
pub(crate) enum Way {
    /// From the program to the stream.
    Out,
    /// From the stream to the program.
    In,
}

impl State {
    /// The count of bytes the pump holds in direction `way` (read, not yet written on).
    pub(crate) fn held(&mut self, way: Way) -> &mut usize {
        match way {
            Way::Out => &mut self.out_held,
            Way::In => &mut self.in_held,
        }
    }

    /// The pump read `n` bytes in direction `way`: it holds them until it wrote them on.
    pub(crate) fn took(&mut self, way: Way, n: usize) {
        *self.held(way) += n;
        if matches!(way, Way::In) && n > 0 {
            self.in_queued = true;
            self.no_report = false;
        }
    }

    /// The handle, when the program's fd `fd` may take the stream directly in direction
    /// `way` without passing bytes that came before: the pump carries the connection, that
    /// side is not shut down, the pump holds no bytes of that direction, and the kernel
    /// queues between the program's socket and the pump's end are empty that way (the side
    /// that sends has nothing unsent, `SIOCOUTQ`; the side that receives nothing unread,
    /// `FIONREAD`: the accepting side's loopback TCP has bytes in flight that `FIONREAD`
    /// alone misses).
    ///
    /// Reading, the queues are asked only while the pump may have put bytes in them
    /// ([`State::in_queued`]); writing, always (the program's own writes to its socket, and
    /// a forked child's, reach it without this library seeing all of them).
    fn in_order(&mut self, fd: c_int, way: Way) -> Option<&trespass::TryHandle> {
        let pump_end = self.pump_end.as_ref()?.as_raw_fd();
        let (shut, held, sender, receiver) = match way {
            Way::Out => (self.write_shut, self.out_held, fd, pump_end),
            Way::In => (self.read_shut, self.in_held, pump_end, fd),
        };
        if shut || held > 0 || self.handle.is_none() {
            return None;
        }
        let ask = match way {
            Way::Out => true,
            Way::In => self.in_queued,
        };
        if ask {
            if queued(sender, SIOCOUTQ)? != 0 || queued(receiver, libc::FIONREAD as _)? != 0 {
                return None;
            }
            if matches!(way, Way::In) {
                self.in_queued = false;
            }
        }
        self.handle.as_ref()
    }
}

/// The flags a direct send or receive keeps TCP's meaning under: none that asks the
/// kernel for more than bytes (`MSG_OOB`, `MSG_PEEK`, `MSG_WAITALL`, `MSG_MORE`, ...).
const PLAIN: c_int = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;

/// Writes `bufs` to `fd`'s stream directly if that keeps the order; `None`: do the kernel's
/// call (for the whole of it: nothing was written).
pub(crate) fn write(fd: c_int, bufs: &[IoSlice<'_>], flags: c_int) -> Option<usize> {
    if flags & !PLAIN != 0 {
        return None;
    }
    let d = get(fd)?;
    let mut s = d.lock();
    let handle = s.in_order(fd, Way::Out)?;
    // One write for all of `bufs` (a `writev` of a header and a body goes out as one RDMA
    // WRITE, as TCP would send it as one segment), as much as there is room for.
    let done = handle.try_write_vectored(bufs).unwrap_or(0);
    if done > 0 {
        count(Event::WriteDirect);
    }
    (done > 0).then_some(done)
}

/// What a direct read came to.
pub(crate) enum Read {
    /// This many bytes, from the stream.
    Bytes(usize),
    /// The kernel's call: bytes came before, or a flag, a state or an error the kernel's
    /// socket (which the pump brings to the same end) answers as TCP would.
    Kernel,
    /// Nothing anywhere yet, in order: what to wait on for more.
    Empty(Waiter),
}

/// What a blocking read with nothing to read waits on, beside the program's socket: the
/// stream, in the pump's place when it can ([`trespass::TryHandle::wait_readable`]), else its
/// readiness fd (kept open by the value), which turns readable when something arrives.
pub(crate) struct Waiter {
    handle: trespass::TryHandle,
    ready: Arc<OwnedFd>,
}

/// Reads into `bufs` from `fd`'s stream directly if that keeps the order.
pub(crate) fn read(fd: c_int, bufs: &mut [IoSliceMut<'_>], flags: c_int) -> Read {
    read_or(fd, bufs, flags).unwrap_or(Read::Kernel)
}

fn read_or(fd: c_int, bufs: &mut [IoSliceMut<'_>], flags: c_int) -> Option<Read> {
    let d = get(fd)?;
    let mut s = d.lock();
    let lent = std::mem::take(&mut s.lent);
    let read = read_locked(&d, &mut s, fd, bufs, flags);
    if lent {
        if let Some(handle) = s.handle.as_ref() {
            // What a wait reported had its read: what this one left goes to the pump. A read
            // the kernel answers comes after the hand-back (the pump carries the bytes into
            // the socket), and waits leave this stream's bytes to the kernel until then.
            handle.hand_back();
            if read.is_none() {
                s.no_report = true;
            }
        }
    }
    read
}

fn read_locked(
    d: &Direct,
    s: &mut State,
    fd: c_int,
    bufs: &mut [IoSliceMut<'_>],
    flags: c_int,
) -> Option<Read> {
    if flags & !PLAIN != 0 {
        return None;
    }
    let handle = s.in_order(fd, Way::In)?;
    let mut done = 0;
    let mut empty = false;
    for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
        match handle.try_read(b) {
            Ok(n) if n > 0 => {
                done += n;
                if n < b.len() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                empty = done == 0;
                break;
            }
            // End of stream or a failure: the pump brings the kernel's socket to the same
            // end, and the kernel's call says it as TCP would.
            _ => break,
        }
    }
    if done > 0 {
        count(Event::ReadDirect);
        return Some(Read::Bytes(done));
    }
    empty.then(|| {
        Read::Empty(Waiter {
            handle: handle.clone(),
            ready: Arc::clone(&d.ready),
        })
    })
}

/// A stream a poll or epoll wait may wait on in the pump's place, and report bytes of.
#[derive(Clone)]
pub(crate) struct Watched {
    pub(crate) direct: Arc<Direct>,
    pub(crate) handle: trespass::TryHandle,
}

/// `d`'s stream, when a wait may report its bytes as the socket's: this process's pump
/// carries it, its read side is open, and its reads have not turned to the kernel since a
/// wait last reported bytes (see [`State::no_report`]).
fn watch(d: Arc<Direct>) -> Option<Watched> {
    watch_or_later(d)?.ok()
}

/// `d`'s stream as [`watched_or_later`] says.
fn watch_or_later(d: Arc<Direct>) -> Option<Result<Watched, ()>> {
    let s = d.lock();
    let reportable = s.reportable()?;
    let handle = s.handle.clone()?;
    drop(s);
    Some(if reportable {
        Ok(Watched { direct: d, handle })
    } else {
        Err(())
    })
}

impl State {
    /// Whether a wait may report this stream's bytes now: `None` when never again (the pump
    /// stopped carrying, or the read side is shut), `Some(false)` while its reads go to the
    /// kernel (see [`State::no_report`]).
    fn reportable(&self) -> Option<bool> {
        if self.read_shut || self.handle.is_none() {
            return None;
        }
        Some(!self.no_report)
    }
}

/// `fd`'s stream as [`watch`] says, or `Err` when only its `no_report` keeps a wait from
/// reporting it now (which the pump's next read of it clears).
pub(crate) fn watched_or_later(fd: c_int) -> Option<Result<Watched, ()>> {
    watch_or_later(get(fd)?)
}

/// The direct paths of those of `fds` this process's pump carries, looked up under one
/// lock of the registry.
pub(crate) fn carried_among(fds: impl Iterator<Item = c_int>) -> Vec<Arc<Direct>> {
    if FDS.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let me = std::process::id();
    let r = lock();
    let Some(r) = r.as_ref() else {
        return Vec::new();
    };
    fds.filter_map(|fd| r.fds.get(&fd).filter(|d| d.owner == me).cloned())
        .collect()
}

impl Watched {
    /// Whether a wait may report this stream's bytes now (as [`watch`] says).
    pub(crate) fn reportable(&self) -> bool {
        self.direct.lock().reportable() == Some(true)
    }
}

/// The streams among `fds` (each with the caller's index for it) a wait may report bytes
/// of, as [`watch`] says of each, looked up under one lock of the registry; `None` when
/// more than `max` of them are this process's carried connections (the wait is then the
/// kernel's) or none is.
pub(crate) fn watched_among(
    fds: impl Iterator<Item = (usize, c_int)>,
    max: usize,
) -> Option<Vec<(usize, Watched)>> {
    if FDS.load(Ordering::Acquire) == 0 {
        return None;
    }
    let me = std::process::id();
    let mut found = Vec::new();
    {
        let r = lock();
        let r = r.as_ref()?;
        for (i, fd) in fds {
            if let Some(d) = r.fds.get(&fd).filter(|d| d.owner == me) {
                if found.len() == max {
                    return None;
                }
                found.push((i, Arc::clone(d)));
            }
        }
    }
    let out: Vec<(usize, Watched)> = found
        .into_iter()
        .filter_map(|(i, d)| Some((i, watch(d)?)))
        .collect();
    (!out.is_empty()).then_some(out)
}

/// Streams a wait reported bytes of, until a read or the next wait takes them back.
static LENT: Mutex<Vec<Arc<Direct>>> = Mutex::new(Vec::new());
static LENT_N: AtomicUsize = AtomicUsize::new(0);

/// The lent list's lock, held across `fork` (see `before_fork`).
pub(crate) type LentGuard = MutexGuard<'static, Vec<Arc<Direct>>>;

/// Takes the lent list's lock, for the fork handlers.
pub(crate) fn lock_lent() -> LentGuard {
    LENT.lock().unwrap_or_else(|p| p.into_inner())
}

/// In a forked child: the parent's lent streams are not this process's to hand back (their
/// other references live in the parent's threads, which the child does not have), so they
/// are forgotten, as the registry's copies are.
pub(crate) fn forget_lent_in_child() {
    let lent = std::mem::take(&mut *lock_lent());
    LENT_N.store(0, Ordering::Release);
    std::mem::forget(lent);
}

impl Watched {
    /// A wait is about to tell the program this stream has bytes: they stay in the stream
    /// for the program's read, which takes them directly (see [`read`]), until its next
    /// read or wait.
    pub(crate) fn lend(&self) {
        let mut s = self.direct.lock();
        if s.lent {
            return;
        }
        s.lent = true;
        drop(s);
        let mut l = LENT.lock().unwrap_or_else(|p| p.into_inner());
        l.push(Arc::clone(&self.direct));
        LENT_N.store(l.len(), Ordering::Release);
    }
}

/// A new wait begins: streams an earlier wait reported that have had no read since hand
/// what is unread to the pump (so bytes never wait in the stream for a read that does not
/// come, whatever the program waits in next), but for those `keep` picks, which this wait
/// looks at itself.
pub(crate) fn hand_back_lent(keep: impl Fn(&Arc<Direct>) -> bool) {
    if LENT_N.load(Ordering::Acquire) == 0 {
        return;
    }
    let lent = {
        let mut l = LENT.lock().unwrap_or_else(|p| p.into_inner());
        LENT_N.store(0, Ordering::Release);
        std::mem::take(&mut *l)
    };
    for d in lent {
        if d.owner != std::process::id() {
            std::mem::forget(d);
            continue;
        }
        let mut s = d.lock();
        if !std::mem::take(&mut s.lent) {
            continue;
        }
        if keep(&d) {
            continue;
        }
        if let Some(h) = s.handle.as_ref() {
            h.hand_back();
        }
    }
}

/// What a blocking read's wait on the program's socket and the stream came to.
pub(crate) enum Waited {
    /// The stream's fd turned readable: look again.
    Stream,
    /// The socket turned readable (or hung up, or failed): the kernel's call.
    Socket,
    /// The socket's receive timeout (`SO_RCVTIMEO`) passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

/// The longest a blocking read waits on the stream itself; then it is the kernel's read on
/// the socket (which the pump keeps fed), where the socket's own timeout, signals and thread
/// cancellation act as they always do. Cancellation is held off during the wait (see
/// `interpose::try_direct`), so this is also how long it may be late.
const WAIT_BOUND_MS: c_int = 20;

/// Waits, as a blocking read of `fd` would, for the program's socket or the stream to have
/// something: at most the socket's receive timeout (`SO_RCVTIMEO`), and at most
/// [`WAIT_BOUND_MS`], after which the kernel's read takes over.
///
/// The stream is waited on in the pump's place when trespass lets this thread take the
/// completion channel (`wait_readable`): then an arrival wakes this thread alone, where a
/// wait on the readiness fd wakes the pump too, which races it for the bytes. The value
/// returned beside `Stream` must live until the read that follows is done: dropping it
/// hands what that read leaves to the pump.
pub(crate) fn wait(fd: c_int, on: &Waiter) -> (Waited, Option<trespass::ReadWait>) {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: SO_RCVTIMEO writes a timeval, for which `tv` and `len` are valid.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw mut tv).cast(),
            &mut len,
        )
    };
    let limit = if r == 0 && (tv.tv_sec > 0 || tv.tv_usec > 0) {
        let us = tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64;
        Some(c_int::try_from(us.div_ceil(1000)).unwrap_or(c_int::MAX))
    } else {
        None
    };
    let ms = limit.map_or(WAIT_BOUND_MS, |l| l.min(WAIT_BOUND_MS));
    let timed_out = || {
        if limit.is_some_and(|l| l <= WAIT_BOUND_MS) {
            Waited::TimedOut
        } else {
            Waited::Socket
        }
    };
    if crate::config().tenure {
        // SAFETY: `fd` is the program's open socket for the duration of this call (the
        // program's read is in progress on it).
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let bound = std::time::Duration::from_millis(ms as u64);
        match on.handle.wait_readable(socket, bound) {
            Ok(w) => match w.outcome() {
                trespass::ReadWaited::Ready => {
                    count(Event::ReadStoodIn);
                    return (Waited::Stream, Some(w));
                }
                trespass::ReadWaited::Also => return (Waited::Socket, None),
                trespass::ReadWaited::TimedOut => return (timed_out(), None),
                trespass::ReadWaited::Interrupted => return (Waited::Interrupted, None),
                _ => {}
            },
            Err(_) => return (Waited::Socket, None),
        }
    }
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: on.ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds, for the duration of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        let w = if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            Waited::Interrupted
        } else {
            Waited::Socket
        };
        return (w, None);
    }
    if n == 0 {
        return (timed_out(), None);
    }
    if fds[0].revents != 0 {
        return (Waited::Socket, None);
    }
    (Waited::Stream, None)
}

/// Whether every signal handler of this process restarts the calls it interrupts
/// (`SA_RESTART`): then a blocking read interrupted by one goes on, as the kernel's would;
/// else the caller may be waiting for the `EINTR`, and gets it.
pub(crate) fn signals_restart() -> bool {
    for sig in 1..=libc::SIGRTMAX() {
        // SAFETY: an all-zero sigaction is a valid place for the current one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into `old`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
        if handled && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// Whether `fd` is non-blocking (its file's status flags).
pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL takes no argument.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}
