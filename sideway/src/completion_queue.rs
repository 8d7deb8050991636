//! Completion queues (`struct ibv_cq`, `struct ibv_cq_ex`) and the completions they report.
//!
//! One type, [`CompletionQueue`], covers the classic CQ ([`CompletionQueueBuilder::build`],
//! polled with `ibv_poll_cq`) and the extended one ([`CompletionQueueBuilder::build_ex`],
//! polled with `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`, with optional fields such as
//! hardware timestamps): switching is one line, and everything downstream (queue pairs,
//! pollers) takes either.
//!
//! Polling never allocates. [`CompletionQueue::poll`] hands out a [`Poller`], an iterator of
//! [`WorkCompletion`] values; [`CompletionQueue::poll_into`] fills a caller's slice.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::device::DeviceContext;
use crate::errno::{from_ret, non_null};
use crate::macros::c_enum;

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
    /// Another [`Poller`] of this extended CQ is still alive (classic CQs may be polled
    /// from several places at once).
    #[error("this CQ is already being polled (drop the other Poller first)")]
    Busy,
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
/// can wake a sleeping thread instead of being spun on.
#[doc(alias = "ibv_comp_channel")]
pub struct CompletionChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
    ctx: Arc<DeviceContext>,
    /// The CQs created with this channel, so an event hands back the sideway CQ.
    pub(crate) cqs: crate::completion_event::ChannelCqs,
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
        let ch = unsafe { ffi::ibv_create_comp_channel(self.as_raw()) };
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
        let ret = unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if let Err(e) = from_ret(ret) {
            crate::report_drop_failure("ibv_destroy_comp_channel", "a completion channel", &e);
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

/// Builds a [`CompletionQueue`]; from [`DeviceContext::create_cq_builder`].
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
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx.as_raw(),
                cqe,
                std::ptr::null_mut(),
                self.channel_raw(),
                vector,
            )
        };
        let raw = non_null(cq).map_err(|e| self.create_err("ibv_create_cq", e))?;
        Ok(self.wrap(raw, None, WcFlagsEx::empty()))
    }

    /// Creates an extended CQ (`ibv_create_cq_ex`), polled with `ibv_start_poll` and
    /// reporting the fields in [`wc_flags`](Self::wc_flags). Devices without it fail with
    /// `EOPNOTSUPP`; [`build`](Self::build) then works everywhere.
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
        let cq_ex = unsafe { ffi::ibv_create_cq_ex(self.ctx.as_raw(), &mut attr) };
        let ex = non_null(cq_ex).map_err(|e| self.create_err("ibv_create_cq_ex", e))?;
        // SAFETY: ex is a live extended CQ; the conversion is a pointer cast inside the shim.
        let cq = unsafe { ffi::ibv_cq_ex_to_cq(ex.as_ptr()) };
        let raw = non_null(cq).map_err(|e| self.create_err("ibv_cq_ex_to_cq", e))?;
        Ok(self.wrap(raw, Some(ex), self.wc_flags))
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
    /// `ex`, when given, the same object seen as `ibv_cq_ex` (`ibv_cq_ex_to_cq(ex) == raw`)
    /// with `start_poll`, `next_poll`, `end_poll` and the `read_*` functions of its
    /// `wc_flags` set. Both stay valid until the context's owner is dropped.
    #[doc(hidden)]
    pub unsafe fn wrap_raw(
        &self,
        raw: NonNull<ffi::ibv_cq>,
        ex: Option<NonNull<ffi::ibv_cq_ex>>,
    ) -> Arc<CompletionQueue> {
        let wc_flags = if ex.is_some() {
            self.wc_flags
        } else {
            WcFlagsEx::empty()
        };
        self.wrap(raw, ex, wc_flags)
    }

    fn wrap(
        &self,
        raw: NonNull<ffi::ibv_cq>,
        ex: Option<NonNull<ffi::ibv_cq_ex>>,
        wc_flags: WcFlagsEx,
    ) -> Arc<CompletionQueue> {
        let cq = Arc::new(CompletionQueue {
            raw,
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
        cq
    }
}

/// A completion queue, classic or extended. Holds its device context and channel.
#[doc(alias = "ibv_cq")]
#[doc(alias = "ibv_cq_ex")]
pub struct CompletionQueue {
    raw: NonNull<ffi::ibv_cq>,
    ex: Option<NonNull<ffi::ibv_cq_ex>>,
    wc_flags: WcFlagsEx,
    /// Set while a [`Poller`] or a batch poll of an extended CQ is running: the extended
    /// API's start..end sequence must not interleave on one CQ.
    polling: AtomicBool,
    /// Completion events received and not yet acknowledged (`ibv_ack_cq_events`).
    pub(crate) unacked_events: std::sync::atomic::AtomicU32,
    _channel: Option<Arc<CompletionChannel>>,
    ctx: Arc<DeviceContext>,
}

// SAFETY: verbs CQs may be used from any thread; extended polling is serialised by
// `polling`, and `ibv_poll_cq` on a classic CQ is thread-safe in libibverbs.
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
        crate::completion_event::before_destroy(
            self.raw.as_ptr(),
            &self.unacked_events,
            self._channel.as_deref(),
        );
        // SAFETY: every QP using this CQ holds an Arc of it, so none is left; raw is the CQ
        // (for an extended CQ, the same object seen as ibv_cq).
        let ret = unsafe { ffi::ibv_destroy_cq(self.raw.as_ptr()) };
        if let Err(e) = from_ret(ret) {
            crate::report_drop_failure("ibv_destroy_cq", "a completion queue", &e);
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
/// `None` for a classic CQ, which needs no flag: each `ibv_poll_cq` call is complete in
/// itself, and libibverbs allows concurrent calls.
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
        self.ex.map(NonNull::as_ptr)
    }

    /// True for a CQ made by [`CompletionQueueBuilder::build_ex`].
    pub fn is_extended(&self) -> bool {
        self.ex.is_some()
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

    #[inline(always)]
    fn begin_poll(&self) -> Result<PollGuard<'_>, CompletionQueueError> {
        if self.ex.is_none() {
            // Classic polling has no start..end sequence to protect, and the atomic swap
            // would cost as much as the poll itself.
            return Ok(PollGuard(None));
        }
        if self.polling.swap(true, Ordering::Acquire) {
            return Err(CompletionQueueError::Busy);
        }
        Ok(PollGuard(Some(&self.polling)))
    }

    /// Starts polling: the [`Poller`] yields the completions that are ready, then `None`.
    /// For an extended CQ this is `ibv_start_poll` (and `ibv_end_poll` when the poller is
    /// dropped); for a classic one, `ibv_poll_cq` one completion at a time.
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_poll_cq")]
    #[inline(always)]
    pub fn poll(&self) -> Result<Poller<'_>, CompletionQueueError> {
        let guard = self.begin_poll()?;
        let mut poller = Poller {
            cq: self,
            _guard: guard,
            state: PollState::Classic,
        };
        if let Some(ex) = self.ex {
            let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
            // SAFETY: ex is a live extended CQ and the guard makes this the only poll of it.
            let ret = unsafe { ffi::ibv_start_poll(ex.as_ptr(), &mut attr) };
            poller.state = match ret {
                0 => PollState::ExPositioned,
                libc::ENOENT => PollState::ExEmpty,
                n => {
                    return Err(CompletionQueueError::Poll {
                        call: "ibv_start_poll",
                        source: io::Error::from_raw_os_error(n.saturating_abs()),
                    })
                }
            };
        }
        Ok(poller)
    }

    /// Polls up to `out.len()` ready completions into `out` and returns how many; never
    /// waits. Classic CQs use one `ibv_poll_cq` call per 32 entries; extended ones one
    /// `ibv_start_poll`..`ibv_end_poll` sequence.
    #[inline(always)]
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.ex.is_some() {
            let mut n = 0;
            let mut poller = self.poll()?;
            while n < out.len() {
                match poller.next_completion()? {
                    Some(wc) => {
                        out[n] = wc;
                        n += 1;
                    }
                    None => break,
                }
            }
            return Ok(n);
        }
        if let [only] = out {
            // One entry (a post-and-poll loop): polled straight into the caller's entry.
            // Copying an ibv_wc the provider has just written field by field costs more
            // than the poll: the copy's wide loads cannot be forwarded from those stores.
            let raw: *mut ffi::ibv_wc = &mut only.raw;
            // SAFETY: raw is a valid, exclusive ibv_wc; every bit pattern is a valid
            // ibv_wc (integers and a union of integers), so the verb may write it.
            let slot = unsafe { std::slice::from_raw_parts_mut(raw.cast(), 1) };
            let got = self.poll_classic(slot)?;
            if got == 1 {
                only.timestamp = None;
            }
            return Ok(got);
        }
        const CHUNK: usize = 32;
        // Not zeroed: ibv_poll_cq writes the entries it returns, and zeroing 32 of them
        // would cost more than the poll.
        let mut raw = [MaybeUninit::<ffi::ibv_wc>::uninit(); CHUNK];
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(CHUNK);
            let got = self.poll_classic(&mut raw[..want])?;
            for (dst, src) in out[n..n + got].iter_mut().zip(&raw[..got]) {
                // SAFETY: poll_classic returns how many leading entries the verb wrote.
                *dst = WorkCompletion::from_wc(unsafe { src.assume_init_ref() });
            }
            n += got;
            if got < want {
                break;
            }
        }
        Ok(n)
    }

    /// Polls into `raw` and returns how many of its leading entries the verb wrote.
    #[inline(always)]
    fn poll_classic(
        &self,
        raw: &mut [MaybeUninit<ffi::ibv_wc>],
    ) -> Result<usize, CompletionQueueError> {
        let len = c_int::try_from(raw.len()).unwrap_or(c_int::MAX);
        // SAFETY: the CQ is live and raw has room for len entries (ibv_poll_cq only writes).
        let got = unsafe { ffi::ibv_poll_cq(self.raw.as_ptr(), len, raw.as_mut_ptr().cast()) };
        if got < 0 {
            return Err(CompletionQueueError::Poll {
                call: "ibv_poll_cq",
                source: from_ret(got)
                    .err()
                    .unwrap_or_else(|| io::Error::from_raw_os_error(libc::EIO)),
            });
        }
        // Never more than asked, whatever the provider says.
        Ok((got as usize).min(raw.len()))
    }
}

enum PollState {
    Classic,
    /// `ibv_start_poll` returned an entry that has not been read yet.
    ExPositioned,
    /// Inside a poll whose current entry was read; the next needs `ibv_next_poll`.
    ExRead,
    /// The poll sequence ended (nothing more, or `ibv_end_poll` already called).
    ExEmpty,
    ExEnded,
}

/// An iterator over the completions ready on a CQ; from [`CompletionQueue::poll`].
///
/// Ends (`None`) when no completion is ready; poll again later for more. An error from the
/// device ends the iteration too: use [`Poller::next_completion`] to see it.
#[must_use = "a Poller does nothing unless iterated"]
pub struct Poller<'a> {
    cq: &'a CompletionQueue,
    _guard: PollGuard<'a>,
    state: PollState,
}

impl Poller<'_> {
    /// The next ready completion, `Ok(None)` when there is none, or the poll verb's error.
    #[inline(always)]
    pub fn next_completion(&mut self) -> Result<Option<WorkCompletion>, CompletionQueueError> {
        match self.state {
            PollState::Classic => {
                let mut raw = [MaybeUninit::<ffi::ibv_wc>::uninit(); 1];
                if self.cq.poll_classic(&mut raw)? == 0 {
                    return Ok(None);
                }
                // SAFETY: the verb wrote the entry it returned.
                let wc = unsafe { raw[0].assume_init_ref() };
                Ok(Some(WorkCompletion::from_wc(wc)))
            }
            PollState::ExPositioned => {
                self.state = PollState::ExRead;
                Ok(Some(self.read_current()))
            }
            PollState::ExRead => {
                let ex = self.ex_ptr();
                // SAFETY: ex is live, we are inside its poll sequence.
                match unsafe { ffi::ibv_next_poll(ex) } {
                    0 => Ok(Some(self.read_current())),
                    libc::ENOENT => {
                        self.end();
                        Ok(None)
                    }
                    n => {
                        self.end();
                        Err(CompletionQueueError::Poll {
                            call: "ibv_next_poll",
                            source: io::Error::from_raw_os_error(n.saturating_abs()),
                        })
                    }
                }
            }
            PollState::ExEmpty | PollState::ExEnded => Ok(None),
        }
    }

    #[inline]
    fn ex_ptr(&self) -> *mut ffi::ibv_cq_ex {
        // The Ex* states exist only for extended CQs.
        self.cq.ex.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    #[inline(always)]
    fn end(&mut self) {
        if matches!(self.state, PollState::ExPositioned | PollState::ExRead) {
            // SAFETY: a poll sequence started by ibv_start_poll is ended exactly once.
            unsafe { ffi::ibv_end_poll(self.ex_ptr()) };
        }
        if !matches!(self.state, PollState::Classic) {
            self.state = PollState::ExEnded;
        }
    }

    /// Reads the current entry's fields, those the CQ was created with.
    #[inline(always)]
    fn read_current(&self) -> WorkCompletion {
        let cq = self.ex_ptr();
        let flags = self.cq.wc_flags;
        // SAFETY: cq is live and positioned on an entry (start_poll/next_poll returned 0),
        // and each optional reader is called only when its WC flag was requested.
        unsafe {
            let mut wc = ffi::ibv_wc {
                wr_id: (*cq).wr_id,
                status: (*cq).status,
                opcode: ffi::ibv_wc_read_opcode(cq),
                vendor_err: ffi::ibv_wc_read_vendor_err(cq),
                wc_flags: ffi::ibv_wc_read_wc_flags(cq),
                ..Default::default()
            };
            if flags.contains(WcFlagsEx::BYTE_LEN) {
                wc.byte_len = ffi::ibv_wc_read_byte_len(cq);
            }
            if flags.contains(WcFlagsEx::IMM) {
                let flags_now = WcFlags::from_bits_retain(wc.wc_flags);
                if flags_now.contains(WcFlags::WITH_INV) {
                    wc.__bindgen_anon_1.invalidated_rkey = ffi::ibv_wc_read_invalidated_rkey(cq);
                } else if flags_now.contains(WcFlags::WITH_IMM) {
                    wc.__bindgen_anon_1.imm_data = ffi::ibv_wc_read_imm_data(cq);
                }
            }
            if flags.contains(WcFlagsEx::QP_NUM) {
                wc.qp_num = ffi::ibv_wc_read_qp_num(cq);
            }
            if flags.contains(WcFlagsEx::SRC_QP) {
                wc.src_qp = ffi::ibv_wc_read_src_qp(cq);
            }
            if flags.contains(WcFlagsEx::SLID) {
                // The classic struct's slid is 16 bits; LIDs are.
                wc.slid = ffi::ibv_wc_read_slid(cq) as u16;
            }
            if flags.contains(WcFlagsEx::SL) {
                wc.sl = ffi::ibv_wc_read_sl(cq);
            }
            if flags.contains(WcFlagsEx::DLID_PATH_BITS) {
                wc.dlid_path_bits = ffi::ibv_wc_read_dlid_path_bits(cq);
            }
            let timestamp = if flags.contains(WcFlagsEx::COMPLETION_TIMESTAMP) {
                Some(ffi::ibv_wc_read_completion_ts(cq))
            } else {
                None
            };
            WorkCompletion { raw: wc, timestamp }
        }
    }
}

impl Iterator for Poller<'_> {
    type Item = WorkCompletion;

    #[inline(always)]
    fn next(&mut self) -> Option<WorkCompletion> {
        if let PollState::Classic = self.state {
            // The common case without the Result<Option<_>> of next_completion, whose
            // copies of the completion cost more than the poll.
            let mut raw = [MaybeUninit::<ffi::ibv_wc>::uninit(); 1];
            return match self.cq.poll_classic(&mut raw) {
                // SAFETY: the verb wrote the entry it returned.
                Ok(1) => Some(WorkCompletion::from_wc(unsafe { raw[0].assume_init_ref() })),
                _ => None,
            };
        }
        self.next_completion().ok().flatten()
    }
}

impl Drop for Poller<'_> {
    #[inline]
    fn drop(&mut self) {
        self.end();
    }
}

c_enum! {
    /// How a work request ended.
    pub enum WcStatus: "ibv_wc_status" {
        /// Success.
        Success = ffi::ibv_wc_status::IBV_WC_SUCCESS,
        /// Local length error: a receive buffer too small, or a message too long.
        LocLenErr = ffi::ibv_wc_status::IBV_WC_LOC_LEN_ERR,
        /// Local QP operation error.
        LocQpOpErr = ffi::ibv_wc_status::IBV_WC_LOC_QP_OP_ERR,
        /// Local EE context operation error.
        LocEecOpErr = ffi::ibv_wc_status::IBV_WC_LOC_EEC_OP_ERR,
        /// Local protection error: an SGE outside its region, or a bad lkey.
        LocProtErr = ffi::ibv_wc_status::IBV_WC_LOC_PROT_ERR,
        /// Flushed: the QP went to the error state before this request ran.
        WrFlushErr = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind error.
        MwBindErr = ffi::ibv_wc_status::IBV_WC_MW_BIND_ERR,
        /// Bad response from the peer.
        BadRespErr = ffi::ibv_wc_status::IBV_WC_BAD_RESP_ERR,
        /// Local access error.
        LocAccessErr = ffi::ibv_wc_status::IBV_WC_LOC_ACCESS_ERR,
        /// Remote invalid request.
        RemInvReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
        /// Remote access error: a bad rkey, an address outside the remote region, or access
        /// the remote region does not grant.
        RemAccessErr = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        /// Remote operation error.
        RemOpErr = ffi::ibv_wc_status::IBV_WC_REM_OP_ERR,
        /// Transport retry counter exceeded: the peer did not answer.
        RetryExcErr = ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        /// RNR retry counter exceeded: the peer had no receive posted.
        RnrRetryExcErr = ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR,
        /// Local RDD violation.
        LocRddViolErr = ffi::ibv_wc_status::IBV_WC_LOC_RDD_VIOL_ERR,
        /// Remote invalid RD request.
        RemInvRdReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_RD_REQ_ERR,
        /// Remote aborted.
        RemAbortErr = ffi::ibv_wc_status::IBV_WC_REM_ABORT_ERR,
        /// Invalid EE context number.
        InvEecnErr = ffi::ibv_wc_status::IBV_WC_INV_EECN_ERR,
        /// Invalid EE context state.
        InvEecStateErr = ffi::ibv_wc_status::IBV_WC_INV_EEC_STATE_ERR,
        /// Fatal error.
        FatalErr = ffi::ibv_wc_status::IBV_WC_FATAL_ERR,
        /// Response timeout.
        RespTimeoutErr = ffi::ibv_wc_status::IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralErr = ffi::ibv_wc_status::IBV_WC_GENERAL_ERR,
        /// Tag matching error.
        TmErr = ffi::ibv_wc_status::IBV_WC_TM_ERR,
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = ffi::ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

impl WcStatus {
    /// What usually causes this status, for error messages; empty when nothing useful is
    /// known.
    pub fn hint(self) -> &'static str {
        match self {
            WcStatus::RetryExcErr => {
                "the peer did not acknowledge: it is gone, its QP is not in RTR/RTS, or the \
                 address (GID index, LID, QPN) it was given is wrong"
            }
            WcStatus::RnrRetryExcErr => "the peer had no receive buffer posted in time",
            WcStatus::RemAccessErr => {
                "the remote key, address or length does not match a region the peer \
                 registered with the needed access"
            }
            WcStatus::LocProtErr => "a scatter/gather entry is outside its memory region",
            WcStatus::LocLenErr => "the message is longer than the receive buffer",
            WcStatus::WrFlushErr => "the QP entered the error state; an earlier error caused it",
            _ => "",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string (the shim
        // returns one even without the library).
        let text = unsafe { ffi::ibv_wc_status_str(u32::from(*self)) };
        if text.is_null() {
            return write!(f, "status {}", u32::from(*self));
        }
        // SAFETY: non-NULL static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
        write!(f, "{text} ({})", u32::from(*self))
    }
}

c_enum! {
    /// The operation a completion reports.
    pub enum WcOpcode: "ibv_wc_opcode" {
        /// A send completed.
        Send = ffi::ibv_wc_opcode::IBV_WC_SEND,
        /// An RDMA WRITE completed.
        RdmaWrite = ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        /// An RDMA READ completed.
        RdmaRead = ffi::ibv_wc_opcode::IBV_WC_RDMA_READ,
        /// An atomic compare-and-swap completed.
        CompSwap = ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP,
        /// An atomic fetch-and-add completed.
        FetchAdd = ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD,
        /// A memory window bind completed.
        BindMw = ffi::ibv_wc_opcode::IBV_WC_BIND_MW,
        /// A local invalidate completed.
        LocalInv = ffi::ibv_wc_opcode::IBV_WC_LOCAL_INV,
        /// A TSO send completed.
        Tso = ffi::ibv_wc_opcode::IBV_WC_TSO,
        /// An atomic write completed.
        AtomicWrite = ffi::ibv_wc_opcode::IBV_WC_ATOMIC_WRITE,
        /// A receive completed.
        Recv = ffi::ibv_wc_opcode::IBV_WC_RECV,
        /// An RDMA WRITE with immediate consumed a receive.
        RecvRdmaWithImm = ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

bitflags! {
    /// Flags of one completion (`ibv_wc_flags`).
    #[doc(alias = "ibv_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = ffi::ibv_wc_flags::IBV_WC_GRH;
        /// `IBV_WC_WITH_IMM`: immediate data is valid.
        const WITH_IMM = ffi::ibv_wc_flags::IBV_WC_WITH_IMM;
        /// `IBV_WC_IP_CSUM_OK`
        const IP_CSUM_OK = ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK;
        /// `IBV_WC_WITH_INV`: an rkey was invalidated.
        const WITH_INV = ffi::ibv_wc_flags::IBV_WC_WITH_INV;
        const _ = !0;
    }
}

/// One work completion: every `ibv_wc` field, plus the completion timestamp of extended CQs
/// created with [`WcFlagsEx::COMPLETION_TIMESTAMP`]. A plain value: it borrows nothing.
#[doc(alias = "ibv_wc")]
#[derive(Clone, Copy, Default)]
pub struct WorkCompletion {
    raw: ffi::ibv_wc,
    timestamp: Option<u64>,
}

impl WorkCompletion {
    #[inline]
    fn from_wc(raw: &ffi::ibv_wc) -> Self {
        WorkCompletion {
            raw: *raw,
            timestamp: None,
        }
    }

    /// The `wr_id` of the work request.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// How it ended.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from(self.raw.status)
    }

    /// True when the status is [`WcStatus::Success`].
    #[inline]
    pub fn is_success(&self) -> bool {
        self.raw.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// `Ok(self)` on success, else an error naming the status, the work request and the
    /// likely cause. Inlined: an out-of-line call taking `&self` would force every polled
    /// completion out of registers into memory, which costs more than the poll.
    #[inline]
    pub fn ok(&self) -> Result<&Self, WorkCompletionError> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(WorkCompletionError {
                status: self.status(),
                wr_id: self.wr_id(),
                qp_num: self.raw.qp_num,
                vendor_err: self.raw.vendor_err,
            })
        }
    }

    /// The operation (valid only on success, as in C).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from(self.raw.opcode)
    }

    /// Vendor error syndrome of a failed completion.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.raw.vendor_err
    }

    /// Bytes transferred (receives, RDMA READ, atomics).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.raw.byte_len
    }

    /// The completion's flags.
    #[inline]
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.raw.wc_flags)
    }

    /// Immediate data in host order, when the sender sent some.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: both union members are plain u32s; WITH_IMM says which one is meant.
        self.wc_flags()
            .contains(WcFlags::WITH_IMM)
            .then(|| u32::from_be(unsafe { self.raw.__bindgen_anon_1.imm_data }))
    }

    /// The rkey a send-with-invalidate invalidated.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        // SAFETY: as for imm_data; WITH_INV selects this member.
        self.wc_flags()
            .contains(WcFlags::WITH_INV)
            .then_some(unsafe { self.raw.__bindgen_anon_1.invalidated_rkey })
    }

    /// The local QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }

    /// The remote QP number (UD).
    pub fn src_qp(&self) -> u32 {
        self.raw.src_qp
    }

    /// P_Key index (GSI QPs).
    pub fn pkey_index(&self) -> u16 {
        self.raw.pkey_index
    }

    /// Source LID (UD).
    pub fn slid(&self) -> u16 {
        self.raw.slid
    }

    /// Service level (UD).
    pub fn sl(&self) -> u8 {
        self.raw.sl
    }

    /// Destination LID path bits (UD).
    pub fn dlid_path_bits(&self) -> u8 {
        self.raw.dlid_path_bits
    }

    /// The device clock when the completion was written, from extended CQs created with
    /// [`WcFlagsEx::COMPLETION_TIMESTAMP`].
    pub fn completion_timestamp(&self) -> Option<u64> {
        self.timestamp
    }

    /// The C struct.
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        &self.raw
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .field("wc_flags", &self.wc_flags())
            .field("imm_data", &self.imm_data())
            .field("completion_timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

/// A completion with an error status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("work request {wr_id} on QP {qp_num:#x} failed: {status}{}{}",
    if status.hint().is_empty() { "" } else { ": " }, status.hint())]
pub struct WorkCompletionError {
    /// The status.
    pub status: WcStatus,
    /// The work request's id.
    pub wr_id: u64,
    /// The local QP number.
    pub qp_num: u32,
    /// The vendor's error syndrome.
    pub vendor_err: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_status_and_opcode_do_not_panic() {
        assert_eq!(WcStatus::from(12), WcStatus::RetryExcErr);
        assert_eq!(WcStatus::from(999), WcStatus::Unknown(999));
        assert_eq!(WcOpcode::from(128), WcOpcode::Recv);
        assert_eq!(WcOpcode::from(200), WcOpcode::Unknown(200));
    }

    #[test]
    fn failed_completion_explains_itself() {
        let mut wc = WorkCompletion::default();
        wc.raw.status = ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
        wc.raw.wr_id = 7;
        wc.raw.qp_num = 0x11;
        let err = wc.ok().unwrap_err().to_string();
        assert!(
            err.starts_with("work request 7 on QP 0x11 failed: "),
            "{err}"
        );
        assert!(
            err.contains("(12)") && err.contains("did not acknowledge"),
            "{err}"
        );
    }

    #[test]
    fn immediate_data_needs_its_flag() {
        let mut wc = WorkCompletion::default();
        wc.raw.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        assert_eq!(wc.imm_data(), None);
        wc.raw.wc_flags = WcFlags::WITH_IMM.bits();
        assert_eq!(wc.imm_data(), Some(0x1234_5678));
        assert_eq!(wc.invalidated_rkey(), None);
    }
}
