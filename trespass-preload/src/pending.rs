//! Connects on non-blocking sockets: `connect` returns `EINPROGRESS` instead of waiting for
//! the RDMA attempt, as a TCP connect does, and the socket turns writable when the
//! connection is made.
//!
//! The pump makes the attempt. The program's connect waits for its answer at most
//! `TRESPASS_PRELOAD_CONNECT_WAIT_MS` (50 ms by default): a served peer or a refusal on one
//! network answers within it, and the connection is then set up as a blocking connect's (the
//! socket pair put in at once, or a plain TCP connect on the program's own socket). Past
//! that, the program's fd becomes one end of a socket pair that is *not writable* (its
//! sending side is filled with bytes the pump throws away), the connect returns
//! `EINPROGRESS`, and when the answer comes the pump takes the filler out, so the fd turns
//! writable exactly when a TCP socket's would: over RDMA if the peer is served, else over TCP
//! from the program's own socket (kept aside, with whatever it was bound to), carried through
//! the same socket pair. If that fails too, the pair closes and `SO_ERROR` says why, once.
//!
//! The fd is never replaced after `connect` returned: an epoll set that watches it watches
//! the file the connection ends up on.

use std::ffi::c_int;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::direct::{self, Direct};
use crate::real;
use crate::stats::{count, Event};
use crate::table::{self, Entry, Pending};

/// What the program's connect left for the pump once it returned `EINPROGRESS`.
pub(crate) struct Handoff {
    /// The pending connect's id in the table.
    id: u64,
    /// The family of the program's socket.
    family: c_int,
    /// The address the program connects to, as it gave it (a TCP connect uses it).
    pub(crate) peer: SocketAddr,
    /// The address tried over RDMA (v4-mapped addresses unmapped).
    pub(crate) target: SocketAddr,
    /// The pump's end of the socket pair.
    theirs: UnixStream,
    /// A copy of the program's end, kept to give it its send buffer back; dropped then.
    mine: UnixStream,
    /// The program's own TCP socket, as it was before connect.
    pub(crate) socket: OwnedFd,
    /// Bytes of filler in the pair, program to pump.
    filler: usize,
    /// The program's end's send buffer size before it was shrunk (as `SO_SNDBUF` read it).
    sndbuf: c_int,
    /// `TCP_NODELAY` as the program set it before connecting.
    nodelay: bool,
}

impl Handoff {
    /// Takes the filler out and gives the program's end its send buffer back: from here the
    /// program's fd is writable (the connection is made), or readable at end of stream and
    /// writable (it failed, once `theirs` is dropped).
    fn open(&mut self) -> io::Result<()> {
        let mut left = self.filler;
        let mut sink = [0u8; 4096];
        while left > 0 {
            let n = (&self.theirs).read(&mut sink[..left.min(4096)])?;
            if n == 0 {
                break;
            }
            left -= n;
        }
        self.filler = 0;
        // The kernel doubles what it is given; give back half of what it reported.
        set_int(
            self.mine.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            self.sndbuf / 2,
        )
    }

    /// The connection is made (`local` to `peer`): records it for every fd of this connect
    /// (with a direct path through `handle`, when given), then opens the program's fd;
    /// returns the pump's end of the pair, to carry, and the direct path.
    pub(crate) fn connected(
        mut self,
        local: SocketAddr,
        peer: SocketAddr,
        handle: Option<trespass::TryHandle>,
    ) -> (UnixStream, Option<Arc<Direct>>) {
        let conn = table::Conn {
            local,
            peer,
            family: self.family,
            pair: true,
            nodelay: self.nodelay,
            owner: std::process::id(),
        };
        // Recorded before the fd turns writable: the program's getpeername (and its first
        // write) may follow.
        let fds = table::settle(self.id, Entry::Conn(conn));
        let end = self.theirs.try_clone().map(OwnedFd::from);
        let direct = match (handle, end) {
            (Some(h), Ok(end)) => Direct::new(h, &end).ok(),
            _ => None,
        };
        if let Some(d) = &direct {
            for fd in fds {
                direct::insert(fd, Arc::clone(d));
            }
        }
        if let Err(e) = self.open() {
            crate::log(format_args!("{}: {e}", self.peer));
        }
        (self.theirs, direct)
    }

    /// The pending connect failed for good: `SO_ERROR` says `errno`, and the program's fd
    /// reads end of stream.
    pub(crate) fn fail(self, errno: c_int) {
        // Recorded before the pair closes (closing it wakes the program).
        table::settle(
            self.id,
            Entry::Pending(Pending {
                id: self.id,
                family: self.family,
                error: errno,
                reported: false,
            }),
        );
        drop(self);
    }
}

fn set_int(fd: c_int, level: c_int, name: c_int, v: c_int) -> io::Result<()> {
    // SAFETY: `v` is an int, passed with its size.
    let r = unsafe {
        real::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast(),
            size_of::<c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_int(fd: c_int, level: c_int, name: c_int) -> io::Result<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for an int option.
    if unsafe { real::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Gives the socket pair's end `to` the socket options the program set on its TCP socket
/// `from` before connecting that a socket pair keeps the meaning of (read and write
/// timeouts, which a blocking program counts on; keepalive, linger and priority, which it
/// may read back); returns the TCP socket's `TCP_NODELAY`, which the table answers for.
/// An option that cannot be read or set is left as it is.
pub(crate) fn carry_options(from: c_int, to: c_int) -> bool {
    for name in [
        libc::SO_RCVTIMEO,
        libc::SO_SNDTIMEO,
        libc::SO_KEEPALIVE,
        libc::SO_LINGER,
        libc::SO_PRIORITY,
    ] {
        let mut buf = [0u8; 32];
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: `buf` has `len` bytes for the option's value.
        let got = unsafe {
            real::getsockopt(
                from,
                libc::SOL_SOCKET,
                name,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if got == 0 {
            // SAFETY: the value just read, with its length.
            unsafe { real::setsockopt(to, libc::SOL_SOCKET, name, buf.as_ptr().cast(), len) };
        }
    }
    get_int(from, libc::IPPROTO_TCP, libc::TCP_NODELAY).is_ok_and(|v| v != 0)
}

/// Puts `end` (a socket pair's) in the program's `fd`'s place, keeping `fd`'s descriptor
/// flags (`descriptor`, as `F_GETFD` read them: close-on-exec).
pub(crate) fn put_in_place(end: &UnixStream, fd: c_int, descriptor: c_int) -> io::Result<()> {
    let cloexec = if descriptor & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // SAFETY: `end` is open; `fd` is the caller's socket, which this replaces as connect
    // would have connected it.
    if unsafe { real::dup3(end.as_raw_fd(), fd, cloexec) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts a not-yet-writable socket pair end in `fd`'s place (keeping its descriptor flags;
/// the status flags, `O_NONBLOCK` among them, are set on the pair's end) and records the
/// pending connect `id` for it.
pub(crate) fn install(
    fd: c_int,
    id: u64,
    family: c_int,
    peer: SocketAddr,
    target: SocketAddr,
) -> io::Result<Handoff> {
    let (mine, theirs) = UnixStream::pair()?;
    let nodelay = carry_options(fd, mine.as_raw_fd());
    let sndbuf = get_int(mine.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF)?;
    // The smallest send buffer the kernel allows (a few KiB), filled: a Unix stream socket
    // is writable only while its bytes in flight take less than a quarter of it.
    set_int(mine.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, 1)?;
    mine.set_nonblocking(true)?;
    let chunk = [0u8; 512];
    let mut filler = 0;
    loop {
        match (&mine).write(&chunk) {
            Ok(n) => filler += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // SAFETY: fcntl queries and a duplicate of the fd the caller passed to connect.
    let (status, descriptor, copy) = unsafe {
        (
            libc::fcntl(fd, libc::F_GETFL),
            libc::fcntl(fd, libc::F_GETFD),
            libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0),
        )
    };
    if status < 0 || descriptor < 0 || copy < 0 {
        let e = io::Error::last_os_error();
        if copy >= 0 {
            // SAFETY: `copy` was just made here and nothing else has it.
            drop(unsafe { OwnedFd::from_raw_fd(copy) });
        }
        return Err(e);
    }
    // SAFETY: `copy` is a new fd of this function's.
    let socket = unsafe { OwnedFd::from_raw_fd(copy) };
    let keep = mine.try_clone()?;
    // SAFETY: F_SETFL on the pair's end, which this function owns.
    if unsafe { libc::fcntl(mine.as_raw_fd(), libc::F_SETFL, status) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // The program's own socket lives on in `socket`.
    put_in_place(&mine, fd, descriptor)?;
    table::insert(
        fd,
        Entry::Pending(Pending {
            id,
            family,
            error: 0,
            reported: false,
        }),
    );
    Ok(Handoff {
        id,
        family,
        peer,
        target,
        theirs,
        mine: keep,
        socket,
        filler,
        sndbuf,
        nodelay,
    })
}

/// One RDMA attempt for a non-blocking connect, between the program's thread and the pump.
pub(crate) struct Attempt {
    state: Mutex<State>,
    answered: Condvar,
}

enum State {
    /// The program's connect is still waiting.
    Waiting,
    /// The answer came while it waited.
    Answered(io::Result<trespass::Stream>),
    /// It returned `EINPROGRESS`: the pump finishes the connection.
    Handed(Handoff),
    /// Taken by whichever side finishes.
    Done,
}

impl Attempt {
    pub(crate) fn new() -> Arc<Attempt> {
        Arc::new(Attempt {
            state: Mutex::new(State::Waiting),
            answered: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pump's: the attempt's answer. Returns it with the hand-off when the program's
    /// connect has returned already (the pump then finishes the connection).
    pub(crate) fn answer(
        &self,
        r: io::Result<trespass::Stream>,
    ) -> Option<(Handoff, io::Result<trespass::Stream>)> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Done) {
            State::Waiting => {
                *state = State::Answered(r);
                self.answered.notify_all();
                None
            }
            State::Handed(h) => Some((h, r)),
            other => {
                *state = other;
                None
            }
        }
    }

    /// The program's connect: the answer, if it comes within `wait`.
    pub(crate) fn wait(&self, wait: Duration) -> Option<io::Result<trespass::Stream>> {
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            if let State::Answered(_) = &*state {
                let State::Answered(r) = std::mem::replace(&mut *state, State::Done) else {
                    unreachable!("matched above")
                };
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state = self
                .answered
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The program's connect, about to return `EINPROGRESS` with `h` installed: the pump
    /// finishes it when the answer comes; if it came meanwhile, the caller hands both to the
    /// pump itself.
    pub(crate) fn hand_off(&self, h: Handoff) -> Option<(Handoff, io::Result<trespass::Stream>)> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Done) {
            State::Answered(r) => Some((h, r)),
            _ => {
                *state = State::Handed(h);
                None
            }
        }
    }
}

/// Whether `e` says this machine has no RDMA device (rdma_cm's ENODEV anywhere in its
/// chain of causes).
pub(crate) fn no_device(e: &io::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|e| e as _);
    while let Some(c) = cause {
        if c.downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            == Some(libc::ENODEV)
        {
            return true;
        }
        cause = c.source();
    }
    e.raw_os_error() == Some(libc::ENODEV)
}

fn fail_event(e: &io::Error) -> Event {
    if no_device(e) {
        return Event::ConnectTcpNoDevice;
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Event::ConnectTcpRefused,
        io::ErrorKind::AddrNotAvailable | io::ErrorKind::NotFound => Event::ConnectTcpNoDevice,
        io::ErrorKind::TimedOut => Event::ConnectTcpTimeout,
        _ => Event::ConnectTcpError,
    }
}

/// Counts and logs an RDMA attempt that failed (the connection goes over TCP), and
/// remembers a peer that did not answer.
pub(crate) fn note_failure(peer: SocketAddr, target: SocketAddr, e: &io::Error) {
    let event = fail_event(e);
    if event == Event::ConnectTcpTimeout {
        table::note_unanswered(target.ip());
    }
    count(event);
    crate::log(format_args!("{peer}: over TCP ({e})"));
}
