//! How long a wait spins before it sleeps: an adaptive busy-poll. Waking from the completion
//! channel costs a system call and a scheduler round trip; when the peer typically answers
//! sooner than that, spinning is both faster and cheaper.
//!
//! The policy learns only from waits that ended while spinning (a wait that slept measures
//! the wake-up, not the peer): while such waits come, it spins up to twice their average,
//! within the limit; after [`MISSES_TO_IDLE`] waits in a row that slept it spins only the
//! minimum, except every [`PROBE_EVERY`]th wait, which spins the whole limit to find out
//! whether the peer has become quick again. The average moves an eighth of the way with each
//! caught wait, but a wait for an answer caught after answers that slept starts it again from
//! its own length: the waits it missed were longer than it said.
//!
//! Both front ends spin up to the whole limit only in a wait for an answer: a read that
//! begins after this side wrote since its last read wait, as in a request and its reply.
//! Other waits (a reader of a bulk transfer waiting for the next piece, a writer waiting for
//! room) spin at most [`OTHER_WAITS`]'s fraction of it: each of those ends sooner when it
//! spins, but where the device is emulated on the same cores, the spin takes the CPU that
//! moves the bytes.
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

    /// How long the next wait spins, within the whole limit (the tests' shorthand for
    /// [`time_for`](Self::time_for) of an answer).
    #[cfg(test)]
    pub(crate) fn time(&self) -> Duration {
        self.time_within(self.max)
    }

    /// How long the next wait spins: within the whole limit when it
    /// waits for an answer (a read after this side wrote), else within [`OTHER_WAITS`] of it.
    pub(crate) fn time_for(&self, answer: bool) -> Duration {
        if answer {
            self.time_within(self.max)
        } else {
            self.time_within(self.max / OTHER_WAITS)
        }
    }

    fn time_within(&self, max: Duration) -> Duration {
        if max <= self.min {
            return self.min;
        }
        if self.misses >= MISSES_TO_IDLE || self.caught_ns == 0 {
            // Idle, or nothing learned yet: probe now and then.
            return if self.waits % PROBE_EVERY == 0 {
                max
            } else {
                self.min
            };
        }
        (Duration::from_nanos(self.caught_ns) * 2).clamp(self.min, max)
    }

    /// A wait other than an answer's ended after `took`; `slept` when it slept on the
    /// completion channel (the tests' shorthand for [`record_wait`](Self::record_wait)).
    #[cfg(test)]
    pub(crate) fn record(&mut self, took: Duration, slept: bool) {
        self.record_wait(took, slept, false);
    }

    /// A wait ended after `took`; `slept` when it slept on the completion channel; `answer`
    /// when it waited for an answer: one caught after answers that slept starts the average
    /// again from its own length, since the average missed them and no longer says how long
    /// this peer takes to answer. (Other waits, a bulk transfer's, keep the moving average:
    /// starting it again from one quick piece there would spin the next slow ones longer
    /// for nothing.)
    pub(crate) fn record_wait(&mut self, took: Duration, slept: bool, answer: bool) {
        self.waits = self.waits.wrapping_add(1);
        if slept {
            self.misses = self.misses.saturating_add(1);
            return;
        }
        let after_miss = answer && self.misses > 0;
        self.misses = 0;
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.caught_ns = if self.caught_ns == 0 || after_miss {
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
        let s = Spin::new(20 * US, 250 * US);
        assert_eq!(s.time(), 250 * US);
    }

    #[test]
    fn waits_caught_while_spinning_set_the_spin_to_twice_their_average() {
        let mut s = Spin::new(20 * US, 250 * US);
        for _ in 0..64 {
            s.record(90 * US, false);
        }
        assert_eq!(s.time(), 180 * US);
        // Faster than half the minimum: the minimum.
        let mut fast = Spin::new(20 * US, 250 * US);
        fast.record(3 * US, false);
        assert_eq!(fast.time(), 20 * US);
        // Slower than half the limit: the limit.
        let mut slow = Spin::new(20 * US, 250 * US);
        slow.record(200 * US, false);
        assert_eq!(slow.time(), 250 * US);
    }

    #[test]
    fn a_few_sleeps_do_not_forget_a_quick_peer_but_many_do() {
        let mut s = Spin::new(20 * US, 250 * US);
        s.record(90 * US, false);
        for _ in 0..MISSES_TO_IDLE - 1 {
            s.record(Duration::from_millis(5), true);
        }
        assert_eq!(s.time(), 180 * US, "still spinning for the quick peer");
        s.record(Duration::from_millis(5), true);
        // Idle now: the minimum, with a probe of the whole limit every PROBE_EVERY waits.
        let spins: Vec<Duration> = (0..PROBE_EVERY)
            .map(|_| {
                let t = s.time();
                s.record(Duration::from_millis(5), true);
                t
            })
            .collect();
        assert_eq!(spins.iter().filter(|&&t| t == 250 * US).count(), 1);
        assert_eq!(spins.iter().filter(|&&t| t == 20 * US).count(), 15);
        // A probe that catches the peer ends the idle mode.
        s.record(60 * US, false);
        assert!(s.time() > 150 * US, "{:?}", s.time());
    }

    #[test]
    fn a_limit_at_or_below_the_minimum_turns_adaptation_off() {
        let mut s = Spin::new(5 * US, Duration::ZERO);
        assert_eq!(s.time(), 5 * US);
        s.record(2 * US, false);
        assert_eq!(s.time(), 5 * US);
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
    fn waits_that_are_not_for_an_answer_spin_a_third_of_the_limit() {
        let mut s = Spin::new(20 * US, 750 * US);
        assert_eq!(
            s.time_for(true),
            750 * US,
            "the first wait probes the limit"
        );
        assert_eq!(s.time_for(false), 250 * US, "or a third of it");
        for _ in 0..64 {
            s.record(200 * US, false);
        }
        assert_eq!(s.time_for(true), 400 * US);
        assert_eq!(s.time_for(false), 250 * US);
        assert_eq!(s.time(), s.time_for(true));
        // A third of the limit at or below the minimum: the minimum.
        let low = Spin::new(20 * US, 50 * US);
        assert_eq!(low.time_for(false), 20 * US);
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

    #[test]
    fn a_peer_that_became_slower_is_caught_again_at_its_new_pace() {
        let mut s = Spin::new(20 * US, 750 * US);
        for _ in 0..64 {
            s.record(40 * US, false);
        }
        assert_eq!(s.time(), 80 * US);
        // The peer now answers in 300 us: every wait sleeps until the idle mode's probe
        // catches one, whose length is the new average (not an eighth of the way to it).
        let mut waits = s;
        while waits.time() != 750 * US {
            waits.record_wait(Duration::from_millis(1), true, true);
        }
        let mut answers = waits;
        answers.record_wait(300 * US, false, true);
        assert_eq!(answers.time(), 600 * US);
        answers.record_wait(300 * US, false, true);
        assert_eq!(answers.time(), 600 * US, "and it holds");
        // Waits that are not for an answer keep the moving average: an eighth of the way.
        waits.record_wait(300 * US, false, false);
        assert_eq!(waits.time(), 2 * (40 * US * 7 / 8 + 300 * US / 8));
    }
}
