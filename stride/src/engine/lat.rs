//! The latency loops, as perftest's `ib_*_lat` runs them.
//!
//! - WRITE: a ping-pong of RDMA WRITEs. Each side spins on the last byte of its receive half
//!   until it holds the expected counter, then writes the next counter value into the last
//!   byte of the peer's receive half with one signaled WRITE (inline when it fits). The
//!   server writes first. The spin reads host memory, so this test refuses GPU buffers (the
//!   parameter check says so) unless they are staged through host memory (`--staging`).
//! - SEND: the same ping-pong with SEND/RECV; the client sends first.
//! - READ and atomics: the client posts one operation, polls its completion, and repeats;
//!   the server only serves them.
//!
//! Each side timestamps every post; the samples are the intervals between consecutive posts
//! (one round trip each), halved for the ping-pongs ([`crate::latency`]).
//!
//! Duration mode (`-D`): the client stops at the deadline and says so on the out-of-band
//! channel; the server, waiting for a message that will not come, sees that and stops too.

use std::time::{Duration, Instant};

use sideway::completion_channel::CompletionChannel;
use sideway::completion_queue::{ClaimedCq, WorkCompletion};
use sideway::queue_pair::{PostSendGuard, QueuePair, SendFlags};

use sideway::memory_region::Sge;
use sideway::queue_pair::SendData;

use super::bw::{wr_op, Targets, WrOpOwned};
use super::completion::{op_name, wc_failed};
use super::dc::{DcOp, DcQps};
use super::error::RunError;
use super::setup::{local_data, remote_target, sleep_on, RemoteTarget, Resources};
use super::watch::Watch;
use crate::buffer::QpBuffers;
use crate::cli::Verb;
use crate::latency::LatencySummary;
use crate::oob::OobChannel;
use crate::params::TestParams;
use crate::post_clock::{PostClock, StampLog};
use crate::report::LatencyResult;

/// What a ping-pong posts on: its QP, or with `-c DC` its DC initiator (QP index 0).
enum LatQp<'r> {
    Qp(&'r mut QueuePair),
    Dc(&'r mut DcQps),
}

/// One signaled request of a ping-pong, for the QP or for the DC initiator.
enum LatOp<'a> {
    Qp(WrOpOwned<'a>),
    Dc(DcOp),
}

impl<'a> LatOp<'a> {
    /// `op` as the side's transport posts it.
    fn of(op: WrOpOwned<'a>, dc: bool) -> Result<Self, RunError> {
        Ok(if dc {
            LatOp::Dc(op.dc()?)
        } else {
            LatOp::Qp(op)
        })
    }
}

/// The waiting side of a latency loop: its completion queues and watchdog. The QP it posts
/// on is kept apart, so that a request can sit built in the QP's send guard while the loop
/// waits (see [`prepare`]).
struct PingPong<'r> {
    /// With `-c DC`: the shared queue the DC target receives through.
    srq: Option<&'r sideway::shared_receive_queue::SharedReceiveQueue>,
    /// Claimed for the whole run: polls take no claim of their own.
    send_cq: ClaimedCq,
    recv_cq: ClaimedCq,
    recv_sge: Sge,
    wcs: [WorkCompletion; 4],
    /// A signaled send not yet seen complete.
    outstanding: bool,
    watch: &'r mut Watch,
    duration_mode: bool,
    progress: u64,
    /// With `-e`: sleep on this channel instead of spinning.
    events: Option<&'r CompletionChannel>,
    /// Whether waits are for receives too (SEND).
    receives: bool,
    /// What the sends are, for error messages.
    send_op: &'static str,
    /// The ack timeout code (`-u`), for error messages.
    qp_timeout: u8,
}

/// How a wait ended.
enum Waited {
    /// What was waited for came.
    Came,
    /// The peer ended its part (duration mode).
    PeerDone,
}

impl PingPong<'_> {
    /// Posts `op` on `qp` as one signaled request (wr_id 0); `stamp` runs just before the
    /// doorbell.
    #[inline(always)]
    fn post(
        &mut self,
        qp: &mut LatQp<'_>,
        op: &LatOp<'_>,
        stamp: impl FnOnce(),
    ) -> Result<(), RunError> {
        match (qp, op) {
            (LatQp::Qp(qp), LatOp::Qp(op)) => {
                let mut guard = qp.start_post_send();
                op.push(&mut guard, 0, SendFlags::SIGNALED);
                stamp();
                guard.post()?;
            }
            (LatQp::Dc(dc), LatOp::Dc(op)) => dc.post(0, op, &[(0, SendFlags::SIGNALED)], stamp)?,
            _ => {
                return Err(RunError::new(
                    "internal error: an operation for another transport",
                ))
            }
        }
        self.outstanding = true;
        Ok(())
    }

    /// Reaps our send's completion if it is there.
    #[inline(always)]
    fn reap_send(&mut self) -> Result<bool, RunError> {
        if self.outstanding {
            let got = self.send_cq.poll_into(&mut self.wcs[..1])?;
            if got > 0 {
                if let Err(e) = self.wcs[0].ok() {
                    return Err(wc_failed(
                        &e,
                        self.send_op,
                        0,
                        self.progress + 1,
                        self.qp_timeout,
                    ));
                }
                self.outstanding = false;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until `ready()` holds and our last send is complete. A failed completion is
    /// explained by the watchdog (the peer's state first, then the link).
    #[inline(always)]
    fn wait(
        &mut self,
        oob: &mut OobChannel,
        ready: impl FnMut(&mut Self) -> Result<bool, RunError>,
    ) -> Result<Waited, RunError> {
        match self.wait_for(oob, ready) {
            Ok(w) => Ok(w),
            Err(e) => Err(self.watch.explain(oob, e)),
        }
    }

    /// [`PingPong::wait`] without the explanation of a failed completion.
    #[inline(always)]
    fn wait_for(
        &mut self,
        oob: &mut OobChannel,
        mut ready: impl FnMut(&mut Self) -> Result<bool, RunError>,
    ) -> Result<Waited, RunError> {
        let mut have = false;
        loop {
            let reaped = self.reap_send()?;
            // Whether `ready` turned true on this turn: progress, like a reaped send. A wait
            // whose `ready` holds from the start (READ, atomic) still goes through the
            // watchdog below while its send is outstanding: a dead peer must be noticed.
            let came = !have && {
                have = ready(self)?;
                have
            };
            if have && !self.outstanding {
                self.progress += 1;
                return Ok(Waited::Came);
            }
            if !reaped && !came {
                let spoke = self.watch.idle(oob, self.progress)?;
                if spoke && self.duration_mode {
                    self.drain(oob)?;
                    return Ok(Waited::PeerDone);
                }
                self.nap()?;
            }
        }
    }

    /// Waits for our last send to complete.
    fn drain(&mut self, oob: &mut OobChannel) -> Result<(), RunError> {
        while self.outstanding {
            let reaped = match self.reap_send() {
                Ok(r) => r,
                Err(e) => return Err(self.watch.explain(oob, e)),
            };
            if !reaped {
                self.watch.idle(oob, self.progress)?;
                self.nap()?;
            }
        }
        Ok(())
    }

    /// With `-e`, sleeps until a CQ waited on raises an event (or a short nap passes).
    fn nap(&self) -> Result<(), RunError> {
        if let Some(channel) = self.events {
            match (self.outstanding, self.receives) {
                (true, true) => sleep_on(channel, &[&**self.send_cq.cq(), &**self.recv_cq.cq()])?,
                (true, false) => sleep_on(channel, &[&**self.send_cq.cq()])?,
                (false, true) => sleep_on(channel, &[&**self.recv_cq.cq()])?,
                (false, false) => {}
            }
        }
        Ok(())
    }

    /// Takes one receive completion if there is one, and reposts the receive (on `qp`, or on
    /// the SRQ of a DC target).
    #[inline(always)]
    fn take_recv(&mut self, qp: &mut LatQp<'_>) -> Result<bool, RunError> {
        let got = self.recv_cq.poll_into(&mut self.wcs[1..2])?;
        if got == 0 {
            return Ok(false);
        }
        if let Err(e) = self.wcs[1].ok() {
            return Err(wc_failed(
                &e,
                "receive",
                0,
                self.progress + 1,
                self.qp_timeout,
            ));
        }
        match (self.srq, qp) {
            (Some(srq), _) => {
                let mut guard = srq.start_post_recv();
                guard.recv(0, &[self.recv_sge]);
                guard.post()?;
            }
            (None, LatQp::Qp(qp)) => {
                let mut guard = qp.start_post_recv();
                guard.recv(0, &[self.recv_sge]);
                guard.post()?;
            }
            (None, LatQp::Dc(_)) => {
                return Err(RunError::new(
                    "internal error: a DC side receives through its SRQ",
                ))
            }
        }
        Ok(true)
    }
}

/// `op` built into a send guard of `qp` as one signaled request (wr_id 0), checked and
/// written now, while the previous request is in flight or the peer's message is on its way:
/// when the wait ends, only the timestamp and the doorbell remain, as in perftest's loops
/// (which post a request they built before the run). On SoftRoCE that matters beyond the
/// instructions saved: a READ posted within about a microsecond of the previous completion
/// finds the QP's kernel task still running and hands the request over to it; one posted
/// later runs the task again inside its own system call, and the round trip takes ~15 µs
/// more in the emulated guest (perftest's own `--latency_gap=1` shows the same step).
#[inline(always)]
fn prepare<'q>(qp: &'q mut QueuePair, op: &WrOpOwned<'q>) -> PostSendGuard<'q> {
    let mut guard = qp.start_post_send();
    op.push(&mut guard, 0, SendFlags::SIGNALED);
    guard
}

/// What one size of a latency run works with: this side's resources, the test's parameters,
/// the channel to the peer, which side this is, the post stamps (`posted`, one of `stamps`
/// per post, with room for every iteration) and the watchdog.
pub(crate) struct LatSize<'a> {
    pub(crate) res: &'a mut Resources,
    pub(crate) params: &'a TestParams,
    pub(crate) oob: &'a mut OobChannel,
    pub(crate) is_client: bool,
    pub(crate) posted: &'a mut StampLog,
    pub(crate) stamps: &'a PostClock,
    pub(crate) watch: &'a mut Watch,
}

/// Runs one size.
/// Returns what this side measured: nothing on the server of READ and atomic tests.
///
/// The measured loops do as little per iteration as perftest's: a post's stamp is one TSC
/// reading where the kernel keeps time with the TSC ([`PostClock`]; the arithmetic that turns
/// stamps into microseconds runs after the loop), a WRITE's SGE is made once, before the
/// loop, and each request is built while the loop waits ([`prepare`]).
pub(crate) fn run_size(run: LatSize<'_>, size: u64) -> Result<Option<LatencyResult>, RunError> {
    let LatSize {
        res,
        params,
        oob,
        is_client,
        posted,
        stamps,
        watch,
    } = run;
    watch.start();
    posted.clear();
    let duration_mode = params.duration.is_some();
    let deadline = params
        .duration
        .map(|d| Instant::now() + Duration::from_secs(d));
    let iterations = if duration_mode {
        u64::MAX
    } else {
        params.iterations
    };
    let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
    let recv_sge = res.recv_sge(0);
    let Resources {
        qps,
        bufs,
        remotes,
        send_cq,
        recv_cq,
        half,
        inline,
        events,
        ahs,
        srq,
        dc,
        ..
    } = res;
    let half = *half;
    let inline = *inline;
    if bufs.qps() == 0 {
        return Err(RunError::usage("a latency test needs one QP"));
    }
    let staging = super::bw::Staging::of(bufs.is_staged(), params, size, half);
    let is_dc = dc.is_some();
    let mut qp = match (dc.as_mut(), qps.first_mut()) {
        (Some(dc), _) => LatQp::Dc(dc),
        (None, Some(qp)) => LatQp::Qp(qp),
        (None, None) => return Err(RunError::usage("a latency test needs one QP")),
    };
    let mut pp = PingPong {
        srq: srq.as_deref(),
        send_cq: send_cq.claim()?,
        recv_cq: recv_cq.claim()?,
        recv_sge,
        wcs: [WorkCompletion::default(); 4],
        outstanding: false,
        watch,
        duration_mode,
        progress: 0,
        events: events.as_deref(),
        receives: params.verb == Verb::Send,
        send_op: op_name(params.verb),
        qp_timeout: params.qp_timeout,
    };
    let rtt_factor = rtt_factor(params.verb);
    match params.verb {
        Verb::Write => {
            let last = usize::try_from(size - 1).unwrap_or(half - 1).min(half - 1);
            let RemoteTarget {
                rkey, addr: raddr, ..
            } = remote_target(remotes, 0, half)?;
            // The data of every WRITE: the same SGE each time, unless it is inline.
            let fixed_sge = match local_data(bufs.qp(0), half, inline, size, Verb::Write) {
                SendData::Sge(sge) => Some(sge),
                _ => None,
            };
            let mut i = 0u64;
            // --staging: the message comes from the GPU before each WRITE, and what landed
            // goes to it once the counter says it is all there.
            let landed = |bufs: &QpBuffers| match staging.before_post {
                Some(len) => bufs.qp(0).stage_to_gpu(half..half + len),
                None => Ok(()),
            };
            // Each turn: our previous WRITE complete (it reads the buffer the counter goes
            // into), the next one's counter written and its request built, then the wait
            // for the peer's message, and the doorbell. The server writes first, and waits
            // for the peer's answer to its last WRITE after the loop.
            let mut stopped = false;
            while i < iterations {
                let value = (i as u8).wrapping_add(1);
                pp.drain(oob)?;
                if let Some(len) = staging.before_post {
                    bufs.qp(0).stage_from_gpu(0..len)?;
                }
                bufs.qp_mut(0).poke(last, value)?;
                let data = match fixed_sge {
                    Some(sge) => SendData::Sge(sge),
                    None => local_data(bufs.qp(0), half, inline, size, Verb::Write),
                };
                let op = WrOpOwned::write(rkey, raddr, data);
                let expect = match (is_client, i) {
                    (true, _) => Some(value),
                    (false, 0) => None,
                    (false, _) => Some(i as u8),
                };
                // The peer's message, when one is due; false when the run ends here.
                let mut peer = |pp: &mut PingPong<'_>| -> Result<bool, RunError> {
                    if expect.is_none() {
                        return Ok(true);
                    }
                    let came = pp.wait(oob, |_| Ok(bufs.qp(0).peek(half + last) == expect))?;
                    if matches!(came, Waited::PeerDone) || (is_client && past_deadline()) {
                        return Ok(false);
                    }
                    landed(bufs)?;
                    Ok(true)
                };
                match &mut qp {
                    LatQp::Qp(q) => {
                        let guard = prepare(q, &op);
                        if !peer(&mut pp)? {
                            stopped = true;
                            break;
                        }
                        posted.push(stamps.now());
                        guard.post()?;
                        pp.outstanding = true;
                    }
                    LatQp::Dc(_) => {
                        if !peer(&mut pp)? {
                            stopped = true;
                            break;
                        }
                        let op = LatOp::of(op, true)?;
                        pp.post(&mut qp, &op, || posted.push(stamps.now()))?;
                    }
                }
                i += 1;
            }
            if !is_client && !stopped && i > 0 {
                let value = ((i - 1) as u8).wrapping_add(1);
                let came = pp.wait(oob, |_| Ok(bufs.qp(0).peek(half + last) == Some(value)))?;
                if matches!(came, Waited::Came) {
                    landed(bufs)?;
                }
            }
        }
        Verb::Send => {
            let targets = Targets {
                bufs,
                ahs,
                remotes,
                half,
                inline,
            };
            let op = LatOp::of(wr_op(&targets, 0, size, params)?, is_dc)?;
            let mut i = 0u64;
            while i < iterations {
                if !is_client {
                    let came = pp.wait(oob, |p| p.take_recv(&mut qp))?;
                    if matches!(came, Waited::PeerDone) {
                        break;
                    }
                    if let Some(len) = staging.after_receive {
                        bufs.qp(0).stage_to_gpu(half..half + len)?;
                    }
                }
                if let Some(len) = staging.before_post {
                    bufs.qp(0).stage_from_gpu(0..len)?;
                }
                pp.post(&mut qp, &op, || posted.push(stamps.now()))?;
                if is_client {
                    let came = pp.wait(oob, |p| p.take_recv(&mut qp))?;
                    if matches!(came, Waited::PeerDone) || past_deadline() {
                        break;
                    }
                    if let Some(len) = staging.after_receive {
                        bufs.qp(0).stage_to_gpu(half..half + len)?;
                    }
                }
                i += 1;
            }
        }
        Verb::Read | Verb::Atomic => {
            if !is_client {
                return Ok(None);
            }
            let targets = Targets {
                bufs,
                ahs,
                remotes,
                half,
                inline,
            };
            let op = wr_op(&targets, 0, size, params)?;
            let mut i = 0u64;
            match &mut qp {
                LatQp::Qp(q) => {
                    // The next request is built while this one is in flight (see prepare) on
                    // a classic QP, where it waits in sideway's own storage. An extended QP's
                    // request goes into the provider's send queue as it is built, and at TX
                    // depth 1 the one in flight holds the only slot: built after the wait.
                    if q.is_extended() {
                        while i < iterations && !past_deadline() {
                            let guard = prepare(q, &op);
                            posted.push(stamps.now());
                            guard.post()?;
                            pp.outstanding = true;
                            i += 1;
                            pp.wait(oob, |_| Ok(true))?;
                            if let Some(len) = staging.after_completion {
                                bufs.qp(0).stage_to_gpu(0..len)?;
                            }
                        }
                    } else if i < iterations && !past_deadline() {
                        let mut guard = prepare(q, &op);
                        loop {
                            posted.push(stamps.now());
                            guard.post()?;
                            pp.outstanding = true;
                            i += 1;
                            let next = if i < iterations && !past_deadline() {
                                Some(prepare(q, &op))
                            } else {
                                None
                            };
                            pp.wait(oob, |_| Ok(true))?;
                            if let Some(len) = staging.after_completion {
                                bufs.qp(0).stage_to_gpu(0..len)?;
                            }
                            match next {
                                Some(g) => guard = g,
                                None => break,
                            }
                        }
                    }
                }
                LatQp::Dc(_) => {
                    let op = LatOp::of(op, true)?;
                    while i < iterations && !past_deadline() {
                        pp.post(&mut qp, &op, || posted.push(stamps.now()))?;
                        pp.wait(oob, |_| Ok(true))?;
                        if let Some(len) = staging.after_completion {
                            bufs.qp(0).stage_to_gpu(0..len)?;
                        }
                        i += 1;
                    }
                }
            }
        }
    }
    pp.drain(oob)?;
    latency_result(size, posted, stamps, rtt_factor).map(Some)
}

/// How many one-way trips a sample spans: a ping-pong's (WRITE, SEND) round trip is two,
/// and is halved; a READ's or atomic's is its own.
fn rtt_factor(verb: Verb) -> f64 {
    match verb {
        Verb::Write | Verb::Send => 2.0,
        Verb::Read | Verb::Atomic => 1.0,
    }
}

/// A size's result from its post stamps: the intervals between them, in microseconds (the
/// arithmetic the loop left out), and their statistics.
fn latency_result(
    size: u64,
    posted: &StampLog,
    stamps: &PostClock,
    rtt_factor: f64,
) -> Result<LatencyResult, RunError> {
    let kept = posted.kept();
    if posted.total() > kept.len() as u64 {
        eprintln!(
            "stride-perf: {size} B: the statistics are those of the first {} of the {} \
             iterations (a -D run keeps at most {} post stamps)",
            kept.len(),
            posted.total(),
            posted.cap()
        );
    }
    let mut intervals = stamps
        .intervals_us(kept)
        .map_err(|e| RunError::new(e.to_string()))?;
    let summary = LatencySummary::from_samples(&mut intervals, rtt_factor)?;
    Ok(LatencyResult {
        bytes: size,
        iterations: posted.total(),
        summary,
    })
}
