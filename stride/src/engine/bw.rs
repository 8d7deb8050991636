//! The bandwidth loop, as perftest's `ib_*_bw` runs it.
//!
//! The sending side keeps at most `tx_depth` work requests outstanding per QP, posts
//! `post_list` of them per doorbell, and signals one in `cq_mod` (and the last one, and the
//! last of a batch when the unsignaled run would otherwise block the queue). It timestamps
//! each post and each signaled completion into arrays allocated before the run; nothing in
//! the loop allocates. A receiving side (SEND tests) reposts each receive as it completes,
//! while the messages still to come need it (the rest after the run, as perftest), and
//! timestamps each receive completion.
//!
//! Duration mode (`-D`, and `--run-infinitely` until a signal or the peer ends it) posts
//! until the deadline, then one last signaled message per QP so that every unsignaled
//! request before it is accounted for; it keeps only the first post and the last
//! completion. Unlike perftest, it measures the whole duration rather than a window after a
//! warm-up, prints every reporting interval as it closes, and reports the best interval as
//! the peak (perftest reports none).
//!
//! With `--rate-limit`, the sender asks the [`Pacer`] before each post list.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::address_handle::AddressHandle;
use sideway::completion_queue::WorkCompletion;
use sideway::memory_region::Sge;
use sideway::queue_pair::{SendData, SendFlags};

use super::completion::{op_name, wc_failed};
use super::dc::{DcOp, DcQps};
use super::error::RunError;
use super::interrupt::stop_requested;
use super::setup::{
    local_data, remote_target, sleep_on, RemoteTarget, Resources, QP_INDEX_MASK, UD_QKEY,
};
use super::watch::{Watch, STALL};
use crate::bandwidth::{interval_line, BandwidthResult, BandwidthTimes, Interval, IntervalMeter};
use crate::buffer::QpBuffers;
use crate::cli::{AtomicType, Connection, Verb};
use crate::oob::{OobChannel, QpEndpoint};
use crate::pacing::Pacer;
use crate::params::TestParams;

/// What one side does in a bandwidth run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BwRole {
    /// Posts the measured operations.
    pub(crate) sends: bool,
    /// Receives the peer's SENDs.
    pub(crate) receives: bool,
    /// Prints intervals in Gb/s (else MiB/s).
    pub(crate) gbits: bool,
}

/// The operation of one QP's work requests.
#[derive(Clone, Copy)]
enum WrOp<'a> {
    Write(u32, u64, SendData<'a>),
    Read(u32, u64, SendData<'a>),
    Send(SendData<'a>, Option<(&'a AddressHandle, u32)>),
    FetchAdd(u32, u64, Sge),
    CmpSwap(u32, u64, Sge),
}

/// `--staging`: the bytes copied between the GPU and host memory around each message, in
/// the measured loop. The targets of one-sided operations, which see no event, are staged
/// once per size outside it ([`Resources::stage_targets_from_gpu`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Staging {
    /// Copied from the GPU before each WRITE or SEND is posted: the message.
    pub(super) before_post: Option<usize>,
    /// Copied to the GPU after each READ or atomic completes: what it fetched.
    pub(super) after_completion: Option<usize>,
    /// Copied to the GPU after each receive completes: the receive half's first bytes (with
    /// UD's GRH in front of the message).
    pub(super) after_receive: Option<usize>,
}

impl Staging {
    /// What `size`-byte messages stage in buffers of `half`-byte halves, when they are
    /// `staged`; nothing otherwise.
    pub(super) fn of(staged: bool, params: &TestParams, size: u64, half: usize) -> Self {
        if !staged {
            return Staging::default();
        }
        let message = usize::try_from(size).unwrap_or(half).min(half);
        let grh = if params.connection == Connection::Ud {
            sideway::address_handle::GRH_LEN
        } else {
            0
        };
        Staging {
            before_post: matches!(params.verb, Verb::Write | Verb::Send).then_some(message),
            after_completion: match params.verb {
                Verb::Read => Some(message),
                Verb::Atomic => Some(8),
                Verb::Write | Verb::Send => None,
            },
            after_receive: (params.verb == Verb::Send).then_some((message + grh).min(half)),
        }
    }
}

/// How long a receiver keeps draining after the sender said it is done.
const DRAIN: Duration = Duration::from_millis(50);

/// What the work requests of every QP point at: local buffers, the peer's QPs, and (UD) the
/// address handles that reach them.
pub(super) struct Targets<'a> {
    pub(super) bufs: &'a QpBuffers,
    pub(super) ahs: &'a [Arc<AddressHandle>],
    pub(super) remotes: &'a [QpEndpoint],
    pub(super) half: usize,
    pub(super) inline: u32,
}

/// Builds QP `q`'s operation for `size`-byte messages; fails when the peer sent no usable
/// endpoint for it.
pub(super) fn wr_op<'a>(
    t: &Targets<'a>,
    q: usize,
    size: u64,
    params: &TestParams,
) -> Result<WrOpOwned<'a>, RunError> {
    // The peer's operations target the second half of its buffer.
    let RemoteTarget {
        rkey,
        addr: raddr,
        qpn,
    } = remote_target(t.remotes, q, t.half)?;
    let buf = t.bufs.qp(q);
    let data = local_data(buf, t.half, t.inline, size, params.verb);
    // half >= 64 bytes by construction: the first 8 always exist.
    let sge8 = buf.sge(0..8).expect("a buffer half holds at least 8 bytes");
    let ud = t.ahs.get(q).map(|ah| (&**ah, qpn));
    Ok(WrOpOwned(match params.verb {
        Verb::Write => WrOp::Write(rkey, raddr, data),
        Verb::Read => WrOp::Read(rkey, raddr, data),
        Verb::Send => WrOp::Send(data, ud),
        Verb::Atomic if params.atomic_type == AtomicType::FetchAndAdd => {
            WrOp::FetchAdd(rkey, raddr, sge8)
        }
        Verb::Atomic => WrOp::CmpSwap(rkey, raddr, sge8),
    }))
}

/// A QP's operation, ready to post.
#[derive(Clone, Copy)]
pub(super) struct WrOpOwned<'a>(WrOp<'a>);

impl<'a> WrOpOwned<'a> {
    /// Adds one work request of this operation to `guard`.
    #[inline(always)]
    pub(super) fn push(
        &self,
        guard: &mut sideway::queue_pair::PostSendGuard<'a>,
        wr_id: u64,
        flags: SendFlags,
    ) {
        let wr = guard.wr(wr_id, flags);
        match self.0 {
            WrOp::Write(rkey, addr, data) => {
                wr.rdma_write(rkey, addr, data);
            }
            WrOp::Read(rkey, addr, data) => {
                wr.rdma_read(rkey, addr, data);
            }
            WrOp::Send(data, None) => {
                wr.send(data);
            }
            WrOp::Send(data, Some((ah, qpn))) => {
                wr.ud_addr(ah, qpn, UD_QKEY).send(data);
            }
            WrOp::FetchAdd(rkey, addr, sge) => {
                wr.atomic_fetch_add(rkey, addr, 1, sge);
            }
            WrOp::CmpSwap(rkey, addr, sge) => {
                wr.atomic_cmp_swp(rkey, addr, 0, 0, sge);
            }
        }
    }
}

impl<'a> WrOpOwned<'a> {
    /// An RDMA WRITE of `data` to `addr` under `rkey`.
    pub(super) fn write(rkey: u32, addr: u64, data: SendData<'a>) -> Self {
        WrOpOwned(WrOp::Write(rkey, addr, data))
    }

    /// The same operation for a DC initiator, which posts from one registered entry (the
    /// run never gives DC inline data).
    pub(super) fn dc(&self) -> Result<DcOp, RunError> {
        let entry = |data: SendData<'_>| match data {
            SendData::Sge(sge) => Ok(sge),
            _ => Err(RunError::new(
                "internal error: a DC request must post from one registered entry",
            )),
        };
        Ok(match self.0 {
            WrOp::Write(rkey, addr, data) => DcOp::Write {
                rkey,
                addr,
                sge: entry(data)?,
            },
            WrOp::Read(rkey, addr, data) => DcOp::Read {
                rkey,
                addr,
                sge: entry(data)?,
            },
            WrOp::Send(data, _) => DcOp::Send(entry(data)?),
            WrOp::FetchAdd(rkey, addr, sge) => DcOp::FetchAdd { rkey, addr, sge },
            WrOp::CmpSwap(rkey, addr, sge) => DcOp::CmpSwap { rkey, addr, sge },
        })
    }
}

/// Where a side posts its measured operations: its QPs (RC, UC, UD), or with `-c DC` its DC
/// initiators.
pub(super) enum Senders<'r, 'a> {
    Qps(
        &'r mut [sideway::queue_pair::QueuePair],
        &'r [WrOpOwned<'a>],
    ),
    Dc(&'r mut DcQps, Vec<DcOp>),
}

impl<'a> Senders<'_, 'a> {
    /// Posts on QP `q` one request per `(wr_id, flags)` of `wrs` with one doorbell; `stamp`
    /// runs once they are built, just before the doorbell.
    #[inline(always)]
    pub(super) fn post(
        &mut self,
        q: usize,
        wrs: &[(u64, SendFlags)],
        stamp: impl FnOnce(),
    ) -> Result<(), RunError> {
        match self {
            Senders::Qps(qps, ops) => {
                let (Some(qp), Some(op)) = (qps.get_mut(q), ops.get(q)) else {
                    return Err(RunError::new(format!(
                        "internal error: no QP {q} to post on"
                    )));
                };
                let mut guard = qp.start_post_send();
                for &(wr_id, flags) in wrs {
                    op.push(&mut guard, wr_id, flags);
                }
                stamp();
                guard.post()?;
                Ok(())
            }
            Senders::Dc(dc, ops) => {
                let op = *ops.get(q).ok_or_else(|| {
                    RunError::new(format!("internal error: no DC operation for QP {q}"))
                })?;
                dc.post(q, &op, wrs, stamp)
            }
        }
    }
}

/// Per-QP counters of the sending side.
#[derive(Debug, Clone, Copy, Default)]
struct QpCount {
    /// Messages posted.
    posted: u64,
    /// Messages known complete.
    completed: u64,
    /// `posted` at the last signaled message.
    signaled: u64,
    /// Messages to post in all.
    target: u64,
}

/// The error to report for a failed send completion `e`. A flushed completion names no
/// cause, and the one that moved the QP to the error state (a transport retry failure, say)
/// may come after it in the queue: looks among `rest` (the batch polled with `e`) and then in
/// `cq` for at most 100 ms for a completion that failed with another status.
#[cold]
fn first_cause(
    e: sideway::completion_queue::WorkCompletionError,
    rest: &[WorkCompletion],
    cq: &mut sideway::completion_queue::ClaimedCq,
) -> sideway::completion_queue::WorkCompletionError {
    if e.status != sideway::completion_queue::WcStatus::WrFlushErr {
        return e;
    }
    let cause = |wc: &WorkCompletion| {
        wc.ok()
            .err()
            .filter(|c| c.status != sideway::completion_queue::WcStatus::WrFlushErr)
    };
    if let Some(c) = rest.iter().find_map(cause) {
        return c;
    }
    let deadline = Instant::now() + Duration::from_millis(100);
    let mut more = [WorkCompletion::default(); 32];
    while Instant::now() < deadline {
        let n = cq.poll_into(&mut more).unwrap_or(0);
        if let Some(c) = more[..n].iter().find_map(cause) {
            return c;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    e
}

/// `--perform-warm-up`: posts `per_qp` signaled messages on every QP (the send CQ holds
/// -t per QP) and waits for all of them, within the stall limit.
fn warm_up(
    senders: &mut Senders<'_, '_>,
    n: usize,
    cq: &mut sideway::completion_queue::ClaimedCq,
    wcs: &mut [WorkCompletion],
    per_qp: u64,
    params: &TestParams,
) -> Result<(), RunError> {
    // Outside the measured loop: one list per warm-up.
    let per = usize::try_from(per_qp).unwrap_or(usize::MAX);
    for q in 0..n {
        let wrs = vec![(q as u64 | 1 << 32, SendFlags::SIGNALED); per];
        senders.post(q, &wrs, || ())?;
    }
    let mut left = per_qp * n as u64;
    let deadline = Instant::now() + STALL;
    while left > 0 {
        let got = cq.poll_into(wcs)?;
        for wc in &wcs[..got] {
            if let Err(e) = wc.ok() {
                let q = (wc.wr_id() & QP_INDEX_MASK) as usize;
                let what = format!("the warm-up's {}", op_name(params.verb));
                return Err(wc_failed(&e, &what, q, 1, params.qp_timeout));
            }
        }
        left = left.saturating_sub(got as u64);
        if got == 0 && Instant::now() > deadline {
            return Err(RunError::timeout(format!(
                "the warm-up's {left} last completions did not come within {} s: the peer \
                 stopped answering; check its output",
                STALL.as_secs()
            )));
        }
    }
    Ok(())
}

/// What one size of a bandwidth run works with: this side's resources, the test's
/// parameters, the channel to the peer, this side's role, the records of its messages
/// (`tx`, `rx`: cleared and refilled, allocated with room for every message), the time the
/// stamps count from, and the watchdog.
pub(crate) struct BwSize<'a> {
    pub(crate) res: &'a mut Resources,
    pub(crate) params: &'a TestParams,
    pub(crate) oob: &'a mut OobChannel,
    pub(crate) role: BwRole,
    pub(crate) tx: &'a mut BandwidthTimes,
    pub(crate) rx: &'a mut BandwidthTimes,
    pub(crate) base: Instant,
    pub(crate) watch: &'a mut Watch,
}

/// A size's counts and limits, fixed before its loop starts.
struct SizePlan {
    /// A run timed by the clock (`-D`, `--run-infinitely`) rather than counted.
    duration_mode: bool,
    /// When a `-D` run stops posting.
    deadline: Option<Instant>,
    tx_depth: u64,
    post_list: u64,
    cq_mod: u64,
    /// Per QP: the messages to post, and those posted, signaled and completed so far.
    counts: Vec<QpCount>,
    /// The messages a counted run receives in all, when this side receives.
    rx_expected: Option<u64>,
    rx_depth: u64,
    /// Per QP: the receives completed.
    rx_per_qp: Vec<u64>,
    /// Per QP: the receives left out of the loop, posted after it.
    rx_deferred: Vec<u32>,
}

impl SizePlan {
    /// The plan of a size over `n` QPs. A `-D` run's deadline starts now.
    fn new(params: &TestParams, n: usize, role: BwRole) -> Self {
        let duration_mode = params.timed();
        let per_qp = if duration_mode {
            u64::MAX
        } else {
            params.iterations
        };
        let deadline = params
            .duration
            .map(|d| Instant::now() + Duration::from_secs(d));
        let counts = vec![
            QpCount {
                target: if role.sends { per_qp } else { 0 },
                ..QpCount::default()
            };
            n
        ];
        let rx_expected = if duration_mode || !role.receives {
            None
        } else {
            Some(params.iterations * n as u64)
        };
        SizePlan {
            duration_mode,
            deadline,
            tx_depth: u64::from(params.tx_depth),
            post_list: u64::from(params.post_list),
            cq_mod: u64::from(params.cq_mod),
            counts,
            rx_expected,
            // As perftest: during a run of a fixed number of messages, a receive is
            // reposted only while the messages still to come need it; those it leaves out
            // are posted after the run, outside the measured time, so that the next size
            // starts with a full queue.
            rx_depth: u64::from(params.rx_depth),
            rx_per_qp: vec![0u64; n],
            rx_deferred: vec![0u32; n],
        }
    }
}

/// Where a size's loop ended: what the steps after it need.
struct LoopEnd {
    /// The side said it sent its last message (`send -b` timed), and waits for the peer's.
    says_sent: bool,
    sent_step: String,
    rx_deferred: Vec<u32>,
    rx_expected: Option<u64>,
    rx_count: u64,
    total_done: u64,
    meter: Option<IntervalMeter>,
    /// When the measured loop started.
    t0: f64,
}

/// After a size's loop: waits for the peer's last message (`send -b` timed), posts the
/// receives the loop left out, and refuses a loss that RC should never allow.
fn settle(
    res: &mut Resources,
    params: &TestParams,
    oob: &mut OobChannel,
    end: &LoopEnd,
) -> Result<(), RunError> {
    if end.says_sent {
        oob.expect_ready(&end.sent_step)?;
    }
    for (q, &deferred) in end.rx_deferred.iter().enumerate() {
        if deferred > 0 {
            res.post_recvs(q, deferred)?;
        }
    }
    if let Some(expected) = end.rx_expected {
        let rx_count = end.rx_count;
        if rx_count < expected && params.connection == Connection::Rc {
            return Err(RunError::new(format!(
                "received {rx_count} of {expected} messages over RC before the peer finished: \
                 messages were lost, which RC should never allow"
            )));
        }
    }
    Ok(())
}

/// What the side that measures reports for a size: its bandwidth from the records of what
/// it sent (or, sending nothing, received), and a timed run's intervals, the last printed.
fn size_result(
    end: LoopEnd,
    size: u64,
    role: BwRole,
    params: &TestParams,
    tx: &BandwidthTimes,
    rx: &BandwidthTimes,
) -> Result<Option<(BandwidthResult, Vec<Interval>)>, RunError> {
    let (times, count, peak) = if role.sends {
        (tx, end.total_done, params.reports_peak())
    } else if role.receives {
        (rx, end.rx_count, false)
    } else {
        return Ok(None);
    };
    let mut result = BandwidthResult::compute(size, times, peak)?;
    let mut intervals = Vec::new();
    if let Some(mut m) = end.meter {
        let end_t = times.completed.last().map_or(end.t0, |&(_, t)| t);
        if let Some(iv) = m.finish(end_t, count) {
            println!("{}", interval_line(&iv, role.gbits));
        }
        result = result.with_intervals(&m.intervals);
        intervals = m.intervals;
    }
    Ok(Some((result, intervals)))
}

/// Runs one size. Returns what this side measured, if anything, with the reporting
/// intervals of a timed run.
pub(crate) fn run_size(
    run: BwSize<'_>,
    size: u64,
) -> Result<Option<(BandwidthResult, Vec<Interval>)>, RunError> {
    let BwSize {
        res,
        params,
        oob,
        role,
        tx,
        rx,
        base,
        watch,
    } = run;
    let n = res.bufs.qps();
    let SizePlan {
        duration_mode,
        deadline,
        tx_depth,
        post_list,
        cq_mod,
        mut counts,
        rx_expected,
        rx_depth,
        mut rx_per_qp,
        mut rx_deferred,
    } = SizePlan::new(params, n, role);
    let recv_sges: Vec<Sge> = (0..n).map(|q| res.recv_sge(q)).collect();
    tx.posted.clear();
    tx.completed.clear();
    rx.posted.clear();
    rx.completed.clear();

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
    let srq = srq.as_deref();
    let targets = Targets {
        bufs,
        ahs,
        remotes,
        half: *half,
        inline: *inline,
    };
    let ops = (0..n)
        .map(|q| wr_op(&targets, q, size, params))
        .collect::<Result<Vec<_>, _>>()?;
    let mut senders = match dc.as_mut() {
        Some(dc) => {
            let dc_ops = ops.iter().map(WrOpOwned::dc).collect::<Result<_, _>>()?;
            Senders::Dc(dc, dc_ops)
        }
        None => Senders::Qps(qps, &ops),
    };
    // The requests of one post list, reused: the loop allocates nothing.
    let mut wrs: Vec<(u64, SendFlags)> =
        Vec::with_capacity(usize::try_from(post_list).unwrap_or(1));
    let staging = Staging::of(bufs.is_staged(), params, size, *half);
    let half = *half;
    // Claimed for the whole loop: its polls then take no claim of their own.
    let mut send_poll = send_cq.claim()?;
    let mut recv_poll = recv_cq.claim()?;
    let mut wcs = [WorkCompletion::default(); 32];
    if params.warm_up && role.sends {
        warm_up(&mut senders, n, &mut send_poll, &mut wcs, tx_depth, params)
            .map_err(|e| watch.explain(oob, e))?;
    }
    watch.start();
    let mut total_done = 0u64;
    let mut rx_count = 0u64;
    let mut stopping = false;
    let mut peer_done_at: Option<Instant> = None;
    let says_sent = duration_mode && role.sends && role.receives;
    let sent_step = format!("sent {size}");
    let mut sent_said = false;
    let now = |base: Instant| base.elapsed().as_secs_f64();
    let t0 = now(base);
    rx.posted.push(t0);
    // The side that measures meters its own count: the sender its completions, a receiver
    // that sends nothing its receives.
    let mut meter = duration_mode.then(|| IntervalMeter::new(params.report_interval, size, t0));
    let mut pacer = match (role.sends, params.rate_limit) {
        (true, Some(limit)) => Some(Pacer::new(limit.messages_per_sec(size), limit.burst, t0)),
        _ => None,
    };

    loop {
        let mut idle = true;
        if role.sends {
            if !stopping {
                let over = match deadline {
                    Some(end) => Instant::now() >= end,
                    // --run-infinitely: until a signal or, with -b, until the peer
                    // stopped sending (it spoke; a passive peer speaks at once, so only
                    // a sending one counts).
                    None => {
                        params.run_infinitely
                            && (stop_requested()
                                || (params.bidirectional && watch.peer_has_spoken()))
                    }
                };
                if over {
                    stopping = true;
                    // One last signaled message per QP accounts for the unsignaled ones.
                    for c in &mut counts {
                        c.target = c.posted + u64::from(c.posted > c.signaled);
                    }
                }
            }
            for (q, c) in counts.iter_mut().enumerate() {
                while c.posted < c.target && c.posted - c.completed + post_list <= tx_depth {
                    let batch = post_list.min(c.target - c.posted);
                    if let Some(p) = pacer.as_mut() {
                        if !p.may_post(now(base), batch) {
                            break;
                        }
                        p.posted(batch);
                    }
                    // Staged, a message's time starts with its copy from the GPU.
                    let staged_at = match staging.before_post {
                        Some(len) => {
                            let t = now(base);
                            let buf = bufs.qp(q);
                            for _ in 0..batch {
                                buf.stage_from_gpu(0..len)?;
                            }
                            Some(t)
                        }
                        None => None,
                    };
                    wrs.clear();
                    for j in 0..batch {
                        let k = c.posted + j + 1;
                        let last_of_batch = j + 1 == batch;
                        let signal = k % cq_mod == 0
                            || k == c.target
                            || (last_of_batch && k - c.signaled + post_list > tx_depth);
                        if signal {
                            let covered = k - c.signaled;
                            c.signaled = k;
                            wrs.push((q as u64 | covered << 32, SendFlags::SIGNALED));
                        } else {
                            wrs.push((q as u64, SendFlags::empty()));
                        }
                    }
                    let mut t = 0.0;
                    senders.post(q, &wrs, || t = staged_at.unwrap_or_else(|| now(base)))?;
                    if !duration_mode {
                        for _ in 0..batch {
                            tx.posted.push(t);
                        }
                    } else if tx.posted.is_empty() {
                        tx.posted.push(t);
                    }
                    c.posted += batch;
                    idle = false;
                }
            }
            let got = send_poll.poll_into(&mut wcs)?;
            if got > 0 {
                let t = now(base);
                for (i, wc) in wcs[..got].iter().enumerate() {
                    let q = (wc.wr_id() & QP_INDEX_MASK) as usize;
                    if let Err(e) = wc.ok() {
                        let e = first_cause(e, &wcs[i + 1..got], &mut send_poll);
                        // The first message of those this completion covers.
                        let at = counts.get(q).map_or(0, |c| c.completed) + 1;
                        return Err(watch.explain(
                            oob,
                            wc_failed(&e, op_name(params.verb), q, at, params.qp_timeout),
                        ));
                    }
                    let covered = wc.wr_id() >> 32;
                    counts[q].completed += covered;
                    // Staged, a message is done once its copy to the GPU is.
                    let t = match staging.after_completion {
                        Some(len) => {
                            let buf = bufs.qp(q);
                            for _ in 0..covered {
                                buf.stage_to_gpu(0..len)?;
                            }
                            now(base)
                        }
                        None => t,
                    };
                    total_done += covered;
                    let entry = (total_done as usize - 1, t);
                    if duration_mode {
                        tx.completed.clear();
                    }
                    tx.completed.push(entry);
                }
                if let Some(m) = meter.as_mut() {
                    if let Some(iv) = m.observe(t, total_done) {
                        println!("{}", interval_line(&iv, role.gbits));
                    }
                }
                idle = false;
            }
        }
        if role.receives {
            let got = recv_poll.poll_into(&mut wcs)?;
            if got > 0 {
                let t = now(base);
                for wc in &wcs[..got] {
                    let q = (wc.wr_id() & QP_INDEX_MASK) as usize;
                    if let Err(e) = wc.ok() {
                        let at = rx_per_qp.get(q).map_or(0, |&n| n) + 1;
                        return Err(
                            watch.explain(oob, wc_failed(&e, "receive", q, at, params.qp_timeout))
                        );
                    }
                    rx_per_qp[q] += 1;
                    let t = match staging.after_receive {
                        Some(len) => {
                            bufs.qp(q).stage_to_gpu(half..half + len)?;
                            now(base)
                        }
                        None => t,
                    };
                    // With --use-srq, q is the buffer the receive pointed into, not the QP
                    // the message came on: the queue is counted as a whole.
                    let needed = match srq {
                        Some(_) => {
                            rx_count + 1 + rx_depth * n as u64 <= params.iterations * n as u64
                        }
                        None => rx_per_qp[q] + rx_depth <= params.iterations,
                    };
                    if duration_mode || needed {
                        if let Some(srq) = srq {
                            let mut guard = srq.start_post_recv();
                            guard.recv(q as u64, &[recv_sges[q]]);
                            guard.post()?;
                        } else {
                            let Senders::Qps(qps, _) = &mut senders else {
                                return Err(RunError::new(
                                    "internal error: a DC side receives through its SRQ",
                                ));
                            };
                            let mut guard = qps[q].start_post_recv();
                            guard.recv(q as u64, &[recv_sges[q]]);
                            guard.post()?;
                        }
                    } else {
                        rx_deferred[q] += 1;
                    }
                    rx_count += 1;
                    if duration_mode {
                        rx.completed.clear();
                    }
                    rx.completed.push((rx_count as usize - 1, t));
                }
                if let (Some(m), false) = (meter.as_mut(), role.sends) {
                    if let Some(iv) = m.observe(t, rx_count) {
                        println!("{}", interval_line(&iv, role.gbits));
                    }
                }
                idle = false;
                if peer_done_at.is_some() {
                    peer_done_at = Some(Instant::now());
                }
            }
        }
        let tx_done = counts
            .iter()
            .all(|c| c.posted == c.target && c.completed == c.signaled);
        // A timed run in which both sides send and receive (send -b): each side's receive
        // part ends when the peer said it sent its last message, so say so at once rather
        // than at the "done" barrier, which the peer, still receiving, would wait for.
        if tx_done && says_sent && !sent_said {
            oob.send_ready(&sent_step)?;
            sent_said = true;
        }
        let rx_done = match (rx_expected, peer_done_at) {
            _ if !role.receives => true,
            (Some(e), _) if rx_count >= e => true,
            (_, Some(at)) => at.elapsed() >= DRAIN,
            _ => false,
        };
        if tx_done && rx_done {
            break;
        }
        // Every turn, busy or not: a peer that died while completions still flowed (its
        // device tearing down) must be noticed too. The watch looks rarely.
        let spoke = watch.idle(oob, total_done + rx_count)?;
        if spoke && role.receives && peer_done_at.is_none() {
            peer_done_at = Some(Instant::now());
        }
        if let (true, Some(channel)) = (idle, events.as_ref()) {
            let cqs: &[&sideway::completion_queue::CompletionQueue] =
                match (role.sends, role.receives) {
                    (true, true) => &[send_cq, recv_cq],
                    (true, false) => &[send_cq],
                    (false, _) => &[recv_cq],
                };
            sleep_on(channel, cqs)?;
        }
    }

    let end = LoopEnd {
        says_sent,
        sent_step,
        rx_deferred,
        rx_expected,
        rx_count,
        total_done,
        meter,
        t0,
    };
    settle(res, params, oob, &end)?;
    size_result(end, size, role, params, tx, rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Verb};
    use clap::Parser;

    fn params(args: &[&str]) -> TestParams {
        let mut argv = vec!["stride-perf"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).unwrap();
        let (verb, a) = cli.command.run_args().unwrap();
        TestParams::resolve(verb, a).unwrap()
    }

    #[test]
    fn staging_copies_each_message_where_it_is_sent_or_lands() {
        let half = 4096;
        let none = Staging::default();
        assert_eq!(
            Staging::of(false, &params(&["write", "bw"]), 1024, half),
            none
        );
        assert_eq!(
            Staging::of(true, &params(&["write", "bw"]), 1024, half),
            Staging {
                before_post: Some(1024),
                ..none
            }
        );
        assert_eq!(
            Staging::of(true, &params(&["send", "bw"]), 1024, half),
            Staging {
                before_post: Some(1024),
                after_receive: Some(1024),
                ..none
            }
        );
        // UD: the GRH lands in front of the message.
        assert_eq!(
            Staging::of(true, &params(&["send", "bw", "-c", "UD"]), 1024, half),
            Staging {
                before_post: Some(1024),
                after_receive: Some(1024 + sideway::address_handle::GRH_LEN),
                ..none
            }
        );
        assert_eq!(
            Staging::of(true, &params(&["read", "bw"]), 65536, 65536),
            Staging {
                after_completion: Some(65536),
                ..none
            }
        );
        assert_eq!(
            Staging::of(true, &params(&["atomic", "bw"]), 8, 64),
            Staging {
                after_completion: Some(8),
                ..none
            }
        );
        // Never past the half.
        let p = params(&["send", "bw", "-c", "UD"]);
        assert_eq!(p.verb, Verb::Send);
        assert_eq!(Staging::of(true, &p, 100, 128).after_receive, Some(128));
    }
}
