//! The end of a `--run-infinitely` run: SIGINT (Ctrl-C) or SIGTERM sets a flag that the
//! measured loop reads, so the run ends as a `-D` run does, with both sides' summaries,
//! instead of killing the process mid-run.

// Installing a signal handler is a libc call.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::Relaxed);
}

/// From now on SIGINT and SIGTERM ask the run to stop instead of ending the process.
pub(crate) fn catch_stop_signals() -> Result<(), super::error::RunError> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: on_signal only stores to an atomic, which is async-signal-safe; signal()
        // replaces the disposition of a valid signal number and touches no Rust memory.
        let old = unsafe { libc::signal(sig, handler) };
        if old == libc::SIG_ERR {
            return Err(super::error::RunError::setup(format!(
                "cannot catch signal {sig} to end --run-infinitely cleanly: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM came since [`catch_stop_signals`].
#[inline]
pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}
