//! The library's own threads (the keep-alive helper, the shared receive queue's thread)
//! leave the application's signals to the application's threads. A signal sent to the
//! process (`kill`, `alarm`, a timer) goes to any one thread that does not block it: were
//! it one of ours, the handler would run there and the call the application meant to
//! interrupt (a blocking read in its reader thread, say) would go on waiting.

#![allow(unsafe_code)]

/// Blocks every signal in the calling thread but those a fault in the thread itself raises
/// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS): blocking those would turn a crash
/// report (Rust's stack overflow message, say) into a bare kill. SIGKILL and SIGSTOP cannot
/// be blocked. Threads this thread starts inherit the mask.
///
/// trespass's own threads call it first thing. A library that drives trespass streams from
/// threads of its own, behind a program that did not ask for them (an `LD_PRELOAD` library,
/// say), calls it first thing in each of those threads too, so that a signal sent to the
/// process reaches the program's threads and interrupts the call it was meant for.
///
/// ```
/// std::thread::spawn(|| {
///     trespass::leave_signals_to_the_application();
///     // ... drive streams here ...
/// })
/// .join()
/// .unwrap();
/// ```
pub fn leave_signals_to_the_application() {
    // SAFETY: an all-zero sigset_t is a valid place for sigfillset to fill.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid ones.
    unsafe {
        libc::sigfillset(&mut set);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut set, sig);
        }
    }
    // SAFETY: `set` is initialised; a null old set is allowed. It fails only for an invalid
    // `how`, and then the thread keeps its mask, which is what it had before.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask of the calling thread.
    fn mask() -> libc::sigset_t {
        // SAFETY: an all-zero sigset_t is a valid place for the current mask.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: a null new set only reads the current mask into `old`.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut old) };
        old
    }

    fn blocked(set: &libc::sigset_t, sig: libc::c_int) -> bool {
        // SAFETY: `set` is a valid, initialised sigset_t.
        unsafe { libc::sigismember(set, sig) == 1 }
    }

    #[test]
    fn a_library_thread_blocks_the_applications_signals_but_not_its_own_faults() {
        let before = blocked(&mask(), libc::SIGALRM);
        let set = std::thread::spawn(|| {
            leave_signals_to_the_application();
            mask()
        })
        .join()
        .unwrap();
        for sig in [
            libc::SIGALRM,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGUSR1,
            libc::SIGCHLD,
            libc::SIGPIPE,
            libc::SIGRTMIN(),
        ] {
            assert!(
                blocked(&set, sig),
                "signal {sig} is left to the application"
            );
        }
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL] {
            assert!(
                !blocked(&set, sig),
                "signal {sig} (a fault) stays deliverable"
            );
        }
        assert_eq!(
            blocked(&mask(), libc::SIGALRM),
            before,
            "only the thread that asked changed its mask"
        );
    }
}
