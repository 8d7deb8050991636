//! What a connection carries: port spaces, private data limits, the parameters of
//! `rdma_connect`/`rdma_accept` and of the peer's answer.

use std::ptr;

use rdma_mummy_sys as ffi;

/// Most private data `rdma_connect` carries on an `RDMA_PS_TCP` id over InfiniBand or RoCE
/// (the IB CM REQ's 92 bytes less rdma_cm's 36-byte header).
pub const MAX_PRIVATE_DATA_TCP_CONNECT: usize = 56;
/// Most private data `rdma_accept` carries on an `RDMA_PS_TCP` id over InfiniBand or RoCE
/// (the IB CM REP).
pub const MAX_PRIVATE_DATA_TCP_ACCEPT: usize = 196;
/// Most private data `rdma_reject` carries on an `RDMA_PS_TCP` id over InfiniBand or RoCE
/// (the IB CM REJ).
pub const MAX_PRIVATE_DATA_TCP_REJECT: usize = 148;
/// Most private data `rdma_connect` carries on an `RDMA_PS_UDP` id over InfiniBand or RoCE
/// (the SIDR REQ's 216 bytes less rdma_cm's 36-byte header).
pub const MAX_PRIVATE_DATA_UDP_CONNECT: usize = 180;
/// Most private data `rdma_accept` or `rdma_reject` carries on an `RDMA_PS_UDP` id over
/// InfiniBand or RoCE (the SIDR REP).
pub const MAX_PRIVATE_DATA_UDP_REPLY: usize = 136;

/// The port space of an rdma_cm id: what kind of service it offers.
#[doc(alias = "rdma_port_space")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC QPs).
    Tcp,
    /// `RDMA_PS_UDP`: datagrams and multicast (UD QPs).
    Udp,
}

impl PortSpace {
    pub(super) fn raw(self) -> ffi::rdma_port_space::Type {
        match self {
            PortSpace::Tcp => ffi::rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => ffi::rdma_port_space::RDMA_PS_UDP,
        }
    }
}

/// Which call private data is for; the limits differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivateDataCall {
    /// `rdma_connect`.
    Connect,
    /// `rdma_accept`.
    Accept,
    /// `rdma_reject`.
    Reject,
}

impl PrivateDataCall {
    pub(super) fn name(self) -> &'static str {
        match self {
            PrivateDataCall::Connect => "rdma_connect",
            PrivateDataCall::Accept => "rdma_accept",
            PrivateDataCall::Reject => "rdma_reject",
        }
    }
}

/// The most private data `call` carries on an id of `port_space` over InfiniBand or RoCE
/// (the limits in rdma_connect(3) and rdma_accept(3)).
pub fn max_private_data(port_space: PortSpace, call: PrivateDataCall) -> usize {
    match (port_space, call) {
        (PortSpace::Tcp, PrivateDataCall::Connect) => MAX_PRIVATE_DATA_TCP_CONNECT,
        (PortSpace::Tcp, PrivateDataCall::Accept) => MAX_PRIVATE_DATA_TCP_ACCEPT,
        (PortSpace::Tcp, PrivateDataCall::Reject) => MAX_PRIVATE_DATA_TCP_REJECT,
        (PortSpace::Udp, PrivateDataCall::Connect) => MAX_PRIVATE_DATA_UDP_CONNECT,
        (PortSpace::Udp, PrivateDataCall::Accept | PrivateDataCall::Reject) => {
            MAX_PRIVATE_DATA_UDP_REPLY
        }
    }
}

/// The parameters of the other side, from a connection event of an `RDMA_PS_TCP` id
/// (`param.conn`).
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConnParam {
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) flow_control: u8,
    pub(super) retry_count: u8,
    pub(super) rnr_retry_count: u8,
    pub(super) srq: bool,
    pub(super) qp_num: u32,
}

impl PeerConnParam {
    /// Responder resources asked of this side: the peer's initiator depth.
    pub fn responder_resources(&self) -> u8 {
        self.responder_resources
    }

    /// Outstanding RDMA reads and atomics this side may issue: the peer's responder resources.
    pub fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    /// Whether the peer offers hardware flow control.
    pub fn flow_control(&self) -> u8 {
        self.flow_control
    }

    /// The retry count the peer asks for (connect requests only).
    pub fn retry_count(&self) -> u8 {
        self.retry_count
    }

    /// The RNR retry count the peer asks for.
    pub fn rnr_retry_count(&self) -> u8 {
        self.rnr_retry_count
    }

    /// Whether the peer uses a shared receive queue.
    pub fn srq(&self) -> bool {
        self.srq
    }

    /// The peer's QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
}

/// Connection parameters for [`CmId::connect`](super::CmId::connect) and [`CmId::accept`](super::CmId::accept) (`struct
/// rdma_conn_param`), private data included. The defaults are what librdmacm uses when given
/// none: the device's most responder resources and initiator depth, retry and RNR retry 7.
///
/// rxe note: an RNR retry count of 7 retries forever; against a peer that never posts
/// receives it can stall SoftRoCE. Set a finite `rnr_retry_count` where that matters.
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    pub(super) private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: ffi::RDMA_MAX_RESP_RES as u8,
            initiator_depth: ffi::RDMA_MAX_INIT_DEPTH as u8,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

impl ConnParam {
    /// The defaults; see the type's documentation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Private data for the peer (`private_data`, `private_data_len`); the call checks the
    /// length against the transport's limit before sending anything.
    pub fn private_data(&mut self, data: &[u8]) -> &mut Self {
        self.private_data = data.to_vec();
        self
    }

    /// Most outstanding RDMA reads and atomics the peer may issue to this side
    /// (`responder_resources`; 255 = the device's most).
    pub fn responder_resources(&mut self, n: u8) -> &mut Self {
        self.responder_resources = n;
        self
    }

    /// Most outstanding RDMA reads and atomics this side issues (`initiator_depth`; 255 = the
    /// device's most).
    pub fn initiator_depth(&mut self, n: u8) -> &mut Self {
        self.initiator_depth = n;
        self
    }

    /// Whether hardware flow control is offered (`flow_control`; told to the peer only).
    pub fn flow_control(&mut self, on: u8) -> &mut Self {
        self.flow_control = on;
        self
    }

    /// Retries of a transfer after a timeout (`retry_count`, 3 bits; connect only).
    pub fn retry_count(&mut self, n: u8) -> &mut Self {
        self.retry_count = n;
        self
    }

    /// Retries after a receiver-not-ready NAK (`rnr_retry_count`, 3 bits; 7 = forever).
    pub fn rnr_retry_count(&mut self, n: u8) -> &mut Self {
        self.rnr_retry_count = n;
        self
    }

    /// Whether the connection's QP uses a shared receive queue (`srq`); ignored when the id
    /// has a QP of its own.
    pub fn srq(&mut self, on: bool) -> &mut Self {
        self.srq = on;
        self
    }

    /// The QP number of the connection (`qp_num`), for a QP that is not the id's own (see
    /// [`CmId::init_qp_attr`](super::CmId::init_qp_attr)); ignored when the id has a QP.
    pub fn qp_num(&mut self, qp_num: u32) -> &mut Self {
        self.qp_num = qp_num;
        self
    }

    pub(super) fn raw(&self) -> ffi::rdma_conn_param {
        ffi::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            // Checked against the limits (all ≤ 255) before this is used.
            private_data_len: u8::try_from(self.private_data.len()).unwrap_or(u8::MAX),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: u8::from(self.srq),
            qp_num: self.qp_num,
        }
    }
}
