//! An `LD_PRELOAD` library that carries an unmodified program's TCP connections over
//! trespass streams (RDMA), and lets them go over TCP when the peer is not served.
//!
//! ```text
//! LD_PRELOAD=/path/to/libtrespass_preload.so redis-server
//! ```
//!
//! - **Connecting**: a `connect` on a TCP socket first tries a trespass connection to the
//!   same address and port (bounded by `TRESPASS_PRELOAD_TIMEOUT_MS`, 2 s by default). When
//!   the peer accepts, the program's fd becomes one end of a Unix socket pair whose other end
//!   the library's pump thread carries over RDMA; when it refuses (nothing listens for
//!   trespass there), has no RDMA device, or does not answer, the connect goes on over TCP as
//!   if the library were absent. A non-blocking socket's connect waits for the answer only
//!   briefly (`TRESPASS_PRELOAD_CONNECT_WAIT_MS`), then returns `EINPROGRESS`, and the fd
//!   turns writable when the pump has made the connection (over RDMA, or over TCP from the
//!   program's own socket), or reports the failure through `SO_ERROR`.
//! - **Listening**: a `listen` on a TCP socket also listens for trespass on the same address
//!   and port. The pump accepts each RDMA connection and connects it to the program's own
//!   listener over loopback, so the program's `accept` (blocking, non-blocking, in epoll)
//!   returns it among its TCP clients, with the RDMA peer's address.
//! - Every data call (`read`, `write`, `send*`, `recv*`, `readv`, `writev`, `sendfile`,
//!   `splice`) and every readiness call (`poll`, `select`, `epoll` level- or edge-triggered,
//!   an fd in several sets) keeps the kernel's meaning on a real socket; `fork` children and
//!   `dup`s share the connection as they would a TCP one. The program's own reads and writes
//!   take a shortcut to the trespass stream when that keeps TCP's order (see `direct`);
//!   otherwise they are the kernel's calls on the socket, which the pump carries. Interposed
//!   are `connect`, `listen`, `accept`, `accept4`, `close`, `shutdown`, `dup`, `dup2`,
//!   `dup3`, `fcntl` and `fcntl64` (their `F_DUPFD` copies), `getpeername`, `getsockname`,
//!   `getsockopt` and `setsockopt`, the data calls for their shortcut, `sendto`,
//!   `sendmsg`, `recvfrom` and `recvmsg` with an address (which a TCP connection ignores and
//!   a socket pair would not), and `poll`, `ppoll`, `select`, `pselect`, `epoll_ctl` and the
//!   `epoll_wait` family, whose waits take carried connections' wake-ups from the pump and
//!   report their bytes without the pump's copy: an epoll set keeps its connections' streams
//!   from one wait to the next, however many (see `parked`); a poll or select takes those of
//!   a few for the length of one wait (see `wait`).
//!
//! The environment (`TRESPASS_PRELOAD`, `_PORTS`, `_NETS`, `_TIMEOUT_MS`, `_CONNECT_WAIT_MS`,
//! `_BUSY_POLL_US`, `_DIRECT`, `_STAND_IN`, `_STATS`, `_LOG`)
//! is described in the crate's README.

// The unit tests build without the interposed functions (below), which leaves their callees
// unused there.
#![cfg_attr(test, allow(dead_code))]

mod addr;
mod config;
mod direct;
// The C library's names, exported from the shared object; not built into the unit tests,
// whose own socket calls they would catch.
#[cfg(not(test))]
#[allow(unreachable_pub)] // reached by symbol name, from C
mod interpose;
mod parked;
mod pending;
mod pump;
mod real;
mod stats;
mod table;
mod wait;

use std::cell::RefCell;
use std::sync::{MutexGuard, OnceLock};

use config::Config;

/// Whether this thread is inside the library (or is one of its own threads): socket calls
/// made there go straight to the C library.
pub(crate) mod internal {
    use std::cell::Cell;

    thread_local! {
        static INSIDE: Cell<bool> = const { Cell::new(false) };
    }

    /// This thread's flag.
    pub(crate) fn get() -> bool {
        INSIDE.with(Cell::get)
    }

    /// Sets this thread's flag.
    pub(crate) fn set(v: bool) {
        INSIDE.with(|c| c.set(v));
    }

    /// Runs `f` with the flag set, restoring it after.
    pub(crate) fn with<R>(f: impl FnOnce() -> R) -> R {
        let before = get();
        set(true);
        let r = f();
        set(before);
        r
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The environment's settings, read on first use (which also arranges the counters' report
/// at exit and the fork handlers).
pub(crate) fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (config, problem) = Config::from_env(|k| std::env::var(k).ok());
        if let Some(msg) = problem {
            eprintln!("{msg}");
        }
        // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as the process (this
        // library is never unloaded: it is preloaded). Registered this early (the library's
        // constructor), it runs after the program's own exit handlers.
        unsafe { libc::atexit(at_exit) };
        // SAFETY: the handlers are `extern "C" fn()`s of this never-unloaded library.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(in_child)) };
        config
    })
}

/// How long `exit` may wait for the pump to carry what the program wrote.
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// At exit: half-closes the connections this process's pump carries, so that the pump reads
/// their last bytes and an end of stream, waits (at most [`EXIT_DRAIN`]) until it has sent
/// them, then reports the counters.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if pump::mine() {
            for fd in table::carried_here() {
                // SAFETY: shutdown on an fd of a connection this process carries; a number the
                // program closed is no longer in the table.
                unsafe { libc::shutdown(fd, libc::SHUT_WR) };
            }
            pump::drain_at_exit(EXIT_DRAIN);
        }
        if let Some(c) = CONFIG.get() {
            stats::report(&c.stats);
        }
    });
}

type Held = (
    MutexGuard<'static, Option<pump::Pump>>,
    MutexGuard<'static, Option<table::Tables>>,
    MutexGuard<'static, Option<direct::Registry>>,
    wait::RegsGuard,
    direct::LentGuard,
    parked::SetsGuard,
);

thread_local! {
    /// The locks `before_fork` took, released by `after_fork` in the parent and the child.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Takes the library's locks before `fork`, so that the child's copies are not held by a
/// thread it does not have (a child that closes a socket would wait for it forever).
extern "C" fn before_fork() {
    let held = (
        pump::lock(),
        table::lock(),
        direct::lock(),
        wait::lock_regs(),
        direct::lock_lent(),
        parked::lock_sets(),
    );
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

extern "C" fn after_fork() {
    HELD.with(|h| drop(h.borrow_mut().take()));
}

/// `after_fork` in the child, which also starts its counters from zero: each process's line
/// counts what that process did.
extern "C" fn in_child() {
    after_fork();
    direct::forget_lent_in_child();
    parked::forget_in_child();
    stats::reset();
}

/// Says why a connection went where it went, when `TRESPASS_PRELOAD_LOG` asks.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    if CONFIG.get().is_some_and(|c| c.log) {
        eprintln!("trespass-preload: {args}");
    }
}
