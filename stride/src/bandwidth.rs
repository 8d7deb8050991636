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
}

fn in_unit(bytes_per_sec: f64, gbits: bool) -> f64 {
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
}
