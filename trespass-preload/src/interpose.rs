//! The functions this library puts in front of the C library's. Each catches panics (none
//! may cross into C: a panic becomes `EIO`) and goes straight to the C library when called
//! from inside the library itself.

use std::ffi::{c_int, c_void};
use std::io;
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
use crate::{addr, internal, pending, pump, real};

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an entry point's body; a panic becomes -1 with `EIO`.
fn entry(body: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        -1
    })
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
    // SAFETY: the caller's arguments, passed on as they came.
    let direct = || unsafe { real::connect(fd, addr, len) };
    if internal::get() {
        return direct();
    }
    entry(|| {
        if let Some(r) = connect_again(fd) {
            return r;
        }
        // SAFETY: the caller promises `len` readable bytes at `addr`.
        let Some(peer) = (unsafe { addr::read(addr, len) }) else {
            return direct();
        };
        let Some(family) = keep_errno(|| tcp_family(fd)) else {
            return direct();
        };
        let config = crate::config();
        if !config.covers(peer) {
            count(Event::ConnectTcpRule);
            return direct();
        }
        let target = addr::unmap(peer);
        if table::recently_unanswered(target.ip()) {
            count(Event::ConnectTcpTimeout);
            crate::log(format_args!("{peer}: over TCP (no RDMA answer lately)"));
            return direct();
        }
        // SAFETY: F_GETFL on the caller's fd.
        let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        let answer = if nonblocking {
            match internal::with(|| in_progress(fd, family, peer, target, config)) {
                Progress::Answered(r) => r,
                Progress::Returned => {
                    count(Event::ConnectInProgress);
                    set_errno(libc::EINPROGRESS);
                    return -1;
                }
            }
        } else {
            internal::with(|| trespass::Stream::connect_timeout(&target, config.timeout))
        };
        match answer.and_then(|stream| internal::with(|| attach(fd, family, stream))) {
            Ok(()) => {
                count(Event::ConnectRdma);
                crate::log(format_args!("{peer}: over RDMA"));
                0
            }
            Err(e) => {
                note_failure(peer, target, &e);
                direct()
            }
        }
    })
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
    pump::send(pump::Job::Carry {
        stream,
        app: OwnedFd::from(theirs),
        counted: pump::Carrying::new(),
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
            0
        });
    }
}

fn duplicated(old: c_int, new: c_int) {
    if old != new {
        forget(new);
        table::copy(old, new);
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
