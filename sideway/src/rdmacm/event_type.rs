//! The kinds of rdma_cm events and reject reasons, as C numbers that a newer librdmacm may
//! grow.

use std::fmt;
use std::io;

use rdma_mummy_sys as ffi;

use crate::macros::c_enum;

c_enum! {
    /// The type of an rdma_cm event.
    pub enum EventType: "rdma_cm_event_type" {
        /// `rdma_resolve_addr` completed.
        AddrResolved = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        /// `rdma_resolve_addr` failed.
        AddrError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR,
        /// `rdma_resolve_route` completed.
        RouteResolved = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        /// `rdma_resolve_route` failed.
        RouteError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_ERROR,
        /// A connection request arrived on a listening id; the event's id is the new one.
        ConnectRequest = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
        /// The peer accepted, on an id without a QP: finish with [`CmId::establish`](super::CmId::establish).
        ConnectResponse = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE,
        /// Setting up the connection failed.
        ConnectError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR,
        /// The peer is unreachable or did not answer.
        Unreachable = ffi::rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE,
        /// The peer rejected the connection.
        Rejected = ffi::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
        /// The connection is established.
        Established = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
        /// The connection was disconnected.
        Disconnected = ffi::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED,
        /// The device under the id was removed.
        DeviceRemoval = ffi::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL,
        /// A multicast join completed.
        MulticastJoin = ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN,
        /// A multicast join failed, or a joined group was lost.
        MulticastError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_ERROR,
        /// The network device under the id changed its hardware address.
        AddrChange = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_CHANGE,
        /// The connection's QP left its timewait state and may be reused.
        TimewaitExit = ffi::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }
}

c_enum! {
    /// The InfiniBand CM's reason for a reject (IBA table "REJ reason"), reported as the
    /// status of `RDMA_CM_EVENT_REJECTED` on InfiniBand and RoCE.
    pub enum IbRejectReason: "ib_cm_rej_reason" {
        /// No QP available.
        NoQp = 1,
        /// No EEC available.
        NoEec = 2,
        /// No resources available.
        NoResources = 3,
        /// Timeout.
        Timeout = 4,
        /// Unsupported request.
        Unsupported = 5,
        /// Invalid communication ID.
        InvalidCommId = 6,
        /// Invalid communication instance.
        InvalidCommInstance = 7,
        /// Invalid service ID: nobody listens on that address and port.
        InvalidServiceId = 8,
        /// Invalid transport service type.
        InvalidTransportType = 9,
        /// Stale connection.
        StaleConn = 10,
        /// RDC does not exist.
        RdcNotExist = 11,
        /// Primary remote port GID rejected.
        InvalidGid = 12,
        /// Primary remote port LID rejected.
        InvalidLid = 13,
        /// Invalid primary SL.
        InvalidSl = 14,
        /// Invalid primary traffic class.
        InvalidTrafficClass = 15,
        /// Invalid primary hop limit.
        InvalidHopLimit = 16,
        /// Invalid primary packet rate.
        InvalidPacketRate = 17,
        /// Alternate remote port GID rejected.
        InvalidAltGid = 18,
        /// Alternate remote port LID rejected.
        InvalidAltLid = 19,
        /// Invalid alternate SL.
        InvalidAltSl = 20,
        /// Invalid alternate traffic class.
        InvalidAltTrafficClass = 21,
        /// Invalid alternate hop limit.
        InvalidAltHopLimit = 22,
        /// Invalid alternate packet rate.
        InvalidAltPacketRate = 23,
        /// Port redirection (CM).
        PortCmRedirect = 24,
        /// Port redirection.
        PortRedirect = 25,
        /// Invalid path MTU.
        InvalidMtu = 26,
        /// Insufficient responder resources.
        InsufficientRespResources = 27,
        /// The peer's application rejected the request (`rdma_reject`).
        ConsumerDefined = 28,
        /// Invalid RNR NAK retry count.
        InvalidRnrRetry = 29,
        /// Duplicate local communication ID.
        DuplicateLocalCommId = 30,
        /// Invalid class version.
        InvalidClassVersion = 31,
        /// Invalid primary flow label.
        InvalidFlowLabel = 32,
        /// Invalid alternate flow label.
        InvalidAltFlowLabel = 33,
    }
}

/// Why a connection was rejected: the status of `RDMA_CM_EVENT_REJECTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectReason {
    pub(super) status: i32,
}

impl RejectReason {
    /// The raw status: a positive transport reason (the IB CM's on InfiniBand and RoCE), or a
    /// negative errno (iWARP reports `-ECONNREFUSED`).
    pub fn status(self) -> i32 {
        self.status
    }

    /// The IB CM reason, when the status is one.
    pub fn ib_reason(self) -> Option<IbRejectReason> {
        u32::try_from(self.status)
            .ok()
            .filter(|&s| s > 0)
            .map(IbRejectReason::from)
    }

    /// True when the peer's application called `rdma_reject` (IB CM reason 28, or
    /// `-ECONNREFUSED` on iWARP).
    pub fn is_consumer_reject(self) -> bool {
        self.ib_reason() == Some(IbRejectReason::ConsumerDefined)
            || self.status == -libc::ECONNREFUSED
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ib_reason() {
            Some(IbRejectReason::ConsumerDefined) => {
                write!(f, "the peer rejected it (IB CM reason 28)")
            }
            Some(IbRejectReason::InvalidServiceId) => {
                write!(
                    f,
                    "nobody listens there (IB CM reason 8, invalid service ID)"
                )
            }
            Some(IbRejectReason::Unknown(n)) => write!(f, "IB CM reason {n}"),
            Some(r) => write!(f, "{r:?} (IB CM reason {})", self.status),
            None => write!(f, "{}", status_text(self.status)),
        }
    }
}

pub(super) fn status_text(status: i32) -> String {
    if status < 0 {
        io::Error::from_raw_os_error(-status).to_string()
    } else {
        format!("transport status {status}")
    }
}
