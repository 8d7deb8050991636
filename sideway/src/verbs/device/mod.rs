//! RDMA devices: listing them, opening one, and what it says about itself.
//!
//! [`DeviceList`] wraps `ibv_get_device_list`; each [`Device`] in it keeps the list alive, so
//! devices can be held and passed around freely. [`Device::open`] (or the one-call
//! [`open_device`](crate::open_device)) gives an `Arc<`[`DeviceContext`]`>`, the root every other
//! verbs object holds on to: the context is closed when the last object that needs it is dropped.
//!
//! Files: `context.rs` (the list, the device, the context and its errors), `attributes.rs`
//! ([`DeviceAttr`], [`DeviceContext::query_device`]), `port.rs` ([`PortAttr`], [`Mtu`],
//! [`DeviceContext::query_port`]), `gid_table.rs` ([`GidEntry`],
//! [`DeviceContext::query_gid_table`]).

#[allow(unsafe_code)]
mod attributes;
#[allow(unsafe_code)]
pub(crate) mod context;

#[allow(unsafe_code)]
mod gid_table;
mod locking;
#[allow(unsafe_code)]
mod port;

pub use attributes::*;
pub(crate) use context::{ensure_ibverbs, open_device, NO_DEVICE_HELP};
pub use context::{
    Device, DeviceContext, DeviceError, DeviceList, DeviceResult, NodeType, TransportType,
};
pub use gid_table::*;
pub use port::*;
