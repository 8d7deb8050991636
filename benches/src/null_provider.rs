//! The null provider: in-memory verbs objects whose provider operations only count (and, for
//! polling, hand back canned completions), wrapped in sideway objects, so the wrapper's own
//! cost on the data path can be timed on any machine.
//!
//! The objects and their operations are C (`csrc/null_provider.c`), shared by both sides of
//! every comparison: sideway reaches them through rdma-mummy-sys's Rust data-path inlines,
//! the C side through verbs.h's. Nothing here needs an RDMA device or rdma-core's libraries
//! at run time: the context has no device, and the sideway objects wrapped around it are
//! built with the `wrap_raw`/`from_raw_parts` constructors, which never call libibverbs and
//! whose drops destroy nothing.

use std::ptr::NonNull;
use std::sync::Arc;

use sideway::completion_queue::{CompletionQueue, CompletionQueueError, WcFlagsEx};
use sideway::device::DeviceContext;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QueuePair, QueuePairBuilder, Threading};
use sideway::sys::{ibv_context, ibv_cq, ibv_cq_ex, ibv_pd, ibv_qp, ibv_qp_ex, ibv_wc};

/// The completion timestamp the provider reports for a completion: this plus its `wr_id`
/// (`NULL_TS_BASE`).
pub const TIMESTAMP_BASE: u64 = 1_000_000;

/// What the provider's operations saw (`struct null_counters`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `ops.post_send` calls.
    pub post_send_calls: u64,
    /// Work requests in the chains posted with `ops.post_send`.
    pub send_wrs: u64,
    /// `ops.post_recv` calls.
    pub post_recv_calls: u64,
    /// Work requests in the chains posted with `ops.post_recv`.
    pub recv_wrs: u64,
    /// `qp_ex->wr_start` calls.
    pub wr_starts: u64,
    /// `qp_ex->wr_<opcode>` calls.
    pub wr_ops: u64,
    /// `qp_ex->wr_set_sge` (and list, inline) calls.
    pub wr_sges: u64,
    /// `qp_ex->wr_complete` calls.
    pub wr_completes: u64,
    /// `qp_ex->wr_abort` calls.
    pub wr_aborts: u64,
    /// `ops.poll_cq`, `cq_ex->start_poll` and `cq_ex->next_poll` calls.
    pub poll_calls: u64,
    /// Completions handed back.
    pub completions: u64,
    /// `cq_ex->end_poll` calls.
    pub end_polls: u64,
    /// Signaled send requests posted (each makes one completion ready).
    pub signaled: u64,
    /// Sum of the `wr_id` of every request posted.
    pub wr_id_sum: u64,
    /// Sum of the SGE lengths of every request posted.
    pub length_sum: u64,
}

/// What the thread- and parent-domain operations saw (`struct null_domains`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Domains {
    /// `alloc_td` calls.
    pub alloc_td_calls: u64,
    /// `dealloc_td` calls.
    pub dealloc_td_calls: u64,
    /// `alloc_parent_domain` calls.
    pub alloc_parent_domain_calls: u64,
    /// `create_cq_ex` calls.
    pub create_cq_ex_calls: u64,
    /// `create_qp_ex` calls.
    pub create_qp_ex_calls: u64,
    /// Calls of the parent domain's `alloc` callback.
    pub alloc_calls: u64,
    /// ... that answered `IBV_ALLOCATOR_USE_DEFAULT`.
    pub default_allocs: u64,
    /// Calls of the parent domain's `free` callback.
    pub free_calls: u64,
    /// Buffers allocated and not yet freed.
    pub live_buffers: u64,
    /// `dealloc_td` calls made while buffers of objects on the domain were live.
    pub order_errors: u64,
    /// 1 while a thread domain is allocated.
    pub td_live: u64,
    /// `comp_mask` of the last `create_cq_ex`.
    pub last_cq_comp_mask: u32,
    /// `comp_mask` of the last `create_qp_ex`.
    pub last_qp_comp_mask: u32,
    /// `parent_domain` of the last `create_cq_ex` (NULL without `IBV_CQ_INIT_ATTR_MASK_PD`).
    pub last_cq_parent_domain: *mut ibv_pd,
    /// `pd` of the last `create_qp_ex`.
    pub last_qp_pd: *mut ibv_pd,
    /// `send_cq` of the last `create_qp_ex`.
    pub last_qp_send_cq: *mut ibv_cq,
}

/// The size of the buffer every object made on a parent domain asks for (`NULL_BUFFER_SIZE`).
pub const BUFFER_SIZE: usize = 4096;
/// Its alignment (`NULL_BUFFER_ALIGN`).
pub const BUFFER_ALIGN: usize = 64;
/// The `resource_type` of a QP's buffer (`NULL_RES_QP`).
pub const RES_QP: u64 = 1;
/// The `resource_type` of a CQ's buffer (`NULL_RES_CQ`).
pub const RES_CQ: u64 = 2;
/// The errno `create_qp_ex` fails with after recording its arguments (`NULL_QP_REFUSED`).
pub const QP_REFUSED: i32 = 42; // ENOMSG on Linux

/// The opaque `struct null_provider`.
#[repr(C)]
struct RawProvider {
    _private: [u8; 0],
}

extern "C" {
    fn null_provider_new() -> *mut RawProvider;
    fn null_provider_free(np: *mut RawProvider);
    fn null_provider_context(np: *mut RawProvider) -> *mut ibv_context;
    fn null_provider_pd(np: *mut RawProvider) -> *mut ibv_pd;
    fn null_provider_qp(np: *mut RawProvider) -> *mut ibv_qp;
    fn null_provider_qp_ex(np: *mut RawProvider) -> *mut ibv_qp_ex;
    fn null_provider_cq(np: *mut RawProvider) -> *mut ibv_cq;
    fn null_provider_cq_ex(np: *mut RawProvider) -> *mut ibv_cq_ex;
    fn null_provider_counters(np: *const RawProvider) -> *const Counters;
    fn null_cq_last_poll_array(np: *const RawProvider) -> *const ibv_wc;
    fn null_cq_add(cq: *mut ibv_cq, n: u32);
    fn null_provider_domains(np: *const RawProvider) -> *const Domains;
    fn null_domain_release(np: *mut RawProvider);
    fn null_provider_disable_domains(np: *mut RawProvider);
}

/// Owns one `struct null_provider` and frees it on drop.
struct Allocation {
    np: NonNull<RawProvider>,
    /// Its CQ, kept so that making completions ready is one C call, as on the C side
    /// (which holds the CQ pointer), not two.
    cq: NonNull<ibv_cq>,
}

// SAFETY: the provider is plain memory with no thread affinity; who may touch it when is
// governed by the sideway objects and `NullProvider` methods, which need `&mut` or are
// documented as single-threaded (a CQ is polled by one poller at a time).
unsafe impl Send for Allocation {}
// SAFETY: as above; `Allocation` itself exposes nothing but its pointers.
unsafe impl Sync for Allocation {}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: the pointer came from null_provider_new and is freed once, here, after
        // every sideway object using it (they hold an Arc of this allocation through their
        // context's owner).
        unsafe { null_provider_free(self.np.as_ptr()) }
    }
}

/// One null provider: a context, a PD, one CQ and one QP (whose send and receive CQ is that
/// CQ), usable as classic or extended objects.
pub struct NullProvider {
    mem: Arc<Allocation>,
}

impl std::fmt::Debug for NullProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullProvider")
            .field("counters", &self.counters())
            .finish()
    }
}

impl Default for NullProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl NullProvider {
    /// A new provider with no completion ready.
    ///
    /// # Panics
    ///
    /// When the C allocation fails (out of memory).
    pub fn new() -> Self {
        // SAFETY: no preconditions; NULL means out of memory.
        let raw = unsafe { null_provider_new() };
        let raw = NonNull::new(raw).expect("null_provider_new: out of memory");
        // SAFETY: raw is a live provider.
        let cq = unsafe { null_provider_cq(raw.as_ptr()) };
        let cq = NonNull::new(cq).expect("a field address");
        NullProvider {
            mem: Arc::new(Allocation { np: raw, cq }),
        }
    }

    fn raw(&self) -> *mut RawProvider {
        self.mem.np.as_ptr()
    }

    /// The raw context, for the C side.
    pub fn context_raw(&self) -> *mut ibv_context {
        // SAFETY: self.raw() is a live provider.
        unsafe { null_provider_context(self.raw()) }
    }

    /// The raw classic QP, for the C side.
    pub fn qp_raw(&self) -> *mut ibv_qp {
        // SAFETY: self.raw() is a live provider.
        unsafe { null_provider_qp(self.raw()) }
    }

    /// The raw extended QP (the same object), for the C side.
    pub fn qp_ex_raw(&self) -> *mut ibv_qp_ex {
        // SAFETY: self.raw() is a live provider.
        unsafe { null_provider_qp_ex(self.raw()) }
    }

    /// The raw classic CQ, for the C side.
    pub fn cq_raw(&self) -> *mut ibv_cq {
        self.mem.cq.as_ptr()
    }

    /// The raw extended CQ (the same object), for the C side.
    pub fn cq_ex_raw(&self) -> *mut ibv_cq_ex {
        // SAFETY: self.raw() is a live provider.
        unsafe { null_provider_cq_ex(self.raw()) }
    }

    /// What the provider's operations have seen so far.
    pub fn counters(&self) -> Counters {
        // SAFETY: the counters live inside the provider; copied out while no operation runs
        // (operations run only inside calls that borrow the sideway objects or the
        // provider's raw pointers on this thread).
        unsafe { *null_provider_counters(self.raw()) }
    }

    /// What the thread- and parent-domain operations have seen so far.
    pub fn domains(&self) -> Domains {
        // SAFETY: as for counters().
        unsafe { *null_provider_domains(self.raw()) }
    }

    /// Gives every buffer the parent domain's allocator handed out back through its `free`
    /// callback, as a provider does when it destroys the objects (which the sideway objects
    /// of a test double do not reach: their destroy verbs are libibverbs functions).
    pub fn release_domain_buffers(&self) {
        // SAFETY: self.raw() is a live provider; the call runs on this thread, and the
        // callbacks' pd_context is alive while the parent domain is (the caller holds an
        // object on it, or none was allocated and nothing is called).
        unsafe { null_domain_release(self.raw()) }
    }

    /// Takes away the thread- and parent-domain operations: a provider without them (as
    /// rxe), for which verbs.h's inlines fail with `EOPNOTSUPP`.
    pub fn disable_domains(&self) {
        // SAFETY: self.raw() is a live provider; the call clears three pointers.
        unsafe { null_provider_disable_domains(self.raw()) }
    }

    /// A sideway context around the provider's. Besides the data path, the verbs.h inlines
    /// that reach the provider's `verbs_context` ops (`alloc_td`, `dealloc_td`,
    /// `alloc_parent_domain`, `create_cq_ex`, `create_qp_ex`) may be used on it.
    pub fn sideway_context(&self) -> Arc<DeviceContext> {
        self.context()
    }

    /// A sideway PD around the provider's, on `ctx` (from
    /// [`sideway_context`](Self::sideway_context)).
    pub fn sideway_pd(&self, ctx: &Arc<DeviceContext>) -> Arc<ProtectionDomain> {
        // SAFETY: the PD belongs to ctx's provider (the caller got ctx from this provider),
        // which ctx's owner keeps alive.
        unsafe { ProtectionDomain::from_raw_parts(self.nonnull_pd(), ctx) }
    }

    /// A sideway QP around the provider's classic one, made by `builder` (on the provider's
    /// PD or a parent domain of it), with `cq` as both CQs.
    pub fn sideway_qp_on<T: Threading>(
        &self,
        builder: &mut QueuePairBuilder<T>,
        cq: &Arc<CompletionQueue>,
    ) -> QueuePair<T> {
        builder.send_cq(cq).recv_cq(cq);
        let qp_raw = NonNull::new(self.qp_raw()).expect("a field address");
        // SAFETY: the builder's context is this provider's (from sideway_context); qp_raw is
        // its classic QP with post_send and post_recv set (null_provider_new).
        unsafe { builder.wrap_raw(qp_raw, None) }.expect("the builder was given both CQs")
    }

    /// The `ibv_wc` array the last classic poll (`ops.poll_cq`) wrote into; NULL before the
    /// first. Tells a test whether a poll wrote into its slice or somewhere else.
    pub fn last_poll_array(&self) -> *const ibv_wc {
        // SAFETY: self.raw() is a live provider; the call reads one field.
        unsafe { null_cq_last_poll_array(self.raw()) }
    }

    /// Makes `n` more completions ready on the CQ (`null_cq_add`).
    pub fn add_completions(&self, n: u32) {
        // SAFETY: cq_raw() is the provider's live CQ; the call adds to a counter in it.
        unsafe { null_cq_add(self.cq_raw(), n) }
    }

    /// Sideway objects around the provider's: a classic or extended QP, with its CQ (of the
    /// same kind). The QP takes sideway's default capabilities (128 work requests, 1 SGE)
    /// and is in RTS, ready to post.
    pub fn sideway(&self, extended: bool) -> (QueuePair, Arc<CompletionQueue>) {
        self.sideway_with(extended, |_| {})
    }

    /// As [`sideway`](Self::sideway), with the QP builder's settings changed by `configure`
    /// first (its `send_ops_flags`, say); the capabilities must stay within the provider's
    /// (no limit on work requests, 1 SGE is what the provider checks).
    pub fn sideway_with(
        &self,
        extended: bool,
        configure: impl FnOnce(&mut QueuePairBuilder),
    ) -> (QueuePair, Arc<CompletionQueue>) {
        let ctx = self.context();
        // SAFETY: the PD belongs to ctx's provider, which ctx's owner keeps alive.
        let pd = unsafe { ProtectionDomain::from_raw_parts(self.nonnull_pd(), &ctx) };
        let cq = self
            .cq_in(&ctx, extended, WcFlagsEx::default_ex())
            .expect("null_provider_new sets every poll and read function");
        let mut builder: QueuePairBuilder = pd.create_qp_builder();
        builder.send_cq(&cq).recv_cq(&cq);
        configure(&mut builder);
        let qp_raw = NonNull::new(self.qp_raw()).expect("a field address");
        let qp_ex = NonNull::new(self.qp_ex_raw()).expect("a field address");
        // SAFETY: the PD's context came from from_raw_parts; qp_raw is the provider's QP,
        // with post_send and post_recv set and no capacity limit, and qp_ex the same object
        // as ibv_qp_ex with wr_start, wr_complete, wr_abort and the wr_* of SEND (with
        // immediate), RDMA WRITE (with immediate), RDMA READ and the two atomics set
        // (null_provider_new), never changed after; an operation of send_ops_flags that
        // the provider left out is refused by sideway before any call.
        let qp = unsafe { builder.wrap_raw(qp_raw, extended.then_some(qp_ex)) }
            .expect("the builder was given both CQs");
        (qp, cq)
    }

    /// A sideway CQ around the provider's, classic or extended; an extended one reports
    /// `wc_flags`. Fails as `build_ex` does when the provider's `ibv_cq_ex` lacks a function
    /// polling it needs (a test may clear one through [`cq_ex_raw`](Self::cq_ex_raw)).
    pub fn cq(
        &self,
        extended: bool,
        wc_flags: WcFlagsEx,
    ) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        self.cq_in(&self.context(), extended, wc_flags)
    }

    fn cq_in(
        &self,
        ctx: &Arc<DeviceContext>,
        extended: bool,
        wc_flags: WcFlagsEx,
    ) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        let cq_ex = NonNull::new(self.cq_ex_raw()).expect("a field address");
        let cq_raw = NonNull::new(self.cq_raw()).expect("a field address");
        // SAFETY: ctx came from from_raw_parts (context()); cq_raw is the provider's CQ and
        // cq_ex the same object as ibv_cq_ex, whose function pointers are the provider's or
        // NULL.
        unsafe {
            ctx.create_cq_builder()
                .wc_flags(wc_flags)
                .wrap_raw(cq_raw, extended.then_some(cq_ex))
        }
    }

    fn context(&self) -> Arc<DeviceContext> {
        let raw = NonNull::new(self.context_raw()).expect("a field address");
        // SAFETY: raw is the provider's context, which the owner (an Arc of the allocation)
        // keeps alive with every object in it; only the data path is used on the sideway
        // objects built on it (sideway(), the benchmarks), and the provider's operations do
        // what verbs.h documents.
        unsafe { DeviceContext::from_raw_parts(raw, "null", Box::new(Arc::clone(&self.mem))) }
    }

    fn nonnull_pd(&self) -> NonNull<ibv_pd> {
        // SAFETY: self.raw() is a live provider.
        NonNull::new(unsafe { null_provider_pd(self.raw()) }).expect("a field address")
    }
}
