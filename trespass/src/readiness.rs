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

impl Readiness {
    /// An epoll instance watching `fds` and `notify` for readability.
    pub(crate) fn new(fds: &[RawFd], notify: Notifier) -> io::Result<Readiness> {
        // SAFETY: epoll_create1 takes no pointers; the fd it returns is ours alone.
        let epoll = check(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        // SAFETY: epoll is a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        let r = Readiness { epoll, notify };
        for &fd in fds.iter().chain([r.notify.0.as_raw_fd()].iter()) {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            let epfd = r.epoll.as_raw_fd();
            // SAFETY: both fds are open (the caller's live for this call, ours owned); ev is
            // a valid epoll_event the kernel copies.
            let ret = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            check(ret, "epoll_ctl")?;
        }
        Ok(r)
    }

    /// Waits until one of the fds is readable or `timeout` passes (`None`: no limit). True
    /// when something is readable. EINTR counts as a wake-up.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ms = match timeout {
            None => -1,
            // Round up, so a short wait does not become a busy loop of zero-length waits.
            Some(t) => t.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int,
        };
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: the epoll fd is open; ev has room for the one event asked for.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(true);
            }
            return Err(io::Error::new(e.kind(), format!("epoll_wait failed: {e}")));
        }
        Ok(n > 0)
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
