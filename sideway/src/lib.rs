//! Fast, safe RDMA in Rust.
//!
//! `sideway` wraps rdma-core's libibverbs and librdmacm, loaded at run time through
//! [`rdma-mummy-sys`](rdma_mummy_sys) so nothing links rdma-core at build time and one binary
//! runs on any rdma-core version.
//!
//! - Every verbs object is owned through an `Arc`, and each holds the `Arc`s of what it needs
//!   (a memory region its protection domain, a queue pair its completion queues), so drop
//!   order is always right and no user code names a lifetime.
//! - `Drop` calls the destroy verb and never panics; a failed destroy is reported on stderr.
//! - Errors are typed per operation and say what failed, with which inputs, and why.
//! - C enums that a newer rdma-core may grow are `#[non_exhaustive]` with an `Unknown` arm;
//!   flags keep bits this crate does not know.
//!
//! ```no_run
//! let ctx = sideway::open_device(None)?; // the first device
//! let port = ctx.query_port(1)?;
//! println!("{}: port 1 is {:?}, MTU {:?}", ctx.name(), port.state(), port.active_mtu());
//! let pd = ctx.alloc_pd()?;
//! let buf = pd.reg_buffer(4096, sideway::AccessFlags::LOCAL_WRITE)?;
//! println!("lkey {:#x}", buf.lkey());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod address_handle;
#[allow(unsafe_code)]
pub mod async_event;
#[allow(unsafe_code)]
pub mod completion_event;
#[allow(unsafe_code)]
pub mod completion_queue;
#[allow(unsafe_code)]
pub mod device;
pub mod gid;
#[allow(unsafe_code)]
pub mod memory_region;
#[allow(unsafe_code)]
pub mod memory_window;
#[allow(unsafe_code)]
pub mod protection_domain;
#[allow(unsafe_code)]
pub mod queue_pair;
#[allow(unsafe_code)]
pub mod rdmacm;
#[allow(unsafe_code)]
pub mod shared_receive_queue;
pub mod testing;

// The workspace README's Rust example is compiled as a doc test of this crate, so it cannot
// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[allow(unsafe_code)]
mod errno;
mod macros;

pub use address_handle::{AddressHandle, AddressHandleError, Grh, GrhKind, GRH_LEN};
pub use async_event::{AsyncEvent, AsyncEventKind, AsyncEventObject, EventError};
pub use completion_queue::{
    ClaimedCq, CompletionChannel, CompletionQueue, CompletionQueueBuilder, CompletionQueueError,
    Poller, WcFlags, WcFlagsEx, WcOpcode, WcStatus, WorkCompletion, WorkCompletionError,
};
pub use device::{open_device, Device, DeviceContext, DeviceError, DeviceList};
pub use gid::{Gid, ParseGidError};
pub use memory_region::{
    leaked_memory, AccessFlags, BufferAccess, BufferError, DeviceReadOnly, DeviceWritable,
    LeakedMemory, MemoryRegion, MemoryRegionError, Plain, RegisteredBuffer,
};
pub use memory_window::{MemoryWindow, MemoryWindowError, MwType};
pub use protection_domain::ProtectionDomain;
pub use queue_pair::{
    ConnectError, ConnectOptions, Endpoint, ModifyQpError, PostError, PostRecvGuard, PostSendGuard,
    QpAttrMask, QpState, QpType, QueuePair, QueuePairAttribute, QueuePairBuilder, QueuePairError,
    SendData, SendFlags,
};
/// The raw bindings, for calls this crate does not wrap.
pub use rdma_mummy_sys as sys;
pub use shared_receive_queue::{
    SharedReceiveQueue, SharedReceiveQueueBuilder, SharedReceiveQueueError, SrqPostRecvGuard,
};

/// Reports a destroy verb that failed in a `Drop`: the resource may leak, but the program goes
/// on. Writing to stderr can itself fail; that is ignored rather than allowed to panic.
pub(crate) fn report_drop_failure(call: &str, object: &str, error: &std::io::Error) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "sideway: {call} failed while dropping {object}: {error} (the resource may leak)"
    );
}
