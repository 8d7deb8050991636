//! Completion queues (`struct ibv_cq`, `struct ibv_cq_ex`) and the completions they report.
//!
//! One type, [`CompletionQueue`], covers the classic CQ ([`CompletionQueueBuilder::build`],
//! polled with `ibv_poll_cq`) and the extended one ([`CompletionQueueBuilder::build_ex`],
//! polled with `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`, with optional fields such as
//! hardware timestamps, read through [`Poller::completion_timestamp`]): switching is one
//! line, and everything downstream (queue pairs, pollers) takes either.
//!
//! Polling never allocates. [`CompletionQueue::poll`] hands out a [`Poller`], an iterator of
//! [`WorkCompletion`] values; [`CompletionQueue::poll_into`] fills a caller's slice. A loop
//! that polls one CQ again and again claims it once ([`CompletionQueue::claim`]) and polls the
//! [`ClaimedCq`]: an extended CQ then pays its one-poller-at-a-time check once, not per poll.

use std::fmt;
use std::io;
use std::os::raw::{c_int, c_uint};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_post_ret, from_ret, non_null};
use crate::verbs::device::DeviceContext;
use crate::work_completion::{WcFlags, WorkCompletion};

/// Why a completion queue or channel could not be created, or polled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionQueueError {
    /// The create verb failed.
    #[error(
        "{call} with {cqe} entries failed on {device}: {source}{}",
        create_hint(source, call)
    )]
    Create {
        /// `ibv_create_cq` or `ibv_create_cq_ex`.
        call: &'static str,
        /// The device's name.
        device: String,
        /// The requested number of entries.
        cqe: u32,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_create_comp_channel` failed.
    #[error("ibv_create_comp_channel failed on {device}: {source}")]
    CreateChannel {
        /// The device's name.
        device: String,
        /// The errno.
        source: io::Error,
    },
    /// The poll verb failed (the CQ overran, or the device is in error).
    #[error("{call} failed on a CQ: {source}")]
    Poll {
        /// `ibv_poll_cq` or `ibv_start_poll`/`ibv_next_poll`.
        call: &'static str,
        /// The errno.
        source: io::Error,
    },
    /// Another [`Poller`] or [`ClaimedCq`] of this CQ is still alive: one poller at a time,
    /// classic or extended (see [`CompletionQueue`]'s "Threads").
    #[error("this CQ is already being polled (drop the other Poller or ClaimedCq first)")]
    Busy,
    /// The provider made an extended CQ without a function that polling it needs: one every
    /// extended CQ has (`start_poll`, `read_opcode`, ...), or the reader of a field its WC
    /// flags asked for. Checked when the CQ is created, so polling never meets a NULL one.
    #[error(
        "ibv_create_cq_ex on {device} made a CQ without cq_ex->{function}, which polling it \
         with these WC flags needs (use build(), or leave that field's flag out)"
    )]
    MissingFunction {
        /// The device's name.
        device: String,
        /// The `ibv_cq_ex` field that was NULL, e.g. `read_byte_len`.
        function: &'static str,
    },
}

fn create_hint(source: &io::Error, call: &str) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) if call == "ibv_create_cq_ex" => {
            " (this device has no extended CQ, or not with these WC flags: use build() instead)"
        }
        Some(libc::EINVAL) => " (more entries than the device's max_cqe?)",
        _ => "",
    }
}

/// A completion event channel (`struct ibv_comp_channel`): completion queues created with it
/// can wake a sleeping thread instead of being spun on. One channel may serve many CQs; its
/// descriptor plugs into poll/epoll (it is [`AsFd`](std::os::fd::AsFd)).
///
/// ```no_run
/// # fn demo() -> Result<(), sideway::Report> {
/// use std::time::Duration;
/// let ctx = sideway::open_device(None)?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq_builder().cqe(256).channel(&channel).build()?;
/// // ... create QPs on cq and post ...
/// cq.req_notify(false)?; // arm, then look once more before sleeping
/// let mut done = cq.poll()?.count();
/// while done == 0 {
///     let fired = channel.get_cq_event(Some(Duration::from_secs(5)))?; // sleeps
///     fired.req_notify(false)?;
///     for wc in fired.poll()? {
///         wc.ok()?;
///         done += 1;
///     }
/// }
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_comp_channel")]
pub struct CompletionChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
    ctx: Arc<DeviceContext>,
    /// The CQs created with this channel, so an event hands back the sideway CQ.
    pub(crate) cqs: crate::verbs::completion_event::ChannelCqs,
}

// SAFETY: a completion channel is a file descriptor wrapper; libibverbs allows its use from
// any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl DeviceContext {
    /// Creates a completion event channel (`ibv_create_comp_channel`).
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_comp_channel(
        self: &Arc<Self>,
    ) -> Result<Arc<CompletionChannel>, CompletionQueueError> {
        // SAFETY: the context is open.
        let ch = fresh(|| unsafe { ffi::ibv_create_comp_channel(self.as_raw()) });
        let raw = non_null(ch).map_err(|source| CompletionQueueError::CreateChannel {
            device: self.name().to_owned(),
            source,
        })?;
        Ok(Arc::new(CompletionChannel {
            raw,
            ctx: Arc::clone(self),
            cqs: Default::default(),
        }))
    }

    /// A builder for a completion queue on this device.
    pub fn create_cq_builder(self: &Arc<Self>) -> CompletionQueueBuilder {
        CompletionQueueBuilder {
            ctx: Arc::clone(self),
            cqe: 128,
            channel: None,
            comp_vector: 0,
            wc_flags: WcFlagsEx::default_ex(),
        }
    }
}

impl CompletionChannel {
    /// The raw channel, valid while this channel is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Arc of it, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure(
                "ibv_destroy_comp_channel",
                "a completion channel",
                &e,
            );
        }
    }
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("device", &self.ctx.name())
            .finish()
    }
}

bitflags! {
    /// Which optional fields an extended CQ reports (`ibv_create_cq_wc_flags`).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct WcFlagsEx: u64 {
        /// `IBV_WC_EX_WITH_BYTE_LEN`
        const BYTE_LEN = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN as u64;
        /// `IBV_WC_EX_WITH_IMM`: immediate data and invalidated rkeys.
        const IMM = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM as u64;
        /// `IBV_WC_EX_WITH_QP_NUM`
        const QP_NUM = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM as u64;
        /// `IBV_WC_EX_WITH_SRC_QP`
        const SRC_QP = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP as u64;
        /// `IBV_WC_EX_WITH_SLID`
        const SLID = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID as u64;
        /// `IBV_WC_EX_WITH_SL`
        const SL = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL as u64;
        /// `IBV_WC_EX_WITH_DLID_PATH_BITS`
        const DLID_PATH_BITS = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: the device clock at completion.
        const COMPLETION_TIMESTAMP = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;
        /// `IBV_WC_EX_WITH_CVLAN`
        const CVLAN = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_CVLAN as u64;
        /// `IBV_WC_EX_WITH_FLOW_TAG`
        const FLOW_TAG = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_FLOW_TAG as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`
        const COMPLETION_TIMESTAMP_WALLCLOCK = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64;
        const _ = !0;
    }
}

impl WcFlagsEx {
    /// What the builder asks for unless told otherwise: every field a classic `ibv_wc` has
    /// (`IBV_WC_STANDARD_FLAGS`), so both kinds of CQ report the same.
    pub fn default_ex() -> Self {
        WcFlagsEx::BYTE_LEN
            | WcFlagsEx::IMM
            | WcFlagsEx::QP_NUM
            | WcFlagsEx::SRC_QP
            | WcFlagsEx::SLID
            | WcFlagsEx::SL
            | WcFlagsEx::DLID_PATH_BITS
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
}

impl CompletionQueueBuilder {
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
        // SAFETY: the context and channel are alive; attr is fully initialised.
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
            ctx: Arc::clone(&self.ctx),
        });
        if let Some(channel) = &self.channel {
            channel.cqs.register(&cq);
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
/// # fn demo(cq: &std::sync::Arc<sideway::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
/// let claimed = cq.claim()?; // this thread's loop owns the polling now
/// assert!(matches!(cq.poll(), Err(sideway::CompletionQueueError::Busy)));
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
    ctx: Arc<DeviceContext>,
}

// SAFETY: verbs CQs may be used from any thread; every poll, classic or extended, is
// serialised by `polling`, so the provider never sees two polls of one CQ at once, whatever
// its locking mode (mlx5's single-threaded mode and thread domains take no CQ lock).
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
        crate::verbs::completion_event::before_destroy(
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

/// Releases the CQ's polling flag when a poll ends, however it ends.
/// `None` for a poll of a [`ClaimedCq`], which holds the flag itself.
struct PollGuard<'a>(Option<&'a AtomicBool>);

impl Drop for PollGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(polling) = self.0 {
            polling.store(false, Ordering::Release);
        }
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

/// What a poll works with: the CQ's pointers, copied out of the shared [`CompletionQueue`]
/// (where every provider call would make the compiler load them again: the CQ's atomics
/// make it mutable behind `&`) into the poll, where they stay in registers as they do in a
/// C loop.
#[derive(Clone, Copy)]
enum PollTarget<'a> {
    Classic(ClassicCq),
    Extended(ExPoll<'a>),
}

impl<'a> PollTarget<'a> {
    /// A poller, started (`ibv_start_poll`) for an extended CQ; a classic one polls into
    /// `slot` (see [`poll_one`]).
    ///
    /// # Safety
    ///
    /// For an extended CQ the caller holds the polling flag until the poller is dropped:
    /// `guard` holds it, or the caller's claim outlives the poller.
    #[inline(always)]
    unsafe fn poller(
        self,
        guard: PollGuard<'a>,
        slot: Option<&'a mut WorkCompletion>,
    ) -> Result<Poller<'a>, CompletionQueueError> {
        let (kind, ex_state) = match self {
            PollTarget::Classic(cq) => (PollKind::Classic(cq, slot), ExState::Ended),
            PollTarget::Extended(ex) => {
                // SAFETY: the caller holds the claim, and no sequence of this CQ is open: a
                // sequence lives only inside a poller or a batch poll, which hold the claim.
                let state = match unsafe { ex.start() } {
                    0 => ExState::Positioned,
                    libc::ENOENT => ExState::Ended,
                    ret => return Err(poll_error("ibv_start_poll", ret)),
                };
                (PollKind::Extended(ex), state)
            }
        };
        Ok(Poller {
            kind,
            ex_state,
            _guard: guard,
        })
    }

    /// [`CompletionQueue::poll_into`] once the CQ is claimed.
    ///
    /// # Safety
    ///
    /// For an extended CQ the caller holds the polling flag for the call.
    #[inline(always)]
    unsafe fn poll_into(self, out: &mut [WorkCompletion]) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        match self {
            PollTarget::Classic(cq) => poll_classic_into(cq, out),
            // SAFETY: the caller holds the claim.
            PollTarget::Extended(ex) => unsafe { ex.poll_into(out) },
        }
    }
}

/// The provider's `poll_cq` (`ibv_context_ops.poll_cq`).
type PollCqFn = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;

/// A classic CQ and its provider's `poll_cq`, read once when the CQ was created.
///
/// verbs.h's `ibv_poll_cq` loads `cq->context->ops.poll_cq` on every call (two dependent
/// loads), and rdma-mummy-sys's also tests it for NULL. A provider fills its context's ops
/// when the context opens and never changes them, so the pointer read at creation is the
/// one every call would load; a provider without one gets [`poll_cq_unsupported`], which
/// fails each poll as the missing verb would.
#[derive(Clone, Copy)]
struct ClassicCq {
    raw: NonNull<ffi::ibv_cq>,
    poll_cq: PollCqFn,
}

/// Reads the provider's `poll_cq` for `cq`.
///
/// # Safety
///
/// `cq` is a live CQ of an open context.
unsafe fn provider_poll_cq(cq: NonNull<ffi::ibv_cq>) -> PollCqFn {
    // SAFETY: the caller's promise: cq and its context are live.
    unsafe { (*(*cq.as_ptr()).context).ops.poll_cq }.unwrap_or(poll_cq_unsupported)
}

/// `poll_cq` of a provider that has none: every poll fails with `EOPNOTSUPP`.
unsafe extern "C" fn poll_cq_unsupported(
    _cq: *mut ffi::ibv_cq,
    _num_entries: c_int,
    _wc: *mut ffi::ibv_wc,
) -> c_int {
    -libc::EOPNOTSUPP
}

/// Classic polling straight into the caller's slice, as a C program polls into its `ibv_wc`
/// array: no scratch array, no copy. (Copying an `ibv_wc` the provider has just written field
/// by field costs more than the poll: the copy's wide loads cannot be forwarded from those
/// narrow stores.)
#[inline(always)]
fn poll_classic_into(
    cq: ClassicCq,
    out: &mut [WorkCompletion],
) -> Result<usize, CompletionQueueError> {
    if let Ok(len) = c_int::try_from(out.len()) {
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so out is an array of
        // len initialised ibv_wc, which the verb may overwrite.
        return unsafe { poll_cq(cq, out.as_mut_ptr().cast(), len) };
    }
    // More entries than one call can take: c_int::MAX at a time.
    let mut n = 0;
    for chunk in out.chunks_mut(c_int::MAX as usize) {
        // SAFETY: as above, for the chunk (its length fits a c_int).
        let got = unsafe { poll_cq(cq, chunk.as_mut_ptr().cast(), chunk.len() as c_int) }?;
        n += got;
        if got < chunk.len() {
            break;
        }
    }
    Ok(n)
}

/// `ibv_poll_cq` of up to `len` entries into `wc`: how many it wrote (never more than `len`,
/// whatever the provider says).
///
/// # Safety
///
/// `cq` is a live CQ, and `wc` points to `len` initialised `ibv_wc`, exclusively the
/// caller's.
#[inline(always)]
unsafe fn poll_cq(
    cq: ClassicCq,
    wc: *mut ffi::ibv_wc,
    len: c_int,
) -> Result<usize, CompletionQueueError> {
    // SAFETY: the CQ is live and wc has room for len entries (the caller's promise).
    let got = unsafe { (cq.poll_cq)(cq.raw.as_ptr(), len, wc) };
    if got < 0 {
        return Err(poll_error("ibv_poll_cq", got));
    }
    Ok(got.min(len) as usize)
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
/// # fn demo(cq: &std::sync::Arc<sideway::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
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

type ReadU32 = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u32;
type ReadU8 = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u8;
type ReadImm = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> ffi::__be32;

/// The provider functions that polling an extended CQ calls, copied out of its `ibv_cq_ex`
/// and checked once, when the CQ is created.
///
/// verbs.h's inlines call these pointers untested; rdma-mummy-sys's test each for NULL on
/// every call. Checked here once, a provider that leaves one out fails the creation
/// ([`CompletionQueueError::MissingFunction`]) instead of a poll, and the per-completion
/// path calls them with no test. Copying is exact because providers set these pointers when
/// they create the CQ and never change them.
struct ExFns {
    start_poll: unsafe extern "C" fn(*mut ffi::ibv_cq_ex, *mut ffi::ibv_poll_cq_attr) -> c_int,
    next_poll: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> c_int,
    end_poll: unsafe extern "C" fn(*mut ffi::ibv_cq_ex),
    read_opcode: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> ffi::ibv_wc_opcode::Type,
    read_vendor_err: ReadU32,
    read_wc_flags: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> c_uint,
    /// Which optional fields a completion reads, decided at creation.
    fields: ExFields,
    read_completion_ts: Option<unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u64>,
}

/// The optional fields of an `ibv_wc` that a completion of an extended CQ reads.
enum ExFields {
    /// Every field of a classic `ibv_wc` (the default WC flags,
    /// [`WcFlagsEx::default_ex`]): each completion calls all of them, with no test.
    Standard(StandardReaders),
    /// Another set: each completion tests each reader (present when its flag was asked).
    Asked(AskedReaders),
}

/// The readers of the fields [`WcFlagsEx::default_ex`] asks for.
struct StandardReaders {
    byte_len: ReadU32,
    imm_data: ReadImm,
    qp_num: ReadU32,
    src_qp: ReadU32,
    slid: ReadU32,
    sl: ReadU8,
    dlid_path_bits: ReadU8,
}

/// The readers of the fields the WC flags asked for; `None` for the others, whatever the
/// provider set.
struct AskedReaders {
    byte_len: Option<ReadU32>,
    imm_data: Option<ReadImm>,
    qp_num: Option<ReadU32>,
    src_qp: Option<ReadU32>,
    slid: Option<ReadU32>,
    sl: Option<ReadU8>,
    dlid_path_bits: Option<ReadU8>,
}

impl ExFns {
    /// The functions of `ex` that polling it with `flags` calls, or the name of the first
    /// one that is NULL.
    ///
    /// # Safety
    ///
    /// `ex` points to a live `ibv_cq_ex` whose function pointers are provider functions or
    /// NULL, and which no other thread is changing.
    unsafe fn of(ex: NonNull<ffi::ibv_cq_ex>, flags: WcFlagsEx) -> Result<Self, &'static str> {
        fn required<F>(f: Option<F>, name: &'static str) -> Result<F, &'static str> {
            f.ok_or(name)
        }
        /// A reader its WC flag asked for must be there; the others are never called.
        fn asked<F>(
            asked: bool,
            f: Option<F>,
            name: &'static str,
        ) -> Result<Option<F>, &'static str> {
            match asked {
                true => required(f, name).map(Some),
                false => Ok(None),
            }
        }
        // SAFETY: the caller promises a live CQ that nobody changes meanwhile.
        let cq = unsafe { ex.as_ref() };
        let has = |flag| flags.contains(flag);
        let readers = AskedReaders {
            byte_len: asked(has(WcFlagsEx::BYTE_LEN), cq.read_byte_len, "read_byte_len")?,
            imm_data: asked(has(WcFlagsEx::IMM), cq.read_imm_data, "read_imm_data")?,
            qp_num: asked(has(WcFlagsEx::QP_NUM), cq.read_qp_num, "read_qp_num")?,
            src_qp: asked(has(WcFlagsEx::SRC_QP), cq.read_src_qp, "read_src_qp")?,
            slid: asked(has(WcFlagsEx::SLID), cq.read_slid, "read_slid")?,
            sl: asked(has(WcFlagsEx::SL), cq.read_sl, "read_sl")?,
            dlid_path_bits: asked(
                has(WcFlagsEx::DLID_PATH_BITS),
                cq.read_dlid_path_bits,
                "read_dlid_path_bits",
            )?,
        };
        let fields = match readers {
            AskedReaders {
                byte_len: Some(byte_len),
                imm_data: Some(imm_data),
                qp_num: Some(qp_num),
                src_qp: Some(src_qp),
                slid: Some(slid),
                sl: Some(sl),
                dlid_path_bits: Some(dlid_path_bits),
            } => ExFields::Standard(StandardReaders {
                byte_len,
                imm_data,
                qp_num,
                src_qp,
                slid,
                sl,
                dlid_path_bits,
            }),
            readers => ExFields::Asked(readers),
        };
        Ok(ExFns {
            start_poll: required(cq.start_poll, "start_poll")?,
            next_poll: required(cq.next_poll, "next_poll")?,
            end_poll: required(cq.end_poll, "end_poll")?,
            read_opcode: required(cq.read_opcode, "read_opcode")?,
            read_vendor_err: required(cq.read_vendor_err, "read_vendor_err")?,
            read_wc_flags: required(cq.read_wc_flags, "read_wc_flags")?,
            fields,
            read_completion_ts: asked(
                has(WcFlagsEx::COMPLETION_TIMESTAMP),
                cq.read_completion_ts,
                "read_completion_ts",
            )?,
        })
    }
}

/// The extended side of a CQ: its `ibv_cq_ex` and the provider functions polling calls.
struct ExCq {
    raw: NonNull<ffi::ibv_cq_ex>,
    fns: ExFns,
}

impl ExCq {
    /// The view a poll works with.
    #[inline(always)]
    fn poll(&self) -> ExPoll<'_> {
        ExPoll {
            raw: self.raw,
            fns: &self.fns,
        }
    }
}

/// The error of a poll verb that returned `ret` (neither 0 nor, for the extended ones,
/// `ENOENT`). Out of line: the data path only tests for it.
#[cold]
#[inline(never)]
fn poll_error(call: &'static str, ret: c_int) -> CompletionQueueError {
    CompletionQueueError::Poll {
        call,
        source: from_post_ret(ret)
            .err()
            .unwrap_or_else(|| io::Error::from_raw_os_error(libc::EIO)),
    }
}

/// An extended CQ as one poll uses it (see [`PollTarget`]): its `ibv_cq_ex` and provider
/// functions.
///
/// Every method runs a step of the `ibv_start_poll`..`ibv_end_poll` sequence, which must
/// not interleave with another on the same CQ: callers hold the CQ's polling flag. `start`
/// and `next` return the verb's own result: 0 when positioned on an entry, `ENOENT` when
/// there is none, else an error number (for [`poll_error`]).
#[derive(Clone, Copy)]
struct ExPoll<'a> {
    raw: NonNull<ffi::ibv_cq_ex>,
    fns: &'a ExFns,
}

impl ExPoll<'_> {
    /// `ibv_start_poll`. On `ENOENT` or an error the sequence is over (no `ibv_end_poll`).
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, and no sequence of this CQ is open.
    #[inline(always)]
    unsafe fn start(self) -> c_int {
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: start_poll is the provider's (checked at creation), raw is live, and the
        // caller polls it exclusively; attr is valid with comp_mask 0.
        unsafe { (self.fns.start_poll)(self.raw.as_ptr(), &mut attr) }
    }

    /// `ibv_next_poll`. Whatever it returns, the sequence still needs `ibv_end_poll`.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, inside a sequence `start` opened.
    #[inline(always)]
    unsafe fn next(self) -> c_int {
        // SAFETY: next_poll is the provider's (checked at creation), called inside the
        // sequence the caller holds.
        unsafe { (self.fns.next_poll)(self.raw.as_ptr()) }
    }

    /// `ibv_end_poll`.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, inside a sequence `start` opened, and ends it
    /// once.
    #[inline(always)]
    unsafe fn end(self) {
        // SAFETY: end_poll is the provider's (checked at creation), ending the caller's
        // sequence.
        unsafe { (self.fns.end_poll)(self.raw.as_ptr()) }
    }

    /// Reads the current entry: `wr_id`, `status`, and the fields the CQ was created with
    /// (zero for the others).
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into).
    #[inline(always)]
    unsafe fn read(self) -> WorkCompletion {
        let mut wc = WorkCompletion::default();
        // SAFETY: the caller's promise.
        unsafe { self.read_into(&mut wc.raw) };
        wc
    }

    /// Writes the current entry into `wc`, each field as soon as it is read, as a C
    /// program fills its `ibv_wc`: `wr_id`, `status`, the fields the CQ was created with,
    /// and zero in the fields an extended CQ does not report (`pkey_index`) or was not
    /// asked for. (Building the value first and storing it whole made the compiler keep
    /// every reader's result on the stack across the later calls: two instructions more
    /// per field.) The immediate-data union is written when the completion's flags say it
    /// holds something (`WITH_IMM`, `WITH_INV`) and otherwise keeps what `wc` held, as
    /// `ibv_poll_cq` leaves it: [`WorkCompletion::imm_data`] and
    /// [`WorkCompletion::invalidated_rkey`] read it only under those flags.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, positioned on an entry (`start` or `next`
    /// returned 0 and the sequence has not ended).
    #[inline(always)]
    unsafe fn read_into(self, wc: &mut ffi::ibv_wc) {
        // SAFETY: the caller's promise, for each call.
        unsafe {
            match &self.fns.fields {
                ExFields::Standard(r) => self.read_standard(r, wc),
                ExFields::Asked(r) => self.read_asked(r, wc),
            }
        }
    }

    /// The fields every completion has: `wr_id`, `status`, opcode, vendor error and WC
    /// flags, which it returns.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into).
    #[inline(always)]
    unsafe fn read_head(self, wc: &mut ffi::ibv_wc) -> WcFlags {
        let cq = self.raw.as_ptr();
        let f = self.fns;
        // SAFETY: cq is live and positioned on an entry (the caller's promise), so its wr_id
        // and status are the entry's and its readers, the provider's own (checked at
        // creation), may be called.
        unsafe {
            wc.wr_id = (*cq).wr_id;
            wc.status = (*cq).status;
            wc.opcode = (f.read_opcode)(cq);
            wc.vendor_err = (f.read_vendor_err)(cq);
            wc.wc_flags = (f.read_wc_flags)(cq);
        }
        WcFlags::from_bits_retain(wc.wc_flags)
    }

    /// [`read_into`](Self::read_into) for a CQ that reports every field of a classic
    /// `ibv_wc` ([`ExFields::Standard`]): each reader is called with no test.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into), and `r` is this CQ's.
    #[inline(always)]
    unsafe fn read_standard(self, r: &StandardReaders, wc: &mut ffi::ibv_wc) {
        let cq = self.raw.as_ptr();
        // SAFETY: as in read_head; every reader of r is the provider's, checked at creation
        // (the WC flags asked for all of them).
        unsafe {
            // The immediate data first, while the flags that say whether it is there are
            // still in a register (a reader only reads the current entry: the order of the
            // reads does not matter).
            // verbs.h reads the invalidated rkey with the immediate data's reader.
            if self
                .read_head(wc)
                .intersects(WcFlags::WITH_INV | WcFlags::WITH_IMM)
            {
                wc.__bindgen_anon_1.imm_data = (r.imm_data)(cq);
            }
            wc.byte_len = (r.byte_len)(cq);
            wc.qp_num = (r.qp_num)(cq);
            wc.src_qp = (r.src_qp)(cq);
            // The classic struct's slid is 16 bits; LIDs are.
            wc.slid = (r.slid)(cq) as u16;
            wc.pkey_index = 0;
            wc.sl = (r.sl)(cq);
            wc.dlid_path_bits = (r.dlid_path_bits)(cq);
        }
    }

    /// [`read_into`](Self::read_into) for another set of WC flags ([`ExFields::Asked`]):
    /// one test per optional field, zero for those not asked for.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into), and `r` is this CQ's.
    #[inline(always)]
    unsafe fn read_asked(self, r: &AskedReaders, wc: &mut ffi::ibv_wc) {
        let cq = self.raw.as_ptr();
        // SAFETY: as in read_head; a reader of r is there only when its WC flag was asked
        // for, and is then the provider's, checked at creation.
        unsafe {
            let with = self.read_head(wc);
            wc.byte_len = r.byte_len.map_or(0, |read| read(cq));
            // verbs.h reads the invalidated rkey with the immediate data's reader.
            match r.imm_data {
                Some(read) if with.intersects(WcFlags::WITH_INV | WcFlags::WITH_IMM) => {
                    wc.__bindgen_anon_1.imm_data = read(cq);
                }
                // Flagged but not asked for: zero, as the CQ reports it.
                None => wc.__bindgen_anon_1.imm_data = 0,
                Some(_) => {}
            }
            wc.qp_num = r.qp_num.map_or(0, |read| read(cq));
            wc.src_qp = r.src_qp.map_or(0, |read| read(cq));
            wc.slid = r.slid.map_or(0, |read| read(cq) as u16);
            wc.pkey_index = 0;
            wc.sl = r.sl.map_or(0, |read| read(cq));
            wc.dlid_path_bits = r.dlid_path_bits.map_or(0, |read| read(cq));
        }
    }

    /// `ibv_wc_read_completion_ts` of the current entry, when the CQ reports it.
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read).
    #[inline]
    unsafe fn completion_ts(self) -> Option<u64> {
        let read = self.fns.read_completion_ts?;
        // SAFETY: positioned on an entry (the caller's promise); the reader is the
        // provider's, there because COMPLETION_TIMESTAMP was asked for.
        Some(unsafe { read(self.raw.as_ptr()) })
    }

    /// Reads up to `out.len()` ready entries into `out` in one sequence; how many.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, and no sequence of this CQ is open.
    #[inline(always)]
    unsafe fn poll_into(self, out: &mut [WorkCompletion]) -> Result<usize, CompletionQueueError> {
        // Which readers a completion calls is chosen once per poll, not per completion:
        // one loop for each kind.
        // SAFETY: the caller's promise; each loop reads entries with this CQ's readers.
        unsafe {
            match &self.fns.fields {
                ExFields::Standard(r) => self.poll_into_with(out, |wc| self.read_standard(r, wc)),
                ExFields::Asked(r) => self.poll_into_with(out, |wc| self.read_asked(r, wc)),
            }
        }
    }

    /// [`poll_into`](Self::poll_into), reading each entry with `read`.
    ///
    /// # Safety
    ///
    /// As for [`poll_into`](Self::poll_into); `read` may be called when the CQ is
    /// positioned on an entry, and reads it as [`read_into`](Self::read_into) does.
    #[inline(always)]
    unsafe fn poll_into_with(
        self,
        out: &mut [WorkCompletion],
        read: impl Fn(&mut ffi::ibv_wc),
    ) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        // SAFETY: the caller holds the claim with no sequence open.
        match unsafe { self.start() } {
            0 => {}
            libc::ENOENT => return Ok(0),
            ret => return Err(poll_error("ibv_start_poll", ret)),
        }
        // The entries left to fill, as an iterator: one pointer moving to a fixed end, where
        // an index would need a register (or a stack slot) of its own.
        let len = out.len();
        let mut slots = out.iter_mut();
        let ret = loop {
            // Not empty: out is not, and the loop ends when the last entry is filled.
            let Some(slot) = slots.next() else { break 0 };
            // start or next just positioned the CQ on an entry.
            read(&mut slot.raw);
            if slots.len() == 0 {
                // Every entry filled: the count is known without the iterator's.
                // SAFETY: the sequence start opened, ended once.
                unsafe { self.end() };
                return Ok(len);
            }
            // SAFETY: inside the sequence start opened.
            match unsafe { self.next() } {
                0 => {}
                ret => break ret,
            }
        };
        let n = len - slots.len();
        // SAFETY: the sequence start opened, ended once.
        unsafe { self.end() };
        match ret {
            0 | libc::ENOENT => Ok(n),
            ret => Err(poll_error("ibv_next_poll", ret)),
        }
    }
}

/// `ibv_poll_cq` of one entry: the completion, `Ok(None)` when there is none, or the verb
/// and what it returned.
///
/// The entry polled into must be initialised: providers need not write every field (a
/// send's has no source QP), and Rust must not read bytes nobody wrote. A [`ClaimedCq`]
/// lends its `slot`, zeroed once per claim (what an earlier completion left in a field the
/// provider skips is as meaningless as the stack bytes a C program leaves there, and as
/// harmless); without one, a zeroed local per poll, three stores more than C.
#[inline(always)]
fn poll_one(
    cq: ClassicCq,
    slot: Option<&mut WorkCompletion>,
) -> Result<Option<WorkCompletion>, (&'static str, c_int)> {
    let mut local;
    let wc = match slot {
        Some(slot) => slot,
        None => {
            local = WorkCompletion::default();
            &mut local
        }
    };
    // SAFETY: cq is live (the caller borrows its CompletionQueue); wc is one initialised
    // ibv_wc of ours.
    let ret = unsafe { (cq.poll_cq)(cq.raw.as_ptr(), 1, &mut wc.raw) };
    // A completion first, as C's `while (ibv_poll_cq(cq, 1, &wc) == 1)`: one test on the
    // path of every completion; empty and failed polls are told apart after it.
    if ret > 0 {
        // Never more than asked, whatever the provider says.
        Ok(Some(*wc))
    } else if ret == 0 {
        Ok(None)
    } else {
        Err(("ibv_poll_cq", ret))
    }
}

/// What a [`Poller`] polls: fixed for the poller's life, so that in a loop over a poller
/// the compiler tests a value it holds in a register, not the state the loop changes.
enum PollKind<'a> {
    /// A classic CQ: every completion is one `ibv_poll_cq`, into the claim's entry (a
    /// local one when `None`).
    Classic(ClassicCq, Option<&'a mut WorkCompletion>),
    /// An extended CQ: one `ibv_start_poll`..`ibv_end_poll` sequence.
    Extended(ExPoll<'a>),
}

/// Where an extended CQ's [`Poller`] is in its sequence.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExState {
    /// `ibv_start_poll` positioned the CQ on an entry not handed out yet.
    Positioned,
    /// Positioned on the entry handed out last; the next one needs `ibv_next_poll`.
    Current,
    /// No sequence is open: the CQ was empty, ran empty, or failed (and always, for a
    /// classic CQ).
    Ended,
}

/// An iterator over the completions ready on a CQ; from [`CompletionQueue::poll`] or
/// [`ClaimedCq::poll`].
///
/// Ends (`None`) when no completion is ready; poll again later for more. An error from the
/// device ends the iteration too: use [`Poller::next_completion`] to see it.
///
/// On an extended CQ the poller is one `ibv_start_poll`..`ibv_end_poll` sequence, positioned
/// on the completion it handed out last; [`completion_timestamp`](Self::completion_timestamp)
/// reads that completion's timestamp.
#[must_use = "a Poller does nothing unless iterated"]
pub struct Poller<'a> {
    kind: PollKind<'a>,
    ex_state: ExState,
    _guard: PollGuard<'a>,
}

impl Poller<'_> {
    /// The next ready completion, `Ok(None)` when there is none, or the poll verb's error.
    #[inline(always)]
    pub fn next_completion(&mut self) -> Result<Option<WorkCompletion>, CompletionQueueError> {
        self.advance().map_err(|(call, ret)| poll_error(call, ret))
    }

    /// The next ready completion, `Ok(None)` when there is none, or the verb that failed
    /// and what it returned. The error stays two plain values until someone asks for it:
    /// an `io::Error` on the way through makes the compiler spill the iterator's state.
    #[inline(always)]
    fn advance(&mut self) -> Result<Option<WorkCompletion>, (&'static str, c_int)> {
        let ex = match self.kind {
            PollKind::Classic(cq, ref mut slot) => return poll_one(cq, slot.as_deref_mut()),
            PollKind::Extended(ex) => ex,
        };
        match self.ex_state {
            ExState::Positioned => {
                self.ex_state = ExState::Current;
                // SAFETY: the poller holds the claim; ibv_start_poll positioned the CQ.
                Ok(Some(unsafe { ex.read() }))
            }
            // SAFETY: the poller holds the claim, inside its sequence.
            ExState::Current => match unsafe { ex.next() } {
                // SAFETY: ibv_next_poll positioned the CQ on the next entry.
                0 => Ok(Some(unsafe { ex.read() })),
                ret => {
                    self.end();
                    match ret {
                        libc::ENOENT => Ok(None),
                        ret => Err(("ibv_next_poll", ret)),
                    }
                }
            },
            ExState::Ended => Ok(None),
        }
    }

    /// The completion timestamp (`ibv_wc_read_completion_ts`: the device clock when the
    /// completion was written) of the completion [`next`](Iterator::next) or
    /// [`next_completion`](Self::next_completion) returned last, read while the poll is
    /// still positioned on it.
    ///
    /// `None` for classic CQs, for extended CQs created without
    /// [`WcFlagsEx::COMPLETION_TIMESTAMP`], and when no completion is current: before the
    /// first one, and once the poller has run out. A `for` loop holds the poller; to read
    /// timestamps, iterate with `while let Some(wc) = poller.next()`.
    #[doc(alias = "ibv_wc_read_completion_ts")]
    #[inline]
    pub fn completion_timestamp(&self) -> Option<u64> {
        match (&self.kind, self.ex_state) {
            // SAFETY: the poller holds the claim, positioned on the entry handed out last.
            (PollKind::Extended(ex), ExState::Current) => unsafe { ex.completion_ts() },
            _ => None,
        }
    }

    /// Ends the poll sequence, if one is open.
    #[inline(always)]
    fn end(&mut self) {
        if let PollKind::Extended(ex) = self.kind {
            if self.ex_state != ExState::Ended {
                // SAFETY: the sequence ibv_start_poll opened is ended once: the state
                // leaves it.
                unsafe { ex.end() };
                self.ex_state = ExState::Ended;
            }
        }
    }
}

impl Iterator for Poller<'_> {
    type Item = WorkCompletion;

    #[inline(always)]
    fn next(&mut self) -> Option<WorkCompletion> {
        self.advance().ok().flatten()
    }
}

impl Drop for Poller<'_> {
    #[inline]
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_without_poll_cq_fails_every_poll() {
        let mut wc = WorkCompletion::default();
        // SAFETY: the stub touches nothing.
        let ret = unsafe { poll_cq_unsupported(std::ptr::null_mut(), 1, &mut wc.raw) };
        assert_eq!(ret, -libc::EOPNOTSUPP);
        let err = poll_error("ibv_poll_cq", ret).to_string();
        assert!(err.contains("ibv_poll_cq"), "{err}");
    }
}
