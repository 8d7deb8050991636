//! How long a wait spins before it sleeps: an adaptive busy-poll. Waking from the completion
//! channel costs a system call and a scheduler round trip; when the peer typically answers
//! sooner than that, spinning is both faster and cheaper.
//!
//! The policy learns only from waits that ended while spinning (a wait that slept measures
//! the wake-up, not the peer): while such waits come, it spins up to twice their average,
//! within the limit; after [`MISSES_TO_IDLE`] waits in a row that slept it spins only the
//! minimum, except every [`PROBE_EVERY`]th wait, which spins the whole limit to find out
//! whether the peer has become quick again.

use std::time::Duration;

/// Waits in a row that had to sleep before the policy stops spinning long.
pub(crate) const MISSES_TO_IDLE: u32 = 8;

/// While idle, one wait in this many spins the whole limit.
pub(crate) const PROBE_EVERY: u32 = 16;

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
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn min(&self) -> Duration {
        self.min
    }

    /// How long the next wait spins.
    pub(crate) fn time(&self) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        if self.misses >= MISSES_TO_IDLE || self.caught_ns == 0 {
            // Idle, or nothing learned yet: probe now and then.
            return if self.waits % PROBE_EVERY == 0 {
                self.max
            } else {
                self.min
            };
        }
        (Duration::from_nanos(self.caught_ns) * 2).clamp(self.min, self.max)
    }

    /// A wait ended after `took`; `slept` when it slept on the completion channel.
    pub(crate) fn record(&mut self, took: Duration, slept: bool) {
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
}
