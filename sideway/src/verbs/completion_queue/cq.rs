//! The completion queue itself: its builder, the queue, and claiming it for one poller.

use std::any::Any;
use std::fmt;
use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use rdma_mummy_sys as ffi;

use super::error::CompletionQueueError;
use super::poll::{
    provider_poll_cq, ClassicCq, ExCq, ExFns, ExPoll, PollCqFn, PollGuard, PollTarget, Poller,
    WcFlagsEx,
};
use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::completion_channel::{before_destroy, CompletionChannel};
use crate::verbs::device::DeviceContext;
use crate::verbs::parent_domain::ParentDomain;
use crate::verbs::protection_domain::ProtectionDomain;
use crate::work_completion::WorkCompletion;

impl DeviceContext {
    /// A builder for a completion queue on this device.
    pub fn create_cq_builder(self: &Arc<Self>) -> CompletionQueueBuilder {
        CompletionQueueBuilder {
            ctx: Arc::clone(self),
            cqe: 128,
            channel: None,
            comp_vector: 0,
            wc_flags: WcFlagsEx::default_ex(),
            parent: None,
        }
    }
}

/// Builds a [`CompletionQueue`]; from [`DeviceContext::create_cq_builder`]. Setters are
/// named after the fields of `struct ibv_cq_init_attr_ex`.
#[doc(alias = "ibv_cq_init_attr_ex")]
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() or build_ex()"]
pub struct CompletionQueueBuilder {
    ctx: Arc<DeviceContext>,
    cqe: u32,
    channel: Option<Arc<CompletionChannel>>,
    comp_vector: u32,
    wc_flags: WcFlagsEx,
    /// The parent domain (as a PD) the CQ is made on, which the CQ holds.
    parent: Option<Arc<ProtectionDomain>>,
}

impl CompletionQueueBuilder {
    /// Makes the CQ on a parent domain (`parent_domain`, with `IBV_CQ_INIT_ATTR_MASK_PD`):
    /// its buffers come from the domain's allocator. The CQ holds the parent domain.
    /// Extended CQs only: [`build`](Self::build) fails with
    /// [`CompletionQueueError::ParentDomainNeedsEx`]. A parent domain bound to a thread
    /// domain is refused ([`CompletionQueueError::ThreadBoundPd`]): there the provider takes
    /// no CQ lock, and the polling claim covers polls but not the provider cleaning the CQ
    /// when a QP on it is reset or destroyed on another thread; a one-thread CQ type is not
    /// offered yet. QPs on a thread domain use ordinary CQs.
    pub fn parent_domain(&mut self, parent: &ParentDomain) -> &mut Self {
        self.parent = Some(Arc::clone(parent.pd_inner()));
        self
    }

    /// Least number of entries (`cqe`; default 128). The device may round up.
    pub fn cqe(&mut self, cqe: u32) -> &mut Self {
        self.cqe = cqe;
        self
    }

    /// Completion event channel that wakes on this CQ's completions (`channel`).
    pub fn channel(&mut self, channel: &Arc<CompletionChannel>) -> &mut Self {
        self.channel = Some(Arc::clone(channel));
        self
    }

    /// Completion vector (interrupt) for events (`comp_vector`; default 0).
    pub fn comp_vector(&mut self, comp_vector: u32) -> &mut Self {
        self.comp_vector = comp_vector;
        self
    }

    /// Optional fields an extended CQ reports (`wc_flags`; default: the classic ones). Used
    /// by [`build_ex`](Self::build_ex) only.
    pub fn wc_flags(&mut self, wc_flags: WcFlagsEx) -> &mut Self {
        self.wc_flags = wc_flags;
        self
    }

    fn create_err(&self, call: &'static str, source: io::Error) -> CompletionQueueError {
        CompletionQueueError::Create {
            call,
            device: self.ctx.name().to_owned(),
            cqe: self.cqe,
            source,
        }
    }

    fn channel_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.as_raw())
    }

    /// Creates a classic CQ (`ibv_create_cq`).
    #[doc(alias = "ibv_create_cq")]
    pub fn build(&self) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        if self.parent.is_some() {
            return Err(CompletionQueueError::ParentDomainNeedsEx);
        }
        let cqe = c_int::try_from(self.cqe).map_err(|_| {
            self.create_err("ibv_create_cq", io::Error::from_raw_os_error(libc::EINVAL))
        })?;
        let vector = c_int::try_from(self.comp_vector).unwrap_or(c_int::MAX);
        // SAFETY: the context and the channel (if any) are alive; a NULL cq_context is allowed.
        let cq = fresh(|| unsafe {
            ffi::ibv_create_cq(
                self.ctx.as_raw(),
                cqe,
                std::ptr::null_mut(),
                self.channel_raw(),
                vector,
            )
        });
        let raw = non_null(cq).map_err(|e| self.create_err("ibv_create_cq", e))?;
        self.wrap(raw, None, WcFlagsEx::empty())
    }

    /// Creates an extended CQ (`ibv_create_cq_ex`), polled with `ibv_start_poll` and
    /// reporting the fields in [`wc_flags`](Self::wc_flags). Devices without it fail with
    /// `EOPNOTSUPP`; [`build`](Self::build) then works everywhere. A provider that makes the
    /// CQ without a function polling it needs fails with
    /// [`CompletionQueueError::MissingFunction`] (and the CQ is destroyed).
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn build_ex(&self) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        let mut attr = ffi::ibv_cq_init_attr_ex {
            cqe: self.cqe,
            cq_context: std::ptr::null_mut(),
            channel: self.channel_raw(),
            comp_vector: self.comp_vector,
            wc_flags: self.wc_flags.bits(),
            comp_mask: 0,
            flags: 0,
            parent_domain: std::ptr::null_mut(),
        };
        if let Some(parent) = &self.parent {
            if parent.is_thread_bound() {
                return Err(CompletionQueueError::ThreadBoundPd {
                    device: self.ctx.name().to_owned(),
                });
            }
            attr.comp_mask |= ffi::ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_PD;
            attr.parent_domain = parent.as_raw();
        }
        // SAFETY: the context, channel and parent domain are alive (the CQ will hold them);
        // attr is fully initialised, and comp_mask names parent_domain exactly when it is set.
        let cq_ex = fresh(|| unsafe { ffi::ibv_create_cq_ex(self.ctx.as_raw(), &mut attr) });
        let ex = non_null(cq_ex).map_err(|e| self.create_err("ibv_create_cq_ex", e))?;
        // SAFETY: ex is a live extended CQ; the conversion is a pointer cast inside the shim.
        let cq = fresh(|| unsafe { ffi::ibv_cq_ex_to_cq(ex.as_ptr()) });
        let raw = non_null(cq).map_err(|e| self.create_err("ibv_cq_ex_to_cq", e))?;
        self.wrap(raw, Some(ex), self.wc_flags)
    }

    /// Wraps a CQ of a context made by [`DeviceContext::from_raw_parts`] (a test double's)
    /// with this builder's settings: an extended CQ when `ex` is given (reporting the
    /// builder's [`wc_flags`](Self::wc_flags)), a classic one otherwise. Dropping it calls
    /// no destroy verb.
    ///
    /// # Safety
    ///
    /// The builder's context comes from [`DeviceContext::from_raw_parts`], whose contract
    /// (data path only) applies to the returned CQ too; `raw` is a CQ of that context, and
    /// `ex`, when given, the same object seen as `ibv_cq_ex` (`ibv_cq_ex_to_cq(ex) == raw`),
    /// whose function pointers are valid provider functions or NULL. Both stay valid until
    /// the context's owner is dropped.
    ///
    /// # Errors
    ///
    /// [`CompletionQueueError::MissingFunction`] when `ex` lacks a function polling needs
    /// (as for [`build_ex`](Self::build_ex)).
    #[doc(hidden)]
    pub unsafe fn wrap_raw(
        &self,
        raw: NonNull<ffi::ibv_cq>,
        ex: Option<NonNull<ffi::ibv_cq_ex>>,
    ) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        let wc_flags = if ex.is_some() {
            self.wc_flags
        } else {
            WcFlagsEx::empty()
        };
        self.wrap(raw, ex, wc_flags)
    }

    /// Wraps a CQ this builder's context made. On error the CQ is destroyed (unless the
    /// context is a test double's, whose owner frees it).
    fn wrap(
        &self,
        raw: NonNull<ffi::ibv_cq>,
        ex: Option<NonNull<ffi::ibv_cq_ex>>,
        wc_flags: WcFlagsEx,
    ) -> Result<Arc<CompletionQueue>, CompletionQueueError> {
        let ex = match ex {
            None => None,
            // SAFETY: ex is a live extended CQ (build_ex just made it, or wrap_raw's caller
            // promises it).
            Some(ex) => match unsafe { ExFns::of(ex, wc_flags) } {
                Ok(fns) => Some(ExCq { raw: ex, fns }),
                Err(function) => {
                    if self.ctx.owns_objects() {
                        // SAFETY: raw is the CQ just created, known to nothing else.
                        let ret = fresh(|| unsafe { ffi::ibv_destroy_cq(raw.as_ptr()) });
                        if let Err(e) = from_ret(ret) {
                            crate::diagnostics::report_drop_failure(
                                "ibv_destroy_cq",
                                "an unusable CQ",
                                &e,
                            );
                        }
                    }
                    return Err(CompletionQueueError::MissingFunction {
                        device: self.ctx.name().to_owned(),
                        function,
                    });
                }
            },
        };
        // SAFETY: raw is a live CQ whose context is open.
        let poll_cq = unsafe { provider_poll_cq(raw) };
        let cq = Arc::new(CompletionQueue {
            raw,
            poll_cq,
            ex,
            wc_flags,
            polling: AtomicBool::new(false),
            unacked_events: Default::default(),
            _channel: self.channel.clone(),
            _parent: self.parent.clone(),
            ctx: Arc::clone(&self.ctx),
        });
        if let Some(channel) = &self.channel {
            let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&cq) as Weak<CompletionQueue>;
            channel.cqs.register(cq.as_raw(), weak);
        }
        Ok(cq)
    }
}

/// A completion queue, classic or extended. Holds its device context and channel.
///
/// # Threads
///
/// A `CompletionQueue` is `Send` and `Sync`: share it between threads in an `Arc` (queue
/// pairs hold one). One poll runs at a time: [`poll`](Self::poll) and
/// [`poll_into`](Self::poll_into) claim the CQ for their duration and fail with
/// [`CompletionQueueError::Busy`] while another thread's poll or [`ClaimedCq`] holds it.
/// That holds for classic CQs too, although libibverbs calls `ibv_poll_cq` thread-safe: it
/// is only while the provider locks the CQ, and mlx5's single-threaded mode and thread
/// domains do not. To poll one CQ from several threads, give it to one polling thread
/// that hands completions on, or retry on `Busy`; the usual design is one CQ per thread.
///
/// ```
/// # fn demo(cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
/// let claimed = cq.claim()?; // this thread's loop owns the polling now
/// assert!(matches!(cq.poll(), Err(sideway::completion_queue::CompletionQueueError::Busy)));
/// drop(claimed);
/// # Ok(())
/// # }
/// # let _ = demo;
/// ```
#[doc(alias = "ibv_cq")]
#[doc(alias = "ibv_cq_ex")]
#[doc(alias = "ibv_destroy_cq")]
pub struct CompletionQueue {
    raw: NonNull<ffi::ibv_cq>,
    /// The provider's `poll_cq`, read once at creation (see [`ClassicCq`]).
    poll_cq: PollCqFn,
    ex: Option<ExCq>,
    wc_flags: WcFlagsEx,
    /// Set while a [`Poller`], a [`ClaimedCq`] or a batch poll of an extended CQ holds the
    /// CQ: the extended API's start..end sequence must not interleave on one CQ.
    polling: AtomicBool,
    /// Completion events received and not yet acknowledged (`ibv_ack_cq_events`).
    pub(crate) unacked_events: std::sync::atomic::AtomicU32,
    _channel: Option<Arc<CompletionChannel>>,
    /// The parent domain the CQ was made on: its allocator serves the CQ's buffers until
    /// the CQ is destroyed, so it is dropped after (a field).
    _parent: Option<Arc<ProtectionDomain>>,
    ctx: Arc<DeviceContext>,
}

// SAFETY: verbs CQs may be used from any thread; every poll, classic or extended, is
// serialised by `polling`, so the provider never sees two polls of one CQ at once, whatever
// its locking mode (mlx5's single-threaded mode takes no CQ lock; CQs on a thread domain,
// which would not either, are refused by the builder).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if !self.ctx.owns_objects() {
            // A test double's CQ (wrap_raw): its owner frees it.
            return;
        }
        // ibv_destroy_cq waits until every event it delivered is acknowledged.
        before_destroy(
            self.raw.as_ptr(),
            &self.unacked_events,
            self._channel.as_deref(),
        );
        // SAFETY: every QP using this CQ holds an Arc of it, so none is left; raw is the CQ
        // (for an extended CQ, the same object seen as ibv_cq).
        let ret = fresh(|| unsafe { ffi::ibv_destroy_cq(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_destroy_cq", "a completion queue", &e);
        }
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .field("extended", &self.ex.is_some())
            .field("cqe", &self.cqe())
            .finish()
    }
}

impl CompletionQueue {
    /// The raw `ibv_cq` (also for extended CQs), valid while this CQ is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.raw.as_ptr()
    }

    /// The raw `ibv_cq_ex` of an extended CQ, `None` for a classic one.
    pub fn as_raw_ex(&self) -> Option<*mut ffi::ibv_cq_ex> {
        self.ex.as_ref().map(|ex| ex.raw.as_ptr())
    }

    /// True for a CQ made by [`CompletionQueueBuilder::build_ex`].
    pub fn is_extended(&self) -> bool {
        self.ex.is_some()
    }

    /// The optional fields an extended CQ reports (its builder's
    /// [`wc_flags`](CompletionQueueBuilder::wc_flags)); empty for a classic CQ.
    pub fn wc_flags(&self) -> WcFlagsEx {
        self.wc_flags
    }

    /// The number of entries the device gave the CQ (at least the number asked for).
    pub fn cqe(&self) -> u32 {
        // SAFETY: raw is a live CQ; reading a plain field.
        u32::try_from(unsafe { (*self.raw.as_ptr()).cqe }).unwrap_or(0)
    }

    /// The device context.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// Takes the polling flag: one atomic swap, `Busy` when another poller holds it.
    ///
    /// Classic CQs take it too. libibverbs documents `ibv_poll_cq` as thread-safe, but that
    /// holds only while the provider locks the CQ: mlx5 in single-threaded mode
    /// (`MLX5_SINGLE_THREADED`) and CQs of a thread domain take no lock, and two concurrent
    /// polls there corrupt the CQ. `CompletionQueue` is `Sync`, so it must be sound whatever
    /// the provider does; a hot loop [`claim`](Self::claim)s once and pays nothing per poll.
    #[inline(always)]
    fn take_flag(&self) -> Result<(), CompletionQueueError> {
        if self.polling.swap(true, Ordering::Acquire) {
            return Err(CompletionQueueError::Busy);
        }
        Ok(())
    }

    #[inline(always)]
    fn begin_poll(&self) -> Result<PollGuard<'_>, CompletionQueueError> {
        self.take_flag()?;
        Ok(PollGuard(Some(&self.polling)))
    }

    /// Starts polling: the [`Poller`] yields the completions that are ready, then `None`.
    /// For an extended CQ this is `ibv_start_poll` (and `ibv_end_poll` when the poller is
    /// dropped); for a classic one, `ibv_poll_cq` one completion at a time.
    ///
    /// The CQ is claimed for the poller's life (an atomic swap and a store per call;
    /// [`CompletionQueueError::Busy`] while another poller holds it): a loop that polls the
    /// same CQ again and again should [`claim`](Self::claim) it once instead.
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_poll_cq")]
    #[inline(always)]
    pub fn poll(&self) -> Result<Poller<'_>, CompletionQueueError> {
        let guard = self.begin_poll()?;
        // SAFETY: the guard holds the claim until the poller, which owns it, is dropped.
        unsafe { self.target().poller(guard, None) }
    }

    /// Polls up to `out.len()` ready completions into `out` and returns how many; never
    /// waits. Classic CQs hand `out` to `ibv_poll_cq` itself (one call, unless `out` holds
    /// more than `c_int::MAX` entries); extended ones read it in one
    /// `ibv_start_poll`..`ibv_end_poll` sequence, claiming the CQ for the call as
    /// [`poll`](Self::poll) does.
    #[doc(alias = "ibv_poll_cq")]
    #[inline(always)]
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        let _guard = self.begin_poll()?;
        // SAFETY: the guard holds the claim until the end of this call.
        unsafe { self.target().poll_into(out) }
    }

    /// Claims the CQ for polling until the returned [`ClaimedCq`] is dropped, so that its
    /// polls need no claim of their own; see [`ClaimedCq`] for when that matters.
    ///
    /// # Errors
    ///
    /// [`CompletionQueueError::Busy`] when another [`Poller`] or [`ClaimedCq`] of this CQ
    /// is alive.
    #[inline]
    pub fn claim(self: &Arc<Self>) -> Result<ClaimedCq, CompletionQueueError> {
        self.take_flag()?;
        Ok(ClaimedCq {
            classic: self.classic(),
            ex: self.ex.as_ref().map(|ex| (ex.raw, NonNull::from(&ex.fns))),
            slot: WorkCompletion::default(),
            cq: Arc::clone(self),
        })
    }

    /// The CQ as a classic poll uses it.
    #[inline(always)]
    fn classic(&self) -> ClassicCq {
        ClassicCq {
            raw: self.raw,
            poll_cq: self.poll_cq,
        }
    }

    /// What a poll of this CQ works with.
    #[inline(always)]
    fn target(&self) -> PollTarget<'_> {
        match &self.ex {
            None => PollTarget::Classic(self.classic()),
            Some(ex) => PollTarget::Extended(ex.poll()),
        }
    }
}

/// A completion queue claimed for polling by one owner; from [`CompletionQueue::claim`].
///
/// [`CompletionQueue::poll`] and [`CompletionQueue::poll_into`] claim an extended CQ for the
/// length of one call, because two `ibv_start_poll`..`ibv_end_poll` sequences must not
/// interleave on one CQ and a CQ is shared (`Arc`): an atomic swap and a store per call,
/// about what a poll that finds one completion costs. A loop that polls one CQ again and
/// again claims it once and polls through the `ClaimedCq`: its [`poll`](Self::poll) and
/// [`poll_into`](Self::poll_into) take `&mut self`, so the borrow checker keeps their
/// sequences apart and they touch no flag. The price: while it lives, every other poll of
/// the CQ fails with [`CompletionQueueError::Busy`] (dropping it releases the CQ).
///
/// Classic CQs are claimed the same way: `ibv_poll_cq` is thread-safe only where the
/// provider locks the CQ, and a `CompletionQueue` must be sound whatever the provider does
/// (see [`CompletionQueue`]'s "Threads").
///
/// It holds an `Arc` of the CQ, as every sideway object holds what it uses, so it can live
/// in a struct beside the queue pair with no lifetime to name.
///
/// ```no_run
/// # fn demo(cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
/// let mut cq = cq.claim()?; // once, before the loop
/// let mut done = 0;
/// while done < 1000 {
///     for wc in cq.poll()? {
///         wc.ok()?;
///         done += 1;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "the CQ stays claimed until this is dropped"]
pub struct ClaimedCq {
    /// `cq`'s pointers, copied here so that a loop keeps them in registers: the CQ and its
    /// `poll_cq`, and an extended CQ's `ibv_cq_ex` and provider functions. Valid while `cq`
    /// is.
    classic: ClassicCq,
    ex: Option<(NonNull<ffi::ibv_cq_ex>, NonNull<ExFns>)>,
    /// The entry a classic CQ's pollers poll into (see [`poll_one`]), zeroed once per claim.
    slot: WorkCompletion,
    cq: Arc<CompletionQueue>,
}

// SAFETY: the pointers point into the CQ that the Arc keeps alive, which is Send and Sync;
// polling needs `&mut self`, so a shared ClaimedCq polls nothing.
unsafe impl Send for ClaimedCq {}
// SAFETY: as above.
unsafe impl Sync for ClaimedCq {}

impl ClaimedCq {
    /// As [`CompletionQueue::poll`], without claiming the CQ again.
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_poll_cq")]
    #[inline(always)]
    pub fn poll(&mut self) -> Result<Poller<'_>, CompletionQueueError> {
        let (target, slot) = self.parts();
        // SAFETY: this claim holds the flag, and the poller borrows it mutably, so it
        // outlives the poller and no other poll of this claim runs meanwhile.
        unsafe { target.poller(PollGuard(None), Some(slot)) }
    }

    /// As [`CompletionQueue::poll_into`], without claiming the CQ again.
    #[doc(alias = "ibv_poll_cq")]
    #[inline(always)]
    pub fn poll_into(&mut self, out: &mut [WorkCompletion]) -> Result<usize, CompletionQueueError> {
        // SAFETY: this claim holds the flag for the call (borrowed mutably).
        unsafe { self.parts().0.poll_into(out) }
    }

    /// What a poll through this claim works with, and the claim's slot.
    #[inline(always)]
    fn parts(&mut self) -> (PollTarget<'_>, &mut WorkCompletion) {
        let target = match self.ex {
            None => PollTarget::Classic(self.classic),
            Some((raw, fns)) => PollTarget::Extended(ExPoll {
                raw,
                // SAFETY: fns points to the ExFns of self.cq, which lives as long as self
                // (the lifetime the returned target borrows) and never changes them.
                fns: unsafe { fns.as_ref() },
            }),
        };
        (target, &mut self.slot)
    }

    /// The claimed CQ.
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }
}

impl Drop for ClaimedCq {
    #[inline]
    fn drop(&mut self) {
        self.cq.polling.store(false, Ordering::Release);
    }
}

impl fmt::Debug for ClaimedCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimedCq").field("cq", &self.cq).finish()
    }
}
