//! The C library's own socket calls, found with `dlsym(RTLD_NEXT, ...)`: the definitions
//! this library's exported functions stand in front of.
//!
//! Each is looked up once, on first use, and kept. The `libc` crate gives the declarations
//! and `dlsym`; `libloading`, the usual crate for symbol lookup, models a library handle it
//! opened and closes, which `RTLD_NEXT` (a pseudo-handle) is not, so it would add nothing here.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{sockaddr, socklen_t};

/// The next definition of `name` after this library's, or an abort: without it, calling
/// through would recurse into this library forever.
fn lookup(name: &CStr) -> usize {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle for dlsym.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if f.is_null() {
        // Nothing sensible can continue: the C library has no such function.
        let msg = format!(
            "trespass-preload: the C library has no `{}`; cannot run under this preload\n",
            name.to_string_lossy()
        );
        // SAFETY: writing a byte buffer of its own length to fd 2.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        std::process::abort();
    }
    f as usize
}

/// A cached symbol address; 0 until the first lookup (racing lookups find the same one).
fn resolve(cache: &AtomicUsize, name: &CStr) -> usize {
    match cache.load(Ordering::Acquire) {
        0 => {
            let f = lookup(name);
            cache.store(f, Ordering::Release);
            f
        }
        f => f,
    }
}

macro_rules! real {
    ($( $(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {$(
        $(#[$m])*
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            static CACHE: AtomicUsize = AtomicUsize::new(0);
            let f = resolve(&CACHE, const {
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol names have no NUL"),
                }
            });
            // SAFETY: `f` is the C library's definition of this very function, whose C
            // prototype the `libc` crate declares with these argument and return types.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller keeps the function's own contract (see its man page).
            unsafe { f($($arg),*) }
        }
    )*};
}

real! {
    /// connect(2).
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    /// listen(2).
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    /// accept(2).
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    /// accept4(2).
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    /// close(2).
    fn close(fd: c_int) -> c_int;
    /// dup(2).
    fn dup(fd: c_int) -> c_int;
    /// dup2(2).
    fn dup2(old: c_int, new: c_int) -> c_int;
    /// dup3(2).
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    /// getpeername(2).
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    /// getsockname(2).
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    /// getsockopt(2).
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    /// sendto(2).
    fn sendto(fd: c_int, buf: *const c_void, len: usize, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> isize;
    /// sendmsg(2).
    fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize;
    /// recvfrom(2).
    fn recvfrom(fd: c_int, buf: *mut c_void, len: usize, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> isize;
    /// recvmsg(2).
    fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize;
    /// read(2).
    fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize;
    /// write(2).
    fn write(fd: c_int, buf: *const c_void, len: usize) -> isize;
    /// readv(2).
    fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize;
    /// writev(2).
    fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize;
    /// send(2).
    fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    /// recv(2).
    fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    /// `__read_chk`, read(2) with `_FORTIFY_SOURCE`'s check of the buffer's size.
    fn __read_chk(fd: c_int, buf: *mut c_void, len: usize, size: usize) -> isize;
    /// `__recv_chk`, recv(2) with the same check.
    fn __recv_chk(fd: c_int, buf: *mut c_void, len: usize, size: usize, flags: c_int) -> isize;
    /// shutdown(2).
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    /// setsockopt(2).
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    /// epoll_ctl(2).
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int;
    /// epoll_pwait(2).
    fn epoll_pwait(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
    /// epoll_pwait2(2) (glibc 2.35 and later; looked up only when a program calls it).
    fn epoll_pwait2(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    /// poll(2).
    fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    /// ppoll(2).
    fn ppoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    /// `__poll_chk`, poll(2) with `_FORTIFY_SOURCE`'s check of the array's size.
    fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, size: usize) -> c_int;
    /// select(2).
    fn select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *mut libc::timeval) -> c_int;
    /// pselect(2).
    fn pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
}

/// fcntl(2) and fcntl64, which C declares variadic: the one optional argument (an int, a
/// long or a pointer, or none) travels as a machine word, passed on as it came. The
/// interposed definitions take it the same way (see `interpose::fcntl`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) unsafe fn fcntl(wide: bool, fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    static NARROW: AtomicUsize = AtomicUsize::new(0);
    static WIDE: AtomicUsize = AtomicUsize::new(0);
    let f = if wide {
        resolve(&WIDE, c"fcntl64")
    } else {
        resolve(&NARROW, c"fcntl")
    };
    // SAFETY: `f` is the C library's fcntl (or fcntl64), whose prototype is this one.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller keeps fcntl's contract; an argument the command does not take is
    // not read.
    unsafe { f(fd, cmd, arg) }
}
