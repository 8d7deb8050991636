//! Waiting for completions: spinning on the CQ or sleeping on its channel, and `-t`'s
//! receive clock.

use super::*;

/// `-t`: the clock cycles between consecutive receive completions, as `ibv_rc_pingpong`
/// counts them (the first receive only starts the count; a clock that wrapped is unwrapped
/// with the device's timestamp mask).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecvClock {
    pub(super) mask: u64,
    pub(super) prev: Option<u64>,
    pub(super) max: u64,
    pub(super) min: u64,
    pub(super) total: u64,
    pub(super) count: u64,
}

impl RecvClock {
    /// A count for a device whose timestamps have `mask` valid bits.
    pub fn new(mask: u64) -> Self {
        RecvClock {
            mask,
            prev: None,
            max: 0,
            // ibv_rc_pingpong's starting minimum.
            min: 0xffff_ffff,
            total: 0,
            count: 0,
        }
    }

    /// A receive completed at `ts`.
    pub fn receive(&mut self, ts: u64) {
        if let Some(prev) = self.prev {
            let delta = if ts >= prev {
                ts - prev
            } else {
                self.mask
                    .wrapping_sub(prev)
                    .wrapping_add(ts)
                    .wrapping_add(1)
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total = self.total.wrapping_add(delta);
            self.count += 1;
        }
        self.prev = Some(ts);
    }

    /// The lines `ibv_rc_pingpong -t` prints after the run; none before two receives.
    pub fn lines(&self) -> Vec<String> {
        if self.count == 0 {
            return Vec::new();
        }
        vec![
            format!("Max receive completion clock cycles = {}", self.max),
            format!("Min receive completion clock cycles = {}", self.min),
            format!(
                "Average receive completion clock cycles = {:.6}",
                self.total as f64 / self.count as f64
            ),
        ]
    }
}

/// How a side waits for completions: spinning on its CQ, or (`-e`) sleeping on the CQ's
/// completion channel.
pub(super) struct Waiter {
    pub(super) cq: Arc<CompletionQueue>,
    /// `-t`: each completion's timestamp is read into `stamps`.
    pub(super) timestamps: bool,
    /// The timestamps of the completions the last `wait` returned (`-t` only).
    pub(super) stamps: [u64; 2],
    /// The CQ claimed once for the whole run, so its polls take no claim each.
    pub(super) polls: ClaimedCq,
    pub(super) channel: Option<Arc<CompletionChannel>>,
    pub(super) stall: Duration,
    /// The run's transport and `-n`, which the stall message names.
    pub(super) transport: QpType,
    pub(super) iters: u64,
}

impl Waiter {
    /// Creates the CQ (extended with `-N`) and, with `-e`, its channel, armed.
    pub(super) fn new(
        ctx: &Arc<DeviceContext>,
        cqe: u32,
        args: &PingpongArgs,
        transport: QpType,
    ) -> Result<Self, CliError> {
        let channel = if args.events {
            Some(ctx.create_comp_channel().map_err(CliError::run)?)
        } else {
            None
        };
        let mut builder = ctx.create_cq_builder();
        builder.cqe(cqe);
        if let Some(ch) = &channel {
            builder.channel(ch);
        }
        let timestamps = args.memory.timestamps;
        if timestamps {
            builder.wc_flags(WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP);
        }
        let cq = if args.new_send || timestamps {
            builder.build_ex()
        } else {
            builder.build()
        }
        .map_err(CliError::run)?;
        if channel.is_some() {
            cq.req_notify(false).map_err(CliError::run)?;
        }
        Ok(Waiter {
            polls: cq.claim().map_err(CliError::run)?,
            cq,
            timestamps,
            stamps: [0; 2],
            channel,
            stall: Duration::from_secs(args.stall_timeout),
            transport,
            iters: args.iters,
        })
    }

    /// Waits until at least one completion is in `wcs` and returns how many. Polls before
    /// every sleep and re-arms after every event, so none is missed. Fails when nothing
    /// comes for the stall timeout; `progress` says how far the run got.
    pub(super) fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError> {
        let started = Instant::now();
        let stall = self.stall;
        let (transport, iters) = (self.transport, self.iters);
        let stalled = || CliError::run(stall_message(stall, &progress(), transport, iters));
        loop {
            let n = if self.timestamps {
                self.poll_stamped(wcs)?
            } else {
                self.polls.poll_into(wcs).map_err(CliError::run)?
            };
            if n > 0 {
                return Ok(n);
            }
            let left = self.stall.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(stalled());
            }
            match &self.channel {
                Some(ch) => match ch.get_cq_event(Some(left)) {
                    Ok(cq) => cq.req_notify(false).map_err(CliError::run)?,
                    Err(EventError::Timeout { .. }) => return Err(stalled()),
                    Err(e) => return Err(CliError::run(e)),
                },
                None => std::hint::spin_loop(),
            }
        }
    }
}

impl Waiter {
    /// Polls up to `wcs.len()` (at most 2) completions with their timestamps into `stamps`.
    pub(super) fn poll_stamped(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, CliError> {
        let mut poller = self.polls.poll().map_err(CliError::run)?;
        let mut n = 0;
        while n < wcs.len().min(self.stamps.len()) {
            match poller.next_completion().map_err(CliError::run)? {
                Some(wc) => {
                    wcs[n] = wc;
                    self.stamps[n] = poller.completion_timestamp().unwrap_or(0);
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}
