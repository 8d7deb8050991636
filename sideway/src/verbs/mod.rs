//! The verbs objects (libibverbs), one module each, layered as `ARCHITECTURE.md` draws: the
//! device at the bottom, then the protection domain; memory regions and windows, address
//! handles and completions; what queue pairs and SRQs share, and the SRQ; queue pairs; and
//! async events on top. Only declarations here: the crate root re-exports the modules.

#[allow(unsafe_code)]
pub mod address_handle;
#[allow(unsafe_code)]
pub mod async_event;
#[allow(unsafe_code)]
pub mod completion_channel;
#[allow(unsafe_code)]
pub mod completion_event;
#[allow(unsafe_code)]
pub mod completion_queue;
#[allow(unsafe_code)]
pub mod device;
#[allow(unsafe_code)]
pub mod device_memory;
#[allow(unsafe_code)]
pub mod memory_region;
#[allow(unsafe_code)]
pub mod memory_window;
#[allow(unsafe_code)]
pub mod odp;
#[allow(unsafe_code)]
pub mod parent_domain;
#[allow(unsafe_code)]
pub mod protection_domain;
#[allow(unsafe_code)]
pub mod queue_pair;
#[allow(unsafe_code)]
pub mod shared_receive_queue;
#[allow(unsafe_code)]
pub mod sharing;
#[allow(unsafe_code)]
pub mod thread_domain;
#[allow(unsafe_code)]
pub mod xrc_domain;
