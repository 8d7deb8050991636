//! How long a wait spins before it sleeps: an adaptive busy-poll. Waking from the completion
//! channel costs a system call and a scheduler round trip; when the peer typically answers
//! sooner than that, spinning is both faster and cheaper.

use std::time::Duration;

/// The spin policy of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spin {
    /// Always spin at least this long.
    min: Duration,
    /// Adapt while typical waits are under half of this (zero: never adapt).
    max: Duration,
    /// Moving average (weight 1/8) of the waits that ended, in nanoseconds.
    avg_ns: u64,
}

impl Spin {
    pub(crate) fn new(min: Duration, max: Duration) -> Spin {
        Spin {
            min,
            max,
            avg_ns: 0,
        }
    }

    pub(crate) fn set_min(&mut self, min: Duration) {
        self.min = min;
    }

    /// How long the next wait spins: twice the typical wait while that is at most half the
    /// limit, the minimum otherwise (an idle peer is not worth spinning for).
    pub(crate) fn time(&self) -> Duration {
        let avg = Duration::from_nanos(self.avg_ns);
        if !self.max.is_zero() && avg <= self.max / 2 {
            (avg * 2).max(self.min)
        } else {
            self.min
        }
    }

    /// A wait ended after `took`.
    pub(crate) fn record(&mut self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.avg_ns = (self.avg_ns.saturating_mul(7) / 8).saturating_add(ns / 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn short_waits_raise_the_spin_to_twice_their_average() {
        let mut s = Spin::new(20 * US, 250 * US);
        assert_eq!(s.time(), 20 * US, "nothing measured yet: the minimum");
        for _ in 0..64 {
            s.record(90 * US);
        }
        let t = s.time();
        assert!(t > 170 * US && t <= 180 * US, "{t:?}");
    }

    #[test]
    fn long_waits_fall_back_to_the_minimum() {
        let mut s = Spin::new(20 * US, 250 * US);
        for _ in 0..64 {
            s.record(90 * US);
        }
        // An idle stretch: one wait of a second moves the average past half the limit.
        s.record(Duration::from_secs(1));
        assert_eq!(s.time(), 20 * US);
    }

    #[test]
    fn a_zero_limit_turns_adaptation_off() {
        let mut s = Spin::new(5 * US, Duration::ZERO);
        s.record(50 * US);
        assert_eq!(s.time(), 5 * US);
    }

    #[test]
    fn waits_below_the_minimum_keep_the_minimum() {
        let mut s = Spin::new(20 * US, 250 * US);
        for _ in 0..64 {
            s.record(2 * US);
        }
        assert_eq!(s.time(), 20 * US);
    }
}
