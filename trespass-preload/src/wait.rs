//! poll and select waits in the pump's place, and the epoll registrations the library
//! keeps (for `parked`, which holds epoll sets' streams).
//!
//! A program that waits in `poll`, `ppoll`, `select` or `pselect` (both as a poll of the
//! same fds) for a carried connection to turn readable would, left to the kernel, wake only
//! after the pump woke, read the stream and copied the bytes into its socket: two threads
//! woken and a copy per arrival. When the wait watches at most [`MAX_STANDING`] carried
//! connections for reading, the waiting thread instead takes those streams' completion
//! channels from the pump ([`trespass::TryHandle::stand_in`]) and sleeps on them beside the
//! program's own fds. An arrival wakes the program's thread alone; the wait reports the
//! connection readable as the kernel would have (`POLLIN`), and the program's read that
//! follows takes the bytes from the stream directly (`direct`). (A poll has no identity
//! from one call to the next, so each takes the streams and gives them back; an epoll set
//! keeps them across waits: see `parked`.)
//!
//! What keeps the kernel's meaning:
//!
//! - Everything else is the kernel's: the other fds, writability, hang-ups and errors, and
//!   bytes the pump did copy into the socket, are what the kernel's call says about them.
//! - A stream's bytes are reported only while it has some (level-triggered), never its end
//!   or a failure: the pump carries those into the socket, where the kernel reports them.
//! - Bytes a wait reported stay in the stream until the program's next read of that fd or
//!   its next wait the library sees (one it leaves to the kernel included): then whatever is
//!   unread goes to the pump, which copies it into the socket as before
//!   (`direct::hand_back_lent`). A read the kernel answers (`MSG_PEEK`, ...) hands them over
//!   first and keeps waits from reporting that stream until the pump took them.
//! - The stand-in lasts at most [`BOUND_MS`] of a wait: past it, the kernel's call waits
//!   for the rest of the program's timeout (the pump carries the streams again), so a
//!   thread cancellation, which is held off while the library works, acts within that bound.
//! - Not stood in for: waits on more carried connections than [`MAX_STANDING`] (taking and
//!   giving back each stream on every wait would cost more than the pump's copy), a stream
//!   another thread already waits on, and forked children: each is the kernel's wait, as
//!   before. An epoll set that holds a stream such a wait watches gives it back first.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use trespass::{StandIn, Standing};

use crate::direct::{self, Direct, Watched};
use crate::stats::{count, Event};

/// The most carried connections one wait stands in for.
pub(crate) const MAX_STANDING: usize = 4;

/// The longest part of one wait spent in the pump's place.
pub(crate) const BOUND_MS: u64 = 20;

/// An epoll registration of a connection the library knows.
#[derive(Clone, Copy)]
pub(crate) struct Reg {
    pub(crate) events: u32,
    pub(crate) data: u64,
}

/// One epoll set's registrations of fds the library carries (or was connecting) when they
/// were added or modified, and a number that changes with every change to them.
#[derive(Default)]
pub(crate) struct SetRegs {
    regs: HashMap<c_int, Reg>,
    generation: u64,
}

/// Per epoll fd, its registrations of known fds.
static REGS: Mutex<Option<HashMap<c_int, SetRegs>>> = Mutex::new(None);
/// Entries of `REGS`: nothing is looked up while it is 0.
static REGS_N: AtomicUsize = AtomicUsize::new(0);
/// The last generation given to a set's registrations (each change takes the next).
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed) + 1
}

/// The registrations' lock, held across `fork` (see `before_fork`): a child's `epoll_ctl`
/// must not find it held by a thread it does not have.
pub(crate) type RegsGuard = std::sync::MutexGuard<'static, Option<HashMap<c_int, SetRegs>>>;

/// Takes the registrations' lock, for the fork handlers.
pub(crate) fn lock_regs() -> RegsGuard {
    REGS.lock().unwrap_or_else(|p| p.into_inner())
}

fn with_regs<R>(f: impl FnOnce(&mut HashMap<c_int, SetRegs>) -> R) -> R {
    let mut g = lock_regs();
    let m = g.get_or_insert_with(HashMap::new);
    let r = f(m);
    REGS_N.store(m.values().map(|s| s.regs.len()).sum(), Ordering::Release);
    r
}

/// A successful `epoll_ctl(epfd, op, fd, event)`: keeps the registration when the library
/// knows `fd` (`known`), forgets it otherwise.
pub(crate) fn registered(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: Option<(u32, u64)>,
    known: bool,
) {
    match (op, event) {
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some((events, data))) if known => {
            with_regs(|m| {
                let set = m.entry(epfd).or_default();
                set.regs.insert(fd, Reg { events, data });
                set.generation = next_generation();
            });
        }
        _ => {
            if REGS_N.load(Ordering::Acquire) != 0 {
                with_regs(|m| {
                    if let Some(set) = m.get_mut(&epfd) {
                        if set.regs.remove(&fd).is_some() {
                            set.generation = next_generation();
                        }
                        if set.regs.is_empty() {
                            m.remove(&epfd);
                        }
                    }
                });
            }
        }
    }
}

/// `fd` is closed (or replaced by `dup2`): its registrations go (the kernel drops them when
/// the last fd of the file closes; a number used again must not inherit them), and so does
/// its set if it is an epoll fd.
pub(crate) fn forget(fd: c_int) {
    if REGS_N.load(Ordering::Acquire) == 0 {
        return;
    }
    with_regs(|m| {
        m.remove(&fd);
        m.retain(|_, set| {
            if set.regs.remove(&fd).is_some() {
                set.generation = next_generation();
            }
            !set.regs.is_empty()
        });
    });
}

/// What [`regs_of`] found in an epoll set's registrations.
pub(crate) enum Regs {
    /// Nothing a wait may hold: no carried connection is watched for reading, or a
    /// registration it cannot keep the meaning of (`EPOLLONESHOT`, `EPOLLEXCLUSIVE`) is there.
    None,
    /// The registrations are still at the generation the caller knows.
    Unchanged,
    /// The streams a wait may hold in the pump's place, each with a registration of it that
    /// watches for reading, and whether some stream was left out for now (its bytes went to
    /// the kernel's reads: see `direct`'s `no_report`).
    Holdable(Vec<(Watched, c_int, Reg)>, bool),
}

/// The registrations of `epfd`'s set: their generation, and what a wait may hold (see
/// `parked`); [`Regs::Unchanged`], without looking at the streams, when the generation is
/// `known`.
pub(crate) fn regs_of(epfd: c_int, known: Option<u64>) -> (u64, Regs) {
    if REGS_N.load(Ordering::Acquire) == 0 {
        return (0, Regs::None);
    }
    let (generation, regs): (u64, Vec<(c_int, Reg)>) = {
        let g = lock_regs();
        let Some(set) = g.as_ref().and_then(|m| m.get(&epfd)) else {
            return (0, Regs::None);
        };
        if known == Some(set.generation) {
            return (set.generation, Regs::Unchanged);
        }
        (
            set.generation,
            set.regs.iter().map(|(fd, r)| (*fd, *r)).collect(),
        )
    };
    let mut out = Vec::with_capacity(regs.len());
    let mut later = false;
    for (fd, reg) in regs {
        if reg.events & (libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE) as u32 != 0 {
            return (generation, Regs::None);
        }
        if reg.events & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32 == 0 {
            continue;
        }
        match direct::watched_or_later(fd) {
            Some(Ok(w)) => out.push((w, fd, reg)),
            Some(Err(())) => later = true,
            None => {}
        }
    }
    if out.is_empty() && !later {
        return (generation, Regs::None);
    }
    (generation, Regs::Holdable(out, later))
}

/// Whether `fd` is registered in `epfd`'s set now, for reading, with `data`: an epoll wait
/// reports a held stream only then (another thread may have removed or changed the
/// registration while the wait was in the kernel; the kernel's own events keep that rule).
pub(crate) fn still_registered(epfd: c_int, fd: c_int, data: u64) -> bool {
    let g = lock_regs();
    g.as_ref()
        .and_then(|m| m.get(&epfd))
        .and_then(|set| set.regs.get(&fd))
        .is_some_and(|r| {
            r.data == data && r.events & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32 != 0
        })
}

/// The streams of the carried connections registered in `epfd`'s set (for any event).
pub(crate) fn carried_in(epfd: c_int) -> Vec<Arc<Direct>> {
    if REGS_N.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let fds: Vec<c_int> = {
        let g = lock_regs();
        match g.as_ref().and_then(|m| m.get(&epfd)) {
            Some(set) => set.regs.keys().copied().collect(),
            None => return Vec::new(),
        }
    };
    direct::carried_among(fds.into_iter())
}

/// What the part of a wait in the pump's place came to. Whatever it was, the streams are
/// the owner's again when it returns.
enum Outcome {
    /// Which of the watched streams have bytes to report, and whether the program's fds
    /// may have something: the kernel's call, with no wait, says.
    Look { ready: Vec<bool>, others: bool },
    /// The program's fds were polled together with the streams' channels: `revents` are
    /// set on the program's entries; these streams have bytes.
    Polled { ready: Vec<bool> },
    /// A signal interrupted it (`EINTR`), or the poll failed with this errno.
    Failed(c_int),
    /// Nothing within the bound: the kernel's wait, for what is left of this timeout
    /// (`None`: no limit).
    Kernel(Option<Duration>),
}

/// Which streams have bytes now.
fn with_bytes(watched: &[&Watched]) -> Vec<bool> {
    watched.iter().map(|w| w.handle.has_bytes()).collect()
}

/// Whether one stand-in goes on, after `arm` or `woke` said `standing`: not when it is
/// over (the owner took the stream back, or the connection ended: the pump carries the end
/// into the socket). Sets `ready` when the stream has bytes.
fn goes_on(watched: &Watched, standing: Standing, ready: &mut bool) -> bool {
    match standing {
        Standing::Waiting => true,
        Standing::Ready if watched.handle.has_bytes() => {
            *ready = true;
            true
        }
        _ => false,
    }
}

/// Waits, for at most `timeout` (`None`: no limit), in the pump's place until `until` at
/// the latest, until one of `watched` has bytes or one of the program's `fds` is ready,
/// polling both (the program's entries first, with `mask` as `ppoll`'s signal mask).
fn stand_in(
    watched: &[&Watched],
    fds: &mut [libc::pollfd],
    timeout: Option<Duration>,
    until: Instant,
    mask: *const libc::sigset_t,
) -> Outcome {
    let start = Instant::now();
    let ready = with_bytes(watched);
    if ready.iter().any(|r| *r) || timeout == Some(Duration::ZERO) {
        return Outcome::Look {
            ready,
            others: true,
        };
    }
    let mut ins: Vec<Option<StandIn>> = watched.iter().map(|w| w.handle.stand_in()).collect();
    let mut all = Vec::with_capacity(fds.len() + ins.len());
    loop {
        let mut ready = vec![false; watched.len()];
        for (i, s) in ins.iter_mut().enumerate() {
            if let Some(si) = s {
                if !goes_on(watched[i], si.arm(), &mut ready[i]) {
                    *s = None;
                }
            }
        }
        if ready.iter().any(|r| *r) {
            return Outcome::Look {
                ready,
                others: true,
            };
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left == Some(Duration::ZERO) {
            return Outcome::Look {
                ready,
                others: false,
            };
        }
        let in_place = until.saturating_duration_since(Instant::now());
        if ins.iter().all(Option::is_none) || in_place.is_zero() {
            return Outcome::Kernel(left);
        }
        let wait = left.map_or(in_place, |l| l.min(in_place));
        all.clear();
        all.extend_from_slice(fds);
        let mine: Vec<usize> = (0..ins.len()).filter(|i| ins[*i].is_some()).collect();
        for &i in &mine {
            let fd = ins[i].as_ref().map_or(-1, |s| s.as_fd().as_raw_fd());
            all.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(wait.subsec_nanos()),
        };
        // SAFETY: `all` holds `all.len()` valid pollfds for the call; `ts` and `mask` (null
        // or the program's signal mask) are valid for it.
        let r =
            unsafe { crate::real::ppoll(all.as_mut_ptr(), all.len() as libc::nfds_t, &ts, mask) };
        if r < 0 {
            return Outcome::Failed(errno());
        }
        for (k, &i) in mine.iter().enumerate() {
            let event = all[fds.len() + k].revents != 0;
            if let Some(si) = ins[i].as_mut() {
                if !goes_on(watched[i], si.woke(event), &mut ready[i]) {
                    ins[i] = None;
                }
            }
        }
        let others = all[..fds.len()].iter().any(|p| p.revents != 0);
        if others || ready.iter().any(|r| *r) {
            for (p, q) in fds.iter_mut().zip(&all) {
                p.revents = q.revents;
            }
            return Outcome::Polled { ready };
        }
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// After a wait: the streams it reported keep their bytes for the program's read; the
/// others go back to the pump with whatever came while the wait had them (`ready`: `None`
/// for none reported).
fn settle(watched: &[&Watched], reported: Option<&[bool]>) {
    let mut any = false;
    for (i, w) in watched.iter().enumerate() {
        if reported.is_some_and(|r| r[i]) {
            w.lend();
            any = true;
        } else {
            w.handle.hand_back();
        }
    }
    if any {
        count(Event::WaitStoodIn);
    }
}

/// Milliseconds for the kernel's wait (-1: no limit), rounded up.
pub(crate) fn millis(left: Option<Duration>) -> c_int {
    left.map_or(-1, |l| {
        c_int::try_from(l.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
    })
}

/// What a wait in the pump's place leaves the interposed call to do.
pub(crate) enum Done {
    /// The kernel's wait, for this long (`None`: no limit): the library did not stand in,
    /// or nothing came within [`BOUND_MS`].
    Kernel(Option<Duration>),
    /// The call's result: a count, or -1 with this errno.
    Result(c_int, c_int),
}

/// The poll wait's loop, after the streams in `ws` were chosen: hands
/// back what earlier waits reported (but these streams), stands in (see [`stand_in`]) over
/// `ws` and the program's `fds`, then `look(fds, ready, others)` makes the kernel's no-wait
/// call on the program's fds where they may have something (`others`, or their `revents`),
/// adds the streams with bytes (`ready`), and says how many entries it reports and which
/// streams it told of (or the errno of a failed call). The streams it told of keep their
/// bytes for the program's read, the others go back to the pump; it goes again while
/// nothing was reported and the timeout has not passed.
fn wait_loop(
    ws: &[&Watched],
    fds: &mut [libc::pollfd],
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
    mut look: impl FnMut(&mut [libc::pollfd], &[bool], bool) -> Result<(c_int, Vec<bool>), c_int>,
) -> Done {
    direct::hand_back_lent(|d| ws.iter().any(|w| Arc::ptr_eq(&w.direct, d)));
    let start = Instant::now();
    let until = start + Duration::from_millis(BOUND_MS);
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        for p in fds.iter_mut() {
            p.revents = 0;
        }
        let (ready, others) = match stand_in(ws, fds, left, until, mask) {
            Outcome::Look { ready, others } => (ready, others),
            Outcome::Polled { ready } => (ready, false),
            Outcome::Failed(e) => {
                settle(ws, None);
                return Done::Result(-1, e);
            }
            Outcome::Kernel(left) => {
                settle(ws, None);
                return Done::Kernel(left);
            }
        };
        let (n, reported) = match look(fds, &ready, others) {
            Ok(looked) => looked,
            Err(e) => {
                settle(ws, None);
                return Done::Result(-1, e);
            }
        };
        settle(ws, Some(&reported));
        if n > 0 || timeout.is_some_and(|t| start.elapsed() >= t) {
            return Done::Result(n, 0);
        }
    }
}

/// The program's `poll(fds, timeout)` (or `ppoll` with `mask`).
pub(crate) fn poll(
    fds: &mut [libc::pollfd],
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Done {
    let reading = fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.fd >= 0 && p.events & (libc::POLLIN | libc::POLLRDNORM) != 0)
        .map(|(i, p)| (i, p.fd));
    if crate::parked::any() {
        // Sets that hold streams this poll watches give them back: the pump serves this
        // wait (or the wait stands in for it below).
        let carried = direct::carried_among(fds.iter().filter(|p| p.fd >= 0).map(|p| p.fd));
        crate::parked::release(&carried, None);
    }
    let Some(watched) = direct::watched_among(reading, MAX_STANDING) else {
        direct::hand_back_lent(|_| false);
        return Done::Kernel(timeout);
    };
    let ws: Vec<&Watched> = watched.iter().map(|(_, w)| w).collect();
    wait_loop(&ws, fds, timeout, mask, |fds, ready, others| {
        if others {
            // SAFETY: `fds` is valid for the call; no wait (timeout 0).
            let r = unsafe { crate::real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
            if r < 0 {
                return Err(errno());
            }
        }
        for (k, (i, _)) in watched.iter().enumerate() {
            if ready[k] {
                let p = &mut fds[*i];
                p.revents |= p.events & (libc::POLLIN | libc::POLLRDNORM);
            }
        }
        let n = fds.iter().filter(|p| p.revents != 0).count() as c_int;
        Ok((n, ready.to_vec()))
    })
}

/// The program's `select(n, r, w, e, timeout)` (or `pselect` with `mask`), as a `poll` of
/// the same fds (which stands in for the pump when one it watches for reading is a carried
/// connection's, and is the kernel's call otherwise); `None` when it watches none for
/// reading (the kernel's `select` then). What a `select` reports follows the kernel's
/// rules: readable on `POLLIN`, `POLLHUP` or `POLLERR`, writable on `POLLOUT` or
/// `POLLERR`, exceptional on `POLLPRI`; an fd that is not open fails the call with `EBADF`.
///
/// # Safety
///
/// `r`, `w` and `e` are null or valid fd sets for `n` fds (select's contract), and `n` is
/// at most `FD_SETSIZE`.
pub(crate) unsafe fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Option<Done> {
    // Each set is non-null where used and valid for `n` fds, and each fd is below `n`,
    // itself at most FD_SETSIZE: the caller's promise, on which every FD_* call relies.
    let isset = |set: *mut libc::fd_set, fd: c_int| {
        // SAFETY: as just said.
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut fds = Vec::new();
    for fd in 0..n {
        let events = if isset(r, fd) { libc::POLLIN } else { 0 }
            | if isset(w, fd) { libc::POLLOUT } else { 0 }
            | if isset(e, fd) { libc::POLLPRI } else { 0 };
        if events == 0 {
            continue;
        }
        fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
    }
    if !fds.iter().any(|p| p.events & libc::POLLIN != 0) {
        return None;
    }
    let (count, errno) = match poll(&mut fds, timeout, mask) {
        Done::Result(count, errno) => (count, errno),
        kernel => return Some(kernel),
    };
    if count < 0 {
        return Some(Done::Result(count, errno));
    }
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Some(Done::Result(-1, libc::EBADF));
    }
    for set in [r, w, e] {
        if !set.is_null() {
            // SAFETY: as above.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut bits = 0;
    for p in &fds {
        let ready = [
            (
                r,
                libc::POLLIN,
                libc::POLLIN | libc::POLLRDNORM | libc::POLLHUP | libc::POLLERR,
            ),
            (
                w,
                libc::POLLOUT,
                libc::POLLOUT | libc::POLLWRNORM | libc::POLLERR,
            ),
            (e, libc::POLLPRI, libc::POLLPRI),
        ];
        for (set, asked, shows) in ready {
            if p.events & asked != 0 && p.revents & shows != 0 {
                // SAFETY: as above.
                unsafe { libc::FD_SET(p.fd, set) };
                bits += 1;
            }
        }
    }
    Some(Done::Result(bits, 0))
}
