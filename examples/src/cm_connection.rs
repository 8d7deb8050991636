//! A reliable connection made with rdma_cm on a queue pair of the program's own (as `rping`
//! and `cmtime` make theirs): the QP, its CQ and PD on the id's device, moved through its
//! states with the id's `rdma_init_qp_attr`, and waits for completions that never outlast
//! their limit or the peer.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::rdmacm::{CmId, EventChannel, EventType, QpTargetState};
use sideway::{CompletionQueue, ProtectionDomain, QueuePair, WorkCompletion};

use crate::cli::CliError;

/// The socket address of `host` (a name or an IP address) and `port`; IPv4 first, as
/// rdma-core's programs pick it.
pub fn socket_addr(host: &str, port: u16) -> Result<SocketAddr, CliError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| CliError::run(format!("cannot resolve the address {host:?}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| CliError::run(format!("the address {host:?} resolves to nothing")))
}

/// Moves `qp` to each of `states` in turn, with the attributes `id`'s connection gives
/// (`rdma_init_qp_attr`, then `ibv_modify_qp`).
pub fn move_qp(id: &CmId, qp: &QueuePair, states: &[QpTargetState]) -> Result<(), CliError> {
    for &state in states {
        let attr = id.init_qp_attr(state).map_err(CliError::run)?;
        qp.modify(&attr.into()).map_err(CliError::run)?;
    }
    Ok(())
}

/// How a wait ended when the peer might leave instead.
#[derive(Debug)]
pub enum Waited {
    /// The completions asked for, in the order their work requests were named.
    Done(Vec<WorkCompletion>),
    /// The peer disconnected first (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected,
}

/// One connection: its id and channel (one id per channel), and a QP of the program's own
/// with one CQ for sends and receives, on a PD of the id's device.
pub struct CmConnection {
    /// The connection's id.
    pub id: Arc<CmId>,
    /// The channel the id's events arrive on; no other id uses it.
    pub channel: Arc<EventChannel>,
    /// The protection domain, on the id's device; register buffers here.
    pub pd: Arc<ProtectionDomain>,
    /// The completion queue of both work queues.
    pub cq: Arc<CompletionQueue>,
    /// The queue pair.
    pub qp: QueuePair,
    /// How long any one wait may take.
    pub timeout: Duration,
    /// Completions that came before a wait asked for them.
    early: Vec<WorkCompletion>,
}

impl CmConnection {
    /// A PD, a CQ and an RC QP (`depth` send and receive requests) on the device `id` is
    /// bound to, the QP moved to Init for the id's port. Waits are limited to `timeout`.
    pub fn new(id: &Arc<CmId>, depth: u32, timeout: Duration) -> Result<Self, CliError> {
        let ctx = id.device_context().map_err(CliError::run)?;
        let pd = ctx.alloc_pd().map_err(CliError::run)?;
        let cq = ctx
            .create_cq_builder()
            .cqe(depth * 2)
            .build()
            .map_err(CliError::run)?;
        let qp = pd
            .create_qp_builder()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            .build()
            .map_err(CliError::run)?;
        move_qp(id, &qp, &[QpTargetState::Init])?;
        Ok(CmConnection {
            id: Arc::clone(id),
            channel: id.channel(),
            pd,
            cq,
            qp,
            timeout,
            early: Vec::new(),
        })
    }

    /// Waits for the completions of the work requests `wr_ids` (in any order), each
    /// successful; fails when they take longer than the timeout, or the peer disconnects
    /// first.
    pub fn wait(&mut self, wr_ids: &[u64], what: &str) -> Result<Vec<WorkCompletion>, CliError> {
        match self.wait_or_disconnect(wr_ids, what)? {
            Waited::Done(wcs) => Ok(wcs),
            Waited::Disconnected => Err(CliError::run(format!(
                "the peer disconnected while waiting for {what}"
            ))),
        }
    }

    /// Like [`wait`](Self::wait), but the peer disconnecting first is an answer, not an
    /// error. Completions of other work requests that come meanwhile are kept for the wait
    /// that asks for them: a CQ shared by both queues does not order a send's completion
    /// before the peer's reply to it.
    pub fn wait_or_disconnect(&mut self, wr_ids: &[u64], what: &str) -> Result<Waited, CliError> {
        let deadline = Instant::now() + self.timeout;
        let mut got: Vec<Option<WorkCompletion>> = vec![None; wr_ids.len()];
        for wc in std::mem::take(&mut self.early) {
            claim(wr_ids, &mut got, wc, &mut self.early);
        }
        let mut idle_polls = 0u32;
        while got.iter().any(Option::is_none) {
            let mut poller = self.cq.poll().map_err(CliError::run)?;
            let mut any = false;
            while let Some(wc) = poller.next_completion().map_err(CliError::run)? {
                any = true;
                wc.ok().map_err(|e| CliError::run(format!("{what}: {e}")))?;
                claim(wr_ids, &mut got, wc, &mut self.early);
            }
            drop(poller);
            if any {
                idle_polls = 0;
                continue;
            }
            if self.peer_left(what)? {
                return Ok(Waited::Disconnected);
            }
            if Instant::now() >= deadline {
                return Err(CliError::run(format!(
                    "no completion of {what} within {:?} (is the peer still there?)",
                    self.timeout
                )));
            }
            // Spin briefly for latency, then sleep so an idle wait costs no CPU.
            idle_polls += 1;
            if idle_polls < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(Waited::Done(got.into_iter().flatten().collect()))
    }

    /// Handles the rdma_cm event waiting on the channel, if any: true when it says the peer
    /// disconnected. Connection requests for a listener sharing the channel are refused
    /// (the request's id is dropped): this connection is being served.
    fn peer_left(&self, what: &str) -> Result<bool, CliError> {
        let Some(event) = self.channel.try_get_event().map_err(CliError::run)? else {
            return Ok(false);
        };
        if !Arc::ptr_eq(event.id(), &self.id) {
            return Ok(false);
        }
        match event.into_result().map_err(CliError::run)?.event_type() {
            EventType::Disconnected => Ok(true),
            // Late news of what is already known.
            EventType::Established | EventType::TimewaitExit => Ok(false),
            other => Err(CliError::run(format!(
                "{what}: unexpected rdma_cm event {other:?}"
            ))),
        }
    }

    /// Waits, at most the timeout, for the peer to disconnect
    /// (`RDMA_CM_EVENT_DISCONNECTED`); completions that come meanwhile are kept.
    pub fn wait_peer_disconnect(&mut self) -> Result<(), CliError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.peer_left("the peer's disconnect")? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CliError::run(format!(
                    "the peer did not disconnect within {:?}",
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Disconnects (`rdma_disconnect`) and waits, at most the timeout, for the
    /// `RDMA_CM_EVENT_DISCONNECTED` that ends the connection on this side.
    pub fn disconnect(&mut self) -> Result<(), CliError> {
        self.id.disconnect().map_err(CliError::run)?;
        self.wait_peer_disconnect()
            .map_err(|e| CliError::run(format!("disconnecting: {e}")))
    }
}

/// Files `wc` under the work request of `wr_ids` it completes, or with the early ones.
fn claim(
    wr_ids: &[u64],
    got: &mut [Option<WorkCompletion>],
    wc: WorkCompletion,
    early: &mut Vec<WorkCompletion>,
) {
    match wr_ids.iter().position(|&id| id == wc.wr_id()) {
        Some(i) if got[i].is_none() => got[i] = Some(wc),
        _ => early.push(wc),
    }
}
