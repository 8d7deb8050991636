//! The verbs driver: one connection's verbs resources, and the pump that feeds the protocol
//! core with completions and rdma_cm events and posts what it asks for.
//!
//! It owns the rdma_cm id and its event channel, a PD, a completion channel and one CQ for
//! both queues, the QP (made by rdma_cm), the receive ring (registered for remote write: the
//! peer's RDMA WRITEs land there) and the send buffer (registered for local reads only). No
//! Rust slice ever covers the ring: bytes leave it by copy ([`RegisteredBuffer::read_at`]),
//! and only after the completion that says the peer's write landed.
//!
//! In the shared-receive-queue mode ([`crate::pool`]) the PD is the device pool's, the QP
//! takes its receives from the pool's SRQ and completes them on the pool's CQ, and the
//! connection's own CQ holds only its send completions; its receive completions reach it
//! through its mailbox.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::completion_channel::CompletionChannel;
use sideway::completion_queue::{CompletionQueue, WcStatus, WorkCompletion};
use sideway::memory_region::{AccessFlags, DeviceReadOnly, RegisteredBuffer};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QpAttrMask, QueuePair, QueuePairAttribute, SendFlags};
use sideway::rdmacm::{CmId, ConnParam, EventChannel, EventType};

use crate::config::Config;
use crate::core::{Completion, Connection, Limits};
use crate::error::Error;
use crate::loan::Loan;
use crate::pool::{Mailbox, Pool};
use crate::readiness::{Notifier, Readiness, Woke};
use crate::spin::Spin;
use crate::wire::{Control, Hello, Imm, Lend, LEND_LEN};

/// The wr_id of every receive: sends count up from 0 and never reach it.
pub(crate) const RECV_WR_ID: u64 = u64::MAX;

/// The `rnr_retry` value that retries receiver-not-ready for ever (the IB specification's 7).
const RNR_RETRY_FOREVER: u8 = 7;

/// RNR retries a shared-mode side asks its peers for (`rnr_retry_count`): for ever. A
/// write that finds the overcommitted pool empty waits until a receive is posted again, as
/// a TCP sender waits on a zero window, however long the receiving process takes to poll
/// (a finite count is a wall-clock limit: under load, or on a slow host, it failed
/// connections that were only waiting). A receiver that stopped for good is found by the
/// writer's keep-alive, which in that case times its probe from when it was wanted
/// (`Connection::set_rnr_forever`).
const SHARED_RNR_RETRY: u8 = RNR_RETRY_FOREVER;

/// The RNR NAK timer a shared-mode side asks its peers to wait between those retries
/// (`min_rnr_timer` code 12: 0.64 ms). rdma_cm's own is code 0, 655 ms: a write that met an
/// empty pool then waited that long however soon the pool was refilled.
const SHARED_RNR_TIMER: u8 = 12;

/// Where a connection's receives come from.
enum Receives {
    /// The QP's own receive queue, `recv_depth` deep.
    Own,
    /// The device's shared pool; completions arrive in the mailbox.
    Shared {
        pool: Arc<Pool>,
        mailbox: Arc<Mailbox>,
    },
}

/// Completions polled per call.
const POLL_BATCH: usize = 32;

/// How long a busy poll runs before it reads rdma_cm's channel too, and how often after
/// that ([`Driver::spin_for_progress`]): the longest a spin goes on after the peer
/// disconnected. Far above an answer's spin (at most `BUSY_POLL_MAX` by default), so that
/// a ping-pong's waits never pay the read's system call.
pub(crate) const CM_LOOK: Duration = Duration::from_millis(1);

/// RDMA READs a connection may have outstanding, each way (rdma_cm's initiator depth and
/// responder resources), lowered to what the device allows: enough to keep a fetch's
/// 1 MiB READs flowing. A device that allows none does not lend.
const READ_DEPTH: u8 = 4;

/// The resources of a connection being set up, before the peer's hello is known.
pub(crate) struct Resources {
    _pd: Arc<ProtectionDomain>,
    comp_channel: Arc<CompletionChannel>,
    cq: Arc<CompletionQueue>,
    /// `None` only while [`Drop`] hands it to the pool to destroy.
    qp: Option<QueuePair>,
    qp_num: u32,
    recvs: Receives,
    notifier: Notifier,
    ring: RegisteredBuffer,
    staging: RegisteredBuffer<DeviceReadOnly>,
    limits: Limits,
    max_inline: u32,
    /// RDMA READs outstanding each way (0: this side does not lend).
    read_depth: u8,
    // The id and its channel drop last (fields drop in order): librdmacm frees the
    // device's PD of its own only when its last id goes, not when the last device list
    // (which the verbs objects above hold, through their context) is freed.
    pub(crate) id: Arc<CmId>,
    pub(crate) channel: Arc<EventChannel>,
}

impl Resources {
    /// A PD, a completion channel and CQ, an RC QP on `id` (rdma_cm's), the ring and the
    /// send buffer, with every receive posted (in the shared mode: the pool's, and the
    /// connection's mailbox in place): ready to connect or accept.
    pub(crate) fn new(id: &Arc<CmId>, config: &Config) -> Result<Resources, Error> {
        let mut limits = config.limits();
        let ctx = id
            .device_context()
            .map_err(|e| Error::verbs("opening the RDMA device of the connection", e))?;
        let read_depth = match ctx.query_device() {
            Ok(attr) => {
                let allowed = attr.max_qp_rd_atom().min(attr.max_qp_init_rd_atom());
                u8::try_from(allowed).unwrap_or(u8::MAX).min(READ_DEPTH)
            }
            Err(_) => 0,
        };
        limits.lends = limits.lends && read_depth > 0;
        let pool = match config.shared_receive_queue {
            Some(depth) => Some(Pool::for_device(&ctx, depth)?),
            None => None,
        };
        let pd = match &pool {
            Some(pool) => Arc::clone(pool.pd()),
            None => ctx
                .alloc_pd()
                .map_err(|e| Error::verbs("allocating a protection domain", e))?,
        };
        let notifier =
            Notifier::new().map_err(|e| Error::verbs("creating the connection's eventfd", e))?;
        let comp_channel = ctx
            .create_comp_channel()
            .map_err(|e| Error::verbs("creating a completion channel", e))?;
        let own_recvs = if pool.is_some() {
            0
        } else {
            u32::from(limits.recv_depth)
        };
        let cq = ctx
            .create_cq_builder()
            .cqe(limits.send_depth + own_recvs + 1)
            .channel(&comp_channel)
            .build()
            .map_err(|e| Error::verbs("creating a completion queue", e))?;
        let mut builder = pd.create_qp_builder();
        builder
            .send_cq(&cq)
            .max_send_wr(limits.send_depth)
            .max_recv_wr(own_recvs)
            .max_send_sge(1)
            .max_recv_sge(1)
            .max_inline_data(config.max_inline);
        match &pool {
            Some(pool) => builder.recv_cq(pool.cq()).srq(pool.srq()),
            None => builder.recv_cq(&cq),
        };
        let mut qp = id
            .create_qp(&builder)
            .map_err(|e| Error::verbs("creating the connection's queue pair", e))?;
        // The QP joins the pool (its mailbox) only below, after the last step that can
        // fail: a failure before drops a QP that never connected and has no completion.
        let qp_num = qp.qp_num();
        let max_inline = qp.cap().max_inline_data.min(config.max_inline);
        let ring = pd
            .reg_buffer(
                limits.ring_size as usize,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(|e| Error::verbs("registering the receive ring", e))?;
        let staging = pd
            .reg_read_only_buffer(limits.send_buffer as usize, AccessFlags::empty())
            .map_err(|e| Error::verbs("registering the send buffer", e))?;
        let recvs = match pool {
            Some(pool) => {
                let mailbox = pool.join(qp_num, notifier.clone(), limits.recv_depth);
                Receives::Shared { pool, mailbox }
            }
            None => {
                post_recvs(&mut qp, own_recvs)?;
                Receives::Own
            }
        };
        Ok(Resources {
            id: Arc::clone(id),
            channel: id.channel(),
            _pd: pd,
            comp_channel,
            cq,
            qp: Some(qp),
            qp_num,
            recvs,
            notifier,
            ring,
            staging,
            limits,
            max_inline,
            read_depth,
        })
    }

    /// What this side tells the peer.
    pub(crate) fn hello(&self) -> Hello {
        Hello {
            ring_addr: self.ring.addr(),
            ring_rkey: self.ring.rkey(),
            ring_size: self.limits.ring_size,
            recv_depth: self.limits.recv_depth,
            max_message: self.limits.max_message,
            lends: self.limits.lends,
        }
    }

    /// The connection parameters for `rdma_connect` / `rdma_accept`, carrying the hello.
    pub(crate) fn conn_param(&self, config: &Config) -> ConnParam {
        let mut p = ConnParam::new();
        p.private_data(&self.hello().encode())
            // READs only fetch lent regions; a side that does not lend asks for none.
            .responder_resources(self.read_depth)
            .initiator_depth(self.read_depth)
            .retry_count(config.retry_count)
            // No receiver-not-ready retries with receives of its own: credits make RNR
            // impossible, so one is a bug (or a lying peer) and should fail loudly, not
            // stall. The shared pool may be overcommitted: there an RNR is a wait.
            .rnr_retry_count(match self.recvs {
                Receives::Own => 0,
                Receives::Shared { .. } => SHARED_RNR_RETRY,
            });
        p
    }

    /// The connection, once the peer's hello is known.
    pub(crate) fn into_driver(
        self,
        peer: Hello,
        config: &Config,
    ) -> Result<(Driver, Readiness), Error> {
        let readiness = Readiness::new(
            self.comp_channel.fd(),
            self.channel.as_raw_fd(),
            self.notifier.clone(),
        )
        .map_err(|e| Error::verbs("creating the connection's readiness fd", e))?;
        let qp = self
            .qp
            .as_ref()
            .expect("the QP lives until the resources drop");
        if let Receives::Shared { .. } = self.recvs {
            // rdma_cm moved the QP to RTS with its own RNR timer; RTS to RTS may change it.
            // A peer that wrote before this waited the longer timer once: slower, no loss.
            qp.modify(QueuePairAttribute::new().set_min_rnr_timer(SHARED_RNR_TIMER))
                .map_err(|e| Error::verbs("setting the shared pool's RNR timer", e))?;
        }
        // What the peer asked this side's NIC for: a shared-mode peer asks for RNR retries
        // for ever, and then this side's keep-alive cannot leave a stuck probe to them.
        let rnr_forever = qp
            .query(QpAttrMask::RNR_RETRY)
            .map_err(|e| Error::verbs("querying the queue pair's RNR retry count", e))?
            .rnr_retry()
            == RNR_RETRY_FOREVER;
        let mut conn = Connection::new(self.limits, peer);
        let now = Instant::now();
        conn.set_rnr_forever(rnr_forever);
        conn.set_keepalive(config.keepalive, now);
        let local = self.id.local_addr();
        let remote = self.id.peer_addr();
        let driver = Driver {
            res: self,
            conn,
            wcs: vec![WorkCompletion::default(); POLL_BATCH],
            spin: Spin::new(
                config.busy_poll,
                config.busy_poll_max.unwrap_or(crate::config::BUSY_POLL_MAX),
            ),
            answers: crate::spin::Answers::default(),
            disconnected: false,
            local,
            remote,
            lent: VecDeque::new(),
            reclaimed: VecDeque::new(),
            fetch: None,
            tenure: Tenure::default(),
        };
        Ok((driver, readiness))
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        if let Receives::Shared { pool, .. } = &self.recvs {
            let qp = &mut self.qp;
            pool.leave(self.qp_num, || drop(qp.take()));
        }
    }
}

fn post_recvs(qp: &mut QueuePair, n: u32) -> Result<(), Error> {
    let mut left = n;
    while left > 0 {
        let mut batch = qp.start_post_recv();
        let chunk = left.min(64);
        for _ in 0..chunk {
            let _ = batch.recv(RECV_WR_ID, &[]);
        }
        batch
            .post()
            .map_err(|e| Error::verbs("posting receives", e))?;
        left -= chunk;
    }
    Ok(())
}

pub(crate) fn completion(status: WcStatus) -> Completion {
    match status {
        WcStatus::Success => Completion::Ok,
        WcStatus::WrFlushErr => Completion::Flushed,
        WcStatus::RetryExcErr => Completion::RetryExceeded,
        WcStatus::RemAccessErr | WcStatus::RemInvReqErr => Completion::RemoteAccess,
        other => Completion::Other(other.into(), other.hint()),
    }
}

/// Whether a write with immediate `imm` brings the peer something to read (bytes, a
/// message's end, the end of the stream): those are posted solicited, so that a reader
/// waiting for them can arm its completion queue for solicited completions alone and sleep
/// through credit updates, keep-alive probes and its own send completions.
fn carries_data(imm: u32) -> bool {
    matches!(
        Imm::decode(imm),
        Ok(Imm::Data { .. } | Imm::Control(Control::Fin))
    )
}

/// One live connection: its resources and its protocol core.
pub(crate) struct Driver {
    /// Drops first: the QP is destroyed before the loans below are deregistered, so no
    /// READ of this side's or the peer's is in flight when their memory goes back.
    res: Resources,
    pub(crate) conn: Connection,
    wcs: Vec<WorkCompletion>,
    spin: Spin,
    /// Which read waits wait for an answer ([`Self::awaits_answer`]).
    answers: crate::spin::Answers,
    disconnected: bool,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) remote: Option<SocketAddr>,
    /// Buffers lent to the peer, oldest first, until it returns them.
    lent: VecDeque<Loan>,
    /// Buffers the peer returned, deregistered, waiting for the application.
    pub(crate) reclaimed: VecDeque<Vec<u8>>,
    /// The target of the region being fetched.
    fetch: Option<Loan>,
    /// A thread waiting for bytes in the owner's place (`TryHandle::wait_readable`).
    tenure: Tenure,
}

/// A wait for bytes by a thread other than the stream's owner, which holds the completion
/// channel meanwhile: the channel is out of the readiness epoll, so the owner (parked on the
/// readiness fd) is not woken by the completions that thread takes.
#[derive(Debug, Default, Clone, Copy)]
struct Tenure {
    /// A thread holds the channel.
    active: bool,
    /// The owner went to sleep meanwhile and put the channel back: the holder stops
    /// taking its events and leaves it in the epoll.
    revoked: bool,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("qp_num", &self.res.qp_num)
            .field("peer", self.conn.peer())
            .finish()
    }
}

impl Driver {
    /// The ring, for copying bytes out.
    pub(crate) fn ring(&self) -> &RegisteredBuffer {
        &self.res.ring
    }

    /// The send buffer, for copying bytes in.
    pub(crate) fn staging_mut(&mut self) -> &mut RegisteredBuffer<DeviceReadOnly> {
        &mut self.res.staging
    }

    pub(crate) fn set_busy_poll(&mut self, d: Duration) {
        self.spin.set_min(d);
    }

    /// The connection's spin policy, as it stands.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn spin(&self) -> Spin {
        self.spin
    }

    /// One round: every completion and rdma_cm event that is waiting, the timers, then the
    /// receives and the writes the core asks for. True when anything happened.
    pub(crate) fn pump(&mut self, now: Instant) -> bool {
        self.pump_woken(now, Woke::ALL)
    }

    /// [`pump`](Self::pump) after a look at the readiness fd that found `woke`: rdma_cm's
    /// channel is read only when that look found it readable (its fd stays readable while
    /// an event waits, so no event is missed: the next look finds it).
    fn pump_woken(&mut self, now: Instant, woke: Woke) -> bool {
        let mut progress = self.poll_cq(now, false);
        self.take_returns();
        if woke.cm() {
            progress |= self.poll_cm();
        }
        progress |= self.run_due_timers(now);
        progress |= self.post();
        self.disconnect_if_failed();
        progress
    }

    /// The core's timers (keep-alive's probe and verdict), when one is due at `now`: true
    /// when one ran.
    fn run_due_timers(&mut self, now: Instant) -> bool {
        let due = self.conn.poll_timeout().is_some_and(|t| now >= t);
        if due {
            self.conn.handle_timeout(now);
        }
        due
    }

    /// A connection that failed (the peer lied, keep-alive ran out, a verb failed) is
    /// disconnected at once, so the peer learns it without waiting for this side to drop
    /// the stream.
    fn disconnect_if_failed(&mut self) {
        if self.conn.error().is_some() && !self.disconnected {
            self.disconnected = true;
            let _ = self.res.id.disconnect();
        }
    }

    /// Every completion waiting for this connection: its own CQ's, and in the shared mode
    /// its mailbox's after polling the pool (if no other thread is, or with `wait`, after
    /// that thread finished routing).
    fn poll_cq(&mut self, now: Instant, wait: bool) -> bool {
        let mut progress = self.poll_own_cq(now);
        if let Receives::Shared { pool, mailbox } = &self.res.recvs {
            pool.poll(mailbox, wait);
            let conn = &mut self.conn;
            progress |=
                mailbox.drain(|e| conn.on_recv_completion(e.imm, e.byte_len, e.status, now));
        }
        progress
    }

    /// The connection's own CQ: every completion, or (shared mode) its sends'.
    fn poll_own_cq(&mut self, now: Instant) -> bool {
        let mut progress = false;
        loop {
            let n = match self.res.cq.poll_into(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.conn
                        .on_local_error(format!("polling the completion queue failed: {e}"));
                    return true;
                }
            };
            for wc in &self.wcs[..n] {
                let status = completion(wc.status());
                if wc.wr_id() == RECV_WR_ID {
                    self.conn
                        .on_recv_completion(wc.imm_data(), wc.byte_len(), status, now);
                } else {
                    self.conn.on_send_completion(wc.wr_id(), status, now);
                }
            }
            progress |= n > 0;
            if n < self.wcs.len() {
                return progress;
            }
        }
    }

    fn poll_cm(&mut self) -> bool {
        let mut progress = false;
        loop {
            match self.res.channel.try_get_event() {
                Ok(None) => return progress,
                Ok(Some(ev)) => {
                    progress = true;
                    log::debug!(
                        target: "trespass",
                        "{:?} -> {:?}: rdma_cm event {:?} (status {})",
                        self.local,
                        self.remote,
                        ev.event_type(),
                        ev.status()
                    );
                    match ev.event_type() {
                        EventType::Disconnected => {
                            // Completions that landed before the disconnect count first
                            // (in the shared mode, also those another thread is routing).
                            drop(ev);
                            self.poll_cq(Instant::now(), true);
                            // Buffers the peer returned before it left are the caller's
                            // again now: a reclaim that sees the connection gone must find
                            // them first.
                            self.take_returns();
                            self.conn.on_disconnected();
                            if !self.disconnected {
                                self.disconnected = true;
                                // Answer the peer's DREQ; the QP goes to the error state.
                                let _ = self.res.id.disconnect();
                            }
                        }
                        EventType::DeviceRemoval => self
                            .conn
                            .on_local_error("the RDMA device was removed".into()),
                        _ => {}
                    }
                }
                Err(e) => {
                    self.conn
                        .on_local_error(format!("reading rdma_cm events failed: {e}"));
                    return true;
                }
            }
        }
    }

    /// Posts the receives and the writes the core asks for: receives first (the credits
    /// that follow report them), then every write in one doorbell.
    fn post(&mut self) -> bool {
        let mut progress = false;
        let Some(qp) = self.res.qp.as_mut() else {
            return false;
        };
        let recvs = self.conn.poll_recvs();
        if recvs > 0 {
            progress = true;
            // In the shared mode the pool posted one again for each completion it routed;
            // the core's count only feeds the receive credits.
            if let Receives::Own = self.res.recvs {
                if let Err(e) = post_recvs(qp, recvs) {
                    self.conn.on_local_error(e.to_string());
                    return true;
                }
            }
        }
        let max_inline = self.res.max_inline;
        let peer = self.conn.peer();
        let (rkey, raddr) = (peer.ring_rkey, peer.ring_addr);
        let conn = &mut self.conn;
        let staging = &mut self.res.staging;
        let fetch = &self.fetch;
        let mut batch = qp.start_post_send();
        let mut count = 0;
        while let Some(t) = conn.poll_transmit() {
            let flags = if t.signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            if t.read {
                let range = t.local_offset as usize..(t.local_offset + t.len) as usize;
                let (Some(lend), Some(sge)) = (
                    conn.fetching().copied(),
                    fetch.as_ref().and_then(|f| f.mr.sge(range)),
                ) else {
                    conn.on_local_error("a READ with no fetch target registered".into());
                    return true;
                };
                let _ = batch.wr(t.wr_id, flags).rdma_read(
                    lend.rkey,
                    lend.addr + u64::from(t.remote_offset),
                    sideway::queue_pair::SendData::Sge(sge),
                );
                count += 1;
                continue;
            }
            let range = t.local_offset as usize..(t.local_offset + t.len) as usize;
            let data = if t.len == 0 {
                sideway::queue_pair::SendData::Empty
            } else {
                let piece = if t.len <= max_inline {
                    staging.inline(range)
                } else {
                    staging.sge(range).map(sideway::queue_pair::SendData::Sge)
                };
                match piece {
                    Some(d) => d,
                    None => {
                        // The core names ranges inside the buffer it was given; this would
                        // be a bug here, reported rather than posted.
                        conn.on_local_error("a send buffer range out of bounds".into());
                        return true;
                    }
                }
            };
            let flags = if !t.plain && carries_data(t.imm) {
                flags | SendFlags::SOLICITED
            } else {
                flags
            };
            let wr = batch.wr(t.wr_id, flags);
            let _ = if t.plain {
                wr.rdma_write(rkey, raddr, data)
            } else {
                wr.rdma_write_with_imm(rkey, raddr + u64::from(t.remote_offset), t.imm, data)
            };
            count += 1;
        }
        if count > 0 {
            progress = true;
            if let Err(e) = batch.post() {
                conn.on_local_error(format!("posting {count} RDMA requests failed: {e}"));
            }
        }
        progress
    }

    /// The hot path's round: completions, then posts; no rdma_cm event and no timer (those
    /// come with [`pump`](Self::pump) whenever a wait wakes up).
    pub(crate) fn pump_fast(&mut self, now: Instant) -> bool {
        let polled = self.poll_cq(now, false);
        self.after_poll() || polled
    }

    /// What follows a poll of the completion queue: the returned buffers taken, what the
    /// core has to post posted, a failed connection disconnected. True when it posted.
    fn after_poll(&mut self) -> bool {
        self.take_returns();
        let posted = self.post();
        self.disconnect_if_failed();
        posted
    }

    /// Busy-polls until `end` for anything that moves the connection: true as soon as a
    /// round made progress (completions were taken and what they allow posted, as
    /// [`pump_fast`](Self::pump_fast) does), false when `end` came first.
    ///
    /// A round with an empty completion queue posts nothing and takes no returns: while
    /// this holds the connection nothing but a completion changes what the core would post
    /// (the application's writes and flushes post before they return, and timers run only
    /// in [`pump`](Self::pump)), so an idle round is one poll of the queue and one look at
    /// the clock. Once a spin has run [`CM_LOOK`], and every `CM_LOOK` after that,
    /// rdma_cm's channel is read and the core's timers run too: a peer that left (its
    /// disconnect) ends the spin then, and a silent one is probed and declared dead on
    /// keep-alive's schedule, not when a long busy poll runs out. A spin for an answer within
    /// the default limits never gets that far, and never pays for the read.
    ///
    /// No `PAUSE` (`std::hint::spin_loop`) between rounds, as perftest's and rsocket's
    /// polling loops have none: a round is a whole poll of the queue, not a load in a tight
    /// loop, and a pause (about 140 cycles on recent x86 cores) would only make the next
    /// look later. Under QEMU's software emulation it costs far more (every `PAUSE` leaves
    /// the translated code for the emulator's main loop and its global lock): a spinning
    /// round trip of 8 and 64 bytes took 0.88-0.90 of the time without it in the SoftRoCE
    /// guest (docs/trespass-perf.md, "The spin's rounds").
    pub(crate) fn spin_for_progress(&mut self, end: Instant) -> bool {
        let mut cm_look: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            if self.poll_cq(now, false) {
                self.after_poll();
                return true;
            }
            match cm_look {
                None => cm_look = Some(now + CM_LOOK),
                Some(at) if now >= at => {
                    cm_look = Some(now + CM_LOOK);
                    let cm = self.poll_cm();
                    if self.run_due_timers(now) || cm {
                        self.after_poll();
                        return true;
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// Posts what the core has to post (after the application committed bytes).
    pub(crate) fn flush_posts(&mut self) {
        self.post();
    }

    /// Empties the completion channel and the readiness eventfd, arms the CQ, and pumps once
    /// more (a completion that came before the arming would raise no event): after this,
    /// the readiness fd turns readable on the next completion or rdma_cm event.
    ///
    /// One look at the readiness fd first says which of its fds have something: only those
    /// are read (an empty channel's read, the eventfd's and rdma_cm's each cost a system
    /// call that fails with EAGAIN, and rdma_cm's an allocation too, on every sleep). An fd
    /// that turns readable after the look stays readable, so the sleep that follows returns
    /// at once and the next round reads it.
    pub(crate) fn prepare_sleep(&mut self, readiness: &Readiness) -> bool {
        // The owner waits: completions must wake it again, whoever holds the channel.
        self.revoke_tenure(readiness);
        self.prepare_sleep_reading(readiness)
    }

    /// [`prepare_sleep`](Self::prepare_sleep) for an owner that will wait for bytes
    /// without holding the connection (the tokio front end's read): a thread waiting for
    /// bytes in its place keeps the completion channel, and hands what it leaves unread
    /// and the end back through the eventfd (`TryHandle::wait_readable`).
    pub(crate) fn prepare_sleep_reading(&mut self, readiness: &Readiness) -> bool {
        let woke = readiness.peek();
        if woke.cq() {
            // One CQ on the channel, one event per arming, and this arms only after the
            // read: at most one event waits here (two when one lands between the look and
            // the arming; the second keeps the fd readable and the next round reads it).
            // Reading until EAGAIN would cost a failing read on every sleep.
            let _ = self.res.comp_channel.try_get_cq_event();
        }
        if woke.notified() {
            readiness.clear();
        }
        if let Receives::Shared { pool, mailbox } = &self.res.recvs {
            if let Err(e) = pool.sleep(mailbox) {
                self.conn.on_local_error(e);
                return true;
            }
        }
        if let Err(e) = self.res.cq.req_notify(false) {
            self.conn
                .on_local_error(format!("arming the completion queue failed: {e}"));
            return true;
        }
        self.pump_woken(Instant::now(), woke)
    }

    /// Takes the completion channel out of `readiness` for a thread that waits for bytes
    /// in the owner's place; false (nothing changed) when another thread holds it already,
    /// or when receives complete on the shared pool (their wake-ups come through the
    /// eventfd, which stays the owner's).
    pub(crate) fn begin_tenure(&mut self, readiness: &Readiness) -> bool {
        if self.tenure.active || !matches!(self.res.recvs, Receives::Own) {
            return false;
        }
        if readiness.detach_cq().is_err() {
            return false;
        }
        self.tenure = Tenure {
            active: true,
            revoked: false,
        };
        true
    }

    /// Whether the owner took the channel back since [`begin_tenure`](Self::begin_tenure).
    pub(crate) fn tenure_revoked(&self) -> bool {
        self.tenure.revoked
    }

    /// Before the holder sleeps on the channel: arms the CQ and pumps once more (a
    /// completion that came before the arming raises no event). A failed arming is the
    /// connection's error, which the holder then sees, as it sees bytes that came.
    pub(crate) fn tenure_arm(&mut self) {
        // Solicited only: the peer's writes of bytes and its end of stream are solicited
        // (see `carries_data`), its credit updates, keep-alive probes and this side's own
        // send completions are not, and do not wake a thread that waits for bytes. (Errors
        // raise an event either way.)
        if let Err(e) = self.res.cq.req_notify(true) {
            self.conn
                .on_local_error(format!("arming the completion queue failed: {e}"));
            return;
        }
        self.pump_fast(Instant::now());
    }

    /// After the holder's sleep: takes the channel's event if the sleep saw one (and the
    /// channel is still the holder's), and pumps.
    pub(crate) fn tenure_woke(&mut self, cq: bool) {
        if cq && !self.tenure.revoked {
            let _ = self.res.comp_channel.try_get_cq_event();
        }
        self.pump_fast(Instant::now());
    }

    /// The holder is done: unless the owner took it back already, the CQ is armed again
    /// (the owner sleeps on an armed CQ), the channel goes back into the epoll (an event
    /// waiting on it wakes the owner at once), and the owner is poked when the connection
    /// ended (the owner carries the end) or, `owner_writes`, it has a task waiting for room.
    pub(crate) fn end_tenure(&mut self, readiness: &Readiness, owner_writes: bool) {
        if !self.tenure.active {
            return;
        }
        if !self.tenure.revoked {
            if let Err(e) = self.res.cq.req_notify(false) {
                self.conn
                    .on_local_error(format!("arming the completion queue failed: {e}"));
            }
            self.pump_fast(Instant::now());
            if let Err(e) = readiness.attach_cq() {
                self.conn.on_local_error(format!(
                    "putting the completion channel back into the readiness fd failed: {e}"
                ));
                readiness.notify();
            }
        }
        self.tenure = Tenure::default();
        // A task of the owner's that began to wait for room after the wait began (the wait
        // declines to begin while one waits) may have missed the credits taken here.
        let ended = self.conn.error().is_some() || self.conn.broken().is_some();
        if owner_writes || ended || self.conn.is_eof() {
            readiness.notify();
        }
    }

    /// The owner is about to sleep: the channel goes back into the epoll if a holder has
    /// it. The holder sees [`tenure_revoked`](Self::tenure_revoked) and stops.
    fn revoke_tenure(&mut self, readiness: &Readiness) {
        if self.tenure.active && !self.tenure.revoked {
            self.tenure.revoked = true;
            if let Err(e) = readiness.attach_cq() {
                self.conn.on_local_error(format!(
                    "putting the completion channel back into the readiness fd failed: {e}"
                ));
            }
        }
    }

    /// Whether a read wait beginning now waits for an answer: this side committed bytes
    /// since the last read wait began (a request before its reply; see `spin::Answers`).
    pub(crate) fn awaits_answer(&mut self) -> bool {
        self.answers.read_wait(self.conn.committed())
    }

    /// Waits until `ready(core)` holds or `deadline` passes (false then): pumps, spins for
    /// the busy-poll time, then sleeps on the readiness fd until a completion, an rdma_cm
    /// event or the core's next timer. `answer`: the wait is for an answer (see
    /// [`awaits_answer`](Self::awaits_answer)), which may spin the adaptive spin's whole limit.
    pub(crate) fn wait_until(
        &mut self,
        readiness: &Readiness,
        deadline: Option<Instant>,
        answer: bool,
        ready: impl Fn(&Connection) -> bool,
    ) -> Result<bool, Error> {
        let done = |c: &Connection| ready(c) || c.error().is_some() || c.broken().is_some();
        let started = Instant::now();
        let mut slept = false;
        // Counted among the process's waiting threads until this returns; with more of them
        // than half the cores, a long spin is time the others wait (spin.rs).
        let waiter = crate::spin::WAITING.enter(crate::spin::spinners());
        // Completions only: rdma_cm's channel and the timers are looked at before sleeping
        // (prepare_sleep) and after waking. Reading the channel costs a system call, an
        // allocation and a free even when it is empty, on every wait of a ping-pong; a
        // connection whose peer left stops making progress, so its wait reaches
        // prepare_sleep within the busy-poll time and sees the event there.
        self.pump_fast(started);
        loop {
            if done(&self.conn) {
                self.spin.record_wait(started.elapsed(), slept, answer);
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let spin_end = now
                + if slept {
                    Duration::ZERO
                } else if waiter.uncrowded() {
                    self.spin.time_for(answer)
                } else {
                    self.spin.min()
                };
            // A busy poll set longer than the caller's timeout spins only until the timeout.
            let spin_end = deadline.map_or(spin_end, |d| spin_end.min(d));
            if self.spin_for_progress(spin_end) {
                continue;
            }
            if self.prepare_sleep(readiness) {
                continue;
            }
            let until = match (deadline, self.conn.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timeout = until.map(|u| u.saturating_duration_since(Instant::now()));
            slept = true;
            let woke = readiness
                .wait(timeout)
                .map_err(|e| Error::verbs("waiting for the connection", e))?;
            self.pump_woken(Instant::now(), woke);
        }
    }

    /// Closes gracefully: shuts the write side down, waits at most `linger` for the FIN to
    /// complete (every byte written is then in the peer's ring), and disconnects.
    pub(crate) fn close(&mut self, readiness: &Readiness, linger: Duration) {
        if self.conn.error().is_none() && self.conn.broken().is_none() {
            self.conn.shutdown_write();
            // Lent buffers stay readable until the peer returns them: it may still be
            // fetching what it was sent.
            let _ = self.wait_until(readiness, Some(Instant::now() + linger), false, |c| {
                c.fin_done() && c.lent_outstanding() == 0
            });
        }
        if !self.disconnected {
            self.disconnected = true;
            let _ = self.res.id.disconnect();
        }
    }

    /// Shuts the write side down and posts the FIN (once every byte before it is posted).
    pub(crate) fn shutdown_write(&mut self) {
        self.conn.shutdown_write();
        self.post();
    }

    /// Registers `buf` for the peer to READ and queues it as lent; returns its descriptor
    /// (the caller commits it as the bytes of a message begun with `begin_lend`). On
    /// failure the buffer comes back with the error.
    pub(crate) fn lend(&mut self, buf: Vec<u8>) -> Result<Lend, Box<(Error, Vec<u8>)>> {
        let len = match u32::try_from(buf.len()) {
            Ok(n) => n,
            Err(_) => {
                let e = Error::InvalidInput(format!(
                    "a buffer of {} bytes is larger than a message may be",
                    buf.len()
                ));
                return Err(Box::new((e, buf)));
            }
        };
        // The device reads it only: no write access, so the bytes may stay initialised
        // as they are and nothing the peer does can change them.
        let loan = Loan::new(&self.res._pd, buf, len, AccessFlags::REMOTE_READ)?;
        let desc = loan.descriptor();
        self.lent.push_back(loan);
        Ok(desc)
    }

    /// Deregisters the buffers the peer returned and queues them for the application.
    fn take_returns(&mut self) {
        for _ in 0..self.conn.poll_returned() {
            let Some(loan) = self.lent.pop_front() else {
                break;
            };
            match loan.end() {
                Some(v) => self.reclaimed.push_back(v),
                None => log::warn!(
                    target: "trespass",
                    "a lent buffer could not be deregistered; its memory is kept for ever"
                ),
            }
        }
    }

    /// Buffers lent and not yet reclaimed by the application.
    pub(crate) fn lent_count(&self) -> usize {
        self.lent.len() + self.reclaimed.len()
    }

    /// Consumes the lent-region descriptor at the head of the ring (the receive window
    /// says `lent`) and starts fetching its region into `target`'s allocation (cleared,
    /// grown to the region's length if needed).
    pub(crate) fn begin_fetch(&mut self, mut target: Vec<u8>) -> Result<(), Error> {
        let mut desc = [0u8; LEND_LEN];
        let mut got = 0;
        loop {
            let w = self.conn.recv_window();
            if !w.lent || (w.len == 0 && !w.ends_message) {
                break;
            }
            let take = (w.len as usize).min(LEND_LEN - got);
            self.res
                .ring
                .read_at(w.offset as usize, &mut desc[got..got + take])
                .map_err(|e| Error::verbs("copying a lent region's descriptor", e))?;
            self.conn.consume_message(take as u32, w.ends_message);
            got += take;
            if w.ends_message {
                break;
            }
        }
        self.conn
            .begin_fetch(&desc[..got])
            .map_err(Error::Connection)?;
        let len = self.conn.fetching().map_or(0, |l| l.len);
        target.clear();
        target.reserve(len as usize);
        match Loan::new(&self.res._pd, target, len, AccessFlags::LOCAL_WRITE) {
            Ok(loan) => self.fetch = Some(loan),
            Err(failed) => {
                let (e, _) = *failed;
                self.conn.on_local_error(e.to_string());
                return Err(e);
            }
        }
        self.post();
        Ok(())
    }

    /// The fetched region, once every READ completed: deregistered, its `Vec` of the
    /// region's length; the RETURN goes to the peer. `None` while it is still coming.
    pub(crate) fn take_fetched(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let Some(len) = self.conn.finish_fetch() else {
            return Ok(None);
        };
        let loan = self.fetch.take();
        self.post();
        let Some(mut v) = loan.and_then(Loan::end) else {
            return Err(Error::Connection(crate::core::ConnError::Local(
                "the target of a lent region could not be deregistered; its memory is kept for ever"
                    .into(),
            )));
        };
        // SAFETY: the loan registered `len` bytes of this allocation (its capacity is at
        // least that), and every RDMA READ of the region completed successfully
        // (`finish_fetch` returned): the device wrote each of the `len` bytes.
        #[allow(unsafe_code)]
        unsafe {
            v.set_len(len as usize)
        };
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_reader_waits_for_is_posted_solicited() {
        for (imm, solicited) in [
            (
                Imm::Data {
                    len: 64,
                    msg: false,
                    eom: false,
                },
                true,
            ),
            (
                Imm::Data {
                    len: 0,
                    msg: true,
                    eom: true,
                },
                true,
            ),
            (Imm::Control(Control::Fin), true),
            (Imm::CreditBytes(4096), false),
            (Imm::CreditRecvs(3), false),
            (Imm::Control(Control::Ping), false),
            (Imm::Control(Control::Pong), false),
            (Imm::Control(Control::Lend), false),
            (Imm::Control(Control::Return), false),
        ] {
            assert_eq!(carries_data(imm.encode()), solicited, "{imm:?}");
        }
        // An immediate that does not decode is not solicited (it is never posted).
        assert!(!carries_data(u32::MAX));
    }
}
