//! How long a wait spins before it sleeps: an adaptive busy-poll. Waking from the completion
//! channel costs a system call and a scheduler round trip; when the peer typically answers
//! sooner than that, spinning is both faster and cheaper.
//!
//! A wait for an answer (a read that begins after this side wrote since its last read
//! wait, as in a request and its reply) spins the whole limit: the spin ends as soon as the
//! answer comes, so spinning longer costs nothing when it comes, while an answer that comes
//! just after a shorter spin costs the round trip a wake-up. Every other wait (a reader of a
//! bulk transfer waiting for the next piece, a writer waiting for room) spins up to twice the
//! average of such waits that ended while spinning (a wait that slept measures the wake-up,
//! not the peer; the average moves an eighth of the way with each), within [`OTHER_WAITS`]'s
//! fraction of the limit: each of those ends sooner when it spins, but where the device is
//! emulated on the same cores, the spin takes the CPU that moves the bytes. After
//! [`MISSES_TO_IDLE`] waits in a row that slept, any wait spins only the minimum, except
//! every [`PROBE_EVERY`]th, which spins the whole limit (a third of it, outside answers) to
//! find out whether the peer has become quick again.
//!
//! A long spin pays only while the waiting thread has a core to itself: where more threads
//! wait in the blocking calls than there are cores for them, one thread's spin is time the
//! others wait for a core (the tokio front end asks its runtime the same question). So a
//! blocking wait adapts only while the [`Crowd`] of waiting threads is no larger than
//! [`spinners`], half the cores the process may run on (the other half for a peer on the
//! same host, whose waits this process cannot count, and for the device's interrupts), and
//! spins just the minimum otherwise.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Waits in a row that had to sleep before the policy stops spinning long.
pub(crate) const MISSES_TO_IDLE: u32 = 8;

/// While idle, one wait in this many spins the whole limit.
pub(crate) const PROBE_EVERY: u32 = 16;

/// Waits that do not wait for an answer (a reader that has not written
/// since its last wait, a writer waiting for room) spin at most this fraction of the limit:
/// the waits of a bulk transfer, whose spinning takes the CPU an emulated device needs.
pub(crate) const OTHER_WAITS: u32 = 3;

/// The spin policy of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spin {
    /// Always spin at least this long.
    min: Duration,
    /// Never spin longer than this (zero: never adapt).
    max: Duration,
    /// Moving average (weight 1/8) of the waits that ended while spinning, in nanoseconds;
    /// 0 until one did.
    caught_ns: u64,
    /// Waits in a row that slept.
    misses: u32,
    /// Waits so far (for the probes).
    waits: u32,
}

impl Spin {
    pub(crate) fn new(min: Duration, max: Duration) -> Spin {
        Spin {
            min,
            max,
            caught_ns: 0,
            misses: 0,
            waits: 0,
        }
    }

    pub(crate) fn set_min(&mut self, min: Duration) {
        self.min = min;
    }

    /// Sets the limit (at or below the minimum: no adaptation).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn set_max(&mut self, max: Duration) {
        self.max = max;
    }

    /// The limit.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn max(&self) -> Duration {
        self.max
    }

    /// The least a wait spins.
    pub(crate) fn min(&self) -> Duration {
        self.min
    }

    /// How long the next wait for an answer spins (the tests' shorthand for
    /// [`time_for`](Self::time_for)`(true)`).
    #[cfg(test)]
    pub(crate) fn time(&self) -> Duration {
        self.time_for(true)
    }

    /// How long the next wait spins: the whole limit when it waits for an answer (a read
    /// after this side wrote), else twice the average of the waits caught while spinning
    /// within [`OTHER_WAITS`] of it; only the minimum while the peer looks idle, but for the
    /// probes.
    pub(crate) fn time_for(&self, answer: bool) -> Duration {
        let max = if answer {
            self.max
        } else {
            self.max / OTHER_WAITS
        };
        if max <= self.min {
            return self.min;
        }
        let idle = self.misses >= MISSES_TO_IDLE;
        if answer && !idle {
            return max;
        }
        if idle || self.caught_ns == 0 {
            // Idle, or (outside answers) nothing learned yet: probe now and then.
            return if self.waits % PROBE_EVERY == 0 {
                max
            } else {
                self.min
            };
        }
        (Duration::from_nanos(self.caught_ns) * 2).clamp(self.min, max)
    }

    /// A wait ended after `took`; `slept` when it slept on the completion channel.
    pub(crate) fn record_wait(&mut self, took: Duration, slept: bool) {
        self.waits = self.waits.wrapping_add(1);
        if slept {
            self.misses = self.misses.saturating_add(1);
            return;
        }
        self.misses = 0;
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.caught_ns = if self.caught_ns == 0 {
            ns.max(1)
        } else {
            (self.caught_ns.saturating_mul(7) / 8).saturating_add(ns / 8)
        };
    }
}

/// Tells a wait for an answer from the others: a read wait that begins after this side
/// committed bytes since the last read wait began (a request, then the wait for its reply).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Answers {
    /// The connection's committed bytes when the last read wait began.
    committed: u64,
}

impl Answers {
    /// A read wait begins, `committed` bytes committed so far on the connection: whether it
    /// waits for an answer. Each call starts a new count, so the waits for the rest of a long
    /// answer are not.
    pub(crate) fn read_wait(&mut self, committed: u64) -> bool {
        let answer = committed != self.committed;
        self.committed = committed;
        answer
    }
}

/// How many threads wait in the blocking calls right now: the process's count is
/// [`WAITING`]; each wait holds a [`Waiter`] from its start to its end.
#[derive(Debug)]
pub(crate) struct Crowd {
    waiting: AtomicUsize,
}

/// The threads of this process waiting in a blocking call of trespass. (A child forked
/// while threads of its parent waited inherits their count without the threads: it only
/// spins less than it could.)
pub(crate) static WAITING: Crowd = Crowd::new();

impl Crowd {
    pub(crate) const fn new() -> Crowd {
        Crowd {
            waiting: AtomicUsize::new(0),
        }
    }

    /// Counts the calling thread as waiting until the [`Waiter`] is dropped; the waiter says
    /// whether, with it, no more threads wait than `spinners`.
    pub(crate) fn enter(&self, spinners: usize) -> Waiter<'_> {
        // Relaxed: the count steers a heuristic and orders no other memory.
        let now = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        Waiter {
            crowd: self,
            uncrowded: now <= spinners,
        }
    }

    /// Threads counted as waiting.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// One waiting thread of a [`Crowd`].
#[derive(Debug)]
pub(crate) struct Waiter<'a> {
    crowd: &'a Crowd,
    uncrowded: bool,
}

impl Waiter<'_> {
    /// Whether, when this wait began, no more threads waited than may spin long at once:
    /// then it may spin as long as the adaptive policy says.
    pub(crate) fn uncrowded(&self) -> bool {
        self.uncrowded
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.crowd.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many waiting threads may spin long at once: half the threads this process may run
/// at once (its CPU affinity and cgroup quota, as [`std::thread::available_parallelism`]
/// reads them, once; 1 when it cannot tell), rounded down, so none on one core.
pub(crate) fn spinners() -> usize {
    static SPINNERS: OnceLock<usize> = OnceLock::new();
    *SPINNERS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(NonZeroUsize::get)
            .unwrap_or(1)
            / 2
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_first_wait_probes_the_whole_limit() {
        let s = Spin::new(20 * US, 750 * US);
        assert_eq!(s.time(), 750 * US);
        assert_eq!(s.time_for(false), 250 * US, "a third of it outside answers");
    }

    #[test]
    fn other_waits_caught_while_spinning_set_the_spin_to_twice_their_average() {
        let mut s = Spin::new(20 * US, 750 * US);
        for _ in 0..64 {
            s.record_wait(90 * US, false);
        }
        assert_eq!(s.time_for(false), 180 * US);
        assert_eq!(s.time(), 750 * US, "an answer's spin is the whole limit");
        // Faster than half the minimum: the minimum.
        let mut fast = Spin::new(20 * US, 750 * US);
        fast.record_wait(3 * US, false);
        assert_eq!(fast.time_for(false), 20 * US);
        // Slower than half a third of the limit: a third of the limit.
        let mut slow = Spin::new(20 * US, 750 * US);
        slow.record_wait(200 * US, false);
        assert_eq!(slow.time_for(false), 250 * US);
        // The average moves an eighth of the way with each wait.
        let mut slower = s;
        slower.record_wait(26 * US, false);
        assert_eq!(slower.time_for(false), 2 * (90 * US * 7 / 8 + 26 * US / 8));
    }

    #[test]
    fn an_answer_spins_the_whole_limit_until_the_peer_looks_idle() {
        let mut s = Spin::new(20 * US, 750 * US);
        for _ in 0..64 {
            s.record_wait(40 * US, false);
        }
        assert_eq!(s.time(), 750 * US, "not twice the average: the whole limit");
        for _ in 0..MISSES_TO_IDLE - 1 {
            s.record_wait(Duration::from_millis(5), true);
        }
        assert_eq!(s.time(), 750 * US, "a few sleeps do not make the peer idle");
        s.record_wait(Duration::from_millis(5), true);
        // Idle now: the minimum, with a probe of the whole limit every PROBE_EVERY waits.
        let spins: Vec<Duration> = (0..PROBE_EVERY)
            .map(|_| {
                let t = s.time();
                s.record_wait(Duration::from_millis(5), true);
                t
            })
            .collect();
        assert_eq!(spins.iter().filter(|&&t| t == 750 * US).count(), 1);
        assert_eq!(spins.iter().filter(|&&t| t == 20 * US).count(), 15);
        // A probe that catches the peer ends the idle mode.
        s.record_wait(300 * US, false);
        assert_eq!(s.time(), 750 * US);
    }

    #[test]
    fn a_few_sleeps_do_not_forget_a_quick_peer_but_many_do() {
        let mut s = Spin::new(20 * US, 750 * US);
        s.record_wait(90 * US, false);
        for _ in 0..MISSES_TO_IDLE - 1 {
            s.record_wait(Duration::from_millis(5), true);
        }
        assert_eq!(
            s.time_for(false),
            180 * US,
            "still spinning for the quick peer"
        );
        s.record_wait(Duration::from_millis(5), true);
        // Idle now: the minimum, with a probe of a third of the limit every PROBE_EVERY.
        let spins: Vec<Duration> = (0..PROBE_EVERY)
            .map(|_| {
                let t = s.time_for(false);
                s.record_wait(Duration::from_millis(5), true);
                t
            })
            .collect();
        assert_eq!(spins.iter().filter(|&&t| t == 250 * US).count(), 1);
        assert_eq!(spins.iter().filter(|&&t| t == 20 * US).count(), 15);
        // A probe that catches the peer ends the idle mode.
        s.record_wait(60 * US, false);
        assert!(s.time_for(false) > 150 * US, "{:?}", s.time_for(false));
    }

    #[test]
    fn a_limit_at_or_below_the_minimum_turns_adaptation_off() {
        let mut s = Spin::new(5 * US, Duration::ZERO);
        assert_eq!(s.time(), 5 * US);
        assert_eq!(s.time_for(false), 5 * US);
        s.record_wait(2 * US, false);
        assert_eq!(s.time(), 5 * US);
        // A third of the limit at or below the minimum: the minimum outside answers.
        let low = Spin::new(20 * US, 50 * US);
        assert_eq!(low.time_for(false), 20 * US);
        assert_eq!(low.time(), 50 * US);
    }

    #[test]
    fn a_wait_adapts_only_while_no_more_threads_wait_than_may_spin() {
        let crowd = Crowd::new();
        let first = crowd.enter(2);
        let second = crowd.enter(2);
        assert!(first.uncrowded() && second.uncrowded());
        let third = crowd.enter(2);
        assert!(
            !third.uncrowded(),
            "three waiting threads where two may spin"
        );
        assert_eq!(crowd.waiting(), 3);
        drop(first);
        drop(third);
        assert_eq!(crowd.waiting(), 1, "a wait that ends leaves the count");
        assert!(crowd.enter(2).uncrowded());
        drop(second);
        assert_eq!(crowd.waiting(), 0);
        // Threads waiting at once, each counted while it waits.
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            let seen: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let w = crowd.enter(2);
                        barrier.wait();
                        let n = crowd.waiting();
                        barrier.wait();
                        (w.uncrowded(), n)
                    })
                })
                .collect();
            let seen: Vec<_> = seen.into_iter().map(|h| h.join().unwrap()).collect();
            assert!(seen.iter().all(|&(_, n)| n == 4));
            assert_eq!(seen.iter().filter(|&&(u, _)| u).count(), 2);
        });
        assert_eq!(crowd.waiting(), 0);
    }

    #[test]
    fn half_the_cores_may_spin_long() {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(spinners(), cores / 2);
        // On one core no wait adapts: the first waiter is already a crowd.
        assert!(!Crowd::new().enter(0).uncrowded());
    }

    #[test]
    fn a_read_wait_after_a_write_waits_for_an_answer_and_no_other() {
        let mut a = Answers::default();
        // A server's first wait, before it wrote anything: not an answer.
        assert!(!a.read_wait(0));
        // Request and reply: each read wait after a write is one, the next piece's not.
        assert!(a.read_wait(100));
        assert!(!a.read_wait(100), "the rest of a long answer");
        assert!(a.read_wait(164));
        // A bulk reader that never writes: none.
        let mut bulk = Answers::default();
        assert!((0..10).all(|_| !bulk.read_wait(0)));
    }
}
