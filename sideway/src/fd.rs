//! Waiting on a file descriptor that libibverbs or librdmacm hands out (a completion
//! channel, a context's async fd): made non-blocking once, then poll(2) with a deadline.
//! A leaf: it knows file descriptors and errno, nothing of verbs.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Why waiting for an event (async or completion) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// Nothing arrived within the timeout.
    #[error("waited {timeout:?} for {what}, and none arrived")]
    Timeout {
        /// Which kind of event.
        what: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// A call failed.
    #[error("{call} failed while waiting for {what}: {source}")]
    Call {
        /// The call.
        call: &'static str,
        /// Which kind of event.
        what: &'static str,
        /// The errno.
        source: io::Error,
    },
}

/// Makes `fd` non-blocking (idempotent), so a read never sleeps past a poll(2) deadline.
pub(crate) fn set_nonblocking(fd: RawFd, what: &'static str) -> Result<(), EventError> {
    let call_err = |call| EventError::Call {
        call,
        what,
        source: io::Error::last_os_error(),
    };
    // SAFETY: fcntl on a descriptor the caller owns for the call's duration.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(call_err("fcntl(F_GETFL)"));
    }
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(call_err("fcntl(F_SETFL)"));
        }
    }
    Ok(())
}

/// Waits until `fd` is readable: `Ok(true)` when it is, `Ok(false)` when `timeout` passed
/// (`None` waits for ever). Restarts after signals with the time left.
pub(crate) fn wait_readable(
    fd: RawFd,
    timeout: Option<Duration>,
    what: &'static str,
) -> Result<bool, EventError> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                // Round up so a sub-millisecond remainder still waits.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        match n {
            n if n > 0 => return Ok(true),
            0 => return Ok(false),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(EventError::Call {
                        call: "poll",
                        what,
                        source: e,
                    });
                }
            }
        }
    }
}
