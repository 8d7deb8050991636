//! Bandwidth and message rate computed exactly as perftest's `ib_*_bw` tools compute them.
//!
//! The measuring side timestamps every post and every signaled completion. Then:
//!
//! - average bandwidth = size × messages / (last completion − first post)
//! - message rate = messages / that time, in millions per second
//! - peak bandwidth = size / the smallest time per message over any window that starts at a
//!   post and ends at a signaled completion at or after it: min over i ≤ j of
//!   (completed\[j\] − posted\[i\]) / (j − i + 1); left out above 20,000 iterations and in
//!   duration mode ([`crate::params::TestParams::reports_peak`]).
//!
//! Units: MiB/s (2^20 bytes) by default, Gb/s (10^9 bits) with `--report-gbits`.

use serde::{Deserialize, Serialize};

/// One size's bandwidth result on one side.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BandwidthResult {
    /// Message size in bytes.
    pub bytes: u64,
    /// Messages measured (all QPs together).
    pub iterations: u64,
    /// Peak bandwidth in bytes per second, when computed.
    pub peak_bytes_per_sec: Option<f64>,
    /// Average bandwidth in bytes per second.
    pub avg_bytes_per_sec: f64,
    /// Millions of messages per second.
    pub msg_rate_mpps: f64,
    /// The spread of the run's reporting intervals (duration runs, `-D` and
    /// `--run-infinitely`); absent otherwise and in files written before stride-perf had them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<IntervalStats>,
    /// The busy share of the host's CPUs during the measured loop, in percent
    /// (`--cpu-util`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_util_percent: Option<f64>,
}

/// Timestamps of one bandwidth run, in seconds from any fixed origin.
#[derive(Debug, Clone, Default)]
pub struct BandwidthTimes {
    /// When each message was posted (one entry per message, in order).
    pub posted: Vec<f64>,
    /// `(message index, time)` of each signaled completion, in order: the completion of
    /// message `index` (and, with CQ moderation, the unsignaled ones before it).
    pub completed: Vec<(usize, f64)>,
}

impl BandwidthTimes {
    /// Room for `messages` posts and completions, allocated once before the run so the
    /// measured loop never allocates.
    pub fn with_capacity(messages: usize) -> Self {
        BandwidthTimes {
            posted: Vec::with_capacity(messages),
            completed: Vec::with_capacity(messages),
        }
    }
}

/// Why no bandwidth could be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BandwidthError {
    /// Nothing was posted or completed.
    #[error("no message was posted and completed: nothing to measure")]
    Empty,
    /// The clock did not advance between the first post and the last completion.
    #[error("the run took no measurable time: increase -n or -s")]
    NoTime,
}

impl BandwidthResult {
    /// Computes the result for `bytes`-sized messages from the run's timestamps; `peak`
    /// says whether to compute the peak (see [`crate::params::TestParams::reports_peak`]).
    pub fn compute(bytes: u64, t: &BandwidthTimes, peak: bool) -> Result<Self, BandwidthError> {
        let (&first_post, &(last_index, last_done)) = match (t.posted.first(), t.completed.last()) {
            (Some(p), Some(c)) => (p, c),
            _ => return Err(BandwidthError::Empty),
        };
        let messages = (last_index + 1) as u64;
        let elapsed = last_done - first_post;
        if elapsed <= 0.0 || !elapsed.is_finite() {
            return Err(BandwidthError::NoTime);
        }
        let peak_bytes_per_sec = if peak {
            min_time_per_message(t).map(|d| bytes as f64 / d)
        } else {
            None
        };
        Ok(BandwidthResult {
            bytes,
            iterations: messages,
            peak_bytes_per_sec,
            avg_bytes_per_sec: bytes as f64 * messages as f64 / elapsed,
            msg_rate_mpps: messages as f64 / elapsed / 1e6,
            intervals: None,
            cpu_util_percent: None,
        })
    }

    /// Average bandwidth in the report's unit (MiB/s, or Gb/s with `gbits`).
    pub fn avg(&self, gbits: bool) -> f64 {
        in_unit(self.avg_bytes_per_sec, gbits)
    }

    /// Peak bandwidth in the report's unit, 0 when not computed (perftest prints 0.00).
    pub fn peak(&self, gbits: bool) -> f64 {
        self.peak_bytes_per_sec.map_or(0.0, |p| in_unit(p, gbits))
    }

    /// Adds the spread of a duration run's intervals; the peak (which perftest leaves out
    /// in duration mode) becomes the best interval's bandwidth.
    pub fn with_intervals(mut self, intervals: &[Interval]) -> Self {
        self.intervals = IntervalStats::of(intervals);
        if let Some(stats) = &self.intervals {
            self.peak_bytes_per_sec = Some(stats.max_bytes_per_sec);
        }
        self
    }
}

/// Bytes per second in the report's unit: MiB/s, or Gb/s with `gbits`.
pub fn in_unit(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / f64::from(1u32 << 20)
    }
}

/// perftest's peak rule: the smallest (completed\[j\] − posted\[i\]) / (j − i + 1) over every
/// post i and every signaled completion j ≥ i.
fn min_time_per_message(t: &BandwidthTimes) -> Option<f64> {
    let mut best: Option<f64> = None;
    for (i, &posted) in t.posted.iter().enumerate() {
        // Completions are in message order: skip those before i.
        let start = t.completed.partition_point(|&(j, _)| j < i);
        for &(j, done) in &t.completed[start..] {
            let per_message = (done - posted) / (j - i + 1) as f64;
            if per_message > 0.0 && best.is_none_or(|b| per_message < b) {
                best = Some(per_message);
            }
        }
    }
    best
}

/// One reporting interval of a duration run: what completed between two looks at the clock
/// about a reporting period apart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Start, in seconds from the start of the size's run.
    pub start_s: f64,
    /// End, likewise.
    pub end_s: f64,
    /// Messages completed in it (all QPs together).
    pub messages: u64,
    /// Bandwidth over it, bytes per second.
    pub bytes_per_sec: f64,
    /// Millions of messages per second over it.
    pub msg_rate_mpps: f64,
    /// The run ended before a whole period passed: the last interval, shorter than the
    /// others, counted in the series but not in the minimum, median and maximum (unless it
    /// is the only one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

/// The minimum, median and maximum of a run's whole intervals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IntervalStats {
    /// Intervals counted (the whole ones; the partial last one only when alone).
    pub count: usize,
    /// The slowest interval's bandwidth, bytes per second.
    pub min_bytes_per_sec: f64,
    /// The median interval's bandwidth (the mean of the middle two for an even count).
    pub median_bytes_per_sec: f64,
    /// The fastest interval's bandwidth.
    pub max_bytes_per_sec: f64,
    /// The slowest interval's message rate, millions per second.
    pub min_mpps: f64,
    /// The median message rate.
    pub median_mpps: f64,
    /// The fastest message rate.
    pub max_mpps: f64,
}

fn min_median_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (v[0], median, v[n - 1])
}

impl IntervalStats {
    /// The statistics of `intervals`: the whole ones, or the partial last one when it is
    /// all there is. `None` for no interval.
    pub fn of(intervals: &[Interval]) -> Option<Self> {
        let whole: Vec<&Interval> = intervals.iter().filter(|i| !i.partial).collect();
        let counted: Vec<&Interval> = if whole.is_empty() {
            intervals.iter().collect()
        } else {
            whole
        };
        if counted.is_empty() {
            return None;
        }
        let (min_b, med_b, max_b) =
            min_median_max(counted.iter().map(|i| i.bytes_per_sec).collect());
        let (min_m, med_m, max_m) =
            min_median_max(counted.iter().map(|i| i.msg_rate_mpps).collect());
        Some(IntervalStats {
            count: counted.len(),
            min_bytes_per_sec: min_b,
            median_bytes_per_sec: med_b,
            max_bytes_per_sec: max_b,
            min_mpps: min_m,
            median_mpps: med_m,
            max_mpps: max_m,
        })
    }
}

/// Cuts a running count of completed messages into reporting intervals. The measured loop
/// calls [`IntervalMeter::observe`] with every batch of completions (it already reads the
/// clock for them), so metering costs one comparison per batch.
#[derive(Debug, Clone)]
pub struct IntervalMeter {
    period: f64,
    bytes: u64,
    origin: f64,
    last_t: f64,
    last_count: u64,
    next: f64,
    /// The intervals closed so far.
    pub intervals: Vec<Interval>,
}

impl IntervalMeter {
    /// A meter of `period`-second intervals for `bytes`-byte messages, starting at `t`
    /// (seconds, the loop's clock).
    pub fn new(period: f64, bytes: u64, t: f64) -> Self {
        IntervalMeter {
            period,
            bytes,
            origin: t,
            last_t: t,
            last_count: 0,
            next: t + period,
            // A day of one-second intervals before the vector grows.
            intervals: Vec::with_capacity(1024),
        }
    }

    fn close(&mut self, t: f64, total: u64, partial: bool) -> Option<Interval> {
        let span = t - self.last_t;
        if span <= 0.0 || !span.is_finite() {
            return None;
        }
        let messages = total.saturating_sub(self.last_count);
        let iv = Interval {
            start_s: self.last_t - self.origin,
            end_s: t - self.origin,
            messages,
            bytes_per_sec: self.bytes as f64 * messages as f64 / span,
            msg_rate_mpps: messages as f64 / span / 1e6,
            partial,
        };
        self.last_t = t;
        self.last_count = total;
        self.intervals.push(iv);
        Some(iv)
    }

    /// `total` messages have completed by time `t`: returns the interval that this closes,
    /// if a period has passed since the last one closed.
    #[inline]
    pub fn observe(&mut self, t: f64, total: u64) -> Option<Interval> {
        if t < self.next {
            return None;
        }
        // A loop that saw no completion for several periods closes one long interval, then
        // counts whole periods from there.
        self.next = t + self.period;
        self.close(t, total, false)
    }

    /// The run ended at `t` with `total` messages complete: closes the last, partial
    /// interval when anything happened since the last one.
    pub fn finish(&mut self, t: f64, total: u64) -> Option<Interval> {
        if total == self.last_count {
            return None;
        }
        self.close(t, total, true)
    }
}

/// One interval as printed during the run: its span, bandwidth and message rate.
pub fn interval_line(iv: &Interval, gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
    format!(
        " interval {:>8.2} - {:<8.2} s   BW {:>10.2} {unit}   MsgRate {:.6} Mpps{}",
        iv.start_s,
        iv.end_s,
        in_unit(iv.bytes_per_sec, gbits),
        iv.msg_rate_mpps,
        if iv.partial { "   (partial)" } else { "" }
    )
}

/// The summary line of a run's intervals: how many, and the minimum, median and maximum.
pub fn interval_summary(s: &IntervalStats, period: f64, gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
    format!(
        " Intervals       : {} of {period} s: BW min {:.2}, median {:.2}, max {:.2} {unit}; \
         MsgRate min {:.6}, median {:.6}, max {:.6} Mpps",
        s.count,
        in_unit(s.min_bytes_per_sec, gbits),
        in_unit(s.median_bytes_per_sec, gbits),
        in_unit(s.max_bytes_per_sec, gbits),
        s.min_mpps,
        s.median_mpps,
        s.max_mpps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four messages posted 1 s apart from t=0, each completing 2 s after its post.
    fn steady() -> BandwidthTimes {
        BandwidthTimes {
            posted: vec![0.0, 1.0, 2.0, 3.0],
            completed: vec![(0, 2.0), (1, 3.0), (2, 4.0), (3, 5.0)],
        }
    }

    #[test]
    fn average_and_rate() {
        let r = BandwidthResult::compute(1 << 20, &steady(), true).unwrap();
        assert_eq!(r.iterations, 4);
        // 4 MiB in 5 s.
        assert!((r.avg(false) - 0.8).abs() < 1e-12);
        assert!((r.msg_rate_mpps - 0.8e-6).abs() < 1e-18);
        // Gb/s: 4 MiB * 8 / 5 s / 1e9.
        assert!((r.avg(true) - 4.0 * 1048576.0 * 8.0 / 5.0 / 1e9).abs() < 1e-12);
    }

    #[test]
    fn peak_is_the_best_window() {
        // Best window: post 0 .. completion 3 = 5 s for 4 messages = 1.25 s per message.
        let r = BandwidthResult::compute(1 << 20, &steady(), true).unwrap();
        assert!((r.peak(false) - 0.8).abs() < 1e-12, "{r:?}");
        // A burst: messages 1 and 2 posted together and completed 0.5 s later.
        let t = BandwidthTimes {
            posted: vec![0.0, 10.0, 10.0, 20.0],
            completed: vec![(0, 5.0), (2, 10.5), (3, 25.0)],
        };
        let r = BandwidthResult::compute(1 << 20, &t, true).unwrap();
        // Window i=1..j=2: 0.5 s / 2 messages = 0.25 s per message -> 4 MiB/s.
        assert!((r.peak(false) - 4.0).abs() < 1e-12, "{r:?}");
        assert_eq!(r.iterations, 4);
    }

    #[test]
    fn moderated_completions_count_every_message() {
        // cq_mod 2: only messages 1 and 3 signal.
        let t = BandwidthTimes {
            posted: vec![0.0, 0.0, 1.0, 1.0],
            completed: vec![(1, 2.0), (3, 4.0)],
        };
        let r = BandwidthResult::compute(100, &t, false).unwrap();
        assert_eq!(r.iterations, 4);
        assert_eq!(r.peak_bytes_per_sec, None);
        assert!((r.avg_bytes_per_sec - 100.0).abs() < 1e-12);
    }

    #[test]
    fn degenerate_runs_are_errors() {
        assert_eq!(
            BandwidthResult::compute(8, &BandwidthTimes::default(), true),
            Err(BandwidthError::Empty)
        );
        let t = BandwidthTimes {
            posted: vec![1.0],
            completed: vec![(0, 1.0)],
        };
        assert_eq!(
            BandwidthResult::compute(8, &t, true),
            Err(BandwidthError::NoTime)
        );
    }

    #[test]
    fn intervals_cut_the_run_by_period() {
        let mut m = IntervalMeter::new(1.0, 1000, 10.0);
        assert_eq!(m.observe(10.5, 100), None);
        // 1.1 s in: the first interval, 300 messages over 1.1 s.
        let a = m.observe(11.1, 300).unwrap();
        assert_eq!((a.messages, a.partial), (300, false));
        assert!(a.start_s == 0.0 && (a.end_s - 1.1).abs() < 1e-9, "{a:?}");
        assert!((a.bytes_per_sec - 300_000.0 / 1.1).abs() < 1e-6);
        // The next closes a period after the last one closed, not on a fixed grid.
        assert_eq!(m.observe(12.0, 500), None);
        let b = m.observe(12.2, 600).unwrap();
        assert_eq!(b.messages, 300);
        assert!((b.msg_rate_mpps - 300.0 / 1.1 / 1e6).abs() < 1e-12);
        // The end: a partial interval, left out of the statistics.
        let c = m.finish(12.5, 650).unwrap();
        assert!(c.partial && c.messages == 50);
        assert_eq!(m.finish(12.6, 650), None, "nothing more happened");
        let s = IntervalStats::of(&m.intervals).unwrap();
        assert_eq!(s.count, 2);
        assert!((s.min_bytes_per_sec - s.max_bytes_per_sec).abs() < 1e-6);
        assert!(interval_line(&c, false).ends_with("(partial)"));
    }

    #[test]
    fn interval_statistics() {
        let iv = |bps: f64, partial| Interval {
            start_s: 0.0,
            end_s: 1.0,
            messages: 1,
            bytes_per_sec: bps,
            msg_rate_mpps: bps / 1e6,
            partial,
        };
        assert_eq!(IntervalStats::of(&[]), None);
        let s = IntervalStats::of(&[
            iv(3.0, false),
            iv(1.0, false),
            iv(2.0, false),
            iv(9.0, true),
        ])
        .unwrap();
        assert_eq!(
            (
                s.count,
                s.min_bytes_per_sec,
                s.median_bytes_per_sec,
                s.max_bytes_per_sec
            ),
            (3, 1.0, 2.0, 3.0)
        );
        let s = IntervalStats::of(&[iv(4.0, false), iv(1.0, false)]).unwrap();
        assert_eq!(s.median_bytes_per_sec, 2.5);
        // Only a partial one: it counts.
        let s = IntervalStats::of(&[iv(5.0, true)]).unwrap();
        assert_eq!((s.count, s.median_bytes_per_sec), (1, 5.0));
        // The peak of a duration run is its best interval.
        let t = BandwidthTimes {
            posted: vec![0.0],
            completed: vec![(9, 2.0)],
        };
        let r = BandwidthResult::compute(100, &t, false)
            .unwrap()
            .with_intervals(&[iv(3.0, false), iv(7.0, false)]);
        assert_eq!(r.peak_bytes_per_sec, Some(7.0));
        assert_eq!(r.intervals.unwrap().count, 2);
    }
}
