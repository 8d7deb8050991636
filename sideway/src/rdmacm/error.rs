//! [`CmError`](super::CmError), and the hints its messages give.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rdma_mummy_sys::{Library, LoadError};

use super::address::Endpoints;
use super::conn_param::PortSpace;
use super::event_type::{status_text, EventType, RejectReason};
use crate::verbs::queue_pair::{ModifyQpError, QpType, QueryQpError, QueuePairError};

/// Why an rdma_cm call, or the connection step an event reports, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// librdmacm (or libibverbs) could not be loaded at all.
    #[error(transparent)]
    Library(#[from] LoadError),
    /// A call failed. Creating a channel or an id fails with "No such device" on a machine
    /// without an RDMA device: the message then says what to do, as
    /// [`DeviceError::NoDevice`](crate::device::DeviceError::NoDevice)'s does.
    #[error("{call} failed{endpoints}: {source}{}", call_hint(call, source))]
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
    /// event ([`EventChannel::wait_for`](super::EventChannel::wait_for),
    /// [`CmId::wait_for`](super::CmId::wait_for)), the addresses when the id is known
    /// ([`CmId::wait_for`](super::CmId::wait_for)), and what most often causes that step to hang.
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
    /// A QP could not be made from the builder given to
    /// [`CmId::create_qp`](super::CmId::create_qp).
    #[error("cannot create a QP on the rdma_cm id{endpoints}: {source}")]
    CreateQp {
        /// The id's addresses.
        endpoints: Endpoints,
        /// Why.
        source: Box<QueuePairError>,
    },
    /// The id already has a QP; drop its `QueuePair` before creating another.
    #[error(
        "the rdma_cm id{endpoints} already has QP {qp_num:#x}; drop it before creating another"
    )]
    QpExists {
        /// The id's addresses.
        endpoints: Endpoints,
        /// The number of the QP it has.
        qp_num: u32,
    },
    /// The builder asks for another QP type than the id's port space uses.
    #[error("{port_space:?} ids take {expected:?} QPs, and the builder asks for {asked:?}: set qp_type({expected:?})")]
    QpTypeMismatch {
        /// The id's port space.
        port_space: PortSpace,
        /// What the builder asked for.
        asked: QpType,
        /// What the id takes.
        expected: QpType,
    },
    /// Moving a QP through its states with the id's attributes failed.
    #[error("moving the QP for the connection{endpoints}: {source}")]
    ModifyQp {
        /// The id's addresses.
        endpoints: Endpoints,
        /// Which transition, and why.
        source: Box<ModifyQpError>,
    },
    /// Reading a QP's state failed.
    #[error("reading the QP's state for the connection{endpoints}: {source}")]
    QueryQp {
        /// The id's addresses.
        endpoints: Endpoints,
        /// Why.
        source: Box<QueryQpError>,
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

/// What a failed `call` adds to its errno: librdmacm's setup calls fail with ENODEV when
/// the machine has no RDMA device at all.
pub(super) fn call_hint(call: &str, source: &io::Error) -> String {
    let setup = matches!(
        call,
        "rdma_create_event_channel" | "rdma_create_id" | "rdma_get_devices"
    );
    if setup && source.raw_os_error() == Some(libc::ENODEV) {
        format!(
            " (no RDMA device on this machine; {})",
            crate::verbs::device::NO_DEVICE_HELP
        )
    } else {
        String::new()
    }
}

pub(super) fn addr_hint(source: &io::Error) -> &'static str {
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

pub(super) fn route_hint(source: &io::Error) -> &'static str {
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

pub(super) fn ensure_loaded() -> Result<(), CmError> {
    Library::Rdmacm.load()?;
    Library::Ibverbs.load()?;
    Ok(())
}
