//! The one file descriptor a connection is waited on through: an epoll instance over its
//! completion channel, its rdma_cm event channel and an eventfd ([`Notifier`]) that the
//! keep-alive thread pokes after it made progress on the connection's behalf, and that the
//! shared receive queue's router pokes when it delivered a receive to the connection.
//! Readable when any of them is, so poll/epoll users and the async layer can wait on a
//! single fd.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// An epoll fd over a connection's fds, and the eventfd in it.
#[derive(Debug)]
pub(crate) struct Readiness {
    epoll: OwnedFd,
    notify: Notifier,
    /// The completion channel: taken out of the epoll while a thread other than the
    /// owner waits on it in the owner's place ([`detach_cq`](Self::detach_cq)).
    cq: RawFd,
}

/// A connection's eventfd, shared by its [`Readiness`] and whoever pokes it (the shared
/// receive queue's router holds a clone from before the readiness fd exists). The `Arc`
/// keeps the descriptor open while any holder may still write to it.
#[derive(Debug, Clone)]
pub(crate) struct Notifier(Arc<OwnedFd>);

impl Notifier {
    /// A fresh non-blocking eventfd.
    pub(crate) fn new() -> io::Result<Notifier> {
        // SAFETY: eventfd takes no pointers; the fd it returns is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        let fd = check(fd, "eventfd")?;
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(Notifier(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the fd readable until it is cleared.
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: the eventfd is open (the Arc holds it); the buffer is 8 readable bytes.
        // A full counter (EAGAIN) already makes the fd readable, so the result does not
        // matter.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// The eventfd, for waiting on it.
    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: the eventfd is open and non-blocking; the buffer is 8 writable bytes.
        // EAGAIN means there was nothing to clear.
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

fn check(ret: libc::c_int, call: &str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{call} failed: {e}")));
    }
    Ok(ret)
}

/// Which of a connection's fds a look at its [`Readiness`] found readable: each says what
/// the wake-up asks for (drain the completion channel, read rdma_cm's channel, clear the
/// eventfd), so a wait makes only the system calls that find something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Woke(u8);

impl Woke {
    const CQ: u8 = 1;
    const CM: u8 = 2;
    const NOTIFY: u8 = 4;

    /// Nothing was readable (the wait timed out).
    pub(crate) const NOTHING: Woke = Woke(0);

    /// All of them: what to assume when the look itself failed or was interrupted.
    pub(crate) const ALL: Woke = Woke(Self::CQ | Self::CM | Self::NOTIFY);

    /// The completion channel has an event.
    pub(crate) fn cq(self) -> bool {
        self.0 & Self::CQ != 0
    }

    /// rdma_cm's event channel has an event.
    pub(crate) fn cm(self) -> bool {
        self.0 & Self::CM != 0
    }

    /// The eventfd was poked.
    pub(crate) fn notified(self) -> bool {
        self.0 & Self::NOTIFY != 0
    }
}

impl Readiness {
    /// An epoll instance watching the completion channel `cq`, rdma_cm's channel `cm` and
    /// `notify` for readability.
    pub(crate) fn new(cq: RawFd, cm: RawFd, notify: Notifier) -> io::Result<Readiness> {
        // SAFETY: epoll_create1 takes no pointers; the fd it returns is ours alone.
        let epoll = check(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        // SAFETY: epoll is a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        let r = Readiness { epoll, notify, cq };
        let fds = [
            (cq, Woke::CQ),
            (cm, Woke::CM),
            (r.notify.0.as_raw_fd(), Woke::NOTIFY),
        ];
        for (fd, tag) in fds {
            r.ctl(libc::EPOLL_CTL_ADD, fd, tag)?;
        }
        Ok(r)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, tag: u8) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::from(tag),
        };
        // SAFETY: the epoll fd is ours; `fd` is open (the caller's, or the completion
        // channel, which the connection keeps open as long as this lives); ev is a valid
        // epoll_event the kernel copies (and ignores for EPOLL_CTL_DEL).
        let ret = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        check(ret, "epoll_ctl").map(drop)
    }

    /// Takes the completion channel out of the epoll: completions no longer make the
    /// readiness fd readable (rdma_cm's events and the eventfd still do) until
    /// [`attach_cq`](Self::attach_cq). For a thread that waits on the channel in the
    /// owner's place, so that the owner is not woken by what that thread takes.
    pub(crate) fn detach_cq(&self) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, self.cq, Woke::CQ)
    }

    /// Puts the completion channel back: an event waiting on it makes the readiness fd
    /// readable at once (epoll looks when an fd is added).
    pub(crate) fn attach_cq(&self) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, self.cq, Woke::CQ)
    }

    /// The completion channel's fd, for a thread that waits on it directly, borrowed for as
    /// long as this lives.
    pub(crate) fn cq_borrowed(&self) -> BorrowedFd<'_> {
        // SAFETY: `cq` is the connection's completion channel, owned by its resources. The
        // one caller of `new` outside the unit tests (`Resources::into_driver`) passes the
        // channel of the resources that become the driver beside this `Readiness` in the
        // stream's `Shared`, which keeps both until it drops; so the channel stays open for
        // any borrow of `self`. (The unit tests' channels outlive their `Readiness`.)
        unsafe { BorrowedFd::borrow_raw(self.cq) }
    }

    /// Waits until one of the fds is readable or `timeout` passes (`None`: no limit), and
    /// says which are readable ([`Woke::NOTHING`] after the timeout). EINTR counts as a
    /// wake-up of every kind.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> io::Result<Woke> {
        let ms = match timeout {
            None => -1,
            // Round up, so a short wait does not become a busy loop of zero-length waits.
            Some(t) => t.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int,
        };
        self.look(ms)
    }

    /// Which fds are readable now, without waiting: one system call instead of one per fd
    /// (a read of each that mostly fails with EAGAIN). A failed look says all of them, so
    /// the caller reads each as it would without it.
    pub(crate) fn peek(&self) -> Woke {
        self.look(0).unwrap_or(Woke::ALL)
    }

    fn look(&self, ms: libc::c_int) -> io::Result<Woke> {
        const EMPTY: libc::epoll_event = libc::epoll_event { events: 0, u64: 0 };
        let mut evs = [EMPTY; 3];
        // SAFETY: the epoll fd is open; evs has room for the 3 events asked for.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as libc::c_int,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(Woke::ALL);
            }
            return Err(io::Error::new(e.kind(), format!("epoll_wait failed: {e}")));
        }
        let mut woke = Woke::NOTHING;
        for ev in &evs[..n as usize] {
            // Copied out of the (packed) event before use.
            let tag = ev.u64;
            woke.0 |= u8::try_from(tag).unwrap_or(Woke::ALL.0) & Woke::ALL.0;
        }
        Ok(woke)
    }

    /// Makes the fd readable until [`clear`](Self::clear).
    pub(crate) fn notify(&self) {
        self.notify.notify();
    }

    /// Takes back a [`notify`](Self::notify).
    pub(crate) fn clear(&self) {
        self.notify.clear();
    }
}

impl AsFd for Readiness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

/// Polls `a` and `b` for readability for at most `timeout`: which of them are.
pub(crate) fn poll_two(a: RawFd, b: RawFd, timeout: Duration) -> io::Result<(bool, bool)> {
    let ms = timeout
        .as_micros()
        .div_ceil(1000)
        .min(libc::c_int::MAX as u128) as libc::c_int;
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds, for the duration of the call; the fds are open (the
    // completion channel lives as long as the handle's connection, `b` is borrowed).
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two eventfds stand in for the completion channel and rdma_cm's channel: what the
    /// readiness fd says depends only on which fd is readable.
    fn rig() -> (Notifier, Notifier, Readiness) {
        let cq = Notifier::new().unwrap();
        let cm = Notifier::new().unwrap();
        let r = Readiness::new(cq.as_raw_fd(), cm.as_raw_fd(), Notifier::new().unwrap()).unwrap();
        (cq, cm, r)
    }

    #[test]
    fn a_look_names_exactly_the_fds_that_are_readable() {
        let (cq, cm, r) = rig();
        assert_eq!(r.peek(), Woke::NOTHING);
        cm.notify();
        let w = r.peek();
        assert!(w.cm() && !w.cq() && !w.notified(), "{w:?}");
        cq.notify();
        r.notify();
        let w = r.peek();
        assert!(w.cm() && w.cq() && w.notified(), "{w:?}");
        // Level-triggered: a look takes nothing away; only reading the fd does.
        assert_eq!(r.peek(), w);
        cm.clear();
        r.clear();
        let w = r.peek();
        assert!(w.cq() && !w.cm() && !w.notified(), "{w:?}");
        cq.clear();
        assert_eq!(r.peek(), Woke::NOTHING);
    }

    #[test]
    fn a_wait_says_what_woke_it_and_a_timeout_says_nothing() {
        let (cq, _cm, r) = rig();
        assert_eq!(
            r.wait(Some(Duration::from_millis(1))).unwrap(),
            Woke::NOTHING
        );
        let poke = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            cq.notify();
            cq
        });
        let w = r.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(w.cq() && !w.cm() && !w.notified(), "{w:?}");
        drop(poke.join());
    }

    #[test]
    fn a_detached_channel_wakes_nobody_and_one_put_back_full_wakes_at_once() {
        let (cq, _cm, r) = rig();
        r.detach_cq().unwrap();
        cq.notify();
        assert_eq!(
            r.peek(),
            Woke::NOTHING,
            "a detached channel still woke the epoll"
        );
        // The eventfd still wakes it: the owner can be poked while the channel is away.
        r.notify();
        assert!(r.peek().notified());
        r.clear();
        r.attach_cq().unwrap();
        assert!(
            r.peek().cq(),
            "an event that waited while detached was not seen"
        );
        assert!(r.wait(Some(Duration::from_secs(10))).unwrap().cq());
        // Detached twice is an error, not a silent success: the caller's state is wrong.
        r.detach_cq().unwrap();
        assert!(r.detach_cq().is_err());
        r.attach_cq().unwrap();
        assert!(r.attach_cq().is_err());
    }
}
