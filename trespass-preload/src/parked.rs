//! epoll sets that keep their carried connections' streams in the pump's place from one of
//! the program's waits to the next.
//!
//! A program that waits in `epoll_wait` for its carried connections would, left to the
//! kernel, wake only after the pump woke, read the stream and copied the bytes into the
//! program's socket. Here each epoll set the program waits on that watches carried
//! connections for reading gets a private epoll (its *shadow*) holding those streams'
//! completion channels, taken from the pump ([`trespass::TryHandle::stand_in`]) the first
//! time the set is waited on and kept: the shadow is registered in the program's own set
//! (with data whose high half is [`TOKEN_HIGH`], never shown to the program), so the
//! kernel's `epoll_wait` on the program's set, which the program's thread makes itself (and
//! where a thread cancellation acts as it would without the library), wakes when one of
//! those streams has a completion. The library then takes the event, re-arms that stream's
//! completion queue, and reports the connection readable (`EPOLLIN` with the data the
//! program registered) while its stream has bytes; the program's read takes them from the
//! stream directly (`direct`). A wait costs the streams nothing until one of them has an
//! arrival: no system call per stream and per wait (which is what limited the per-wait
//! stand-in of `wait` to a few connections).
//!
//! What keeps the kernel's meaning:
//!
//! - Everything else is the kernel's answer, from the same call: the other fds,
//!   writability, hang-ups and errors, and bytes the pump did copy into a socket.
//! - A stream's bytes are reported while it has some (level-triggered); its end or a
//!   failure is not: the set gives that stream back to the pump, which carries the end into
//!   the socket, where the kernel reports it.
//! - The pump takes a stream back whenever it must wait on it itself (to write: trespass
//!   revokes the stand-in), and the set then lets it go.
//! - A set gives a stream back, and what is unread goes to the pump, before anything else
//!   might wait for that connection where the set's arrivals would not wake it: another epoll
//!   set's wait or a `poll`/`select` that watches it ([`release`]), a blocking read that
//!   must wait or a read the kernel answers on a blocking socket ([`release_fd`]), and its
//!   `close` or `dup2` ([`forget`]). A set whose registrations the library cannot keep the
//!   meaning of (`EPOLLONESHOT`, `EPOLLEXCLUSIVE`) holds nothing, as before.
//! - Bytes a wait reported stay in the stream for the program's read (`direct`'s lending).
//! - A forked child forgets its parent's sets: their streams are the parent's to carry.
//!
//! Calls the library does not interpose that read a socket (`splice`, `recvmmsg`,
//! io_uring) do not see bytes a set holds until the program's next wait the library sees.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use trespass::{StandIn, Standing};

use crate::direct::{self, Direct, Watched};
use crate::stats::{count, Event};
use crate::wait::{Reg, Regs};

/// The high half of the data with which a set's shadow is registered in the program's set
/// ("trsp"); its low half is the shadow's fd. Events with this high half are the library's:
/// every interposed epoll wait takes them out before the program sees its events.
const TOKEN_HIGH: u64 = 0x7472_7370 << 32;

fn token(shadow: c_int) -> u64 {
    TOKEN_HIGH | u64::from(shadow as u32)
}

fn is_token(data: u64) -> bool {
    data >> 32 == TOKEN_HIGH >> 32
}

/// Whether a shadow was ever registered in this process (or its parent, before a fork):
/// until then no wait has events to take out.
static TOKENS: AtomicBool = AtomicBool::new(false);

/// A stream a set holds, with the program's registrations of it in that set (by fd).
struct Held {
    watched: Watched,
    stand_in: StandIn,
    regs: Vec<(c_int, Reg)>,
    /// Its completion queue was armed after its last event: nothing new comes without
    /// another event.
    armed: bool,
}

fn key(d: &Arc<Direct>) -> u64 {
    Arc::as_ptr(d) as usize as u64
}

/// An epoll set's streams, held in the pump's place.
pub(crate) struct Parked {
    epfd: c_int,
    /// The private epoll over the held streams' completion channels (data: [`key`]),
    /// registered in `epfd` with [`token`].
    shadow: c_int,
    held: Vec<Held>,
    /// The registrations' generation (`wait::regs_of`) the held list follows.
    generation: u64,
    /// Streams were given back since (or could not be taken): look at the registrations
    /// again at the next wait.
    dirty: bool,
}

impl Parked {
    fn new(epfd: c_int) -> Option<Parked> {
        // SAFETY: epoll_create1 takes a flag; the result is checked.
        let shadow = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if shadow < 0 {
            return None;
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token(shadow),
        };
        TOKENS.store(true, Ordering::Release);
        // SAFETY: `ev` is a valid event for the call; both fds are open (the program's
        // epoll fd for the duration of its wait).
        if unsafe { crate::real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, shadow, &mut ev) } != 0 {
            // SAFETY: `shadow` is this function's own fd, closed once.
            unsafe { crate::real::close(shadow) };
            return None;
        }
        Some(Parked {
            epfd,
            shadow,
            held: Vec::new(),
            generation: 0,
            dirty: true,
        })
    }

    /// Gives held stream `i` back to the pump, with what it has unread.
    fn release_at(&mut self, i: usize) {
        let h = self.held.swap_remove(i);
        // SAFETY: removing an fd from this set's own epoll; a null event is valid for DEL.
        unsafe {
            libc::epoll_ctl(
                self.shadow,
                libc::EPOLL_CTL_DEL,
                h.stand_in.as_fd().as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
        drop(h.stand_in);
        h.watched.handle.hand_back();
    }

    /// Gives back every held stream `which` picks.
    fn release_where(&mut self, which: impl Fn(&Arc<Direct>) -> bool) {
        let mut i = 0;
        while i < self.held.len() {
            if which(&self.held[i].watched.direct) {
                self.release_at(i);
                self.dirty = true;
            } else {
                i += 1;
            }
        }
    }

    /// Follows the set's registrations (`want`, at `generation`): lets go of streams no
    /// longer watched for reading, takes the new ones from the pump. Returns the streams it
    /// could not take (another set holds them, or their owner is waiting to write).
    fn follow(&mut self, want: Vec<(Watched, c_int, Reg)>, generation: u64) -> Vec<Arc<Direct>> {
        let mut groups: HashMap<u64, (Watched, Vec<(c_int, Reg)>)> =
            HashMap::with_capacity(want.len());
        for (w, fd, r) in want {
            groups
                .entry(key(&w.direct))
                .or_insert_with(|| (w, Vec::new()))
                .1
                .push((fd, r));
        }
        let mut i = 0;
        while i < self.held.len() {
            match groups.remove(&key(&self.held[i].watched.direct)) {
                Some((_, regs)) => {
                    self.held[i].regs = regs;
                    i += 1;
                }
                None => self.release_at(i),
            }
        }
        let mut declined = Vec::new();
        for (k, (watched, regs)) in groups {
            let Some(stand_in) = watched.handle.stand_in() else {
                declined.push(Arc::clone(&watched.direct));
                continue;
            };
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: k,
            };
            // SAFETY: adding the stream's completion channel (open while `stand_in` lives)
            // to this set's own epoll, with a valid event.
            let added = unsafe {
                libc::epoll_ctl(
                    self.shadow,
                    libc::EPOLL_CTL_ADD,
                    stand_in.as_fd().as_raw_fd(),
                    &mut ev,
                )
            };
            if added != 0 {
                drop(stand_in);
                watched.handle.hand_back();
                declined.push(Arc::clone(&watched.direct));
                continue;
            }
            self.held.push(Held {
                watched,
                stand_in,
                regs,
                armed: false,
            });
        }
        self.generation = generation;
        self.dirty = !declined.is_empty();
        declined
    }

    /// The held streams with bytes to report now. With `fired` (the shadow was ready),
    /// first takes the events of the channels that have one. A stream whose completion
    /// queue is not armed is armed (and looked at once more); one that ended, failed, was
    /// taken back by the pump, or whose bytes may not be reported (see `direct`'s
    /// `no_report`), goes back to the pump.
    fn look(&mut self, fired: bool) -> Vec<Ready> {
        if fired && !self.held.is_empty() {
            let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; self.held.len()];
            // SAFETY: `evs` has room for `evs.len()` events; no wait.
            let n = unsafe {
                crate::real::epoll_pwait(
                    self.shadow,
                    evs.as_mut_ptr(),
                    evs.len() as c_int,
                    0,
                    std::ptr::null(),
                )
            };
            for e in &evs[..usize::try_from(n).unwrap_or(0)] {
                let k = e.u64;
                if let Some(h) = self.held.iter_mut().find(|h| key(&h.watched.direct) == k) {
                    h.stand_in.woke(true);
                    h.armed = false;
                }
            }
        }
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            let h = &mut self.held[i];
            let standing = if h.armed {
                h.stand_in.standing()
            } else {
                h.armed = true;
                h.stand_in.arm()
            };
            let keep = match standing {
                Standing::Waiting => true,
                Standing::Ready if h.watched.handle.has_bytes() => {
                    let reportable = h.watched.reportable();
                    if reportable {
                        ready.push(Ready {
                            watched: h.watched.clone(),
                            regs: h.regs.clone(),
                        });
                    } else {
                        // Its bytes go to the kernel's reads for now: take it again once
                        // the pump carried them.
                        self.dirty = true;
                    }
                    reportable
                }
                // The end or a failure: the pump carries it into the socket for good.
                Standing::Ready => false,
                // The pump took it back to wait on it itself (to write): take it again
                // when it lets go.
                _ => {
                    self.dirty = true;
                    false
                }
            };
            if keep {
                i += 1;
            } else {
                self.release_at(i);
            }
        }
        ready
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        while !self.held.is_empty() {
            self.release_at(self.held.len() - 1);
        }
        // SAFETY: the program's epoll fd is open until after `forget` dropped this set, and
        // the shadow is this set's own fd, closed once here (by the C library's close: the
        // library's own is for the program's fds).
        unsafe {
            crate::real::epoll_ctl(
                self.epfd,
                libc::EPOLL_CTL_DEL,
                self.shadow,
                std::ptr::null_mut(),
            );
            crate::real::close(self.shadow);
        }
    }
}

/// A held stream with bytes, and the registrations (by fd) to report them under.
pub(crate) struct Ready {
    watched: Watched,
    regs: Vec<(c_int, Reg)>,
}

type Sets = HashMap<c_int, Arc<Mutex<Parked>>>;

/// The sets, by the program's epoll fd.
static SETS: Mutex<Option<Sets>> = Mutex::new(None);
/// Entries of `SETS`: nothing is looked up while it is 0.
static SETS_N: AtomicUsize = AtomicUsize::new(0);

/// The sets' lock, held across `fork` (see `before_fork`).
pub(crate) type SetsGuard = MutexGuard<'static, Option<Sets>>;

/// Takes the sets' lock, for the fork handlers.
pub(crate) fn lock_sets() -> SetsGuard {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_set(set: &Mutex<Parked>) -> MutexGuard<'_, Parked> {
    set.lock().unwrap_or_else(|p| p.into_inner())
}

/// In a forked child: the parent's sets hold the parent's streams, and their locks may be
/// held by threads the child does not have; they are forgotten, never dropped (dropping
/// would give the parent's streams "back" from the child).
pub(crate) fn forget_in_child() {
    let sets = lock_sets().take();
    SETS_N.store(0, Ordering::Release);
    std::mem::forget(sets);
}

/// Whether a wait may find the library's events among the kernel's (see [`TOKEN_HIGH`]).
pub(crate) fn tokens() -> bool {
    TOKENS.load(Ordering::Acquire)
}

/// Whether any set holds streams (or may): the release calls look no further while not.
pub(crate) fn any() -> bool {
    SETS_N.load(Ordering::Acquire) != 0
}

/// Removes `epfd`'s set (dropped by the caller, outside the sets' lock).
fn remove(epfd: c_int) -> Option<Arc<Mutex<Parked>>> {
    let mut g = lock_sets();
    let sets = g.as_mut()?;
    let set = sets.remove(&epfd);
    SETS_N.store(sets.len(), Ordering::Release);
    set
}

/// Gives the streams of `directs` back to the pump from every set that holds them, but
/// `except`'s: something other than that set's wait is about to wait for them.
pub(crate) fn release(directs: &[Arc<Direct>], except: Option<c_int>) {
    if !any() || directs.is_empty() {
        return;
    }
    let sets: Vec<Arc<Mutex<Parked>>> = match lock_sets().as_ref() {
        Some(sets) => sets
            .iter()
            .filter(|(epfd, _)| Some(**epfd) != except)
            .map(|(_, s)| Arc::clone(s))
            .collect(),
        None => return,
    };
    for set in sets {
        lock_set(&set).release_where(|d| directs.iter().any(|x| Arc::ptr_eq(x, d)));
    }
}

/// [`release`] of the stream of the program's `fd`, if it is a carried connection's.
pub(crate) fn release_fd(fd: c_int) {
    if !any() {
        return;
    }
    if let Some(d) = direct::get(fd) {
        release(&[d], None);
    }
}

/// The program's `fd` is being closed (or replaced by `dup2`): if it is an epoll fd, its
/// set goes (the streams back to the pump); if a carried connection's, every set lets go
/// of its stream.
pub(crate) fn forget(fd: c_int) {
    if !any() || crate::internal::get() {
        return;
    }
    drop(remove(fd));
    release_fd(fd);
}

/// What an epoll wait found before the kernel's call: the set it waits with, if any, and
/// the streams with bytes now.
pub(crate) struct Look {
    /// The program's epoll fd, the token of its set's shadow, and the set.
    set: Option<(c_int, u64, Arc<Mutex<Parked>>)>,
    ready: Vec<Ready>,
}

impl Look {
    /// Nothing held: the kernel's wait alone (its events still go through [`after`]).
    pub(crate) fn none() -> Look {
        Look {
            set: None,
            ready: Vec::new(),
        }
    }

    /// Whether streams have bytes to report already: the kernel's call then must not wait.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }
}

/// Before the kernel's call of the program's epoll wait on `epfd`: hands back what earlier
/// waits reported and was not read (but this set's), follows the set's registrations (a
/// set is made at its first wait), and looks for held streams with bytes.
pub(crate) fn before(epfd: c_int) -> Look {
    let existing = lock_sets().as_ref().and_then(|s| s.get(&epfd).cloned());
    // The registrations are looked at stream by stream only when they changed since the
    // set followed them (or it was told to look again).
    let known = existing.as_ref().and_then(|s| {
        let p = lock_set(s);
        (!p.dirty).then_some(p.generation)
    });
    let (generation, regs) = crate::wait::regs_of(epfd, known);
    let (want, later) = match regs {
        Regs::Unchanged => (None, false),
        Regs::Holdable(want, later) => (Some(want), later),
        Regs::None => {
            // Not a set this library can hold streams for: the kernel's wait, which the
            // pump must serve for every carried connection in it.
            if any() {
                drop(remove(epfd));
                release(&crate::wait::carried_in(epfd), None);
            }
            direct::hand_back_lent(|_| false);
            return Look::none();
        }
    };
    let set = match existing {
        Some(set) => set,
        None => {
            let Some(p) = Parked::new(epfd) else {
                let streams: Vec<Arc<Direct>> = want
                    .iter()
                    .flatten()
                    .map(|(w, _, _)| Arc::clone(&w.direct))
                    .collect();
                release(&streams, None);
                direct::hand_back_lent(|_| false);
                return Look::none();
            };
            let set = Arc::new(Mutex::new(p));
            let mut g = lock_sets();
            let sets = g.get_or_insert_with(HashMap::new);
            let set = Arc::clone(sets.entry(epfd).or_insert(set));
            SETS_N.store(sets.len(), Ordering::Release);
            set
        }
    };
    let mut p = lock_set(&set);
    let declined = match want {
        Some(want) => {
            let declined = p.follow(want, generation);
            p.dirty |= later;
            declined
        }
        None => Vec::new(),
    };
    direct::hand_back_lent(|d| p.held.iter().any(|h| Arc::ptr_eq(&h.watched.direct, d)));
    let ready = p.look(false);
    let own = token(p.shadow);
    drop(p);
    if !declined.is_empty() {
        // Another set holds them (the program waits here now), or their owner is about to
        // write: either way the pump carries them, and the kernel's wait sees their bytes.
        release(&declined, Some(epfd));
    }
    Look {
        set: Some((epfd, own, set)),
        ready,
    }
}

/// After the kernel's call (`n` events in `events`, room for `max`): takes the library's
/// events out, takes the held streams' events if the shadow had any, and adds the
/// streams with bytes (`EPOLLIN` merged into the kernel's event for the same registration,
/// or a new event while there is room). Returns the count the program gets; the streams it
/// was told of keep their bytes for its read (lent).
///
/// # Safety
///
/// `events` is valid for `max` events, of which the first `n` (>= 0) are the kernel's.
pub(crate) unsafe fn after(
    look: Look,
    events: *mut libc::epoll_event,
    n: c_int,
    max: c_int,
) -> c_int {
    let mut ready = look.ready;
    let mut kept = 0usize;
    let mut fired = false;
    if n > 0 {
        // SAFETY: the caller's promise: the first `n` events are initialised.
        let have = unsafe { std::slice::from_raw_parts_mut(events, n as usize) };
        let own = look.set.as_ref().map(|(_, own, _)| *own);
        let tokens = TOKENS.load(Ordering::Acquire);
        for i in 0..have.len() {
            let e = have[i];
            let data = e.u64;
            if tokens && is_token(data) {
                fired |= Some(data) == own;
                continue;
            }
            have[kept] = e;
            kept += 1;
        }
    }
    if fired {
        if let Some((_, _, set)) = &look.set {
            for r in lock_set(set).look(true) {
                if !ready
                    .iter()
                    .any(|x| Arc::ptr_eq(&x.watched.direct, &r.watched.direct))
                {
                    ready.push(r);
                }
            }
        }
    }
    let mut count_now = kept as c_int;
    let mut reported = false;
    let epfd = look.set.as_ref().map(|(epfd, _, _)| *epfd);
    for r in &ready {
        let mut told = false;
        for (fd, reg) in &r.regs {
            // Not a registration another thread removed or changed meanwhile.
            if !epfd.is_some_and(|e| crate::wait::still_registered(e, *fd, reg.data)) {
                continue;
            }
            let flags = reg.events & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32;
            // SAFETY: the first `count_now` events are initialised, within the array.
            let have = unsafe { std::slice::from_raw_parts_mut(events, count_now as usize) };
            if let Some(e) = have.iter_mut().find(|e| ({ e.u64 }) == reg.data) {
                e.events |= flags;
            } else if count_now < max {
                // SAFETY: `count_now` < `max`: within the caller's array.
                unsafe {
                    events.add(count_now as usize).write(libc::epoll_event {
                        events: flags,
                        u64: reg.data,
                    });
                }
                count_now += 1;
            } else {
                continue;
            }
            told = true;
        }
        if told {
            r.watched.lend();
            reported = true;
        }
    }
    if reported {
        count(Event::WaitStoodIn);
    }
    count_now
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: u64) -> libc::epoll_event {
        libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        }
    }

    #[test]
    fn the_librarys_events_never_reach_the_program() {
        TOKENS.store(true, Ordering::Release);
        let mut events = [
            ev(7),
            ev(token(12)),
            ev(0x7472_736f << 32),
            ev(token(40)),
            ev(9),
        ];
        // SAFETY: five initialised events in an array of five.
        let n = unsafe { after(Look::none(), events.as_mut_ptr(), 5, 5) };
        assert_eq!(n, 3);
        let kept: Vec<u64> = events[..3].iter().map(|e| e.u64).collect();
        // The program's own data, in the kernel's order; a high half one off the library's
        // is the program's.
        assert_eq!(kept, [7, 0x7472_736f << 32, 9]);
    }

    #[test]
    fn a_wait_with_only_the_librarys_events_reports_nothing() {
        TOKENS.store(true, Ordering::Release);
        let mut events = [ev(token(3)), ev(token(4))];
        // SAFETY: two initialised events in an array of two.
        let n = unsafe { after(Look::none(), events.as_mut_ptr(), 2, 2) };
        assert_eq!(n, 0);
    }

    #[test]
    fn tokens_carry_the_shadows_fd_under_the_librarys_high_half() {
        assert!(is_token(token(0)));
        assert!(is_token(token(c_int::MAX)));
        assert_eq!(token(5) & 0xffff_ffff, 5);
        assert!(!is_token(5));
        assert!(!is_token(u64::MAX));
        assert!(!is_token(((TOKEN_HIGH >> 32) ^ 1) << 32));
    }
}
