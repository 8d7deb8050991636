//! Connection management through librdmacm (`rdma_cm`): event channels, ids, connection
//! parameters with private data, reject, UD ids and multicast.
//!
//! Ownership: an [`EventChannel`] is the root. Every [`CmId`] holds the `Arc` of its channel,
//! so a channel is destroyed only after all its ids. Every [`Event`] holds the `Arc`s of the
//! ids it names, so an id is never destroyed while an event about it is still in a user's hands.
//! A QP created on an id ([`CmId::create_qp`]) belongs to the id: the id keeps the QP's
//! protection domain and completion queues alive and destroys the QP (`rdma_destroy_qp`)
//! before itself (`rdma_destroy_id`).
//!
//! Events: [`EventChannel::get_event`] copies everything out of librdmacm's event (type,
//! status, private data, connection or UD parameters, the ids) and acknowledges it
//! (`rdma_ack_cm_event`) before returning, so no Rust value ever points into a buffer that
//! librdmacm frees, and no event is acknowledged twice or forgotten. Each id's `context`
//! field holds a weak reference to its [`CmId`]; that is how an event finds its way back to
//! the Rust object. For `RDMA_CM_EVENT_CONNECT_REQUEST` the event's id is a *new* [`CmId`],
//! owned by whoever keeps it (accept or reject it; dropping it destroys it), and
//! [`Event::listener`] is the listening id.
//!
//! Threads: librdmacm rewrites an id's fields (its device, port, route, addresses, QP) while it
//! processes that id's events and while calls run on that id. Every call on an id of a channel
//! and every event retrieval therefore holds the channel's lock, so no two threads touch those
//! fields at once. Nothing blocks under that lock: the channel's descriptor is non-blocking,
//! and [`EventChannel::get_event`] waits in `poll(2)` outside it.
//!
//! ```no_run
//! use std::time::Duration;
//! use sideway::rdmacm::{ConnParam, EventChannel, EventType, PortSpace};
//!
//! let channel = EventChannel::new()?;
//! let id = channel.create_id(PortSpace::Tcp)?;
//! let server = "198.18.0.1:7471".parse()?;
//! let wait = Some(Duration::from_secs(10));
//! id.resolve_addr(None, server, Duration::from_secs(2))?;
//! id.wait_for(EventType::AddrResolved, wait)?;
//! id.resolve_route(Duration::from_secs(2))?;
//! id.wait_for(EventType::RouteResolved, wait)?;
//! // ... create a QP with id.create_qp(..), or set ConnParam::qp_num for one of your own ...
//! id.connect(ConnParam::new().private_data(b"hello"))?;
//! let established = id.wait_for(EventType::Established, wait)?;
//! println!("the server said {:?}", established.private_data());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The server side: listen, take a connection request, give the new id a QP, accept.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use sideway::rdmacm::{CmQpInitAttr, ConnParam, EventChannel, EventType, PortSpace};
//!
//! let channel = EventChannel::new()?;
//! let listener = channel.create_id(PortSpace::Tcp)?;
//! listener.bind_addr("0.0.0.0:7471".parse()?)?;
//! listener.listen(16)?;
//! let request = channel.wait_for(EventType::ConnectRequest, None)?;
//! println!("a client says {:?}", request.private_data());
//! let conn = Arc::clone(request.id()); // the new connection's id
//! let ctx = conn.device_context()?; // the device the request came in on
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq_builder().cqe(64).build()?;
//! conn.create_qp(&CmQpInitAttr::new(&pd, &cq, &cq))?;
//! // ... register buffers and post receives on the QP before accepting ...
//! conn.accept(ConnParam::new().private_data(b"welcome"))?;
//! conn.wait_for(EventType::Established, Some(Duration::from_secs(10)))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rdma_mummy_sys as ffi;
use rdma_mummy_sys::{Library, LoadError};

use crate::diagnostics::report_drop_failure;
use crate::errno::{fresh, from_ret, non_null, out_ptr, Fresh};
use crate::macros::c_enum;
use crate::verbs::completion_queue::CompletionQueue;
use crate::verbs::device::{DeviceContext, Mtu, TransportType};
use crate::verbs::protection_domain::ProtectionDomain;
use crate::verbs::queue_pair::{QpAttrMask, QueuePairAttribute};

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

/// Why an rdma_cm call, or the connection step an event reports, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// librdmacm (or libibverbs) could not be loaded at all.
    #[error(transparent)]
    Library(#[from] LoadError),
    /// A call failed.
    #[error("{call} failed{endpoints}: {source}")]
    Call {
        /// The librdmacm or verbs call.
        call: &'static str,
        /// The addresses involved, as far as they are known.
        endpoints: Endpoints,
        /// The errno.
        source: io::Error,
    },
    /// No RDMA device could be found for an address (`rdma_resolve_addr` failed at once, or
    /// `RDMA_CM_EVENT_ADDR_ERROR` arrived).
    #[error("cannot resolve {dst} to an RDMA address{}: {}({source})",
        src.map(|s| format!(" from {s}")).unwrap_or_default(), addr_hint(source))]
    AddrUnresolvable {
        /// The destination.
        dst: SocketAddr,
        /// The source address asked for, if any.
        src: Option<SocketAddr>,
        /// The errno (from the call, or the event's status).
        source: io::Error,
    },
    /// No route to the destination could be resolved (`rdma_resolve_route` failed at once,
    /// or `RDMA_CM_EVENT_ROUTE_ERROR` arrived).
    #[error(
        "cannot resolve a route to {}: {}({source})",
        show(dst),
        route_hint(source)
    )]
    RouteUnresolvable {
        /// The destination, once known.
        dst: Option<SocketAddr>,
        /// The errno (from the call, or the event's status).
        source: io::Error,
    },
    /// The remote side did not answer the connection request, or cannot be reached
    /// (`RDMA_CM_EVENT_UNREACHABLE`).
    #[error("{} is unreachable: {}", show(remote), status_text(*status))]
    Unreachable {
        /// The peer.
        remote: Option<SocketAddr>,
        /// The event's status: a negative errno, or a transport status.
        status: i32,
    },
    /// The remote side rejected the connection (`RDMA_CM_EVENT_REJECTED`).
    #[error("the connection to {} was rejected: {reason}{}", show(remote),
        if private_data.iter().all(|&b| b == 0) { String::new() }
        else { format!(" (with private data: {} bytes, zero-padded)", private_data.len()) })]
    Rejected {
        /// The peer.
        remote: Option<SocketAddr>,
        /// Why, as the transport reports it.
        reason: RejectReason,
        /// The private data the peer passed to `rdma_reject` (on InfiniBand and RoCE the
        /// transport's whole buffer: the peer's bytes, then zeros).
        private_data: Vec<u8>,
    },
    /// Setting up the connection failed after the peer answered (`RDMA_CM_EVENT_CONNECT_ERROR`).
    #[error("connection to {} failed: {}", show(remote), status_text(*status))]
    ConnectError {
        /// The peer.
        remote: Option<SocketAddr>,
        /// The event's status.
        status: i32,
    },
    /// A multicast group could not be joined, or was lost (`RDMA_CM_EVENT_MULTICAST_ERROR`).
    #[error("multicast on {} failed: {}", show(local), status_text(*status))]
    MulticastError {
        /// The id's local address.
        local: Option<SocketAddr>,
        /// The event's status.
        status: i32,
    },
    /// The RDMA device under the id went away (`RDMA_CM_EVENT_DEVICE_REMOVAL`); the id must
    /// be dropped.
    #[error("the RDMA device of {} was removed", show(local))]
    DeviceRemoved {
        /// The id's local address.
        local: Option<SocketAddr>,
    },
    /// No event arrived in time. The message names the step when the wait was for one
    /// event ([`EventChannel::wait_for`], [`CmId::wait_for`]), the addresses when the id is
    /// known ([`CmId::wait_for`]), and what most often causes that step to hang.
    #[error("{}", timeout_text(*timeout, *waiting_for, endpoints))]
    Timeout {
        /// How long was waited.
        timeout: Duration,
        /// The event waited for, when the wait was for one.
        waiting_for: Option<EventType>,
        /// The addresses of the id waited on, as far as they are known.
        endpoints: Endpoints,
    },
    /// Another event arrived than the one waited for.
    #[error("expected {expected:?}, got {got:?} (status {status})")]
    UnexpectedEvent {
        /// The event waited for.
        expected: EventType,
        /// The event that came.
        got: EventType,
        /// Its status.
        status: i32,
    },
    /// Private data longer than the transport carries; nothing was sent.
    #[error(
        "{call}: {len} bytes of private data is over the limit of {max} for {port_space:?} \
        ids on {transport}; nothing was sent"
    )]
    PrivateDataTooLong {
        /// `rdma_connect`, `rdma_accept` or `rdma_reject`.
        call: &'static str,
        /// The length given.
        len: usize,
        /// The most the transport carries.
        max: usize,
        /// The id's port space.
        port_space: PortSpace,
        /// The transport the limit is for.
        transport: &'static str,
    },
    /// The id has no device yet.
    #[error(
        "the rdma_cm id{endpoints} is not bound to an RDMA device yet \
        (call bind_addr with a local IP, or resolve_addr, first)"
    )]
    NotBound {
        /// The addresses known.
        endpoints: Endpoints,
    },
    /// A protection domain or CQ from another device context than the id's.
    #[error(
        "{call}: the protection domain and CQs must come from this id's \
        device_context() ({id_device}), not from {other_device}: librdmacm opens its own \
        context of each device"
    )]
    ForeignContext {
        /// The call refused.
        call: &'static str,
        /// The id's device.
        id_device: String,
        /// The device of the object passed in.
        other_device: String,
    },
}

/// A wait's length as a person reads it: whole seconds as "10 s", anything else in ms.
fn show_wait(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The step an event ends, and what most often keeps it from coming.
fn step_of(event: EventType) -> (&'static str, &'static str, &'static str) {
    match event {
        EventType::AddrResolved => (
            "address resolution",
            "ADDR_RESOLVED",
            "is the address right, and on a subnet an RDMA interface reaches?",
        ),
        EventType::RouteResolved => (
            "route resolution",
            "ROUTE_RESOLVED",
            "on InfiniBand, is a subnet manager running?",
        ),
        EventType::ConnectRequest => (
            "waiting for a client",
            "CONNECT_REQUEST",
            "no client asked to connect; is the client pointed at this address and port?",
        ),
        EventType::ConnectResponse | EventType::Established => (
            "rdma_cm connect",
            if matches!(event, EventType::Established) {
                "ESTABLISHED"
            } else {
                "CONNECT_RESPONSE"
            },
            "the peer did not answer: is the server running and listening on that address \
             and port, and reachable over RDMA?",
        ),
        EventType::Disconnected => (
            "disconnect",
            "DISCONNECTED",
            "the peer did not disconnect: is it still running?",
        ),
        EventType::MulticastJoin => (
            "multicast join",
            "MULTICAST_JOIN",
            "on InfiniBand, is a subnet manager running?",
        ),
        _ => ("waiting for an rdma_cm event", "", ""),
    }
}

fn timeout_text(timeout: Duration, waiting_for: Option<EventType>, ends: &Endpoints) -> String {
    let wait = show_wait(timeout);
    let Some(event) = waiting_for else {
        return format!("no rdma_cm event arrived within {wait}{ends}");
    };
    let (step, name, hint) = step_of(event);
    let name = if name.is_empty() {
        format!("{event:?}")
    } else {
        name.to_owned()
    };
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(": {hint}")
    };
    format!("{step}{ends}: no {name} event within {wait}{hint}")
}

fn show(addr: &Option<SocketAddr>) -> String {
    addr.map_or_else(|| "the peer".to_owned(), |a| a.to_string())
}

fn status_text(status: i32) -> String {
    if status < 0 {
        io::Error::from_raw_os_error(-status).to_string()
    } else {
        format!("transport status {status}")
    }
}

fn addr_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENODEV | libc::EADDRNOTAVAIL) => {
            "no RDMA device has an address that reaches it (is the interface up, with an IP, \
             and an RDMA device on it?) "
        }
        Some(libc::ETIMEDOUT | libc::ENODATA) => {
            "no neighbour answered in time (is the peer up, on a subnet an RDMA interface \
             reaches?) "
        }
        _ => "",
    }
}

fn route_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ETIMEDOUT) => {
            "the path query timed out (on InfiniBand: is a subnet manager running?) "
        }
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENODEV | libc::EADDRNOTAVAIL) => {
            "no RDMA device has an address that reaches it (is the interface up, with an IP, \
             and an RDMA device on it?) "
        }
        _ => "",
    }
}

/// The addresses of an rdma_cm id, as far as they are known; shown in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoints {
    /// The local address.
    pub local: Option<SocketAddr>,
    /// The remote address.
    pub remote: Option<SocketAddr>,
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.local, self.remote) {
            (Some(l), Some(r)) => write!(f, " ({l} -> {r})"),
            (Some(l), None) => write!(f, " (on {l})"),
            (None, Some(r)) => write!(f, " (to {r})"),
            (None, None) => Ok(()),
        }
    }
}

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
        /// The peer accepted, on an id without a QP: finish with [`CmId::establish`].
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
    status: i32,
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
    fn raw(self) -> ffi::rdma_port_space::Type {
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
    fn name(self) -> &'static str {
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves no half-updated state behind (they
    // guard C calls, not Rust invariants), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ensure_loaded() -> Result<(), CmError> {
    Library::Rdmacm.load()?;
    Library::Ibverbs.load()?;
    Ok(())
}

fn millis(timeout: Duration) -> c_int {
    c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX)
}

/// A socket address in the C layout rdma_cm takes.
struct RawSockAddr {
    storage: libc::sockaddr_storage,
}

impl RawSockAddr {
    fn new(addr: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; all zeros is a valid (AF_UNSPEC) value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin) };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin6) };
            }
        }
        RawSockAddr { storage }
    }

    fn as_mut_ptr(&mut self) -> *mut ffi::sockaddr {
        ptr::addr_of_mut!(self.storage).cast()
    }
}

/// Reads an IPv4 or IPv6 socket address.
///
/// # Safety
///
/// `sa` points to at least `size_of::<sockaddr_storage>()` readable bytes, or is NULL.
unsafe fn read_sockaddr(sa: *const c_void) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable sockaddr_storage-sized buffer; an unaligned
    // read avoids assuming the C side's alignment.
    let storage: libc::sockaddr_storage = unsafe { ptr::read_unaligned(sa.cast()) };
    match c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { ptr::read_unaligned(ptr::addr_of!(storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { ptr::read_unaligned(ptr::addr_of!(storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// An rdma_cm event channel (`struct rdma_event_channel`): the file descriptor every event of
/// its ids arrives on.
#[doc(alias = "rdma_event_channel")]
pub struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
    /// Serialises every call that reads or writes the fields of this channel's ids; see the
    /// module documentation.
    lock: Mutex<()>,
}

// SAFETY: the channel is a file descriptor; every librdmacm call that touches it or its ids'
// fields runs under `lock`.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id of the channel holds an Arc of it, so none is left; the call
        // cannot fail (it closes the descriptor and frees the struct).
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl AsRawFd for EventChannel {
    /// The channel's descriptor, for poll/epoll: readable when an event is waiting. It is in
    /// non-blocking mode; read events with [`EventChannel::try_get_event`].
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: raw is a live channel; fd is a plain field set at creation.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open for as long as the channel, which outlives the
        // borrow.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

/// What one `rdma_get_cm_event` produced.
enum Fetched {
    Nothing,
    Event(Event),
    /// The event was for an id being dropped; it was acknowledged and discarded.
    Discarded,
}

impl EventChannel {
    /// Opens an event channel (`rdma_create_event_channel`) and puts its descriptor in
    /// non-blocking mode, so waiting happens in [`get_event`](Self::get_event)'s `poll`.
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Arc<EventChannel>, CmError> {
        ensure_loaded()?;
        // SAFETY: no arguments; returns NULL with errno on failure.
        let raw =
            non_null(fresh(|| unsafe { ffi::rdma_create_event_channel() })).map_err(|source| {
                CmError::Call {
                    call: "rdma_create_event_channel",
                    endpoints: Endpoints::default(),
                    source,
                }
            })?;
        let channel = EventChannel {
            raw,
            lock: Mutex::new(()),
        };
        let fd = channel.as_raw_fd();
        // SAFETY: fd is the channel's open descriptor; F_GETFL/F_SETFL take and return ints.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(CmError::Call {
                call: "fcntl(O_NONBLOCK) on the rdma_cm channel",
                endpoints: Endpoints::default(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(Arc::new(channel))
    }

    /// The raw channel, valid while this channel is alive.
    pub fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        lock(&self.lock)
    }

    /// Creates an id on this channel (`rdma_create_id`): `Tcp` for reliable connections,
    /// `Udp` for datagrams and multicast.
    #[doc(alias = "rdma_create_id")]
    pub fn create_id(self: &Arc<Self>, port_space: PortSpace) -> Result<Arc<CmId>, CmError> {
        let _guard = self.guard();
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is open; raw is a valid out-pointer; the context is set below,
        // before any call on the id can produce an event.
        let ret = fresh(|| unsafe {
            ffi::rdma_create_id(self.as_raw(), &mut raw, ptr::null_mut(), port_space.raw())
        });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_create_id",
            endpoints: Endpoints::default(),
            source,
        })?;
        let raw = out_ptr(raw).map_err(|source| CmError::Call {
            call: "rdma_create_id",
            endpoints: Endpoints::default(),
            source,
        })?;
        // SAFETY: raw is a fresh id of this channel, not yet known to anyone else.
        Ok(unsafe { CmId::adopt(raw, Arc::clone(self), port_space) })
    }

    /// Waits for the next event (`poll` on the descriptor, then `rdma_get_cm_event`), at most
    /// `timeout` (`None`: without limit), and acknowledges it (`rdma_ack_cm_event`) after
    /// copying out what it carries. No event within `timeout` is a [`CmError::Timeout`].
    ///
    /// Events for ids that are being dropped are acknowledged and skipped.
    #[doc(alias = "rdma_get_cm_event")]
    #[doc(alias = "rdma_ack_cm_event")]
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Event, CmError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(event);
            }
            let wait_ms = match deadline {
                None => -1,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(CmError::Timeout {
                            timeout: timeout.unwrap_or_default(),
                            waiting_for: None,
                            endpoints: Endpoints::default(),
                        });
                    }
                    // Round up, so a sub-millisecond remainder still sleeps instead of spinning.
                    let left = deadline - now;
                    millis(left + Duration::from_micros(999))
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: pfd is one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(CmError::Call {
                        call: "poll on the rdma_cm channel",
                        endpoints: Endpoints::default(),
                        source: e,
                    });
                }
            }
        }
    }

    /// The next event if one is waiting, without blocking (`rdma_get_cm_event` on the
    /// non-blocking descriptor): the non-blocking mode, for use after poll/epoll said the
    /// descriptor is readable.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_get_event(&self) -> Result<Option<Event>, CmError> {
        loop {
            match self.fetch()? {
                Fetched::Nothing => return Ok(None),
                Fetched::Event(event) => return Ok(Some(event)),
                Fetched::Discarded => {}
            }
        }
    }

    /// Waits like [`get_event`](Self::get_event) for an event of type `expected`; an event
    /// that reports a failure becomes its typed error ([`Event::into_result`]), any other type
    /// a [`CmError::UnexpectedEvent`]. Meant for channels whose events come in a known order
    /// (one id per channel, or one connection step at a time). A [`CmError::Timeout`] names
    /// the event waited for; [`CmId::wait_for`] adds the id's addresses.
    pub fn wait_for(
        &self,
        expected: EventType,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        let event = match self.get_event(timeout) {
            Err(CmError::Timeout {
                timeout, endpoints, ..
            }) => {
                return Err(CmError::Timeout {
                    timeout,
                    waiting_for: Some(expected),
                    endpoints,
                })
            }
            other => other?.into_result()?,
        };
        if event.event_type() != expected {
            return Err(CmError::UnexpectedEvent {
                expected,
                got: event.event_type(),
                status: event.status(),
            });
        }
        Ok(event)
    }

    fn fetch(&self) -> Result<Fetched, CmError> {
        // Whatever this returns, including on error, is dropped after the lock is released:
        // dropping the last Arc of an id destroys it, which takes the lock.
        let guard = self.guard();
        let mut raw: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is open and its descriptor non-blocking, so this returns at once;
        // raw is a valid out-pointer.
        let ret = fresh(|| unsafe { ffi::rdma_get_cm_event(self.as_raw(), &mut raw) });
        if let Err(source) = from_ret(ret) {
            return match source.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(Fetched::Nothing),
                _ => Err(CmError::Call {
                    call: "rdma_get_cm_event",
                    endpoints: Endpoints::default(),
                    source,
                }),
            };
        }
        let Some(raw) = NonNull::new(raw) else {
            return Ok(Fetched::Nothing);
        };
        // SAFETY: a successful rdma_get_cm_event hands out a valid event that stays valid
        // until it is acknowledged below, and the ids it names stay alive at least as long.
        let fetched = unsafe { Event::copy_from(raw.as_ptr()) };
        // SAFETY: raw is the event just retrieved; it is acknowledged exactly once, here, and
        // nothing read from it is used afterwards (everything was copied).
        let ret = fresh(|| unsafe { ffi::rdma_ack_cm_event(raw.as_ptr()) });
        drop(guard);
        match from_ret(ret) {
            Ok(()) => Ok(fetched),
            Err(source) => {
                drop(fetched);
                Err(CmError::Call {
                    call: "rdma_ack_cm_event",
                    endpoints: Endpoints::default(),
                    source,
                })
            }
        }
    }
}

/// Looks up the `CmId` whose weak reference an id's `context` holds.
///
/// # Safety
///
/// `raw` is a live id of this crate whose context, when non-NULL, came from
/// `Weak::into_raw` of a `CmId` (kept alive until after `rdma_destroy_id`).
unsafe fn id_of(raw: *mut ffi::rdma_cm_id) -> Option<Arc<CmId>> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: raw is a live id (caller); context is a plain field.
    let ctx = unsafe { (*raw).context } as *const CmId;
    if ctx.is_null() {
        return None;
    }
    // SAFETY: ctx came from Weak::into_raw, and that weak reference is only reclaimed after
    // the id is destroyed; ManuallyDrop leaves it in place.
    let weak = ManuallyDrop::new(unsafe { Weak::from_raw(ctx) });
    weak.upgrade()
}

/// The parameters of the other side, from a connection event of an `RDMA_PS_TCP` id
/// (`param.conn`).
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConnParam {
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
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

/// The UD parameters from an event of an `RDMA_PS_UDP` id (`param.ud`): how to address the
/// peer or the multicast group.
#[doc(alias = "rdma_ud_param")]
#[derive(Clone, Copy)]
pub struct UdParam {
    ah_attr: ffi::ibv_ah_attr,
    qp_num: u32,
    qkey: u32,
}

impl fmt::Debug for UdParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdParam")
            .field("qp_num", &format_args!("{:#x}", self.qp_num))
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .field("dlid", &self.ah_attr.dlid)
            .field("is_global", &self.ah_attr.is_global)
            .field("port_num", &self.ah_attr.port_num)
            .finish_non_exhaustive()
    }
}

impl UdParam {
    /// Address attributes for the peer or group (`ah_attr`).
    pub fn ah_attr(&self) -> &ffi::ibv_ah_attr {
        &self.ah_attr
    }

    /// The remote QP number (`0xffffff` for a multicast group).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The Q_Key to send with.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Builds an address handle for these attributes (`ibv_create_ah`). The PD must be on
    /// the device of the id the event came from.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, pd: &Arc<ProtectionDomain>) -> Result<CmAddressHandle, CmError> {
        let mut attr = self.ah_attr;
        // SAFETY: the PD is alive; attr is a valid ah_attr the call only reads.
        let ah = fresh(|| unsafe { ffi::ibv_create_ah(pd.as_raw(), &mut attr) });
        let raw = non_null(ah).map_err(|source| CmError::Call {
            call: "ibv_create_ah",
            endpoints: Endpoints::default(),
            source,
        })?;
        Ok(CmAddressHandle {
            raw,
            pd: Arc::clone(pd),
        })
    }
}

/// An address handle (`struct ibv_ah`) built from an event's UD parameters; destroyed
/// (`ibv_destroy_ah`) on drop. Holds its protection domain.
#[doc(alias = "ibv_ah")]
pub struct CmAddressHandle {
    raw: NonNull<ffi::ibv_ah>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: address handles may be used from any thread; this one is only read after creation.
unsafe impl Send for CmAddressHandle {}
// SAFETY: as above.
unsafe impl Sync for CmAddressHandle {}

impl CmAddressHandle {
    /// The raw `ibv_ah`, for `wr.ud.ah`; valid while this handle is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.raw.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for CmAddressHandle {
    fn drop(&mut self) {
        // SAFETY: raw came from ibv_create_ah and is destroyed once, here.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            report_drop_failure("ibv_destroy_ah", "an address handle", &e);
        }
    }
}

impl fmt::Debug for CmAddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmAddressHandle")
            .field("pd", &self.pd)
            .finish()
    }
}

/// An rdma_cm event, with everything it carried copied out; librdmacm's event was already
/// acknowledged when this value was made.
#[doc(alias = "rdma_cm_event")]
pub struct Event {
    event_type: EventType,
    status: i32,
    id: Arc<CmId>,
    listener: Option<Arc<CmId>>,
    private_data: Vec<u8>,
    conn: Option<PeerConnParam>,
    ud: Option<UdParam>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("event_type", &self.event_type)
            .field("status", &self.status)
            .field("id", &self.id)
            .field("private_data_len", &self.private_data.len())
            .field("conn", &self.conn)
            .field("ud", &self.ud)
            .finish_non_exhaustive()
    }
}

impl Event {
    /// Copies an event out of librdmacm.
    ///
    /// # Safety
    ///
    /// `raw` is an event from `rdma_get_cm_event`, not yet acknowledged, and the caller holds
    /// the lock of the channel it came from.
    unsafe fn copy_from(raw: *mut ffi::rdma_cm_event) -> Fetched {
        // SAFETY: the caller guarantees a valid event.
        let e = unsafe { &*raw };
        let event_type = EventType::from(e.event);
        let (id, listener) = if event_type == EventType::ConnectRequest {
            // SAFETY: listen_id is a live id of this crate (its context is ours).
            let listener = unsafe { id_of(e.listen_id) };
            let Some(new_raw) = NonNull::new(e.id) else {
                return Fetched::Discarded;
            };
            let Some(listener) = listener else {
                // The listener is being dropped: nobody can take the new id. Destroying it
                // waits for nothing (the request counts against the listener), and its context
                // still names the listener's weak reference, which is not ours to reclaim.
                // SAFETY: new_raw is the new id librdmacm just made, referenced nowhere else.
                let _ = unsafe { ffi::rdma_destroy_id(new_raw.as_ptr()) };
                return Fetched::Discarded;
            };
            // SAFETY: new_raw is the new id, known to nobody yet; it belongs to the listener's
            // channel and port space.
            let id =
                unsafe { CmId::adopt(new_raw, Arc::clone(&listener.channel), listener.port_space) };
            (id, Some(listener))
        } else {
            // SAFETY: e.id is a live id of this crate.
            match unsafe { id_of(e.id) } {
                Some(id) => (id, None),
                None => return Fetched::Discarded,
            }
        };
        let multicast = matches!(
            event_type,
            EventType::MulticastJoin | EventType::MulticastError
        );
        let mut event = Event {
            event_type,
            status: e.status,
            id,
            listener,
            private_data: Vec::new(),
            conn: None,
            ud: None,
        };
        match event.id.port_space {
            PortSpace::Tcp => {
                // SAFETY: TCP ids' events carry the conn member of the union (zeroed when the
                // event has no parameters).
                let c = unsafe { e.param.conn };
                // SAFETY: when non-NULL, private_data points to private_data_len bytes inside
                // the event, valid until the acknowledgement.
                event.private_data = unsafe { copy_private(c.private_data, c.private_data_len) };
                event.conn = Some(PeerConnParam {
                    responder_resources: c.responder_resources,
                    initiator_depth: c.initiator_depth,
                    flow_control: c.flow_control,
                    retry_count: c.retry_count,
                    rnr_retry_count: c.rnr_retry_count,
                    srq: c.srq != 0,
                    qp_num: c.qp_num,
                });
            }
            PortSpace::Udp => {
                // SAFETY: UDP ids' events carry the ud member of the union.
                let u = unsafe { e.param.ud };
                if !multicast {
                    // SAFETY: as for conn; multicast events put the join context in this
                    // pointer instead, so they are skipped.
                    event.private_data =
                        unsafe { copy_private(u.private_data, u.private_data_len) };
                }
                event.ud = Some(UdParam {
                    ah_attr: u.ah_attr,
                    qp_num: u.qp_num,
                    qkey: u.qkey,
                });
            }
        }
        Fetched::Event(event)
    }

    /// The event's type.
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The event's status: 0 on success, else a negative errno or a transport-specific value
    /// (for [`EventType::Rejected`], the reject reason).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The id the event is about. For [`EventType::ConnectRequest`], the new id of the
    /// incoming connection: accept or reject it, and keep it (it is destroyed with its last
    /// `Arc`).
    pub fn id(&self) -> &Arc<CmId> {
        &self.id
    }

    /// The listening id, for [`EventType::ConnectRequest`].
    pub fn listener(&self) -> Option<&Arc<CmId>> {
        self.listener.as_ref()
    }

    /// The private data the peer sent with `rdma_connect`, `rdma_accept` or `rdma_reject`.
    ///
    /// On InfiniBand and RoCE this is the transport's whole private data field (e.g. 56 bytes
    /// for a connect request): the peer's bytes, then zeros. The length the peer gave is not
    /// transmitted; carry it in the data if it matters.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's connection parameters, for events of `RDMA_PS_TCP` ids (meaningful for
    /// [`EventType::ConnectRequest`], [`EventType::ConnectResponse`] and
    /// [`EventType::Established`]).
    pub fn conn_param(&self) -> Option<&PeerConnParam> {
        self.conn.as_ref()
    }

    /// The UD parameters, for events of `RDMA_PS_UDP` ids (meaningful for
    /// [`EventType::Established`] and [`EventType::MulticastJoin`]).
    pub fn ud_param(&self) -> Option<&UdParam> {
        self.ud.as_ref()
    }

    /// The event as a result: events that report a failure (`ADDR_ERROR`, `ROUTE_ERROR`,
    /// `CONNECT_ERROR`, `UNREACHABLE`, `REJECTED`, `MULTICAST_ERROR`, `DEVICE_REMOVAL`) become
    /// their typed [`CmError`], with the id's addresses; every other event is `Ok`.
    pub fn into_result(self) -> Result<Event, CmError> {
        let errno = |status: i32| {
            io::Error::from_raw_os_error(if status == 0 {
                libc::EIO
            } else {
                status.saturating_abs()
            })
        };
        let ends = self.id.endpoints();
        Err(match self.event_type {
            EventType::AddrError => match ends.remote {
                Some(dst) => CmError::AddrUnresolvable {
                    dst,
                    src: ends.local,
                    source: errno(self.status),
                },
                None => CmError::Call {
                    call: "rdma_resolve_addr",
                    endpoints: ends,
                    source: errno(self.status),
                },
            },
            EventType::RouteError => CmError::RouteUnresolvable {
                dst: ends.remote,
                source: errno(self.status),
            },
            EventType::Unreachable => CmError::Unreachable {
                remote: ends.remote,
                status: self.status,
            },
            EventType::Rejected => CmError::Rejected {
                remote: ends.remote,
                reason: RejectReason {
                    status: self.status,
                },
                private_data: self.private_data,
            },
            EventType::ConnectError => CmError::ConnectError {
                remote: ends.remote,
                status: self.status,
            },
            EventType::MulticastError => CmError::MulticastError {
                local: ends.local,
                status: self.status,
            },
            EventType::DeviceRemoval => CmError::DeviceRemoved { local: ends.local },
            _ => return Ok(self),
        })
    }
}

/// Copies an event's private data.
///
/// # Safety
///
/// `data` is NULL or points to `len` readable bytes.
unsafe fn copy_private(data: *const c_void, len: u8) -> Vec<u8> {
    if data.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller guarantees len readable bytes at data.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// Connection parameters for [`CmId::connect`] and [`CmId::accept`] (`struct
/// rdma_conn_param`), private data included. The defaults are what librdmacm uses when given
/// none: the device's most responder resources and initiator depth, retry and RNR retry 7.
///
/// rxe note: an RNR retry count of 7 retries forever; against a peer that never posts
/// receives it can stall SoftRoCE. Set a finite `rnr_retry_count` where that matters.
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    private_data: Vec<u8>,
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
    /// [`CmId::init_qp_attr`]); ignored when the id has a QP.
    pub fn qp_num(&mut self, qp_num: u32) -> &mut Self {
        self.qp_num = qp_num;
        self
    }

    fn raw(&self) -> ffi::rdma_conn_param {
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

/// The state [`CmId::init_qp_attr`] asks the attributes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpTargetState {
    /// `IBV_QPS_INIT`
    Init,
    /// `IBV_QPS_RTR`
    Rtr,
    /// `IBV_QPS_RTS`
    Rts,
}

impl QpTargetState {
    fn raw(self) -> ffi::ibv_qp_state::Type {
        match self {
            QpTargetState::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
            QpTargetState::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
            QpTargetState::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
        }
    }
}

/// QP attributes and their mask from [`CmId::init_qp_attr`]: exactly what `ibv_modify_qp`
/// needs to move a QP of the user's own to the asked state for this connection.
#[doc(alias = "ibv_qp_attr")]
#[derive(Clone, Copy)]
pub struct CmQpAttr {
    raw: ffi::ibv_qp_attr,
    mask: u32,
}

impl fmt::Debug for CmQpAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmQpAttr")
            .field("qp_state", &self.raw.qp_state)
            .field("mask", &format_args!("{:#x}", self.mask))
            .field("port_num", &self.raw.port_num)
            .field("pkey_index", &self.raw.pkey_index)
            .field("qkey", &format_args!("{:#x}", self.raw.qkey))
            .field("dest_qp_num", &format_args!("{:#x}", self.raw.dest_qp_num))
            .field("path_mtu", &self.path_mtu())
            .finish_non_exhaustive()
    }
}

impl CmQpAttr {
    /// The raw attributes.
    pub fn as_raw(&self) -> &ffi::ibv_qp_attr {
        &self.raw
    }

    /// The attribute mask (`ibv_qp_attr_mask` bits) that says which fields are set.
    pub fn mask(&self) -> u32 {
        self.mask
    }

    /// Both, for `ibv_modify_qp(qp, &attr, mask)`.
    pub fn into_raw(self) -> (ffi::ibv_qp_attr, u32) {
        (self.raw, self.mask)
    }

    /// The target state (`qp_state`, an `ibv_qp_state` value).
    pub fn qp_state(&self) -> ffi::ibv_qp_state::Type {
        self.raw.qp_state
    }

    /// `pkey_index`
    pub fn pkey_index(&self) -> u16 {
        self.raw.pkey_index
    }

    /// `port_num`
    pub fn port_num(&self) -> u8 {
        self.raw.port_num
    }

    /// `qkey` (UD)
    pub fn qkey(&self) -> u32 {
        self.raw.qkey
    }

    /// `qp_access_flags`
    pub fn qp_access_flags(&self) -> u32 {
        self.raw.qp_access_flags
    }

    /// `path_mtu`
    pub fn path_mtu(&self) -> Mtu {
        Mtu::from(self.raw.path_mtu)
    }

    /// `dest_qp_num`
    pub fn dest_qp_num(&self) -> u32 {
        self.raw.dest_qp_num
    }

    /// `rq_psn`
    pub fn rq_psn(&self) -> u32 {
        self.raw.rq_psn
    }

    /// `sq_psn`
    pub fn sq_psn(&self) -> u32 {
        self.raw.sq_psn
    }

    /// `max_dest_rd_atomic`
    pub fn max_dest_rd_atomic(&self) -> u8 {
        self.raw.max_dest_rd_atomic
    }

    /// `max_rd_atomic`
    pub fn max_rd_atomic(&self) -> u8 {
        self.raw.max_rd_atomic
    }

    /// `min_rnr_timer`
    pub fn min_rnr_timer(&self) -> u8 {
        self.raw.min_rnr_timer
    }

    /// `timeout`
    pub fn timeout(&self) -> u8 {
        self.raw.timeout
    }

    /// `retry_cnt`
    pub fn retry_cnt(&self) -> u8 {
        self.raw.retry_cnt
    }

    /// `rnr_retry`
    pub fn rnr_retry(&self) -> u8 {
        self.raw.rnr_retry
    }

    /// `ah_attr`: the path to the peer.
    pub fn ah_attr(&self) -> &ffi::ibv_ah_attr {
        &self.raw.ah_attr
    }
}

impl From<CmQpAttr> for QueuePairAttribute {
    /// The same attributes and mask, for [`QueuePair::modify`](crate::QueuePair::modify):
    /// how a QP of the user's own (any type) follows the id's connection.
    ///
    /// ```no_run
    /// # fn demo(id: &sideway::rdmacm::CmId, qp: &sideway::QueuePair)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use sideway::rdmacm::QpTargetState;
    /// for state in [QpTargetState::Init, QpTargetState::Rtr, QpTargetState::Rts] {
    ///     qp.modify(&id.init_qp_attr(state)?.into())?;
    /// }
    /// # Ok(()) }
    /// ```
    fn from(attr: CmQpAttr) -> Self {
        QueuePairAttribute::from_raw(attr.raw, QpAttrMask::from_bits_retain(attr.mask))
    }
}

/// What [`CmId::create_qp`] creates: the QP's CQs, PD and capacities (`struct
/// ibv_qp_init_attr`). The QP type follows the id: RC for `Tcp`, UD for `Udp`.
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone)]
#[must_use = "pass it to CmId::create_qp"]
pub struct CmQpInitAttr {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    cap: ffi::ibv_qp_cap,
    sq_sig_all: bool,
}

impl CmQpInitAttr {
    /// A QP on `pd` with these CQs; 16 send and receive requests of one SGE each, no inline
    /// data, only requested completions. The PD and CQs must come from the id's
    /// [`CmId::device_context`].
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
    ) -> Self {
        CmQpInitAttr {
            pd: Arc::clone(pd),
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
            cap: ffi::ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        }
    }

    /// `cap.max_send_wr`
    pub fn max_send_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_wr = n;
        self
    }

    /// `cap.max_recv_wr`
    pub fn max_recv_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_wr = n;
        self
    }

    /// `cap.max_send_sge`
    pub fn max_send_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_sge = n;
        self
    }

    /// `cap.max_recv_sge`
    pub fn max_recv_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_sge = n;
        self
    }

    /// `cap.max_inline_data`
    pub fn max_inline_data(&mut self, n: u32) -> &mut Self {
        self.cap.max_inline_data = n;
        self
    }

    /// `sq_sig_all`: every send request completes with a work completion.
    pub fn sq_sig_all(&mut self, on: bool) -> &mut Self {
        self.sq_sig_all = on;
        self
    }
}

/// The QP an id owns, with what must outlive it.
struct IdQp {
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    cap: ffi::ibv_qp_cap,
}

/// An rdma_cm identifier (`struct rdma_cm_id`): the RDMA analogue of a socket.
///
/// Always held in an `Arc`. Dropping the last one leaves the multicast groups it joined,
/// destroys the QP it owns (`rdma_destroy_qp`) and then the id (`rdma_destroy_id`).
#[doc(alias = "rdma_cm_id")]
pub struct CmId {
    raw: NonNull<ffi::rdma_cm_id>,
    channel: Arc<EventChannel>,
    port_space: PortSpace,
    qp: Mutex<Option<IdQp>>,
    groups: Mutex<Vec<SocketAddr>>,
}

// SAFETY: every call on the id and every read of its fields runs under its channel's lock
// (see the module documentation); librdmacm ids may be used from any thread.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ends = self.endpoints();
        f.debug_struct("CmId")
            .field("port_space", &self.port_space)
            .field("local", &ends.local)
            .field("remote", &ends.remote)
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let channel = Arc::clone(&self.channel);
        let _guard = channel.guard();
        let raw = self.raw.as_ptr();
        for group in std::mem::take(&mut *lock(&self.groups)) {
            let mut sa = RawSockAddr::new(group);
            // SAFETY: the id is alive and joined this group; librdmacm detaches the QP.
            let ret = fresh(|| unsafe { ffi::rdma_leave_multicast(raw, sa.as_mut_ptr()) });
            if let Err(e) = from_ret(ret) {
                report_drop_failure("rdma_leave_multicast", &group.to_string(), &e);
            }
        }
        if lock(&self.qp).is_some() {
            // SAFETY: the id owns a QP made by rdma_create_qp; destroyed once, here, while its
            // PD and CQs (held in self.qp) are still alive.
            unsafe { ffi::rdma_destroy_qp(raw) };
        }
        // Every event retrieved for this id was acknowledged before the channel lock was
        // released, so this does not wait on any.
        // SAFETY: the id is alive, and no Rust value refers to it after this.
        let ret = fresh(|| unsafe { ffi::rdma_destroy_id(raw) });
        match from_ret(ret) {
            Ok(()) => {
                // The id is gone, so no event can name this object any more: give back the
                // weak reference its context held.
                // SAFETY: adopt() leaked exactly this weak reference with Weak::into_raw; the
                // allocation is alive (we are inside its value's drop).
                drop(unsafe { Weak::from_raw(self as *const CmId) });
            }
            Err(e) => {
                // The id may live on and its events may still name this allocation: keep the
                // weak reference (and so the allocation) alive rather than risk a dangling one.
                report_drop_failure("rdma_destroy_id", "an rdma_cm id", &e);
            }
        }
    }
}

impl CmId {
    /// Wraps a raw id and points its context at the new object.
    ///
    /// # Safety
    ///
    /// `raw` is a live id of `channel` that no other `CmId` wraps, and the caller holds the
    /// channel's lock.
    unsafe fn adopt(
        raw: NonNull<ffi::rdma_cm_id>,
        channel: Arc<EventChannel>,
        port_space: PortSpace,
    ) -> Arc<CmId> {
        let id = Arc::new(CmId {
            raw,
            channel,
            port_space,
            qp: Mutex::new(None),
            groups: Mutex::new(Vec::new()),
        });
        let weak = Weak::into_raw(Arc::downgrade(&id));
        // SAFETY: raw is live and ours; context is a user field librdmacm hands back in
        // events. The weak reference is reclaimed in Drop after rdma_destroy_id.
        unsafe { (*raw.as_ptr()).context = weak as *mut c_void };
        id
    }

    /// The raw id, valid while this object is alive. Its fields change while librdmacm
    /// processes events; read them only with no other thread using the channel.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The channel the id's events arrive on.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// The id's port space.
    pub fn port_space(&self) -> PortSpace {
        self.port_space
    }

    /// The local and remote addresses, as far as they are known (`rdma_get_local_addr`,
    /// `rdma_get_peer_addr`).
    #[doc(alias = "rdma_get_local_addr")]
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn endpoints(&self) -> Endpoints {
        let _guard = self.channel.guard();
        self.endpoints_locked()
    }

    fn endpoints_locked(&self) -> Endpoints {
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the channel lock is held; the address unions are
        // sockaddr_storage-sized.
        let (local, remote) = unsafe {
            (
                read_sockaddr(ptr::addr_of!((*raw).route.addr.__bindgen_anon_1).cast()),
                read_sockaddr(ptr::addr_of!((*raw).route.addr.__bindgen_anon_2).cast()),
            )
        };
        let unspecified =
            |a: Option<SocketAddr>| a.filter(|a| a.port() != 0 || !a.ip().is_unspecified());
        Endpoints {
            local: unspecified(local),
            remote: unspecified(remote),
        }
    }

    /// The local address (`rdma_get_local_addr`).
    #[doc(alias = "rdma_get_local_addr")]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoints().local
    }

    /// The peer's address (`rdma_get_peer_addr`).
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.endpoints().remote
    }

    /// The device port the id is bound to (`port_num`; 0 before it is bound).
    pub fn port_num(&self) -> u8 {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive and the channel lock is held.
        unsafe { (*self.raw.as_ptr()).port_num }
    }

    /// Waits on this id's channel like [`EventChannel::wait_for`]; a timeout also names
    /// this id's addresses. For a channel whose next event is this id's (one id per channel,
    /// or one connection step at a time).
    pub fn wait_for(
        &self,
        expected: EventType,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        self.channel()
            .wait_for(expected, timeout)
            .map_err(|e| match e {
                CmError::Timeout {
                    timeout,
                    waiting_for,
                    ..
                } => CmError::Timeout {
                    timeout,
                    waiting_for,
                    endpoints: self.endpoints(),
                },
                e => e,
            })
    }

    fn call_err(&self, call: &'static str, source: io::Error) -> CmError {
        CmError::Call {
            call,
            endpoints: self.endpoints_locked(),
            source,
        }
    }

    fn check(&self, call: &'static str, ret: Fresh<c_int>) -> Result<(), CmError> {
        from_ret(ret).map_err(|source| self.call_err(call, source))
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`). Port 0 picks a free one;
    /// a specific IP also binds the id to that IP's RDMA device.
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        let mut sa = RawSockAddr::new(addr);
        // SAFETY: the id is alive; sa is a valid sockaddr the call copies.
        let ret = fresh(|| unsafe { ffi::rdma_bind_addr(self.raw.as_ptr(), sa.as_mut_ptr()) });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_bind_addr",
            endpoints: Endpoints {
                local: Some(addr),
                remote: None,
            },
            source,
        })
    }

    /// Starts resolving `dst` (and `src`, if given) to RDMA addresses (`rdma_resolve_addr`);
    /// [`EventType::AddrResolved`] or [`EventType::AddrError`] follows within `timeout`.
    /// Afterwards the id is bound to a device ([`device_context`](Self::device_context)).
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        let mut src_sa = src.map(RawSockAddr::new);
        let mut dst_sa = RawSockAddr::new(dst);
        let src_ptr = src_sa
            .as_mut()
            .map_or(ptr::null_mut(), RawSockAddr::as_mut_ptr);
        // SAFETY: the id is alive; both addresses are valid sockaddrs (or NULL) the call copies.
        let ret = fresh(|| unsafe {
            ffi::rdma_resolve_addr(
                self.raw.as_ptr(),
                src_ptr,
                dst_sa.as_mut_ptr(),
                millis(timeout),
            )
        });
        from_ret(ret).map_err(|source| {
            if addr_hint(&source).is_empty() {
                CmError::Call {
                    call: "rdma_resolve_addr",
                    endpoints: Endpoints {
                        local: src,
                        remote: Some(dst),
                    },
                    source,
                }
            } else {
                CmError::AddrUnresolvable { dst, src, source }
            }
        })
    }

    /// Starts resolving a route to the resolved destination (`rdma_resolve_route`);
    /// [`EventType::RouteResolved`] or [`EventType::RouteError`] follows within `timeout`.
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the lock held; verbs is a plain field.
        if unsafe { (*raw).verbs }.is_null() {
            // librdmacm would dereference the missing device.
            return Err(CmError::NotBound {
                endpoints: self.endpoints_locked(),
            });
        }
        // SAFETY: the id is alive and bound to a device.
        let ret = fresh(|| unsafe { ffi::rdma_resolve_route(raw, millis(timeout)) });
        from_ret(ret).map_err(|source| {
            if route_hint(&source).is_empty() {
                self.call_err("rdma_resolve_route", source)
            } else {
                CmError::RouteUnresolvable {
                    dst: self.endpoints_locked().remote,
                    source,
                }
            }
        })
    }

    /// Listens for connection requests (`rdma_listen`); bind first. Each request arrives as an
    /// [`EventType::ConnectRequest`] whose id is the new connection.
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: i32) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_listen(self.raw.as_ptr(), backlog) });
        self.check("rdma_listen", ret)
    }

    fn transport(&self) -> TransportType {
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the lock held; verbs, when set, is an open context whose
        // device pointer is set by libibverbs.
        unsafe {
            let verbs = (*raw).verbs;
            if verbs.is_null() || (*verbs).device.is_null() {
                return TransportType::Infiniband;
            }
            TransportType::from((*(*verbs).device).transport_type as u32)
        }
    }

    /// The most private data `call` carries on this id: the InfiniBand/RoCE limits of
    /// [`max_private_data`], or the 255 bytes the C field holds on iWARP (whose driver may
    /// allow less).
    pub fn max_private_data(&self, call: PrivateDataCall) -> usize {
        let _guard = self.channel.guard();
        self.max_private_data_locked(call).0
    }

    fn max_private_data_locked(&self, call: PrivateDataCall) -> (usize, &'static str) {
        match self.transport() {
            TransportType::Iwarp => (usize::from(u8::MAX), "iWARP"),
            _ => (max_private_data(self.port_space, call), "InfiniBand/RoCE"),
        }
    }

    fn check_private_data(&self, call: PrivateDataCall, len: usize) -> Result<(), CmError> {
        let (max, transport) = self.max_private_data_locked(call);
        if len > max {
            return Err(CmError::PrivateDataTooLong {
                call: call.name(),
                len,
                max,
                port_space: self.port_space,
                transport,
            });
        }
        Ok(())
    }

    /// Connects to the resolved destination (`rdma_connect`): a connection request on `Tcp`
    /// ids, a QP lookup (SIDR) on `Udp` ids. Private data over the transport's limit is an
    /// error before anything is sent. [`EventType::Established`] (or, on an id without a QP,
    /// [`EventType::ConnectResponse`]) follows; failures arrive as
    /// [`EventType::Rejected`], [`EventType::Unreachable`] or [`EventType::ConnectError`].
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        self.check_private_data(PrivateDataCall::Connect, param.private_data.len())?;
        let mut raw_param = param.raw();
        // SAFETY: the id is alive; raw_param and the private data it points to live through
        // the call, which copies them.
        let ret = fresh(|| unsafe { ffi::rdma_connect(self.raw.as_ptr(), &mut raw_param) });
        self.check("rdma_connect", ret)
    }

    /// Accepts the connection request this id came from (`rdma_accept`). Private data over
    /// the transport's limit is an error before anything is sent. On an id without a QP, set
    /// [`ConnParam::qp_num`] to the QP that serves the connection.
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        self.check_private_data(PrivateDataCall::Accept, param.private_data.len())?;
        let mut raw_param = param.raw();
        // SAFETY: the id is alive; raw_param and its private data live through the call.
        let ret = fresh(|| unsafe { ffi::rdma_accept(self.raw.as_ptr(), &mut raw_param) });
        self.check("rdma_accept", ret)
    }

    /// Rejects the connection request this id came from (`rdma_reject`), with private data
    /// for the peer. Over the transport's limit is an error before anything is sent.
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        self.check_private_data(PrivateDataCall::Reject, private_data.len())?;
        let (data, len) = if private_data.is_empty() {
            (ptr::null(), 0)
        } else {
            // Checked above: every limit fits in a u8.
            (
                private_data.as_ptr().cast(),
                u8::try_from(private_data.len()).unwrap_or(u8::MAX),
            )
        };
        // SAFETY: the id is alive; data points to len bytes the call copies.
        let ret = fresh(|| unsafe { ffi::rdma_reject(self.raw.as_ptr(), data, len) });
        self.check("rdma_reject", ret)
    }

    /// Completes a connection on the active side of an id without a QP, after
    /// [`EventType::ConnectResponse`] (`rdma_establish`).
    #[doc(alias = "rdma_establish")]
    pub fn establish(&self) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_establish(self.raw.as_ptr()) });
        self.check("rdma_establish", ret)
    }

    /// Disconnects (`rdma_disconnect`); the id's QP goes to the error state, and both sides
    /// get [`EventType::Disconnected`].
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_disconnect(self.raw.as_ptr()) });
        self.check("rdma_disconnect", ret)
    }

    /// Tells librdmacm of a QP event it should act on (`rdma_notify`), in practice
    /// `IBV_EVENT_COMM_EST` when data arrives before [`EventType::Established`]. `EISCONN`
    /// (already established) is not an error.
    #[doc(alias = "rdma_notify")]
    pub fn notify(&self, event: ffi::ibv_event_type::Type) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_notify(self.raw.as_ptr(), event) });
        match from_ret(ret) {
            Err(e) if e.raw_os_error() == Some(libc::EISCONN) => Ok(()),
            r => r.map_err(|source| self.call_err("rdma_notify", source)),
        }
    }

    /// The attributes that move a QP to `state` for this id's connection
    /// (`rdma_init_qp_attr`), for QPs the user created and modifies: pass them to
    /// [`QueuePair::modify`](crate::QueuePair::modify) (they convert into a
    /// [`QueuePairAttribute`]), or to `ibv_modify_qp` with [`CmQpAttr::into_raw`].
    ///
    /// On the active side, the `Init` attributes asked before [`connect`](Self::connect)
    /// grant no remote read or atomic access: those come with the responder resources,
    /// agreed only by the peer's answer. Ask for `Init` again after
    /// [`EventType::ConnectResponse`] and apply it (Init to Init) before `Rtr` and `Rts`,
    /// as librdmacm does for the QPs it owns; otherwise the peer's RDMA READs fail.
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp_attr(&self, state: QpTargetState) -> Result<CmQpAttr, CmError> {
        let _guard = self.channel.guard();
        // SAFETY: ibv_qp_attr is plain data; all zeros is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = state.raw();
        let mut mask: c_int = 0;
        // SAFETY: the id is alive; attr (input qp_state, output the rest) and mask are valid
        // out-parameters.
        let ret =
            fresh(|| unsafe { ffi::rdma_init_qp_attr(self.raw.as_ptr(), &mut attr, &mut mask) });
        self.check("rdma_init_qp_attr", ret)?;
        Ok(CmQpAttr {
            raw: attr,
            mask: mask as u32,
        })
    }

    /// Creates a QP for this id (`rdma_create_qp`): RC on `Tcp` ids, UD on `Udp` ids. The QP
    /// belongs to the id: librdmacm moves it through its states as the connection proceeds,
    /// and it is destroyed (`rdma_destroy_qp`) with the id or by
    /// [`destroy_qp`](Self::destroy_qp). Returns the capacities the device granted.
    #[doc(alias = "rdma_create_qp")]
    pub fn create_qp(&self, attr: &CmQpInitAttr) -> Result<ffi::ibv_qp_cap, CmError> {
        let _guard = self.channel.guard();
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the lock held; plain fields.
        let (verbs, qp_type) = unsafe { ((*raw).verbs, (*raw).qp_type) };
        if verbs.is_null() {
            return Err(CmError::NotBound {
                endpoints: self.endpoints_locked(),
            });
        }
        for (ctx, what) in [
            (attr.pd.context(), "rdma_create_qp"),
            (attr.send_cq.context(), "rdma_create_qp"),
            (attr.recv_cq.context(), "rdma_create_qp"),
        ] {
            if ctx.as_raw() != verbs {
                return Err(CmError::ForeignContext {
                    call: what,
                    id_device: device_name(verbs),
                    other_device: ctx.name().to_owned(),
                });
            }
        }
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: attr.send_cq.as_raw(),
            recv_cq: attr.recv_cq.as_raw(),
            srq: ptr::null_mut(),
            cap: attr.cap,
            qp_type,
            sq_sig_all: c_int::from(attr.sq_sig_all),
        };
        // SAFETY: the id is alive and bound to the device of the PD and CQs (checked above);
        // init is valid for the call, which writes back the granted capacities.
        let ret = fresh(|| unsafe { ffi::rdma_create_qp(raw, attr.pd.as_raw(), &mut init) });
        self.check("rdma_create_qp", ret)?;
        *lock(&self.qp) = Some(IdQp {
            _pd: Arc::clone(&attr.pd),
            _send_cq: Arc::clone(&attr.send_cq),
            _recv_cq: Arc::clone(&attr.recv_cq),
            cap: init.cap,
        });
        Ok(init.cap)
    }

    /// Destroys the QP the id owns (`rdma_destroy_qp`); nothing happens when it has none.
    #[doc(alias = "rdma_destroy_qp")]
    pub fn destroy_qp(&self) {
        let _guard = self.channel.guard();
        let mut qp = lock(&self.qp);
        if qp.is_some() {
            // SAFETY: the id is alive and owns a QP from rdma_create_qp; its PD and CQs are
            // released only after this.
            unsafe { ffi::rdma_destroy_qp(self.raw.as_ptr()) };
            *qp = None;
        }
    }

    /// The number of the QP the id owns, if it has one.
    pub fn qp_num(&self) -> Option<u32> {
        let qp = self.qp_as_raw();
        // SAFETY: a non-NULL QP is alive while the id owns it, and qp_num never changes.
        (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    /// The raw QP the id owns (NULL when none), for posting work requests. It is valid until
    /// the id is dropped or [`destroy_qp`](Self::destroy_qp) is called.
    pub fn qp_as_raw(&self) -> *mut ffi::ibv_qp {
        let _guard = self.channel.guard();
        // SAFETY: the id is alive and the lock held.
        unsafe { (*self.raw.as_ptr()).qp }
    }

    /// The capacities of the QP the id owns, if it has one.
    pub fn qp_cap(&self) -> Option<ffi::ibv_qp_cap> {
        lock(&self.qp).as_ref().map(|q| q.cap)
    }

    /// Joins a multicast group (`rdma_join_multicast`) on a bound or address-resolved `Udp`
    /// id; [`EventType::MulticastJoin`] follows, with the group's [`UdParam`]. When the id
    /// has a QP, librdmacm attaches it to the group as that event is retrieved. Groups still
    /// joined are left when the id is dropped.
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&self, group: SocketAddr) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        let mut sa = RawSockAddr::new(group);
        // SAFETY: the id is alive; sa is a valid sockaddr the call copies; no join context.
        let ret = fresh(|| unsafe {
            ffi::rdma_join_multicast(self.raw.as_ptr(), sa.as_mut_ptr(), ptr::null_mut())
        });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_join_multicast",
            endpoints: Endpoints {
                local: self.endpoints_locked().local,
                remote: Some(group),
            },
            source,
        })?;
        lock(&self.groups).push(group);
        Ok(())
    }

    /// Leaves a multicast group joined with [`join_multicast`](Self::join_multicast)
    /// (`rdma_leave_multicast`), detaching the id's QP.
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, group: SocketAddr) -> Result<(), CmError> {
        let _guard = self.channel.guard();
        let mut sa = RawSockAddr::new(group);
        // SAFETY: the id is alive; sa is a valid sockaddr.
        let ret =
            fresh(|| unsafe { ffi::rdma_leave_multicast(self.raw.as_ptr(), sa.as_mut_ptr()) });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_leave_multicast",
            endpoints: Endpoints {
                local: self.endpoints_locked().local,
                remote: Some(group),
            },
            source,
        })?;
        lock(&self.groups).retain(|g| *g != group);
        Ok(())
    }

    /// The device context the id is bound to (`verbs`), once it is bound (after
    /// [`bind_addr`](Self::bind_addr) to a specific IP, address resolution, or for ids from
    /// connection requests). Allocate the PD and CQs for [`create_qp`](Self::create_qp) here.
    ///
    /// librdmacm opened this context and keeps it: the returned [`DeviceContext`] holds a
    /// reference on librdmacm's device list (`rdma_get_devices`) and never calls
    /// `ibv_close_device`. Ids on the same device share one wrapper while it is alive.
    #[doc(alias = "verbs")]
    #[doc(alias = "rdma_get_devices")]
    pub fn device_context(&self) -> Result<Arc<DeviceContext>, CmError> {
        let verbs = {
            let _guard = self.channel.guard();
            // SAFETY: the id is alive and the lock held.
            unsafe { (*self.raw.as_ptr()).verbs }
        };
        let Some(verbs) = NonNull::new(verbs) else {
            return Err(CmError::NotBound {
                endpoints: self.endpoints(),
            });
        };
        // The id keeps its device referenced while it lives (and we borrow it), so the context
        // stays open until the wrapper's own reference is taken below.
        lent_context(verbs).map_err(|source| CmError::Call {
            call: "rdma_get_devices",
            endpoints: self.endpoints(),
            source,
        })
    }
}

fn device_name(verbs: *mut ffi::ibv_context) -> String {
    // SAFETY: verbs is an open context (the caller's id is bound); device and its name are
    // set by libibverbs and live as long as the context.
    unsafe {
        let device = (*verbs).device;
        if device.is_null() {
            return String::new();
        }
        let name = ffi::ibv_get_device_name(device);
        if name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// librdmacm's device list from `rdma_get_devices`: while it is held, every device in it
/// (and so its context) stays open.
struct RdmacmDevices {
    list: NonNull<*mut ffi::ibv_context>,
}

// SAFETY: the list is only freed, once, in Drop; librdmacm's device bookkeeping is locked.
unsafe impl Send for RdmacmDevices {}
// SAFETY: as above; nothing reads it through a shared reference.
unsafe impl Sync for RdmacmDevices {}

impl Drop for RdmacmDevices {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once, here, after the
        // DeviceContext that borrowed from it (and everything built on that) is gone.
        unsafe { ffi::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// Live wrappers of librdmacm's contexts, so ids on one device share one `DeviceContext`.
static LENT_CONTEXTS: Mutex<Vec<Weak<DeviceContext>>> = Mutex::new(Vec::new());

fn lent_context(verbs: NonNull<ffi::ibv_context>) -> Result<Arc<DeviceContext>, io::Error> {
    let mut cache = lock(&LENT_CONTEXTS);
    cache.retain(|w| w.strong_count() > 0);
    if let Some(ctx) = cache
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.as_raw() == verbs.as_ptr())
    {
        return Ok(ctx);
    }
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is owned by RdmacmDevices below.
    let list = non_null(fresh(|| unsafe { ffi::rdma_get_devices(&mut n) }))?;
    let devices = RdmacmDevices { list };
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: the list holds n context pointers (then NULL).
    let found = (0..len).any(|i| unsafe { *list.as_ptr().add(i) } == verbs.as_ptr());
    if !found {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    // SAFETY: verbs is in the list, which keeps it open while `devices` lives; the wrapper
    // owns `devices`.
    let ctx = unsafe { DeviceContext::from_lent(verbs, Box::new(devices)) };
    cache.push(Arc::downgrade(&ctx));
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_limits_follow_the_man_pages() {
        assert_eq!(
            max_private_data(PortSpace::Tcp, PrivateDataCall::Connect),
            56
        );
        assert_eq!(
            max_private_data(PortSpace::Tcp, PrivateDataCall::Accept),
            196
        );
        assert_eq!(
            max_private_data(PortSpace::Tcp, PrivateDataCall::Reject),
            148
        );
        assert_eq!(
            max_private_data(PortSpace::Udp, PrivateDataCall::Connect),
            180
        );
        assert_eq!(
            max_private_data(PortSpace::Udp, PrivateDataCall::Accept),
            136
        );
    }

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for addr in ["198.18.0.1:7471", "[fe80::1]:9", "0.0.0.0:0"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let mut raw = RawSockAddr::new(addr);
            // SAFETY: raw is a whole sockaddr_storage.
            let back = unsafe { read_sockaddr(raw.as_mut_ptr().cast()) };
            assert_eq!(back, Some(addr));
        }
    }

    #[test]
    fn unknown_event_types_and_reasons_survive() {
        assert_eq!(EventType::from(9), EventType::Established);
        assert_eq!(EventType::from(99), EventType::Unknown(99));
        let r = RejectReason { status: 28 };
        assert!(r.is_consumer_reject());
        assert_eq!(r.ib_reason(), Some(IbRejectReason::ConsumerDefined));
        let r = RejectReason { status: 8 };
        assert!(r.to_string().contains("nobody listens"), "{r}");
        assert_eq!(RejectReason { status: -111 }.ib_reason(), None);
    }

    #[test]
    fn timeouts_name_the_step_the_addresses_and_the_wait() {
        let ends = Endpoints {
            local: Some("127.0.0.1:40000".parse().unwrap()),
            remote: Some("127.0.0.2:7174".parse().unwrap()),
        };
        let e = CmError::Timeout {
            timeout: Duration::from_secs(10),
            waiting_for: Some(EventType::ConnectResponse),
            endpoints: ends,
        };
        assert_eq!(
            e.to_string(),
            "rdma_cm connect (127.0.0.1:40000 -> 127.0.0.2:7174): no CONNECT_RESPONSE event \
             within 10 s: the peer did not answer: is the server running and listening on that \
             address and port, and reachable over RDMA?"
        );
        let e = CmError::Timeout {
            timeout: Duration::from_millis(2500),
            waiting_for: Some(EventType::AddrResolved),
            endpoints: Endpoints {
                local: None,
                ..ends
            },
        };
        let s = e.to_string();
        assert!(
            s.starts_with(
                "address resolution (to 127.0.0.2:7174): no ADDR_RESOLVED event within 2500 ms: "
            ),
            "{s}"
        );
        let e = CmError::Timeout {
            timeout: Duration::from_secs(1),
            waiting_for: Some(EventType::RouteResolved),
            endpoints: Endpoints::default(),
        };
        assert!(e
            .to_string()
            .starts_with("route resolution: no ROUTE_RESOLVED event within 1 s"));
        let e = CmError::Timeout {
            timeout: Duration::from_secs(1),
            waiting_for: None,
            endpoints: Endpoints::default(),
        };
        assert_eq!(e.to_string(), "no rdma_cm event arrived within 1 s");
        let e = CmError::Timeout {
            timeout: Duration::from_secs(1),
            waiting_for: Some(EventType::Unknown(77)),
            endpoints: Endpoints::default(),
        };
        assert_eq!(
            e.to_string(),
            "waiting for an rdma_cm event: no Unknown(77) event within 1 s"
        );
    }

    #[test]
    fn errors_say_what_and_where() {
        let e = CmError::RouteUnresolvable {
            dst: Some("10.1.2.3:7471".parse().unwrap()),
            source: io::Error::from_raw_os_error(libc::ENETUNREACH),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("cannot resolve a route to 10.1.2.3:7471: no RDMA device"),
            "{s}"
        );
        let e = CmError::PrivateDataTooLong {
            call: "rdma_connect",
            len: 57,
            max: 56,
            port_space: PortSpace::Tcp,
            transport: "InfiniBand/RoCE",
        };
        assert!(e.to_string().contains("57 bytes"), "{e}");
        let e = CmError::Call {
            call: "rdma_listen",
            endpoints: Endpoints {
                local: Some("198.18.0.1:7000".parse().unwrap()),
                remote: None,
            },
            source: io::Error::from_raw_os_error(libc::EADDRINUSE),
        };
        assert!(
            e.to_string()
                .starts_with("rdma_listen failed (on 198.18.0.1:7000): "),
            "{e}"
        );
    }
}
