//! Keeping a measured loop honest about its peer: a loop that waits for the network calls
//! [`Watch::idle`] whenever it found nothing to do; now and then (never on the fast path) that
//! checks the out-of-band channel, so a peer that died or aborted ends the run with its
//! reason, the device's async events (the link, see [`super::link`]), and a run that makes
//! no progress at all ends with an error instead of a hang. Between the measured loops,
//! [`Watch::barrier`] waits for the peer the same way.

// One poll(2) call: std has no way to wait on two descriptors at once.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::completion::blame;
use super::error::RunError;
use super::link::LinkWatch;
use crate::oob::{OobChannel, OobError};

/// How long a measured loop may go without any progress before it gives up.
pub(crate) const STALL: Duration = Duration::from_secs(20);
/// How many idle turns pass between two looks at the clock.
const SPINS_PER_CHECK: u32 = 1024;
/// How often the out-of-band channel is looked at.
const PEER_CHECK: Duration = Duration::from_millis(10);
/// How long a failed completion waits for a dying peer's out-of-band channel to close (its
/// QPs and memory may go a moment before its socket does).
const PEER_GRACE: Duration = Duration::from_millis(100);

/// The longest a barrier sleeps before it looks at the link's state again (a port that
/// stays down past the peer's retry budget ends the wait; no event says when that is).
const BARRIER_NAP: Duration = Duration::from_millis(100);

/// The watchdog of a run's measured loops.
pub(crate) struct Watch {
    spins: u32,
    last_peer_check: Instant,
    last_progress: u64,
    last_change: Instant,
    stall: Duration,
    peer_spoke: bool,
    link: LinkWatch,
}

impl Watch {
    /// A watchdog that gives up after `stall` without progress, and watches `link`.
    pub(crate) fn new(stall: Duration, link: LinkWatch) -> Self {
        let now = Instant::now();
        Watch {
            spins: 0,
            last_peer_check: now,
            last_progress: 0,
            last_change: now,
            stall,
            peer_spoke: false,
            link,
        }
    }

    /// Starts watching a new measured loop: no progress yet, the peer not heard from.
    pub(crate) fn start(&mut self) {
        let now = Instant::now();
        self.spins = 0;
        self.last_peer_check = now;
        self.last_progress = 0;
        self.last_change = now;
        self.peer_spoke = false;
    }

    /// A barrier (see [`OobChannel::barrier`]) that, while it waits at most `limit` for the
    /// peer, keeps watching the link: a port that stays down past the peer's retry budget
    /// ends the wait, as does a peer that dies or aborts.
    pub(crate) fn barrier(
        &mut self,
        oob: &mut OobChannel,
        step: &str,
        limit: Duration,
    ) -> Result<(), RunError> {
        oob.send_ready(step)?;
        let started = Instant::now();
        while !oob.peer_spoke()? {
            self.link.check()?;
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(RunError::timeout(format!(
                    "waited {} s for the peer to reach \"{step}\": it is stuck or the network \
                     between the two sides is down; check the peer's output",
                    limit.as_secs()
                )));
            }
            // Asleep until the peer speaks or the device reports an event, not woken every
            // few milliseconds: on a host with few CPUs a waiting side's wake-ups take CPU
            // time from the kernel work (SoftRoCE's) of the peer's measured loop.
            wait_readable([oob.as_fd(), self.link.fd()], left.min(BARRIER_NAP))?;
        }
        Ok(oob.expect_ready(step)?)
    }

    /// Whether the peer has sent a message since [`Watch::start`], as last seen by
    /// [`Watch::idle`] (a `--run-infinitely` peer that stopped says so this way).
    #[inline]
    pub(crate) fn peer_has_spoken(&self) -> bool {
        self.peer_spoke
    }

    /// A failed completion's error: the peer first if its out-of-band channel closed or it
    /// aborted (see [`blame`]), else the completion's status, with the link's part in it if
    /// its port went down. Other errors pass unchanged.
    #[cold]
    pub(crate) fn explain(&mut self, oob: &mut OobChannel, e: RunError) -> RunError {
        if !matches!(e, RunError::Completion { .. }) {
            return e;
        }
        let peer = look_at_peer(oob, PEER_GRACE);
        match blame(e, peer) {
            e @ RunError::Completion { .. } => self.link.explain(e),
            e => e,
        }
    }

    /// Called on every turn of a loop that may wait (or at least on every idle one);
    /// `progress` is any count that grows while the run moves. Returns whether the peer has sent a
    /// message (the end of its own part of the run, usually; the message stays for the next
    /// `recv`).
    #[inline]
    pub(crate) fn idle(&mut self, oob: &mut OobChannel, progress: u64) -> Result<bool, RunError> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins % SPINS_PER_CHECK != 0 {
            return Ok(self.peer_spoke);
        }
        self.check(oob, progress)
    }

    #[cold]
    fn check(&mut self, oob: &mut OobChannel, progress: u64) -> Result<bool, RunError> {
        let now = Instant::now();
        if progress != self.last_progress {
            self.last_progress = progress;
            self.last_change = now;
        } else if now.duration_since(self.last_change) > self.stall {
            return Err(RunError::timeout(format!(
                "no progress for {} s after {progress} operations: the peer stopped \
                 answering, or the fabric lost messages (on UC a lost message is never \
                 resent); check the peer's output",
                self.stall.as_secs()
            )));
        }
        // Even after the peer spoke (a passive side says "done" at once): a peer that then
        // dies must still be noticed.
        if now.duration_since(self.last_peer_check) >= PEER_CHECK {
            self.last_peer_check = now;
            self.peer_spoke = oob.peer_spoke()?;
            self.link.check()?;
        }
        Ok(self.peer_spoke)
    }
}

/// The peer's state just after a failed completion, as [`OobChannel::peer_spoke`] says it:
/// looked at until it reports an error (the channel closed, the peer aborted) or `grace`
/// passes. A message waiting (a passive side says "done" at once) is no sign of life: the
/// channel may still close behind it.
fn look_at_peer(oob: &mut OobChannel, grace: Duration) -> Result<bool, OobError> {
    let deadline = Instant::now() + grace;
    loop {
        let peer = oob.peer_spoke();
        let left = deadline.saturating_duration_since(Instant::now());
        if peer.is_err() || left.is_zero() {
            return peer;
        }
        if wait_readable([oob.as_fd()], left).is_err() {
            return peer;
        }
    }
}

/// Sleeps until one of `fds` is readable (or closed), or `limit` passes, or a signal comes.
fn wait_readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    limit: Duration,
) -> Result<(), RunError> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = libc::c_int::try_from(limit.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: polled is a valid array of polled.len() pollfd entries for the call's
    // duration, and every descriptor in it is borrowed, so open.
    let ret = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    if ret < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(RunError::new(format!(
                "waiting for the peer or the device (poll): {e}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::thread;

    use super::*;
    use crate::oob::Message;

    /// A connected pair over loopback: (this side, the peer).
    fn pair() -> (OobChannel, OobChannel) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = TcpStream::connect(addr).unwrap();
        let (ours, _) = listener.accept().unwrap();
        let t = Duration::from_secs(5);
        (
            OobChannel::from_stream(ours, t).unwrap(),
            OobChannel::from_stream(peer, t).unwrap(),
        )
    }

    #[test]
    fn a_peer_that_said_done_and_then_closed_is_seen_closed() {
        let (mut ours, mut peer) = pair();
        peer.send(&Message::Ready {
            step: "done".into(),
        })
        .unwrap();
        let closer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            drop(peer);
        });
        let seen = look_at_peer(&mut ours, Duration::from_secs(5));
        closer.join().unwrap();
        assert!(matches!(seen, Err(OobError::Closed { .. })), "{seen:?}");
        let failed = RunError::Completion {
            status: sideway::completion_queue::WcStatus::RemAccessErr,
            text: "RDMA READ failed: remote access error (10)".into(),
        };
        let e = blame(failed, seen);
        assert!(matches!(e, RunError::PeerGone(_)), "{e:?}");
    }

    #[test]
    fn a_peer_still_there_is_looked_at_for_the_grace_only() {
        let (mut ours, _peer) = pair();
        let started = Instant::now();
        let seen = look_at_peer(&mut ours, Duration::from_millis(50));
        assert!(matches!(seen, Ok(false)), "{seen:?}");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
