//! `-R`: connecting the QPs through rdma_cm instead of trading QP numbers and PSNs on TCP.
//!
//! The QPs stay this program's own (created on its protection domain like any other run);
//! each gets an rdma_cm id whose connection supplies the attributes of every state change
//! (`rdma_init_qp_attr`), so the path, the PSNs and the peer's QP number come from rdma_cm.
//! The TCP channel still carries what rdma_cm cannot: the parameter check (which must come
//! first, so that a mismatch is refused before anything connects), each buffer's address and
//! remote key, the barriers and the results. The server listens on the same port number as the
//! TCP channel (rdma_cm's port space is its own); the client connects its QPs one after the
//! other, in order, so that the server's k-th connection request is the client's k-th QP.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use sideway::queue_pair::QueuePair;
use sideway::rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace, QpTargetState};

use super::error::RunError;
use super::setup::Resources;
use crate::params::TestParams;

/// How long each rdma_cm step may take.
const CM_TIMEOUT: Duration = Duration::from_secs(15);

/// The rdma_cm ids of a run: they must live as long as the connections.
#[derive(Debug)]
pub(crate) struct CmLinks {
    _ids: Vec<Arc<CmId>>,
    _listener: Option<Arc<CmId>>,
    _channel: Arc<EventChannel>,
}

/// A server's listening id, made before the endpoints are traded so that the client's
/// connection requests find it.
#[derive(Debug)]
pub(crate) struct CmListener {
    channel: Arc<EventChannel>,
    id: Arc<CmId>,
}

fn move_qp(id: &CmId, qp: &QueuePair, states: &[QpTargetState]) -> Result<(), RunError> {
    for &state in states {
        let attr = id.init_qp_attr(state)?;
        qp.modify(&attr).map_err(|e| {
            RunError::setup(format!(
                "moving QP {:#x} to {state:?} with rdma_cm's attributes: {e}",
                qp.qp_num()
            ))
        })?;
    }
    Ok(())
}

fn conn_param(qp: &QueuePair, params: &TestParams) -> ConnParam {
    let rd = u8::try_from(params.outstanding.clamp(1, 255)).unwrap_or(u8::MAX);
    let mut p = ConnParam::new();
    p.qp_num(qp.qp_num())
        .responder_resources(rd)
        .initiator_depth(rd)
        .retry_count(super::link::RETRY_CNT)
        .rnr_retry_count(6);
    p
}

fn check_device(id: &CmId, device: &str) -> Result<(), RunError> {
    let ctx = id.device_context()?;
    if ctx.name() != device {
        return Err(RunError::usage(format!(
            "rdma_cm routes this connection through {}, but the run uses {device}: pass -d {} \
             or connect to an address of {device}",
            ctx.name(),
            ctx.name()
        )));
    }
    Ok(())
}

/// `--tos`: sets the id's type of service (`rdma_set_option(RDMA_OPTION_ID_TOS)`), which
/// rdma_cm turns into the traffic class of the path it resolves next. sideway's rdmacm module
/// has no wrapper for rdma_set_option yet, so this calls the re-exported binding on the
/// id's raw pointer.
#[allow(unsafe_code)]
fn set_tos(id: &CmId, tos: u8) -> Result<(), RunError> {
    let mut value = tos;
    // SAFETY: the id is alive for the call (borrowed); optval points at one readable byte
    // and optlen says 1, as RDMA_OPTION_ID_TOS takes a u8; librdmacm copies it.
    let ret = unsafe {
        sideway::sys::rdma_set_option(
            id.as_raw(),
            sideway::sys::RDMA_OPTION_ID as std::os::raw::c_int,
            sideway::sys::RDMA_OPTION_ID_TOS as std::os::raw::c_int,
            (&mut value as *mut u8).cast(),
            1,
        )
    };
    if ret != 0 {
        return Err(RunError::setup(format!(
            "--tos {tos}: rdma_set_option(RDMA_OPTION_ID_TOS) failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl CmListener {
    /// Listens for rdma_cm connection requests on `port` (all addresses), with the type of
    /// service `tos` (`--tos`) when given.
    pub(crate) fn listen(port: u16, backlog: u32, tos: Option<u8>) -> Result<Self, RunError> {
        let channel = EventChannel::new()?;
        let id = channel.create_id(PortSpace::Tcp)?;
        if let Some(tos) = tos {
            set_tos(&id, tos)?;
        }
        id.bind_addr(SocketAddr::from(([0, 0, 0, 0], port)))?;
        id.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
        Ok(CmListener { channel, id })
    }

    /// Accepts one connection request per QP, in order, and connects each QP with it.
    pub(crate) fn accept_all(
        self,
        res: &Resources,
        params: &TestParams,
        device: &str,
    ) -> Result<CmLinks, RunError> {
        let mut ids = Vec::with_capacity(res.qps.len());
        for qp in &res.qps {
            let request = self
                .id
                .wait_for(EventType::ConnectRequest, Some(CM_TIMEOUT))?;
            let id = Arc::clone(request.id());
            check_device(&id, device)?;
            move_qp(
                &id,
                qp,
                &[QpTargetState::Init, QpTargetState::Rtr, QpTargetState::Rts],
            )?;
            id.accept(&conn_param(qp, params))?;
            id.wait_for(EventType::Established, Some(CM_TIMEOUT))?;
            ids.push(id);
        }
        Ok(CmLinks {
            _ids: ids,
            _listener: Some(self.id),
            _channel: self.channel,
        })
    }
}

/// Connects each QP, in order, to the server's listener at `host:port`.
pub(crate) fn connect_all(
    host: &str,
    port: u16,
    res: &Resources,
    params: &TestParams,
    device: &str,
) -> Result<CmLinks, RunError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| RunError::setup(format!("cannot resolve {host}: {e}")))?
        .collect();
    let server = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| RunError::setup(format!("{host} resolves to no address")))?;
    let channel = EventChannel::new()?;
    let mut ids = Vec::with_capacity(res.qps.len());
    for qp in &res.qps {
        let id = channel.create_id(PortSpace::Tcp)?;
        id.resolve_addr(None, server, Duration::from_secs(2))?;
        id.wait_for(EventType::AddrResolved, Some(CM_TIMEOUT))?;
        check_device(&id, device)?;
        if let Some(tos) = params.tos {
            set_tos(&id, tos)?;
        }
        id.resolve_route(Duration::from_secs(2))?;
        id.wait_for(EventType::RouteResolved, Some(CM_TIMEOUT))?;
        move_qp(&id, qp, &[QpTargetState::Init])?;
        id.connect(&conn_param(qp, params))?;
        // The QP is ours, not the id's: rdma_cm reports the server's answer, and the QP
        // follows it to RTR and RTS here before the connection is declared established.
        id.wait_for(EventType::ConnectResponse, Some(CM_TIMEOUT))?;
        move_qp(&id, qp, &[QpTargetState::Rtr, QpTargetState::Rts])?;
        id.establish()?;
        ids.push(id);
    }
    Ok(CmLinks {
        _ids: ids,
        _listener: None,
        _channel: channel,
    })
}
