//! A reliable connection made with rdma_cm, on a queue pair rdma_cm creates and moves
//! (`rdma_create_qp`) or on one of the program's own (`ibv_create_qp`, as `rping -q` makes
//! its): the QP, its CQ and PD on the id's device (connected with [`CmId::connect_qp`] /
//! [`CmId::accept_qp`]), and waits for completions ([`CompletionWaiter`]) that never
//! outlast their limit or the peer.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::connection::{CompletionWaiter, WaitError};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QpState, QueuePair, QueuePairAttribute};
use sideway::rdmacm::{CmId, EventChannel, EventType, QpTargetState};

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

/// How a wait ended when the peer might leave instead.
#[derive(Debug)]
pub enum Waited {
    /// The completions asked for, in the order their work requests were named.
    Done(Vec<WorkCompletion>),
    /// The peer disconnected first (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected,
}

/// Who creates the connection's QP and moves it through its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpOwner {
    /// librdmacm: `rdma_create_qp` on the id (the QP starts in Init), moved to RTR and RTS
    /// by the connect or accept, and to Error by `rdma_disconnect`.
    RdmaCm,
    /// The program: `ibv_create_qp` on the PD, moved to Init here, to RTR and RTS with
    /// `rdma_init_qp_attr` by [`CmId::connect_qp`] / [`CmId::accept_qp`] (which name it in
    /// the connection's `qp_num`), and to Error by [`CmConnection::disconnect`].
    Program,
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
    /// Who made the QP.
    pub owner: QpOwner,
    /// Waits on `cq`, keeping completions that came before a wait asked for them.
    waiter: CompletionWaiter,
}

/// What ends a wait early: the CQ's own trouble, or the program's.
enum Stop {
    Wait(WaitError),
    Cli(CliError),
}

impl From<WaitError> for Stop {
    fn from(e: WaitError) -> Self {
        Stop::Wait(e)
    }
}

impl CmConnection {
    /// A PD, a CQ and an RC QP (`depth` send and receive requests) on the device `id` is
    /// bound to, made by `owner`, in Init for the id's port. Waits are limited to `timeout`.
    pub fn new(
        id: &Arc<CmId>,
        depth: u32,
        timeout: Duration,
        owner: QpOwner,
    ) -> Result<Self, CliError> {
        let ctx = id.device_context().map_err(CliError::run)?;
        let pd = ctx.alloc_pd().map_err(CliError::run)?;
        let cq = ctx
            .create_cq_builder()
            .cqe(depth * 2)
            .build()
            .map_err(CliError::run)?;
        let mut builder = pd.create_qp_builder();
        builder
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(depth)
            .max_recv_wr(depth);
        let qp = match owner {
            QpOwner::RdmaCm => id.create_qp(&builder).map_err(CliError::run)?,
            QpOwner::Program => {
                let qp = builder.build().map_err(CliError::run)?;
                id.modify_qp(&qp, &[QpTargetState::Init])
                    .map_err(CliError::run)?;
                qp
            }
        };
        let cq_for_waits = Arc::clone(&cq);
        Ok(CmConnection {
            id: Arc::clone(id),
            channel: id.channel(),
            pd,
            cq,
            qp,
            timeout,
            owner,
            waiter: CompletionWaiter::new(&cq_for_waits, timeout),
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
        let (id, channel) = (&self.id, &self.channel);
        let waited = self
            .waiter
            .wait_all_unless(wr_ids, || peer_left(id, channel, what).map_err(Stop::Cli));
        match waited {
            Ok(Some(wcs)) => Ok(Waited::Done(wcs)),
            Ok(None) => Ok(Waited::Disconnected),
            Err(Stop::Wait(e)) => Err(CliError::run(format!("{what}: {e}"))),
            Err(Stop::Cli(e)) => Err(e),
        }
    }

    /// Handles the rdma_cm event waiting on the channel, if any: true when it says the peer
    /// disconnected. Connection requests for a listener sharing the channel are refused
    /// (the request's id is dropped): this connection is being served.
    fn peer_left(&self, what: &str) -> Result<bool, CliError> {
        peer_left(&self.id, &self.channel, what)
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

    /// Moves a QP of the program's own to Error (what `rdma_disconnect` does to rdma_cm's):
    /// its outstanding work requests are flushed. Nothing for rdma_cm's QP.
    pub fn error_own_qp(&self) -> Result<(), CliError> {
        if self.owner == QpOwner::RdmaCm {
            return Ok(());
        }
        let mut attr = QueuePairAttribute::new();
        attr.set_qp_state(QpState::Err);
        self.qp.modify(&attr).map_err(CliError::run)
    }

    /// Disconnects (`rdma_disconnect`, after moving a QP of the program's own to Error) and
    /// waits, at most the timeout, for the `RDMA_CM_EVENT_DISCONNECTED` that ends the
    /// connection on this side.
    pub fn disconnect(&mut self) -> Result<(), CliError> {
        self.error_own_qp()?;
        self.id.disconnect().map_err(CliError::run)?;
        self.wait_peer_disconnect()
            .map_err(|e| CliError::run(format!("disconnecting: {e}")))
    }
}

/// Handles the rdma_cm event waiting on `channel`, if any: true when it says the peer of
/// `id` disconnected. Connection requests for a listener sharing the channel are refused
/// (the request's id is dropped): this connection is being served.
fn peer_left(id: &Arc<CmId>, channel: &EventChannel, what: &str) -> Result<bool, CliError> {
    let Some(event) = channel.try_get_event().map_err(CliError::run)? else {
        return Ok(false);
    };
    if !Arc::ptr_eq(event.id(), id) {
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
