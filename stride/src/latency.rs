//! Latency statistics computed exactly as perftest's `ib_*_lat` tools compute them.
//!
//! perftest timestamps every post on the measuring side; each sample is the interval between
//! two consecutive posts (one round trip in a ping-pong). It sorts the samples, drops the two
//! largest from the count (`LAT_MEASURE_TAIL`), and reports, over the remaining `m` samples
//! (in sorted order `d[0..]`):
//!
//! | column | value |
//! | --- | --- |
//! | t_min | `d[0]` |
//! | t_max | `d[m]`: the second-largest sample overall, a perftest quirk kept for comparability |
//! | t_typical | the median of `d[0..m]` |
//! | t_avg | the mean of `d[0..m]` |
//! | t_stdev | the population standard deviation of `d[0..m]` |
//! | 99% | `d[ceil(0.99 m)]` |
//! | 99.9% | `d[ceil(0.999 m)]` |
//!
//! every value divided by the round-trip factor: 2 for send and write ping-pong (half round
//! trip), 1 for read and atomic. One deliberate difference: perftest accumulates the variance
//! in `int`, truncating each squared deviation to whole microseconds; here it is accumulated in
//! floating point, so for sub-microsecond jitter our t_stdev is the true one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How many of the largest samples perftest drops from the count before the statistics.
pub const MEASURE_TAIL: usize = 2;

/// The latency columns perftest prints, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Smallest sample.
    pub t_min: f64,
    /// perftest's t_max (see the module docs).
    pub t_max: f64,
    /// Median of the kept samples.
    pub t_typical: f64,
    /// Mean of the kept samples.
    pub t_avg: f64,
    /// Population standard deviation of the kept samples.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
}

/// Too few samples to compute perftest's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooFewSamples {
    /// How many samples there were.
    pub got: usize,
}

impl fmt::Display for TooFewSamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "latency statistics need at least {} samples (one more than the {} dropped \
             largest ones), got {}; run more iterations",
            MEASURE_TAIL + 1,
            MEASURE_TAIL,
            self.got
        )
    }
}

impl std::error::Error for TooFewSamples {}

impl LatencySummary {
    /// Computes the summary from raw samples in microseconds (sorted in place), each divided
    /// by `rtt_factor` (2 for half round trip, 1 for full).
    pub fn from_samples(samples: &mut [f64], rtt_factor: f64) -> Result<Self, TooFewSamples> {
        if samples.len() <= MEASURE_TAIL {
            return Err(TooFewSamples { got: samples.len() });
        }
        samples.sort_unstable_by(f64::total_cmp);
        let m = samples.len() - MEASURE_TAIL;
        let kept = &samples[..m];
        let median = if m % 2 == 0 {
            (kept[m / 2 - 1] + kept[m / 2]) / 2.0
        } else {
            kept[m / 2]
        };
        let avg = kept.iter().sum::<f64>() / m as f64;
        let variance = kept.iter().map(|d| (d - avg).powi(2)).sum::<f64>() / m as f64;
        // ceil(m * p) <= m for p < 1, and index m exists because MEASURE_TAIL > 0.
        let at = |p: f64| samples[((m as f64 * p).ceil() as usize).min(m)];
        Ok(LatencySummary {
            t_min: samples[0] / rtt_factor,
            t_max: samples[m] / rtt_factor,
            t_typical: median / rtt_factor,
            t_avg: avg / rtt_factor,
            t_stdev: variance.sqrt() / rtt_factor,
            p99: at(0.99) / rtt_factor,
            p99_9: at(0.999) / rtt_factor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::post_clock::PostClock;

    /// The samples of monotonic post stamps (ns), as the latency loops compute them.
    fn intervals(stamps: &[u64]) -> Vec<f64> {
        PostClock::start(false).intervals_us(stamps).unwrap()
    }

    #[test]
    fn drops_two_largest_like_perftest() {
        // 1..=10 shuffled; m = 8 kept: 1..=8.
        let mut s = [7.0, 3.0, 10.0, 1.0, 9.0, 5.0, 2.0, 8.0, 4.0, 6.0];
        let r = LatencySummary::from_samples(&mut s, 1.0).unwrap();
        assert_eq!(r.t_min, 1.0);
        assert_eq!(r.t_max, 9.0, "perftest prints d[m], the second largest");
        assert_eq!(r.t_typical, 4.5);
        assert_eq!(r.t_avg, 4.5);
        assert!((r.t_stdev - 5.25f64.sqrt()).abs() < 1e-12);
        // ceil(8 * 0.99) = 8 and ceil(8 * 0.999) = 8.
        assert_eq!(r.p99, 9.0);
        assert_eq!(r.p99_9, 9.0);
    }

    #[test]
    fn percentiles_on_large_runs() {
        let mut s: Vec<f64> = (0..1002).map(f64::from).collect();
        let r = LatencySummary::from_samples(&mut s, 1.0).unwrap();
        // m = 1000: ceil(990) = 990, ceil(999) = 999.
        assert_eq!(r.p99, 990.0);
        assert_eq!(r.p99_9, 999.0);
        assert_eq!(r.t_typical, 499.5);
    }

    #[test]
    fn half_round_trip_and_post_times() {
        // Posts 10 us apart, one 30 us gap and one 50 us gap at the end (the dropped tail),
        // as the latency loops stamp them (monotonic stamps in ns) and turn them into samples.
        let mut t = vec![0u64];
        for _ in 0..10 {
            let last = *t.last().unwrap();
            t.push(last + 10_000);
        }
        t.push(t.last().unwrap() + 30_000);
        t.push(t.last().unwrap() + 50_000);
        let r = LatencySummary::from_samples(&mut intervals(&t), 2.0).unwrap();
        assert_eq!(r.t_min, 5.0);
        assert_eq!(r.t_typical, 5.0);
        assert_eq!(r.t_stdev, 0.0);
        assert_eq!(r.t_max, 15.0);
    }

    #[test]
    fn too_few_samples_is_an_error() {
        let err = LatencySummary::from_samples(&mut [1.0, 2.0], 1.0).unwrap_err();
        assert_eq!(err, TooFewSamples { got: 2 });
        assert!(err.to_string().contains("at least 3"));
        assert!(LatencySummary::from_samples(&mut intervals(&[1000]), 1.0).is_err());
    }
}
