//! The link under a run: the device's async events, and how long the transport keeps trying.
//!
//! An RC requester whose packets go unacknowledged resends them after the ack timeout
//! (4.096 µs × 2^`-u`), `retry_cnt` (7) times, then fails the work request with "transport
//! retry counter exceeded". That is how the side that posts learns that the link or the peer
//! is gone, and [`retry_budget_text`] puts the numbers into its error. The other side of a
//! one-sided test posts nothing and would learn nothing; it watches the device's async
//! events instead: a port that goes down is reported at once, one that comes back too, and
//! one that stays down longer than the peer's retry budget (plus slack) ends the run, since
//! the peer's operations have failed by then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::async_event::{AsyncEventKind, AsyncEventObject};
use sideway::device::DeviceContext;

use super::error::RunError;
use crate::params::TestParams;

/// The transport retries stride's QPs make (`retry_cnt`, the verbs' usual 7).
pub(crate) const RETRY_CNT: u8 = 7;

/// How long a requester keeps resending an unacknowledged packet: `retry_cnt` resends after
/// the first try, each after the ack timeout. `None` for `-u 0` (no timeout: for ever).
pub(crate) fn retry_budget(qp_timeout: u8) -> Option<Duration> {
    if qp_timeout == 0 {
        return None;
    }
    let ack = Duration::from_nanos(4096).checked_mul(1u32.checked_shl(u32::from(qp_timeout))?)?;
    ack.checked_mul(u32::from(RETRY_CNT) + 1)
}

/// A duration as a person reads it: "537 ms", "2.1 s", "35 min".
fn show(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{} ms", d.as_millis())
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} min", s / 60.0)
    }
}

/// The retry budget in words, for errors: "about 537 ms (the first try and 7 resends, each
/// after a 67 ms ack timeout: -u 14)".
pub(crate) fn retry_budget_text(qp_timeout: u8) -> String {
    match retry_budget(qp_timeout) {
        Some(total) => format!(
            "about {} (the first try and {RETRY_CNT} resends, each after a {} ack timeout: \
             -u {qp_timeout})",
            show(total),
            show(total / (u32::from(RETRY_CNT) + 1))
        ),
        None => "for ever (-u 0: no ack timeout)".to_owned(),
    }
}

/// How long a port may stay down before the passive side gives up: the peer's budget, as
/// long again for the ack timer's allowed imprecision and the events' delivery, and 2 s.
fn down_limit(qp_timeout: u8) -> Option<Duration> {
    retry_budget(qp_timeout).map(|b| b * 2 + Duration::from_secs(2))
}

/// Watches one device port's async events during a run.
pub(crate) struct LinkWatch {
    ctx: Arc<DeviceContext>,
    port: u8,
    qp_timeout: u8,
    /// When the port went down, while it is down.
    down_since: Option<Instant>,
}

impl LinkWatch {
    /// A watch on `port` of `ctx` for a run of `params`.
    pub(crate) fn new(ctx: Arc<DeviceContext>, port: u8, params: &TestParams) -> Self {
        LinkWatch {
            ctx,
            port,
            qp_timeout: params.qp_timeout,
            down_since: None,
        }
    }

    /// The device's async event descriptor: readable when an event is pending.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ctx.as_fd()
    }

    /// Takes every pending async event: reports port changes on stderr; fails on a device
    /// or QP failure, and on a port that has stayed down past the peer's retry budget.
    #[cold]
    pub(crate) fn check(&mut self) -> Result<(), RunError> {
        while let Some(event) = self.ctx.try_get_async_event()? {
            let ours = match event.object() {
                AsyncEventObject::Port(p) => *p == self.port,
                _ => true,
            };
            if !ours {
                continue;
            }
            let name = self.ctx.name().to_owned();
            match event.kind() {
                AsyncEventKind::PortErr => {
                    self.down_since.get_or_insert_with(Instant::now);
                    eprintln!(
                        "stride-perf: {name} port {}: the link went down (port error); the \
                         peer's transport retries for {}",
                        self.port,
                        retry_budget_text(self.qp_timeout)
                    );
                }
                AsyncEventKind::PortActive => {
                    let after = self
                        .down_since
                        .take()
                        .map(|t| format!(" after {}", show(t.elapsed())))
                        .unwrap_or_default();
                    eprintln!(
                        "stride-perf: {name} port {}: the link is up again{after} (port active)",
                        self.port
                    );
                }
                AsyncEventKind::DeviceFatal => {
                    return Err(RunError::link(format!(
                        "{name} failed (device fatal event): the device must be reset or its \
                         driver reloaded"
                    )));
                }
                AsyncEventKind::QpFatal
                | AsyncEventKind::QpReqErr
                | AsyncEventKind::QpAccessErr
                | AsyncEventKind::CqErr => {
                    return Err(RunError::link(format!(
                        "{name}: {event}: a queue of this run failed outside any completion; \
                         the peer or the link is the likely cause, see its output"
                    )));
                }
                other => eprintln!("stride-perf: {name}: {other} ({event})"),
            }
        }
        if let (Some(since), Some(limit)) = (self.down_since, down_limit(self.qp_timeout)) {
            if since.elapsed() > limit {
                return Err(RunError::link(format!(
                    "the link of {} port {} went down {} ago and is still down: longer than \
                     the peer keeps resending, {}, so its operations have failed; check the \
                     cable, the switch or the peer's interface",
                    self.ctx.name(),
                    self.port,
                    show(since.elapsed()),
                    retry_budget_text(self.qp_timeout)
                )));
            }
        }
        Ok(())
    }
}

impl LinkWatch {
    /// After a failed completion: `e` with what the device said about the link, if its port
    /// went down (a port going down moves the QPs to the error state on some devices, and
    /// the completions then say only "flushed"). Waits at most 100 ms for the port event,
    /// which may trail the completion.
    #[cold]
    pub(crate) fn explain(&mut self, e: RunError) -> RunError {
        let deadline = Instant::now() + Duration::from_millis(100);
        while self.down_since.is_none() && Instant::now() < deadline {
            // An error here (a fatal event) is the better explanation.
            if let Err(fatal) = self.check() {
                return e.map_text(|t| format!("{t}; meanwhile {fatal}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match self.down_since {
            Some(t) => e.map_text(|text| {
                format!(
                    "{text}; {} port {} went down {} before: the link is the likely cause",
                    self.ctx.name(),
                    self.port,
                    show(t.elapsed())
                )
            }),
            None => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_follows_the_ack_timeout() {
        // 4.096 µs × 2^14 = 67.1 ms, eight tries: 537 ms.
        assert_eq!(retry_budget(14), Some(Duration::from_nanos(4096 << 14) * 8));
        assert_eq!(
            retry_budget_text(14),
            "about 536 ms (the first try and 7 resends, each after a 67 ms ack timeout: -u 14)"
        );
        assert_eq!(retry_budget(0), None);
        assert!(retry_budget_text(0).contains("for ever"));
        // The largest code, 31: 2.4 hours per try.
        assert_eq!(
            retry_budget(31),
            Some(Duration::from_nanos(4096) * (1 << 31) * 8)
        );
        assert!(
            retry_budget_text(31).ends_with(
                "min (the first try and 7 resends, each after a 147 min ack timeout: -u 31)"
            ),
            "{}",
            retry_budget_text(31)
        );
        assert_eq!(
            down_limit(14),
            Some(Duration::from_nanos(4096 << 14) * 16 + Duration::from_secs(2))
        );
    }
}
