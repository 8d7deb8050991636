//! The functions this library puts in front of the C library's. Each catches panics (none
//! may cross into C: a panic becomes `EIO`) and goes straight to the C library when called
//! from inside the library itself.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use libc::{sockaddr, sockaddr_storage, socklen_t};

use crate::pending::{no_device, note_failure};
use crate::stats::{count, Event};
use crate::table::{self, Conn, Entry};
use crate::{addr, direct, internal, parked, pending, pump, real, wait};

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an entry point's body with thread cancellation held off (see [`held_off`]); a
/// panic becomes -1 with `EIO`.
fn entry(body: impl FnOnce() -> c_int) -> c_int {
    held_off(|| std::panic::catch_unwind(AssertUnwindSafe(body))).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        -1
    })
}

/// Runs `f` with this thread's cancellation held off (`PTHREAD_CANCEL_DISABLE`), then puts
/// the thread's state back. A program that cancels a thread blocked in a socket call
/// (iperf3 ends its stream threads so) must not have the cancellation's unwinding run through
/// this library's Rust frames: where it meets a `catch_unwind` the process stops (glibc's
/// "FATAL: exception not rethrown"), and a frame with values to drop cannot be unwound by it.
/// Within `f` the library's own waits are bounded (a connect's RDMA attempt by its timeout, a
/// direct read's wait by `direct::wait`'s bound); a cancellation requested meanwhile acts at
/// the next cancellation point after it, such as the kernel's call that follows, as it would
/// have without the library. The kernel calls that may block for long (a TCP connect, a
/// blocking read or write) are made outside it, from frames with nothing to unwind.
fn held_off<R>(f: impl FnOnce() -> R) -> R {
    let mut old: c_int = 0;
    // SAFETY: pthread_setcancelstate writes the previous state through a valid pointer.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
    let r = f();
    let mut ignored: c_int = 0;
    // SAFETY: as above; `old` is the state this thread had.
    unsafe { pthread_setcancelstate(old, &mut ignored) };
    r
}

/// Keeps `errno` across calls whose own failures are not the caller's business.
fn keep_errno<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: as in `set_errno`.
    let saved = unsafe { *libc::__errno_location() };
    let r = f();
    set_errno(saved);
    r
}

fn int_opt(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for an int option.
    let r = unsafe { real::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// The family of `fd` if it is a TCP socket (IPv4 or IPv6 stream, protocol TCP).
fn tcp_family(fd: c_int) -> Option<c_int> {
    let family = int_opt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    if !matches!(family, libc::AF_INET | libc::AF_INET6) {
        return None;
    }
    let stream = int_opt(fd, libc::SOL_SOCKET, libc::SO_TYPE)? == libc::SOCK_STREAM;
    let tcp = int_opt(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)? == libc::IPPROTO_TCP;
    (stream && tcp).then_some(family)
}

fn name_of(
    fd: c_int,
    f: unsafe fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
) -> Option<SocketAddr> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut s: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: `s` has `len` bytes.
    if unsafe { f(fd, (&raw mut s).cast(), &mut len) } != 0 {
        return None;
    }
    addr::from_storage(&s, len as usize)
}

/// What connect says on an fd that is connected or connecting already, as TCP does.
fn connect_again(fd: c_int) -> Option<c_int> {
    let errno = match table::get(fd)? {
        Entry::Conn(_) => libc::EISCONN,
        Entry::Pending(p) if p.error == 0 => libc::EALREADY,
        Entry::Pending(p) => p.error,
        Entry::Listener { .. } => return None,
    };
    set_errno(errno);
    Some(-1)
}

static CONNECTS: AtomicU64 = AtomicU64::new(1);

/// connect(2): tries trespass first, see the crate's docs.
///
/// # Safety
///
/// connect(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if !internal::get() {
        let r =
            held_off(|| std::panic::catch_unwind(AssertUnwindSafe(|| connect_rdma(fd, addr, len))));
        match r {
            Ok(Some(r)) => return r,
            Ok(None) => {}
            Err(_) => {
                set_errno(libc::EIO);
                return -1;
            }
        }
    }
    // The kernel's connect (a TCP one, or not a TCP socket at all): it may block for long
    // and is a cancellation point, so it runs here, with cancellation as the program set it
    // and nothing of the library's to unwind.
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { real::connect(fd, addr, len) }
}

/// connect's RDMA part: `Some(result)` when it is settled here (over RDMA, in progress, or
/// refused as a connected socket's connect is), `None` for the kernel's connect.
fn connect_rdma(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
    if let Some(r) = connect_again(fd) {
        return Some(r);
    }
    // SAFETY: the caller promises `len` readable bytes at `addr`.
    let peer = (unsafe { addr::read(addr, len) })?;
    let family = keep_errno(|| tcp_family(fd))?;
    let config = crate::config();
    if !config.covers(peer) {
        count(Event::ConnectTcpRule);
        return None;
    }
    let target = addr::unmap(peer);
    if table::recently_unanswered(target.ip()) {
        count(Event::ConnectTcpTimeout);
        crate::log(format_args!("{peer}: over TCP (no RDMA answer lately)"));
        return None;
    }
    // SAFETY: F_GETFL on the caller's fd.
    let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    let answer = if nonblocking {
        match internal::with(|| in_progress(fd, family, peer, target, config)) {
            Progress::Answered(r) => r,
            Progress::Returned => {
                count(Event::ConnectInProgress);
                set_errno(libc::EINPROGRESS);
                return Some(-1);
            }
        }
    } else {
        internal::with(|| trespass::Stream::connect_timeout(&target, config.timeout))
    };
    match answer.and_then(|stream| internal::with(|| attach(fd, family, stream))) {
        Ok(()) => {
            count(Event::ConnectRdma);
            crate::log(format_args!("{peer}: over RDMA"));
            Some(0)
        }
        Err(e) => {
            note_failure(peer, target, &e);
            None
        }
    }
}

/// Where a non-blocking connect stands.
enum Progress {
    /// The RDMA attempt answered within the wait (or could not be made).
    Answered(io::Result<trespass::Stream>),
    /// The fd is pending: connect returns `EINPROGRESS`, the pump finishes it.
    Returned,
}

/// A non-blocking connect: the pump tries RDMA while this waits at most the configured
/// wait; then the fd is put in the pending state (see `pending`).
fn in_progress(
    fd: c_int,
    family: c_int,
    peer: SocketAddr,
    target: SocketAddr,
    config: &crate::config::Config,
) -> Progress {
    let attempt = pending::Attempt::new();
    let job = pump::Job::Connect {
        target,
        timeout: config.timeout,
        attempt: attempt.clone(),
    };
    if let Err(e) = pump::send(job) {
        return Progress::Answered(Err(e));
    }
    if let Some(r) = attempt.wait(config.connect_wait.min(config.timeout)) {
        return Progress::Answered(r);
    }
    let id = CONNECTS.fetch_add(1, Ordering::Relaxed);
    let handoff = match pending::install(fd, id, family, peer, target) {
        Ok(h) => h,
        Err(e) => {
            // The fd is as it was: the answer decides as for a blocking connect.
            crate::log(format_args!(
                "{peer}: cannot wait for RDMA in the background ({e}); waiting here"
            ));
            let r = attempt.wait(config.timeout + Duration::from_secs(1));
            return Progress::Answered(r.unwrap_or_else(|| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer from the RDMA attempt",
                ))
            }));
        }
    };
    if let Some((handoff, result)) = attempt.hand_off(handoff) {
        if let Err(e) = pump::send(pump::Job::Finish { handoff, result }) {
            crate::log(format_args!("{peer}: {e}"));
        }
    }
    Progress::Returned
}

/// Puts one end of a socket pair in `fd`'s place (keeping its descriptor and status flags)
/// and hands the other, with `stream`, to the pump.
fn attach(fd: c_int, family: c_int, stream: trespass::Stream) -> io::Result<()> {
    let local = stream.local_addr()?;
    let peer = stream.peer_addr()?;
    let (mine, theirs) = std::os::unix::net::UnixStream::pair()?;
    let nodelay = pending::carry_options(fd, mine.as_raw_fd());
    pump::ensure()?;
    // SAFETY: fcntl queries of an fd the caller passed to connect.
    let (status, descriptor) = unsafe {
        (
            libc::fcntl(fd, libc::F_GETFL),
            libc::fcntl(fd, libc::F_GETFD),
        )
    };
    if status < 0 || descriptor < 0 {
        return Err(io::Error::last_os_error());
    }
    pending::put_in_place(&mine, fd, descriptor)?;
    drop(mine);
    if status & libc::O_NONBLOCK != 0 {
        // SAFETY: F_SETFL on `fd`, now the socket pair's end.
        unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
    }
    table::insert(
        fd,
        Entry::Conn(Conn {
            local,
            peer,
            family,
            pair: true,
            nodelay,
            owner: std::process::id(),
        }),
    );
    let theirs = OwnedFd::from(theirs);
    let direct = if crate::config().direct {
        let d = direct::Direct::new(stream.try_handle(), &theirs)?;
        direct::insert(fd, std::sync::Arc::clone(&d));
        Some(d)
    } else {
        None
    };
    let ending = direct.clone();
    pump::send(pump::Job::Carry {
        stream,
        app: theirs,
        counted: pump::Carrying::new(),
        direct,
    })
    .inspect_err(|_| {
        // The job, stream and all, was dropped: nothing carries the connection.
        if let Some(d) = ending {
            d.finish();
        }
    })
}

static LISTENERS: AtomicU64 = AtomicU64::new(1);

/// What `listen` does about RDMA for one socket.
enum Plan {
    /// Nothing: not a TCP socket, or listening already.
    Nothing,
    /// Not bound to a port yet: the kernel picks one at `listen`, so RDMA listens after it.
    Later,
    /// The settings leave this listener out.
    Rule,
    /// An RDMA listener on the socket's address, or why there is none.
    Tried(SocketAddr, Box<io::Result<trespass::Listener>>),
}

fn plan(fd: c_int, may_wait: bool) -> Plan {
    if tcp_family(fd).is_none() || table::get(fd).is_some() {
        return Plan::Nothing;
    }
    let Some(local) = name_of(fd, real::getsockname) else {
        return Plan::Nothing;
    };
    if local.port() == 0 && may_wait {
        return Plan::Later;
    }
    if !crate::config().covers_listener(local) {
        return Plan::Rule;
    }
    let listener = internal::with(|| {
        pump::ensure()?;
        trespass::Listener::bind(addr::unmap(local))
    });
    Plan::Tried(local, Box::new(listener))
}

/// After the TCP `listen` succeeded: hands the RDMA listener to the pump and counts.
fn start_listening(fd: c_int, plan: Plan) {
    let (local, listener) = match plan {
        Plan::Nothing | Plan::Later => return,
        Plan::Rule => return count(Event::ListenTcpRule),
        Plan::Tried(local, listener) => (local, listener),
    };
    let started = (*listener).and_then(|listener| {
        let id = LISTENERS.fetch_add(1, Ordering::Relaxed);
        table::insert(fd, Entry::Listener { id });
        let reach = addr::reach_locally(local);
        internal::with(|| {
            pump::send(pump::Job::Listen {
                id,
                listener,
                reach,
            })
        })
    });
    match started {
        Ok(()) => {
            count(Event::ListenRdma);
            crate::log(format_args!("listening on {local}: over RDMA and TCP"));
        }
        Err(e) => {
            table::remove(fd);
            count(if no_device(&e) {
                Event::ListenTcpNoDevice
            } else {
                Event::ListenTcpError
            });
            crate::log(format_args!("listening on {local}: over TCP only ({e})"));
        }
    }
}

/// listen(2): also listens for trespass on the socket's address. The RDMA listener is made
/// first, so that it exists once the TCP listener does: a program (or whoever watches for
/// the port to open) may connect as soon as `listen` returns, and a connection request with
/// no RDMA listener yet would be refused and go over TCP. A socket not bound to a port yet
/// gets its port at `listen`; its RDMA listener follows.
///
/// # Safety
///
/// listen(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let direct = || unsafe { real::listen(fd, backlog) };
    if internal::get() {
        return direct();
    }
    entry(|| {
        let early = keep_errno(|| plan(fd, true));
        let r = direct();
        if r != 0 {
            // The RDMA listener, if made, goes; the caller sees listen's own errno.
            keep_errno(|| drop(early));
            return r;
        }
        keep_errno(|| {
            let plan = match early {
                Plan::Later => plan(fd, false),
                other => other,
            };
            start_listening(fd, plan);
        });
        0
    })
}

/// After an accept: a connection from the pump carries an RDMA peer, whose address the
/// caller gets.
fn accepted(nfd: c_int, out: *mut sockaddr, len: *mut socklen_t) {
    let Some(source) = name_of(nfd, real::getpeername) else {
        return;
    };
    match table::take_marker(source) {
        Some(m) => {
            let family = int_opt(nfd, libc::SOL_SOCKET, libc::SO_DOMAIN).unwrap_or(libc::AF_INET);
            table::insert(
                nfd,
                Entry::Conn(Conn {
                    local: m.local,
                    peer: m.peer,
                    family,
                    pair: false,
                    nodelay: false,
                    owner: std::process::id(),
                }),
            );
            if let Some(d) = direct::take_unaccepted(source) {
                direct::insert(nfd, d);
            }
            // SAFETY: the caller's accept arguments (null, or valid for `*len` bytes).
            unsafe { addr::write(m.peer, family, out, len) };
            count(Event::AcceptRdma);
        }
        None => count(Event::AcceptTcp),
    }
}

/// accept(2).
///
/// # Safety
///
/// accept(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    let nfd = unsafe { real::accept(fd, addr, len) };
    if nfd >= 0 && !internal::get() {
        entry(|| {
            keep_errno(|| accepted(nfd, addr, len));
            0
        });
    }
    nfd
}

/// accept4(2).
///
/// # Safety
///
/// accept4(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    let nfd = unsafe { real::accept4(fd, addr, len, flags) };
    if nfd >= 0 && !internal::get() {
        entry(|| {
            keep_errno(|| accepted(nfd, addr, len));
            0
        });
    }
    nfd
}

/// Forgets `fd` before it is closed or replaced; stops listening for RDMA with its last fd.
fn forget(fd: c_int) {
    parked::forget(fd);
    wait::forget(fd);
    direct::remove(fd);
    if let Some(id) = table::remove(fd) {
        pump::stop_listening(id);
    }
}

/// close(2).
///
/// # Safety
///
/// close(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    entry(|| {
        keep_errno(|| forget(fd));
        0
    });
    // SAFETY: the caller's argument.
    unsafe { real::close(fd) }
}

/// dup(2).
///
/// # Safety
///
/// dup(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let new = unsafe { real::dup(fd) };
    if new >= 0 {
        entry(|| {
            table::copy(fd, new);
            direct::copy(fd, new);
            0
        });
    }
    new
}

/// fcntl(2): `F_DUPFD` and `F_DUPFD_CLOEXEC` copies of a carried connection are carried
/// connections too (they answer getpeername with the RDMA peer), as `dup`'s are.
///
/// # Safety
///
/// fcntl(2)'s contract. C declares fcntl variadic (`int fcntl(int, int, ...)`); this takes
/// the optional argument as one machine word, which is where a variadic caller puts an int,
/// a long or a pointer on x86-64 (System V) and on aarch64 Linux (AAPCS64): both pass
/// variadic integer arguments exactly as named ones, so the word read here is the caller's
/// argument (or an unused register when the command takes none), passed on unchanged.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::fcntl(false, fd, cmd, arg) };
    fcntl_done(fd, cmd, r);
    r
}

/// fcntl64: what programs built with 64-bit file offsets call for fcntl; as [`fcntl`].
///
/// # Safety
///
/// As [`fcntl`].
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::fcntl(true, fd, cmd, arg) };
    fcntl_done(fd, cmd, r);
    r
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn fcntl_done(fd: c_int, cmd: c_int, r: c_int) {
    if r >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        entry(|| {
            table::copy(fd, r);
            direct::copy(fd, r);
            0
        });
    }
}

fn duplicated(old: c_int, new: c_int) {
    if old != new {
        forget(new);
        table::copy(old, new);
        direct::copy(old, new);
    }
}

/// dup2(2).
///
/// # Safety
///
/// dup2(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 {
        entry(|| {
            duplicated(old, new);
            0
        });
    }
    r
}

/// dup3(2).
///
/// # Safety
///
/// dup3(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 {
        entry(|| {
            duplicated(old, new);
            0
        });
    }
    r
}

/// The kernel's TCP states (`tcpi_state`) a socket pair reports.
const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_SENT: u8 = 2;
const TCP_CLOSE: u8 = 7;

/// A socket pair standing for a TCP socket (a connected or pending connect's): its family,
/// `TCP_NODELAY`, and the TCP state to report.
fn pair_view(fd: c_int) -> Option<(c_int, bool, u8)> {
    match table::get(fd)? {
        Entry::Conn(c) if c.pair => Some((c.family, c.nodelay, TCP_ESTABLISHED)),
        Entry::Pending(p) if p.error == 0 => Some((p.family, false, TCP_SYN_SENT)),
        Entry::Pending(p) => Some((p.family, false, TCP_CLOSE)),
        _ => None,
    }
}

/// getpeername(2): a carried connection's RDMA peer.
///
/// # Safety
///
/// getpeername(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    entry(|| match table::get(fd) {
        Some(Entry::Pending(_)) => {
            set_errno(libc::ENOTCONN);
            -1
        }
        Some(Entry::Conn(c)) if !out.is_null() && !len.is_null() => {
            // SAFETY: the caller's arguments, checked non-null.
            unsafe { addr::write(c.peer, c.family, out, len) };
            0
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real::getpeername(fd, out, len) },
    })
}

/// getsockname(2): a carried connection's RDMA address.
///
/// # Safety
///
/// getsockname(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    entry(|| match table::get(fd) {
        Some(Entry::Conn(c)) if !out.is_null() && !len.is_null() => {
            // SAFETY: the caller's arguments, checked non-null.
            unsafe { addr::write(c.local, c.family, out, len) };
            0
        }
        // A TCP socket being connected names an address only once the connect is done
        // here (the kernel's is chosen at once, but nothing is bound until the pump knows
        // which transport it is): the unspecified address, port 0.
        Some(Entry::Pending(p)) if !out.is_null() && !len.is_null() => {
            let any = if p.family == libc::AF_INET6 {
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
            } else {
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
            };
            // SAFETY: the caller's arguments, checked non-null.
            unsafe { addr::write(any, p.family, out, len) };
            0
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real::getsockname(fd, out, len) },
    })
}

/// Writes an option value the way the kernel does for ints: at most `*len` bytes (an int's
/// worth), the length written into `*len`.
///
/// # Safety
///
/// `val` is valid for `*len` bytes; `len` is valid.
unsafe fn put_opt(bytes: &[u8], val: *mut c_void, len: *mut socklen_t) -> c_int {
    if val.is_null() || len.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: `len` is valid (the caller's promise, checked non-null).
    let room = unsafe { *len } as usize;
    let n = room.min(bytes.len());
    // SAFETY: `val` has `room` bytes, `n` is at most that.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    0
}

/// getsockopt(2): the connecting side's socket pair answers as the TCP socket it stands
/// for (`SO_DOMAIN`, `SO_PROTOCOL`, `TCP_NODELAY`, `TCP_INFO`, other TCP options as 0).
///
/// # Safety
///
/// getsockopt(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    entry(|| {
        let pair = pair_view(fd);
        let int = |v: c_int| {
            // SAFETY: the caller's arguments.
            unsafe { put_opt(&v.to_ne_bytes(), val, len) }
        };
        match (pair, level, name) {
            (Some((family, ..)), libc::SOL_SOCKET, libc::SO_DOMAIN) => int(family),
            (Some(_), libc::SOL_SOCKET, libc::SO_PROTOCOL) => int(libc::IPPROTO_TCP),
            // A pending connect's outcome, once; else the socket pair's own (0).
            (Some((_, _, state)), libc::SOL_SOCKET, libc::SO_ERROR) if state != TCP_ESTABLISHED => {
                int(table::take_pending_error(fd))
            }
            (Some((_, nodelay, _)), libc::IPPROTO_TCP, libc::TCP_NODELAY) => int(nodelay.into()),
            (Some((_, _, state)), libc::IPPROTO_TCP, libc::TCP_INFO) => {
                // SAFETY: tcp_info is plain integers, for which zero is valid.
                let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
                info.tcpi_state = state;
                // SAFETY: `info` is a plain struct of its own size.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        (&raw const info).cast::<u8>(),
                        size_of::<libc::tcp_info>(),
                    )
                };
                // SAFETY: the caller's arguments.
                unsafe { put_opt(bytes, val, len) }
            }
            (Some(_), libc::IPPROTO_TCP, _) => int(0),
            // SAFETY: the caller's arguments.
            _ => unsafe { real::getsockopt(fd, level, name, val, len) },
        }
    })
}

/// setsockopt(2): TCP options on the connecting side's socket pair are accepted (the
/// carried connection has no Nagle delay to turn off, no keepalive timers to tune) and
/// `TCP_NODELAY` is remembered for getsockopt.
///
/// # Safety
///
/// setsockopt(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    entry(|| match pair_view(fd) {
        Some(_) if level == libc::IPPROTO_TCP => {
            if name == libc::TCP_NODELAY {
                if val.is_null() || (len as usize) < size_of::<c_int>() {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                // SAFETY: `val` has an int's bytes (checked above); read unaligned.
                let on = unsafe { val.cast::<c_int>().read_unaligned() } != 0;
                table::update(fd, |c| c.nodelay = on);
            }
            0
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real::setsockopt(fd, level, name, val, len) },
    })
}

/// Reads the settings when the library is loaded, so that the counters are reported at exit
/// (and a bad setting named) even by a program that never connects or listens.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(crate::config);
}

// An ELF constructor: the dynamic loader runs the functions in `.init_array` when it loads
// the library (a one-entry use of what the `ctor` crate wraps).
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Whether `fd` is the connecting side's socket pair, which must not see a peer address: a
/// Unix stream socket refuses `sendto` with one (`EISCONN`) where TCP ignores it, and names its
/// own kind of peer in `recvfrom`, where TCP names none. Only calls that pass an address look.
fn pair(fd: c_int) -> bool {
    pair_view(fd).is_some()
}

/// sendto(2): on a carried connection the address is ignored, as TCP does.
///
/// # Safety
///
/// sendto(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer. A carried connection ignores the address, as TCP.
        if let Some(n) = unsafe { write_direct(fd, &one_iovec(buf, len), 1, flags) } {
            return n;
        }
    }
    if !addr.is_null() && entry(|| c_int::from(pair(fd))) == 1 {
        // SAFETY: the caller's arguments, without the address.
        return unsafe { real::sendto(fd, buf, len, flags, std::ptr::null(), 0) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendto(fd, buf, len, flags, addr, alen) }
}

/// sendmsg(2): on a carried connection the address is ignored, as TCP does.
///
/// # Safety
///
/// sendmsg(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    // SAFETY: `msg` is valid (the caller's promise) when non-null.
    if direct::any() && !msg.is_null() && unsafe { (*msg).msg_controllen } == 0 {
        // SAFETY: as above; its iovecs are the caller's.
        let (iov, n) = unsafe { ((*msg).msg_iov, iov_count((*msg).msg_iovlen)) };
        // SAFETY: the caller's iovecs.
        if let Some(r) = unsafe { write_direct(fd, iov, n, flags) } {
            return r;
        }
    }
    // SAFETY: `msg` is valid (the caller's promise) when non-null.
    let named = !msg.is_null() && unsafe { !(*msg).msg_name.is_null() };
    if named && entry(|| c_int::from(pair(fd))) == 1 {
        // SAFETY: as above; a copy of the header without the address.
        let mut copy = unsafe { *msg };
        copy.msg_name = std::ptr::null_mut();
        copy.msg_namelen = 0;
        // SAFETY: the caller's message, with the copied header.
        return unsafe { real::sendmsg(fd, &copy, flags) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendmsg(fd, msg, flags) }
}

/// recvfrom(2): on a carried connection no address is written (its length is set to 0), as
/// TCP does.
///
/// # Safety
///
/// recvfrom(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer.
        if let Some(n) = read_direct(fd, &mut unsafe { in_slice(buf, len) }, flags) {
            if !addr.is_null() && !alen.is_null() {
                // SAFETY: `alen` is valid (the caller's promise, checked non-null).
                unsafe { *alen = 0 };
            }
            return n;
        }
    }
    if !addr.is_null() && entry(|| c_int::from(pair(fd))) == 1 {
        // SAFETY: the caller's arguments, without the address.
        let n = unsafe {
            real::recvfrom(
                fd,
                buf,
                len,
                flags,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if n >= 0 && !alen.is_null() {
            // SAFETY: `alen` is valid (the caller's promise, checked non-null).
            unsafe { *alen = 0 };
        }
        return n;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvfrom(fd, buf, len, flags, addr, alen) }
}

/// recvmsg(2): on a carried connection no address is written (`msg_namelen` 0), as TCP does.
///
/// # Safety
///
/// recvmsg(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    // SAFETY: `msg` is valid (the caller's promise) when non-null.
    if direct::any() && !msg.is_null() && unsafe { (*msg).msg_controllen } == 0 {
        // SAFETY: as above; its iovecs are the caller's, writable for the call.
        let mut bufs = unsafe { in_slices((*msg).msg_iov, iov_count((*msg).msg_iovlen)) };
        if let Some(n) = read_direct(fd, &mut bufs, flags) {
            // SAFETY: `msg` is valid; TCP names no peer and sets no flag here.
            unsafe {
                (*msg).msg_namelen = 0;
                (*msg).msg_flags = 0;
            }
            return n;
        }
    }
    // SAFETY: `msg` is valid (the caller's promise) when non-null.
    let named = !msg.is_null() && unsafe { !(*msg).msg_name.is_null() };
    if named && entry(|| c_int::from(pair(fd))) == 1 {
        // SAFETY: `msg` is valid; the name is put back whatever the call does.
        let n = unsafe {
            let name = (*msg).msg_name;
            (*msg).msg_name = std::ptr::null_mut();
            let n = real::recvmsg(fd, msg, flags);
            (*msg).msg_name = name;
            (*msg).msg_namelen = 0;
            n
        };
        return n;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvmsg(fd, msg, flags) }
}

/// glibc's `PTHREAD_CANCEL_DISABLE` (`pthread.h`; the libc crate does not name it for
/// Linux).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

extern "C" {
    /// pthread_setcancelstate(3), in glibc's libc.so.6.
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

/// Runs a direct-path attempt (see `direct`): `None`, the kernel's call, when there is no
/// direct path for the fd, it cannot keep TCP's meaning, or it panicked (nothing was done
/// then: every attempt changes nothing before it succeeds).
///
/// Thread cancellation is held off while it runs (see [`held_off`]): its waits are bounded
/// (`direct::wait`), and the kernel's call that follows is where a cancellation acts.
fn try_direct<R>(f: impl FnOnce() -> Option<R>) -> Option<R> {
    if internal::get() {
        return None;
    }
    library_part(None, f)
}

/// Runs a part of a call that the library does itself: with thread cancellation held off
/// (see [`held_off`]) and the C library's calls that trespass makes going straight through
/// (the provider's doorbell is a `write`, the waits' poll is a `ppoll`); `on_panic` if it
/// panicked.
fn library_part<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    held_off(|| internal::with(|| std::panic::catch_unwind(AssertUnwindSafe(f))))
        .unwrap_or(on_panic)
}

/// The program's buffers as slices.
///
/// # Safety
///
/// `iov` points to `n` iovecs, each valid for reading its length (the caller's promise to
/// writev and its relatives), or `n` is 0.
unsafe fn out_slices<'a>(iov: *const libc::iovec, n: c_int) -> Vec<IoSlice<'a>> {
    if iov.is_null() || n <= 0 || n > IOV_MAX {
        return Vec::new();
    }
    // SAFETY: the caller's promise, for `n` iovecs.
    let iov = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    iov.iter()
        .filter(|v| !v.iov_base.is_null() && v.iov_len > 0)
        // SAFETY: each iovec is valid for reading its length.
        .map(|v| IoSlice::new(unsafe { std::slice::from_raw_parts(v.iov_base.cast(), v.iov_len) }))
        .collect()
}

/// The program's buffers as slices to fill.
///
/// # Safety
///
/// `iov` points to `n` iovecs, each valid for writing its length and not aliased for the
/// call's duration (the caller's promise to readv and its relatives), or `n` is 0.
unsafe fn in_slices<'a>(iov: *const libc::iovec, n: c_int) -> Vec<IoSliceMut<'a>> {
    if iov.is_null() || n <= 0 || n > IOV_MAX {
        return Vec::new();
    }
    // SAFETY: the caller's promise, for `n` iovecs.
    let iov = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    iov.iter()
        .filter(|v| !v.iov_base.is_null() && v.iov_len > 0)
        .map(|v| {
            // SAFETY: each iovec is valid for writing its length, for the call.
            IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast(), v.iov_len) })
        })
        .collect()
}

/// The most iovecs the kernel takes in one call (`UIO_MAXIOV`): a call with more is left
/// to the kernel, which refuses it.
const IOV_MAX: c_int = 1024;

/// A msghdr's iovec count as the iovec helpers take it (the kernel refuses more than
/// `IOV_MAX` anyway).
fn iov_count(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

/// One buffer as a slice to fill.
///
/// # Safety
///
/// `buf` is valid for writing `len` bytes and not aliased for the call, or `len` is 0.
unsafe fn in_slice<'a>(buf: *mut c_void, len: usize) -> [IoSliceMut<'a>; 1] {
    if buf.is_null() || len == 0 {
        return [IoSliceMut::new(&mut [])];
    }
    // SAFETY: the caller's promise.
    [IoSliceMut::new(unsafe {
        std::slice::from_raw_parts_mut(buf.cast(), len)
    })]
}

/// A direct write of the caller's `n` iovecs at `iov` to `fd`; `None`: the kernel's call. A
/// blocking socket's write that the stream took only part of sends the rest through the
/// kernel (the pump carries it after the part written directly), so the call returns what a
/// blocking TCP write would.
///
/// # Safety
///
/// `iov` points to `n` iovecs, each valid for reading its length, or `n` is 0.
unsafe fn write_direct(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> Option<isize> {
    let (done, total) = {
        // SAFETY: the caller's promise.
        let bufs = unsafe { out_slices(iov, n) };
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return None;
        }
        (try_direct(|| direct::write(fd, &bufs, flags))?, total)
    };
    if done == total || flags & libc::MSG_DONTWAIT != 0 || direct::nonblocking(fd) {
        return Some(done as isize);
    }
    // SAFETY: the caller's promise; `done` is at most the iovecs' total.
    let more = unsafe { write_rest(fd, iov, n, done, flags & libc::MSG_NOSIGNAL) };
    // An error after a part was written is the part, as a TCP write reports it.
    Some(done as isize + more.max(0))
}

/// The kernel's blocking `sendmsg` of the caller's iovecs past their first `skip` bytes. It
/// may block and is a cancellation point: nothing here, nor in the frames that called it
/// (each has dropped its values with destructors by then), has anything for a cancellation's
/// unwinding to run, so it passes through as it would through the C library's own frames.
///
/// # Safety
///
/// As [`write_direct`]'s.
unsafe fn write_rest(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    mut skip: usize,
    flags: c_int,
) -> isize {
    let mut rest = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; IOV_MAX as usize];
    let mut len = 0;
    for i in 0..n.clamp(0, IOV_MAX) as usize {
        // SAFETY: the caller's promise: `iov` has `n` iovecs.
        let v = unsafe { *iov.add(i) };
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        rest[len] = libc::iovec {
            // SAFETY: `skip` is within this iovec's buffer.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(skip) }.cast(),
            iov_len: v.iov_len - skip,
        };
        skip = 0;
        len += 1;
    }
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = rest.as_mut_ptr();
    msg.msg_iovlen = len as _;
    // SAFETY: `msg` names the caller's buffers past what was written, valid for the call.
    unsafe { real::sendmsg(fd, &msg, flags) }
}

/// One buffer as an iovec, for [`write_direct`].
fn one_iovec(buf: *const c_void, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: buf.cast_mut(),
        iov_len: len,
    }
}

/// How long a blocking read keeps waiting on the stream while its wake-ups find nothing.
const STALE_WAKES: Duration = Duration::from_micros(300);

/// A direct read into `bufs` from `fd`; `None`: the kernel's call. A blocking read with
/// nothing to read waits on the program's socket and the stream's readiness fd at once, so
/// bytes that arrive wake it straight from the stream rather than through the pump: it reads
/// them itself when it is first, and the kernel's socket when the pump was. The readiness fd
/// stays readable until the pump has looked (only the stream's owner drains it), so a wait
/// right after a read may wake at once and find nothing: it yields and waits again, for at
/// most [`STALE_WAKES`] of such wake-ups, then leaves it to the kernel's read, which the
/// pump's carrying ends.
fn read_direct(fd: c_int, bufs: &mut [IoSliceMut<'_>], flags: c_int) -> Option<isize> {
    if bufs.iter().all(|b| b.is_empty()) {
        return None;
    }
    try_direct(|| {
        let mut stale_since: Option<std::time::Instant> = None;
        // A wait in the pump's place, kept until the read after it is done (see
        // `direct::wait`).
        let mut _waited: Option<trespass::ReadWait> = None;
        loop {
            let on = match direct::read(fd, bufs, flags) {
                direct::Read::Bytes(n) => return Some(n as isize),
                direct::Read::Kernel => {
                    if parked::any() && flags & libc::MSG_DONTWAIT == 0 && !direct::nonblocking(fd)
                    {
                        // The kernel's read may wait: the pump must carry what comes.
                        parked::release_fd(fd);
                    }
                    return None;
                }
                direct::Read::Empty(on) => on,
            };
            _waited = None;
            match stale_since {
                None => {
                    if flags & libc::MSG_DONTWAIT != 0 || direct::nonblocking(fd) {
                        return None;
                    }
                }
                Some(t) if t.elapsed() >= STALE_WAKES => return None,
                // SAFETY: sched_yield takes nothing and cannot fail on Linux.
                Some(_) => unsafe {
                    libc::sched_yield();
                },
            }
            // A set that holds the stream would take the arrivals this wait is for.
            parked::release_fd(fd);
            let (waited, held) = direct::wait(fd, &on);
            _waited = held;
            match waited {
                direct::Waited::Stream => {
                    stale_since.get_or_insert_with(std::time::Instant::now);
                }
                direct::Waited::Socket => return None,
                direct::Waited::TimedOut => {
                    set_errno(libc::EAGAIN);
                    return Some(-1);
                }
                direct::Waited::Interrupted if direct::signals_restart() => return None,
                direct::Waited::Interrupted => {
                    set_errno(libc::EINTR);
                    return Some(-1);
                }
            }
        }
    })
}

/// write(2): a carried connection's bytes go to its stream directly when they can (see
/// `direct`).
///
/// # Safety
///
/// write(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: usize) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer, valid for `len` bytes.
        if let Some(n) = unsafe { write_direct(fd, &one_iovec(buf, len), 1, 0) } {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::write(fd, buf, len) }
}

/// read(2): a carried connection's bytes come from its stream directly when they can.
///
/// # Safety
///
/// read(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer, valid for writing `len` bytes.
        if let Some(n) = read_direct(fd, &mut unsafe { in_slice(buf, len) }, 0) {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::read(fd, buf, len) }
}

/// `__read_chk`: read(2) as a program built with `_FORTIFY_SOURCE` calls it, as `read`
/// (a length past the buffer's size goes to the C library, which stops the program).
///
/// # Safety
///
/// read(2)'s contract, with `size` the buffer's size.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, len: usize, size: usize) -> isize {
    if direct::any() && len <= size {
        // SAFETY: the caller's buffer, valid for writing `len` bytes.
        if let Some(n) = read_direct(fd, &mut unsafe { in_slice(buf, len) }, 0) {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__read_chk(fd, buf, len, size) }
}

/// `__recv_chk`, as `recv` (see `__read_chk`).
///
/// # Safety
///
/// recv(2)'s contract, with `size` the buffer's size.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    size: usize,
    flags: c_int,
) -> isize {
    if direct::any() && len <= size {
        // SAFETY: the caller's buffer.
        if let Some(n) = read_direct(fd, &mut unsafe { in_slice(buf, len) }, flags) {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__recv_chk(fd, buf, len, size, flags) }
}

/// writev(2), as `write`.
///
/// # Safety
///
/// writev(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    if direct::any() {
        // SAFETY: the caller's iovecs.
        if let Some(r) = unsafe { write_direct(fd, iov, n, 0) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::writev(fd, iov, n) }
}

/// readv(2), as `read`.
///
/// # Safety
///
/// readv(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    if direct::any() {
        // SAFETY: the caller's iovecs.
        if let Some(r) = read_direct(fd, &mut unsafe { in_slices(iov, n) }, 0) {
            return r;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::readv(fd, iov, n) }
}

/// send(2), as `write` (plain flags only: see `direct`).
///
/// # Safety
///
/// send(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer.
        if let Some(n) = unsafe { write_direct(fd, &one_iovec(buf, len), 1, flags) } {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::send(fd, buf, len, flags) }
}

/// recv(2), as `read` (plain flags only).
///
/// # Safety
///
/// recv(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    if direct::any() {
        // SAFETY: the caller's buffer.
        if let Some(n) = read_direct(fd, &mut unsafe { in_slice(buf, len) }, flags) {
            return n;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recv(fd, buf, len, flags) }
}

/// shutdown(2): a carried connection's direct path stops taking the side shut down.
///
/// # Safety
///
/// shutdown(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if direct::any() && !internal::get() {
        let _ = std::panic::catch_unwind(|| direct::shutdown(fd, how));
    }
    // SAFETY: the caller's arguments.
    unsafe { real::shutdown(fd, how) }
}

/// Whether poll and epoll waits may stand in for the pump (`TRESPASS_PRELOAD_STAND_IN`).
fn waits_stand_in() -> bool {
    !internal::get() && crate::config().tenure
}

/// Runs a wait's part in the pump's place (see `wait`) with cancellation held off and the
/// library's own calls going straight through; a panic leaves the whole wait to the
/// kernel, with the program's timeout.
fn in_place(timeout: Option<Duration>, f: impl FnOnce() -> wait::Done) -> wait::Done {
    library_part(wait::Done::Kernel(timeout), f)
}

/// A wait's result: the count, or -1 with its errno.
fn waited(n: c_int, e: c_int) -> c_int {
    if n < 0 {
        set_errno(e);
    }
    n
}

/// A timeout in milliseconds as a duration (`None`: negative, no limit).
fn ms_timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// A `timespec` timeout as a duration (`None`: null, no limit; a malformed one is left to
/// the kernel, which refuses it).
///
/// # Safety
///
/// `ts` is null or valid for reading.
unsafe fn ts_timeout(ts: *const libc::timespec) -> Result<Option<Duration>, ()> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    let t = unsafe { *ts };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(());
    }
    Ok(Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)))
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos()),
    }
}

/// epoll_ctl(2): the registrations of carried connections (and connects in progress) are
/// kept, for epoll waits to stand in for the pump (see `wait`).
///
/// # Safety
///
/// epoll_ctl(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::epoll_ctl(epfd, op, fd, event) };
    if r == 0 && waits_stand_in() {
        let ev = (op != libc::EPOLL_CTL_DEL && !event.is_null()).then(|| {
            // SAFETY: for ADD and MOD, `event` is valid for reading (the kernel read it).
            let e = unsafe { *event };
            (e.events, e.u64)
        });
        entry(|| {
            keep_errno(|| {
                let known = matches!(table::get(fd), Some(Entry::Conn(_) | Entry::Pending(_)));
                wait::registered(epfd, op, fd, ev, known);
            });
            0
        });
    }
    r
}

/// epoll_wait(2): carried connections' streams may be held in the pump's place (see
/// `parked`).
///
/// # Safety
///
/// epoll_wait(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's arguments; a null mask is epoll_wait's meaning.
    unsafe { epoll_pwait(epfd, events, max, timeout, std::ptr::null()) }
}

/// epoll_pwait(2): as [`epoll_wait`].
///
/// # Safety
///
/// epoll_pwait(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's arguments, with what is left of its timeout.
    let call = |t: Option<Duration>| unsafe {
        real::epoll_pwait(epfd, events, max, wait::millis(t), mask)
    };
    // SAFETY: the caller's promise for `events` and `max`.
    unsafe { epoll_waited(epfd, events, max, ms_timeout(timeout), call) }
}

/// epoll_pwait2(2): as [`epoll_pwait`], its timeout a `timespec`.
///
/// # Safety
///
/// epoll_pwait2(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's promise for `timeout`.
    let Ok(t) = (unsafe { ts_timeout(timeout) }) else {
        // SAFETY: the caller's arguments (a malformed timeout is the kernel's to refuse).
        return unsafe { real::epoll_pwait2(epfd, events, max, timeout, mask) };
    };
    let call = |t: Option<Duration>| {
        let left = t.map(timespec);
        let p = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        // SAFETY: the caller's arguments, with what is left of its timeout.
        unsafe { real::epoll_pwait2(epfd, events, max, p, mask) }
    };
    // SAFETY: the caller's promise for `events` and `max`.
    unsafe { epoll_waited(epfd, events, max, t, call) }
}

thread_local! {
    /// The looks of this thread's epoll waits that are in the kernel's call (a signal
    /// handler's wait may come on top of one): kept here, not in the waiting frame.
    static LOOKS: Cell<Vec<parked::Look>> = const { Cell::new(Vec::new()) };
}

/// Keeps `look` for the kernel's call; says whether it has streams to report already.
fn stash(look: parked::Look) -> bool {
    let ready = look.has_ready();
    LOOKS.with(|c| {
        let mut v = c.take();
        v.push(look);
        c.set(v);
    });
    ready
}

/// The look [`stash`] kept last.
fn unstash() -> Option<parked::Look> {
    LOOKS.with(|c| {
        let mut v = c.take();
        let look = v.pop();
        c.set(v);
        look
    })
}

/// The program's epoll wait on `epfd` for at most `timeout` (`None`: no limit), whose
/// kernel call `call(timeout)` makes: the streams of `epfd`'s set are held in the pump's
/// place and looked at before and after the kernel's call, which is made here, outside the
/// library's part (so a thread cancellation acts in it as it would without the library);
/// the library's own events never reach the program (a call that had only those waits
/// again, for what is left of the timeout).
///
/// # Safety
///
/// `events` is valid for writing `max` events when `max` > 0 (epoll_wait's contract).
unsafe fn epoll_waited(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    call: impl Fn(Option<Duration>) -> c_int,
) -> c_int {
    if internal::get() || max <= 0 || events.is_null() {
        return call(timeout);
    }
    let hold = direct::any() && waits_stand_in();
    if !hold && !parked::tokens() {
        return call(timeout);
    }
    let start = std::time::Instant::now();
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        let ready = hold && library_part(false, || stash(parked::before(epfd)));
        // Nothing with a destructor lives in this frame across the kernel's call (the look
        // waits in `LOOKS`), so a thread cancellation's unwinding may pass through it.
        let n = call(if ready { Some(Duration::ZERO) } else { left });
        if n < 0 {
            let e = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if hold {
                library_part((), || drop(unstash()));
            }
            set_errno(e);
            return -1;
        }
        let m = library_part(n, || {
            let look = if hold { unstash() } else { None };
            // SAFETY: the kernel wrote the first `n` events of the caller's array, which
            // has room for `max`.
            unsafe { parked::after(look.unwrap_or_else(parked::Look::none), events, n, max) }
        });
        if m > 0 || n == 0 || left.is_some_and(|l| l.is_zero()) {
            return m;
        }
    }
}

/// The program's pollfd array, when a wait may stand in for the pump on it.
///
/// # Safety
///
/// `fds` is valid for `n` pollfds (poll's contract), or `n` is 0.
unsafe fn poll_slice<'a>(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
) -> Option<&'a mut [libc::pollfd]> {
    if !direct::any() || fds.is_null() || n == 0 || n > 1 << 20 || !waits_stand_in() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { std::slice::from_raw_parts_mut(fds, n as usize) })
}

/// poll(2): may wait on carried connections' streams in the pump's place (see `wait`).
///
/// # Safety
///
/// poll(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's promise.
    if let Some(slice) = unsafe { poll_slice(fds, n) } {
        let t = ms_timeout(timeout);
        match in_place(t, || wait::poll(slice, t, std::ptr::null())) {
            wait::Done::Result(r, e) => return waited(r, e),
            wait::Done::Kernel(left) => {
                // SAFETY: the caller's arguments, with what is left of its timeout.
                return unsafe { real::poll(fds, n, wait::millis(left)) };
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::poll(fds, n, timeout) }
}

/// `__poll_chk`: poll(2) as programs built with `_FORTIFY_SOURCE` call it; as [`poll`] when
/// the array is as large as the caller says (else the C library's check fails it).
///
/// # Safety
///
/// poll(2)'s contract, `size` the array's size in bytes.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    size: usize,
) -> c_int {
    if (n as u128) * (size_of::<libc::pollfd>() as u128) <= size as u128 {
        // SAFETY: the caller's arguments, checked as the C library checks them.
        return unsafe { poll(fds, n, timeout) };
    }
    // SAFETY: the caller's arguments: the C library reports the overflow.
    unsafe { real::__poll_chk(fds, n, timeout, size) }
}

/// ppoll(2): as [`poll`], with the caller's signal mask.
///
/// # Safety
///
/// ppoll(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's promises.
    if let (Some(slice), Ok(t)) = unsafe { (poll_slice(fds, n), ts_timeout(ts)) } {
        match in_place(t, || wait::poll(slice, t, mask)) {
            wait::Done::Result(r, e) => return waited(r, e),
            wait::Done::Kernel(left) => {
                let left = left.map(timespec);
                let p = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
                // SAFETY: the caller's arguments, with what is left of its timeout.
                return unsafe { real::ppoll(fds, n, p, mask) };
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ppoll(fds, n, ts, mask) }
}

/// Before a wait the library does not stand in for: what an earlier poll or epoll wait
/// reported and the program has not read goes to the pump, so this wait sees it in the
/// socket (see `wait`).
fn before_kernel_wait() {
    if direct::any() && !internal::get() {
        library_part((), || direct::hand_back_lent(|_| false));
    }
}

/// A `timeval` timeout as a duration (`None`: null, no limit; `Err`: malformed, for the
/// kernel to refuse).
///
/// # Safety
///
/// `tv` is null or valid for reading.
unsafe fn tv_timeout(tv: *const libc::timeval) -> Result<Option<Duration>, ()> {
    if tv.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    let t = unsafe { *tv };
    if t.tv_sec < 0 || !(0..1_000_000).contains(&t.tv_usec) {
        return Err(());
    }
    Ok(Some(Duration::new(
        t.tv_sec as u64,
        t.tv_usec as u32 * 1000,
    )))
}

/// Whether a select of `n` fds may stand in for the pump (see `wait::select`).
fn select_stands_in(n: c_int) -> bool {
    direct::any() && (0..=libc::FD_SETSIZE as c_int).contains(&n) && waits_stand_in()
}

/// select(2): as a poll of the same fds, which may wait on carried connections' streams in
/// the pump's place (see `wait`), when it watches one for reading; else the kernel's, after
/// [`before_kernel_wait`]. Like Linux's, it leaves the time not waited in `timeout`.
///
/// # Safety
///
/// select(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's promise for `timeout`.
    if let (true, Ok(t)) = (select_stands_in(n), unsafe { tv_timeout(timeout) }) {
        let start = std::time::Instant::now();
        // SAFETY: the caller's promises; `n` is at most FD_SETSIZE.
        let done = in_place_or_not(t, || unsafe {
            wait::select(n, r, w, e, t, std::ptr::null())
        });
        let left = |t: Option<Duration>| t.map(|t| t.saturating_sub(start.elapsed()));
        let write_left = |d: Option<Duration>| {
            if let Some(d) = d {
                // SAFETY: `timeout` is non-null here (a limit was read from it), and writable
                // (select's contract: Linux writes what is left into it).
                unsafe {
                    *timeout = libc::timeval {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_usec: d.subsec_micros() as libc::suseconds_t,
                    };
                }
            }
        };
        match done {
            Some(wait::Done::Result(k, err)) => {
                write_left(left(t));
                return waited(k, err);
            }
            Some(wait::Done::Kernel(rest)) => {
                write_left(rest);
                // SAFETY: the caller's arguments, its timeout now what is left of it.
                return unsafe { real::select(n, r, w, e, timeout) };
            }
            None => {}
        }
    }
    before_kernel_wait();
    // SAFETY: the caller's arguments.
    unsafe { real::select(n, r, w, e, timeout) }
}

/// pselect(2): as [`select`], with the caller's signal mask (and its timeout left as it
/// is, as pselect does).
///
/// # Safety
///
/// pselect(2)'s contract.
#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's promise for `timeout`.
    if let (true, Ok(t)) = (select_stands_in(n), unsafe { ts_timeout(timeout) }) {
        // SAFETY: the caller's promises; `n` is at most FD_SETSIZE.
        match in_place_or_not(t, || unsafe { wait::select(n, r, w, e, t, mask) }) {
            Some(wait::Done::Result(k, err)) => return waited(k, err),
            Some(wait::Done::Kernel(rest)) => {
                let rest = rest.map(timespec);
                let p = rest.as_ref().map_or(std::ptr::null(), |t| t as *const _);
                // SAFETY: the caller's arguments, with what is left of its timeout.
                return unsafe { real::pselect(n, r, w, e, p, mask) };
            }
            None => {}
        }
    }
    before_kernel_wait();
    // SAFETY: the caller's arguments.
    unsafe { real::pselect(n, r, w, e, timeout, mask) }
}

/// [`in_place`] for a wait that may decide not to stand in (`None`).
fn in_place_or_not(
    timeout: Option<Duration>,
    f: impl FnOnce() -> Option<wait::Done>,
) -> Option<wait::Done> {
    library_part(Some(wait::Done::Kernel(timeout)), f)
}
