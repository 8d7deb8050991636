//! The rate limiter of `--rate-limit` (perftest's software limiter, `--rate_limit_type SW`):
//! a schedule of bursts that the sender's measured loop consults before each post.
//!
//! Burst `k` may start at `t0 + k × burst / rate`. A post that comes late does not move the
//! schedule, so small delays (a poll, a clock read) cost nothing over a run: the next burst
//! is still due on time, and the average lands on the target. A sender that was held up (a
//! descheduled thread, a full send queue) catches up, but by at most 100 ms worth of
//! messages (or one burst period, if longer): one that falls further behind is limited by
//! the link or the host, not the limiter, and the schedule restarts from that moment
//! instead of flooding the link to pay the whole debt.

/// The most time a late sender may catch up on, in seconds.
const MAX_DEBT: f64 = 0.1;

/// The sender's pace.
#[derive(Debug, Clone)]
pub struct Pacer {
    period: f64,
    burst: u64,
    slack: f64,
    next: f64,
    left: u64,
}

impl Pacer {
    /// A pacer of `messages_per_sec` in bursts of `burst` messages, the first due at `t0`
    /// (seconds on the loop's clock).
    pub fn new(messages_per_sec: f64, burst: u32, t0: f64) -> Self {
        let burst = u64::from(burst.max(1));
        let period = burst as f64 / messages_per_sec;
        Pacer {
            period,
            burst,
            slack: period.max(MAX_DEBT),
            next: t0,
            left: 0,
        }
    }

    /// Whether `batch` messages (at most a burst) may be posted at time `t`. When it says
    /// yes, the caller posts them and calls [`Pacer::posted`].
    #[inline]
    pub fn may_post(&mut self, t: f64, batch: u64) -> bool {
        while self.left < batch {
            if t < self.next {
                return false;
            }
            if t - self.next > self.slack {
                self.next = t;
            }
            self.next += self.period;
            self.left += self.burst;
        }
        true
    }

    /// `batch` messages were posted.
    #[inline]
    pub fn posted(&mut self, batch: u64) {
        self.left = self.left.saturating_sub(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates a sender that tries to post every `step` seconds for `until` seconds and
    /// returns the post times.
    fn simulate(p: &mut Pacer, step: f64, until: f64, batch: u64) -> Vec<f64> {
        let mut t = 0.0;
        let mut out = Vec::new();
        while t < until {
            while p.may_post(t, batch) {
                p.posted(batch);
                for _ in 0..batch {
                    out.push(t);
                }
            }
            t += step;
        }
        out
    }

    #[test]
    fn the_average_lands_on_the_target_despite_late_posts() {
        // 10,000 messages/s, looked at every 7 µs (never exactly on time): 1 s gives
        // 10,000 messages, not fewer.
        let mut p = Pacer::new(10_000.0, 1, 0.0);
        let posts = simulate(&mut p, 7e-6, 1.0, 1);
        assert!((posts.len() as i64 - 10_000).abs() <= 1, "{}", posts.len());
        // One at a time: never two within a tenth of the period.
        assert!(posts.windows(2).all(|w| w[1] - w[0] > 1e-5 * 0.1));
    }

    #[test]
    fn bursts_go_back_to_back() {
        let mut p = Pacer::new(1000.0, 10, 0.0);
        let posts = simulate(&mut p, 1e-6, 0.05, 2);
        // 50 ms at 1000/s: 5 bursts of 10 (due at 0, 10, 20, 30, 40 ms).
        assert_eq!(posts.len(), 50);
        assert!(posts[..10].iter().all(|&t| t == posts[0]));
        assert!((posts[10] - 0.01).abs() < 2e-6, "{}", posts[10]);
    }

    #[test]
    fn a_slow_link_restarts_the_schedule_instead_of_flooding() {
        let mut p = Pacer::new(1000.0, 1, 0.0);
        assert!(p.may_post(0.0, 1));
        p.posted(1);
        // Held up for 50 ms (a descheduled thread): it catches up, 50 messages at once.
        let mut n = 0;
        while p.may_post(0.0505, 1) {
            p.posted(1);
            n += 1;
        }
        assert_eq!(n, 50);
        // Held up for a second (a slow link): one message now, not a thousand.
        let mut n = 0;
        while p.may_post(1.05, 1) {
            p.posted(1);
            n += 1;
        }
        assert_eq!(n, 1);
        assert!(!p.may_post(1.0505, 1));
        assert!(p.may_post(1.0512, 1));
    }
}
