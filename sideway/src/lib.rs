//! Fast, safe RDMA in Rust.
//!
//! `sideway` wraps rdma-core's libibverbs and librdmacm, loaded at run time through
//! [`rdma-core-mummy-sys`](rdma_mummy_sys) so nothing links rdma-core at build time and one binary
//! runs on any rdma-core version.
//!
//! - Every verbs object is owned through an `Arc`, and each holds the `Arc`s of what it needs
//!   (a memory region its protection domain, a queue pair its completion queues), so drop
//!   order is always right and no user code names a lifetime.
//! - `Drop` calls the destroy verb and never panics; a failed destroy is reported through the
//!   [`log`](https://docs.rs/log) facade (see [Diagnostics](#diagnostics)).
//! - Errors are typed per operation and say what failed, with which inputs, and why. Their
//!   `Debug` is their fields; return [`Report`] from `main` (`fn main() -> Result<(),
//!   sideway::Report>`) to have a failure print the sentence instead.
//! - C enums that a newer rdma-core may grow are `#[non_exhaustive]` with an `Unknown` arm;
//!   flags keep bits this crate does not know.
//!
//! # Where things are
//!
//! Every public item has one path, so docs, error messages and programs all name it alike.
//! The crate root holds only the way in ([`open_device`]), the error reporter for `main`
//! ([`Report`]), [`UnknownValue`] and the raw bindings ([`sys`]). Everything else lives in the
//! module of the verbs object it serves, named as rdma-core names the object:
//! [`device`] (the device list, contexts, attributes, ports, GIDs), [`protection_domain`],
//! [`memory_region`] (regions, registered buffers, access flags, scatter/gather entries),
//! [`completion_channel`], [`completion_queue`] (CQs, pollers, work completions),
//! [`queue_pair`] (QPs, their builder, attributes, states, posting), [`shared_receive_queue`],
//! [`address_handle`], [`memory_window`], [`async_event`], [`device_memory`], [`odp`],
//! [`sharing`], [`thread_domain`], [`parent_domain`], [`xrc_domain`]; then [`gid`], [`rdmacm`]
//! (the connection manager), [`connection`] (what two programs trade around a connection),
//! [`dv`] (providers' direct verbs), [`peer_text`] and [`testing`]. Each type's errors sit
//! beside it. `sideway/tests/public_paths.rs` fails when an item gains a second path.
//!
//! ```
//! use sideway::memory_region::AccessFlags;
//! use sideway::queue_pair::{QpType, SendFlags};
//!
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! assert!(access.contains(AccessFlags::REMOTE_WRITE));
//! assert_ne!(QpType::Rc, QpType::Ud);
//! let _ = SendFlags::SIGNALED;
//! ```
//!
//! # Diagnostics
//!
//! A destroy verb that fails inside a `Drop` (`ibv_dereg_mr`, `ibv_destroy_qp`,
//! `ibv_dealloc_pd`, `rdma_destroy_id`, ...) cannot return an error. The crate logs it
//! through the [`log`](https://docs.rs/log) facade at `error` level with target `sideway`
//! (`"ibv_destroy_cq failed while dropping a completion queue: Device or resource busy
//! (os error 16) (the resource may leak)"`) and goes on. Nothing is printed unless the
//! application installs a logger (`env_logger`, `simple_logger`, a `tracing` bridge, or its
//! own [`log::Log`](https://docs.rs/log/latest/log/trait.Log.html)); with `env_logger`,
//! `RUST_LOG=sideway=error` shows them. Memory a failed deregistration leaked on purpose is
//! also counted, whatever the logger: [`leaked_memory`] says how many regions and bytes.
//!
//! ```
//! /// The smallest logger that puts the crate's diagnostics on stderr.
//! struct Stderr;
//!
//! impl log::Log for Stderr {
//!     fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
//!         meta.level() <= log::Level::Warn
//!     }
//!     fn log(&self, record: &log::Record<'_>) {
//!         if self.enabled(record.metadata()) {
//!             eprintln!("{}: {}", record.target(), record.args());
//!         }
//!     }
//!     fn flush(&self) {}
//! }
//!
//! static LOGGER: Stderr = Stderr;
//! log::set_logger(&LOGGER).expect("no logger installed yet");
//! log::set_max_level(log::LevelFilter::Warn);
//! let leaks = sideway::memory_region::leaked_memory();
//! println!("{} regions ({} bytes) leaked so far", leaks.regions, leaks.bytes);
//! ```
//!
//! # Architecture
//!
//! The crate's files form layers with no import circle and no arrow up to `lib.rs`: leaves at
//! the bottom (errno and drop reporting, fd readiness, GIDs, scatter/gather entries, work
//! completions, the one receive batch type), one module per verbs object above them (in
//! `src/verbs/`: the device, protection domain, memory, completions, SRQ, queue pairs, async
//! events), and [`rdmacm`] on top. [`architecture`] (`sideway/ARCHITECTURE.md`) draws the
//! graph, and `sideway/tests/module_graph.rs` checks the code against it.
//!
//! # Soundness
//!
//! Safe code built on this crate cannot cause undefined behaviour, whatever the device or
//! the peer does. The rules that make it so, and the tests that would catch a breach (the
//! repository's `docs/soundness.md` gives each rule with the provider behaviour it assumes,
//! and the items not yet carried):
//!
//! | rule | how it holds | checked by |
//! | --- | --- | --- |
//! | Registered memory outlives its registration. | A [`MemoryRegion`] owns its memory and frees it only after `ibv_dereg_mr` succeeded; clones of its `Arc` keep both. | `sideway/tests/soundness.rs`: `a_region_clone_keeps_the_memory_after_its_buffer_is_dropped` |
//! | A failed deregistration never frees memory the device can reach. | The owner is leaked on purpose, reported, and counted by [`leaked_memory`]. | `a_failed_deregistration_leaks_instead_of_freeing` |
//! | A registration outlives every window bound to it. | A [`MemoryWindow`] holds the `Arc` of every region it was asked to bind, from the bind's attempt (refused, aborted or failed ones too) until the window is dropped. | `a_type1_window_keeps_its_region_alive`, `a_type2_window_keeps_its_region_alive`; unit tests in `memory_window`: `a_region_outlives_an_aborted_or_refused_type2_rebind_until_the_window_goes`, `a_region_outlives_a_failed_type1_rebind_until_the_window_goes`; `sideway/tests/memory_window.rs`: `memory_window_keeps_its_region_through_an_aborted_rebind` |
//! | A posted request cannot reach memory after its region is gone. | The device checks every local and remote key; a deregistered key fails the request (a provider may hand the same key value to a later registration of the same shape, mlx5 does: that key then reaches only the new registration's memory, with its access; an implicit on-demand region, whose shape is always the same, keeps its buffers' memory until its device context closes). | the same tests: the rkey of a dropped region is refused |
//! | No safe `&[u8]`/`&mut [u8]` over memory the device may write. | [`RegisteredBuffer`] (device-writable) has copies, volatile reads, [`RegisteredBuffer::inline`] and an `unsafe` [`RegisteredBuffer::view`]; only `RegisteredBuffer<DeviceReadOnly>` has slices. | compile-fail doc tests in [`memory_region`] |
//! | A `Sync` type is sound: the provider keeps its locks. | Every CQ poll, classic or extended, takes the CQ's polling claim; posting needs `&mut QueuePair`; SRQ batches are behind a lock; an mlx5 device is not opened while `MLX5_SINGLE_THREADED=1` would drop the provider's CQ and SRQ locks, which destroying a QP and reaping SRQ receives rely on ([`DeviceError::UnlockedProvider`]). | `benches/tests/polling.rs`: `a_claimed_cq_refuses_other_pollers_until_dropped`, `threads_sharing_a_classic_cq_poll_it_one_at_a_time`; the locking rule's unit tests |
//! | A region over device memory or over another process's memory hands out no view. | [`ProtectionDomain::reg_dm_mr`] and [`ProtectionDomain::import_mr`] return a plain [`MemoryRegion`], which has no slice; device memory is reached by bounds-checked copies only. | compile-fail doc tests in [`device_memory`] and [`sharing`] |
//! | Every C return convention reads right. | One rule in the `errno` module: `errno` cleared before each control-path verb; NULL, -1, positive and negative error numbers. | its unit tests (`a_stale_errno_is_not_read_as_the_cause_of_minus_eperm`) |
//! | An implicit on-demand region (every address) reaches only memory the program owns. | [`ProtectionDomain::reg_implicit_odp`] grants local access only; [`MemoryRegion::sge`] is `None` on it; entries come from buffers it hands out, whose memory it frees only after its deregistration; remote access is the `unsafe` [`ProtectionDomain::reg_implicit_odp_with_access`]. | `benches/tests/odp.rs`: `an_implicit_region_makes_entries_only_over_the_memory_it_owns`; compile-fail doc test in [`odp`] |
//! | An imported region makes no safe entry from its bounds. | Its exporter may be this process and its bounds the whole address space (an implicit region's handle imported): [`MemoryRegion::sge`] is `None` on it; [`MemoryRegion::imported_sge`] is `unsafe`. | `sideway/tests/sharing_ece_fake.rs` (an imported implicit region's handle); `dm_ece_import.rs`: `a_self_imported_region_makes_no_safe_entry`; compile-fail doc test in [`sharing`] |
//!
//! Registering memory nobody hands over ([`ProtectionDomain::reg_mr`]) and pointing an SGE at
//! raw memory ([`memory_region::Sge::from_raw_parts`]) stay `unsafe`: GPU and device memory need
//! that freedom, and their `# Safety` sections say what the caller keeps.
//!
//! ```no_run
//! let ctx = sideway::open_device(None)?; // the first device
//! let port = ctx.query_port(1)?;
//! println!("{}: port 1 is {:?}, MTU {:?}", ctx.name(), port.state(), port.active_mtu());
//! let pd = ctx.alloc_pd()?;
//! let buf = pd.reg_buffer(4096, sideway::memory_region::AccessFlags::LOCAL_WRITE)?;
//! println!("lkey {:#x}", buf.lkey());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads
//!
//! Every object but the thread and parent domains and their queue pairs is `Send` and `Sync`, and
//! lives in an `Arc`: hand clones to as many threads as you like. What each allows from several
//! threads at once, and why that is sound:
//!
//! | type | from many threads | why |
//! | --- | --- | --- |
//! | [`DeviceContext`], [`ProtectionDomain`], [`MemoryRegion`], [`AddressHandle`], [`MemoryWindow`], [`CompletionChannel`] | everything (`&self` methods) | libibverbs' control verbs are thread-safe; these objects have no state of their own that changes |
//! | [`CompletionQueue`] | polling by one thread at a time; arming, events, queries by any | each poll claims the CQ (a second concurrent [`CompletionQueue::poll`] gets [`CompletionQueueError::Busy`]), so polls never overlap even where the provider takes no CQ lock (mlx5's single-threaded mode; CQs are not made on thread domains, see below); a hot loop [`CompletionQueue::claim`]s once |
//! | [`QueuePair`] | `modify`, `query`, `state`, `qp_num` by any; posting needs `&mut` | the post guards build their batch in storage inside the QP, so posting takes `&mut QueuePair`: put the QP in a `Mutex` to post from several threads, or give each thread its own QP |
//! | [`SharedReceiveQueue`] | everything | its receive batches are built behind a lock |
//! | [`ThreadDomain`], [`ParentDomain`], `QueuePair<OneThread>` | neither `Send` nor `Sync`: used on the thread that made them | a thread domain promises the provider one thread at a time for its objects, and its QPs share provider state (mlx5: the domain's doorbell, written without a lock), so per-QP `&mut` is not enough. [`ParentDomain::create_qp_builder`] makes [`queue_pair::OneThread`] QPs, whose builder and posting guards cannot leave the thread either (compile-fail tests there). CQs and SRQs are not made on a thread-bound parent domain (`ThreadBoundPd` errors): the provider takes no lock for them there, which a `Sync` type cannot allow |
//! | [`RegisteredBuffer`] | reads and copies by any; writes need `&mut` | the device may write it at any time, so no safe slice is handed out; copies and volatile reads are sound whoever runs them |
//! | [`rdmacm::EventChannel`], [`rdmacm::CmId`] | everything | every call on an id, and every event read, holds its channel's lock (librdmacm rewrites an id's fields while it handles events); serve connections in parallel by giving each id its own channel ([`rdmacm::CmId::migrate`]) |
//!
//! A QP posted from two threads, and its CQ polled by a third:
//!
//! ```no_run
//! use std::sync::{Arc, Mutex};
//! use sideway::queue_pair::SendFlags;
//!
//! # fn demo(qp: sideway::queue_pair::QueuePair, buf: sideway::memory_region::RegisteredBuffer) -> Result<(), Box<dyn std::error::Error>> {
//! let cq = Arc::clone(qp.send_cq());
//! let qp = Arc::new(Mutex::new(qp));
//! let buf = Arc::new(buf);
//! let senders: Vec<_> = (0..2u64)
//!     .map(|t| {
//!         let (qp, buf) = (Arc::clone(&qp), Arc::clone(&buf));
//!         std::thread::spawn(move || {
//!             let mut qp = qp.lock().unwrap(); // posting needs the QP to itself
//!             let mut batch = qp.start_post_send();
//!             batch.wr(t, SendFlags::SIGNALED).send(buf.sge(0..64).unwrap());
//!             batch.post()
//!         })
//!     })
//!     .collect();
//! let poller = std::thread::spawn(move || {
//!     let mut seen = 0;
//!     while seen < 2 {
//!         seen += cq.poll().map(|p| p.count()).unwrap_or(0); // one poller at a time
//!     }
//! });
//! for s in senders {
//!     s.join().unwrap()?;
//! }
//! poller.join().unwrap();
//! # Ok(()) }
//! ```
//!
//! The promise, checked at compile time:
//!
//! ```
//! fn shareable<T: Send + Sync>() {}
//! shareable::<sideway::device::DeviceContext>();
//! shareable::<sideway::protection_domain::ProtectionDomain>();
//! shareable::<sideway::memory_region::MemoryRegion>();
//! shareable::<sideway::memory_region::RegisteredBuffer>();
//! shareable::<sideway::completion_queue::CompletionQueue>();
//! shareable::<sideway::completion_channel::CompletionChannel>();
//! shareable::<sideway::queue_pair::QueuePair>();
//! shareable::<sideway::shared_receive_queue::SharedReceiveQueue>();
//! shareable::<sideway::rdmacm::EventChannel>();
//! shareable::<sideway::rdmacm::CmId>();
//! shareable::<sideway::rdmacm::Event>();
//! ```
//! [`AddressHandle`]: crate::address_handle::AddressHandle
//! [`CompletionChannel`]: crate::completion_channel::CompletionChannel
//! [`CompletionQueue::claim`]: crate::completion_queue::CompletionQueue::claim
//! [`CompletionQueue::poll`]: crate::completion_queue::CompletionQueue::poll
//! [`CompletionQueueError::Busy`]: crate::completion_queue::CompletionQueueError::Busy
//! [`CompletionQueue`]: crate::completion_queue::CompletionQueue
//! [`DeviceContext`]: crate::device::DeviceContext
//! [`DeviceError::UnlockedProvider`]: crate::device::DeviceError::UnlockedProvider
//! [`MemoryRegion::imported_sge`]: crate::memory_region::MemoryRegion::imported_sge
//! [`MemoryRegion::sge`]: crate::memory_region::MemoryRegion::sge
//! [`MemoryRegion`]: crate::memory_region::MemoryRegion
//! [`MemoryWindow`]: crate::memory_window::MemoryWindow
//! [`ParentDomain::create_qp_builder`]: crate::parent_domain::ParentDomain::create_qp_builder
//! [`ParentDomain`]: crate::parent_domain::ParentDomain
//! [`ProtectionDomain::import_mr`]: crate::protection_domain::ProtectionDomain::import_mr
//! [`ProtectionDomain::reg_dm_mr`]: crate::protection_domain::ProtectionDomain::reg_dm_mr
//! [`ProtectionDomain::reg_implicit_odp_with_access`]: crate::protection_domain::ProtectionDomain::reg_implicit_odp_with_access
//! [`ProtectionDomain::reg_implicit_odp`]: crate::protection_domain::ProtectionDomain::reg_implicit_odp
//! [`ProtectionDomain::reg_mr`]: crate::protection_domain::ProtectionDomain::reg_mr
//! [`ProtectionDomain`]: crate::protection_domain::ProtectionDomain
//! [`QueuePair`]: crate::queue_pair::QueuePair
//! [`RegisteredBuffer::inline`]: crate::memory_region::RegisteredBuffer::inline
//! [`RegisteredBuffer::view`]: crate::memory_region::RegisteredBuffer::view
//! [`RegisteredBuffer`]: crate::memory_region::RegisteredBuffer
//! [`SharedReceiveQueue`]: crate::shared_receive_queue::SharedReceiveQueue
//! [`ThreadDomain`]: crate::thread_domain::ThreadDomain
//! [`leaked_memory`]: crate::memory_region::leaked_memory

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod connection;
mod diagnostics;
pub mod dv;
#[allow(unsafe_code)]
mod fd;
pub mod gid;
pub mod peer_text;
#[allow(unsafe_code)]
pub mod rdmacm;
#[allow(unsafe_code)]
mod receive_batch;
mod report;
#[allow(unsafe_code)]
mod scatter_gather;
pub mod testing;
mod verbs;
#[allow(unsafe_code)]
mod work_completion;
pub use verbs::odp;
pub use verbs::xrc_domain;
pub use verbs::{
    address_handle, async_event, completion_channel, completion_event, completion_queue, device,
    memory_region, memory_window, parent_domain, protection_domain, queue_pair,
    shared_receive_queue, thread_domain,
};
pub use verbs::{device_memory, sharing};

#[doc = include_str!("../ARCHITECTURE.md")]
pub mod architecture {}

// The workspace README's Rust example is compiled as a doc test of this crate, so it cannot
// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

// And so is this crate's own README.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;

#[allow(unsafe_code)]
mod errno;
mod macros;

pub use macros::UnknownValue;
/// The raw bindings, for calls this crate does not wrap.
pub use rdma_mummy_sys as sys;
pub use report::Report;
pub use verbs::device::context::open_device;
