//! Connection management through librdmacm (`rdma_cm`): event channels, ids, connection
//! parameters with private data, reject, UD ids and multicast.
//!
//! Ownership: an [`EventChannel`] is the root. Every [`CmId`] holds the `Arc` of its channel,
//! so a channel is destroyed only after all its ids. Every [`Event`] holds the `Arc`s of the
//! ids it names, so an id is never destroyed while an event about it is still in a user's hands.
//! A QP created on an id ([`CmId::create_qp`]) is an ordinary
//! [`QueuePair`](crate::queue_pair::QueuePair) that holds the id's `Arc` (and, like every QP, its
//! protection domain and CQs): the id is destroyed only after the QP, and dropping the QP leaves
//! the id without one.
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
//! let ctx = id.device_context()?; // the device the address resolved to
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq_builder().cqe(64).build()?;
//! let qp = id.create_qp(pd.create_qp_builder().send_cq(&cq).recv_cq(&cq))?;
//! // ... register buffers and post receives on the QP before connecting ...
//! let answer = id.connect_qp(&qp, ConnParam::new().private_data(b"hello"), wait)?;
//! println!("the server said {:?}", answer.private_data());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The server side: listen, take a connection request, give the new id a QP, accept. To serve
//! many clients at once, [`CmId::migrate`] each accepted id to a channel of its own.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use sideway::rdmacm::{ConnParam, EventChannel, EventType, PortSpace};
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
//! let qp = conn.create_qp(pd.create_qp_builder().send_cq(&cq).recv_cq(&cq))?;
//! // ... register buffers and post receives on the QP before accepting ...
//! conn.accept_qp(&qp, ConnParam::new().private_data(b"welcome"), Some(Duration::from_secs(10)))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Files
//!
//! Leaves first: `address` (socket addresses in C form), `event_type` (event and reject
//! codes), `conn_param` (port spaces, private data limits, connection parameters), `error`
//! ([`CmError`]); then `ud` (UD parameters and address handles), `channel` ([`EventChannel`] and
//! its lock), `device` (the contexts librdmacm lends), `id` ([`CmId`]), `event` ([`Event`], reading
//! a channel) and `qp` (queue pairs on an id and the connect/accept helpers that drive them). Each
//! imports only the ones listed before it; none imports this file.

mod address;
mod channel;
mod conn_param;
mod device;
mod error;
mod event;
mod event_type;
mod id;
mod qp;
#[cfg(test)]
mod tests;
mod ud;

pub use address::Endpoints;
pub use channel::EventChannel;
pub use conn_param::{
    max_private_data, ConnParam, PeerConnParam, PortSpace, PrivateDataCall,
    MAX_PRIVATE_DATA_TCP_ACCEPT, MAX_PRIVATE_DATA_TCP_CONNECT, MAX_PRIVATE_DATA_TCP_REJECT,
    MAX_PRIVATE_DATA_UDP_CONNECT, MAX_PRIVATE_DATA_UDP_REPLY,
};
pub use error::CmError;
pub use event::Event;
pub use event_type::{EventType, IbRejectReason, RejectReason};
pub use id::CmId;
pub use qp::QpTargetState;
pub use ud::{CmAddressHandle, UdParam};
