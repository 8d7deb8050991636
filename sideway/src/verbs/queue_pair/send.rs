//! Posting work requests: the send and receive guards, and the storage they build batches in.
//!
//! A classic QP's batch is a chain of `ibv_send_wr` (or `ibv_recv_wr`) with their
//! scatter/gather arrays, written into arrays the QP allocated when it was created (sized by
//! `max_send_wr` × `max_send_sge`), so posting allocates nothing. An extended QP's batch is
//! built by the provider itself between `ibv_wr_start` and `ibv_wr_complete`.
//!
//! Memory safety: an [`Sge`] is built bounds-checked from a registered region (or through an
//! `unsafe` constructor), and only the device dereferences it, after checking its lkey and
//! bounds; a stale or foreign SGE completes with a protection error rather than touching
//! memory. Inline data is different: the CPU copies it while posting, so it is borrowed for
//! the guard's lifetime, and the `INLINE` flag is set from the kind of data, never trusted
//! from the caller's flags (inline from an SGE would let the CPU read memory no one keeps
//! alive).

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use super::{QpType, QueuePair, SendOpsFlags};
use crate::errno::from_post_ret;
use crate::verbs::address_handle::AddressHandle;
use crate::verbs::memory_region::Sge;

bitflags! {
    /// Properties of one send work request (`ibv_send_flags`).
    #[doc(alias = "ibv_send_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier RDMA READs and atomics to finish first.
        const FENCE = ffi::ibv_send_flags::IBV_SEND_FENCE;
        /// `IBV_SEND_SIGNALED`: generate a completion (unless the QP signals all anyway).
        const SIGNALED = ffi::ibv_send_flags::IBV_SEND_SIGNALED;
        /// `IBV_SEND_SOLICITED`: raise a solicited event at the receiver.
        const SOLICITED = ffi::ibv_send_flags::IBV_SEND_SOLICITED;
        /// `IBV_SEND_INLINE`: the data is copied into the request. Set automatically for
        /// [`SendData::Inline`] and [`SendData::InlineList`] (also as the legacy bit in
        /// `qp_ex->wr_flags`, which rdma-core's generic `ibv_wr_*` code reads) and cleared
        /// for every other kind of data.
        const INLINE = ffi::ibv_send_flags::IBV_SEND_INLINE;
        /// `IBV_SEND_IP_CSUM`: offload the IP checksum (raw packet and UD QPs).
        const IP_CSUM = ffi::ibv_send_flags::IBV_SEND_IP_CSUM;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

/// The local data of a send work request.
#[derive(Debug, Clone, Copy, Default)]
pub enum SendData<'a> {
    /// No data (a zero-length message).
    #[default]
    Empty,
    /// One scatter/gather entry.
    Sge(Sge),
    /// A gather list: the entries' bytes are sent back to back.
    ///
    /// On extended QPs of rxe (SoftRoCE) with rdma-core 56 or older, the provider's
    /// `ibv_wr_set_sge_list` takes the message length to be the number of entries times the
    /// first entry's length (fixed upstream by rdma-core pull request 1744): there, use
    /// entries of equal length, or a classic QP.
    SgeList(&'a [Sge]),
    /// Bytes copied into the request while posting (at most `max_inline_data`).
    Inline(&'a [u8]),
    /// Several buffers copied back to back into the request.
    InlineList(&'a [&'a [u8]]),
    /// Bytes of a registered buffer copied into the request while posting, from
    /// [`RegisteredBuffer::inline`](crate::RegisteredBuffer::inline): inline data straight
    /// from memory the device may write, where no `&[u8]` may be formed.
    InlineBuffer(BufferBytes<'a>),
}

/// A stretch of a [`RegisteredBuffer`](crate::RegisteredBuffer), borrowed for `'a`, that the
/// CPU copies as inline data while posting; from
/// [`RegisteredBuffer::inline`](crate::RegisteredBuffer::inline). It holds a pointer rather
/// than a slice: the device may write the buffer, so no reference to its bytes is formed.
#[derive(Clone, Copy)]
pub struct BufferBytes<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _buffer: PhantomData<&'a [u8]>,
}

// SAFETY: it stands for a shared borrow of a RegisteredBuffer, which is Sync; the bytes are
// only read (copied by the provider while posting).
unsafe impl Send for BufferBytes<'_> {}
// SAFETY: as above.
unsafe impl Sync for BufferBytes<'_> {}

impl BufferBytes<'_> {
    /// `len` bytes at `ptr`, inside a buffer borrowed for the returned lifetime.
    pub(crate) fn new(ptr: NonNull<u8>, len: usize) -> Self {
        BufferBytes {
            ptr,
            len,
            _buffer: PhantomData,
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for BufferBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBytes")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl From<Sge> for SendData<'_> {
    #[inline]
    fn from(sge: Sge) -> Self {
        SendData::Sge(sge)
    }
}

impl<'a> From<&'a [Sge]> for SendData<'a> {
    fn from(list: &'a [Sge]) -> Self {
        SendData::SgeList(list)
    }
}

impl<'a, const N: usize> From<&'a [Sge; N]> for SendData<'a> {
    fn from(list: &'a [Sge; N]) -> Self {
        SendData::SgeList(list)
    }
}

impl<'a> From<&'a [u8]> for SendData<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        SendData::Inline(bytes)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for SendData<'a> {
    fn from(bytes: &'a [u8; N]) -> Self {
        SendData::Inline(bytes)
    }
}

impl<'a> From<&'a [&'a [u8]]> for SendData<'a> {
    fn from(list: &'a [&'a [u8]]) -> Self {
        SendData::InlineList(list)
    }
}

impl SendData<'_> {
    #[inline]
    fn is_inline(&self) -> bool {
        matches!(
            self,
            SendData::Inline(_) | SendData::InlineList(_) | SendData::InlineBuffer(_)
        )
    }

    /// Scatter/gather entries (or inline buffers) it takes.
    #[inline]
    fn entries(&self) -> usize {
        match self {
            SendData::Empty => 0,
            SendData::Sge(_) | SendData::Inline(_) | SendData::InlineBuffer(_) => 1,
            SendData::SgeList(l) => l.len(),
            SendData::InlineList(l) => l.len(),
        }
    }

    #[inline]
    fn inline_len(&self) -> usize {
        match self {
            SendData::Inline(b) => b.len(),
            SendData::InlineList(l) => l.iter().map(|b| b.len()).sum(),
            SendData::InlineBuffer(b) => b.len,
            _ => 0,
        }
    }
}

/// Why a work request was refused before reaching the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidWorkRequest {
    /// A classic QP's batch holds at most its `max_send_wr` (or `max_recv_wr`) requests.
    #[error("the batch is full: it holds {capacity} work requests (the QP's max_{queue}_wr)")]
    BatchFull {
        /// The batch capacity.
        capacity: usize,
        /// `send` or `recv`.
        queue: &'static str,
    },
    /// More scatter/gather entries (or inline buffers) than the QP allows per request.
    #[error("{given} scatter/gather entries, more than the QP's max_{queue}_sge of {max}")]
    TooManySge {
        /// Entries given.
        given: usize,
        /// The QP's limit.
        max: usize,
        /// `send` or `recv`.
        queue: &'static str,
    },
    /// More inline bytes than the QP's `max_inline_data`.
    #[error("{len} bytes of inline data, more than the QP's max_inline_data of {max} (set it on the builder)")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// The QP's limit.
        max: u32,
    },
    /// The operation carries no inline data (RDMA READ, atomics).
    #[error("{op} cannot take inline data")]
    InlineNotAllowed {
        /// The operation.
        op: &'static str,
    },
    /// An extended QP was not created for this operation (see `send_ops_flags`), or its
    /// provider does not implement it.
    #[error("{op} is not enabled on this extended QP (send_ops_flags) or not implemented by its provider")]
    NotEnabled {
        /// The operation.
        op: &'static str,
    },
    /// The QP's transport has no such operation (UC: SEND and RDMA WRITE only; UD: SEND
    /// only).
    #[error("{op} is not available on a {qp_type} QP ({allowed})")]
    NotForQpType {
        /// The operation.
        op: &'static str,
        /// The QP's type.
        qp_type: QpType,
        /// What the type allows.
        allowed: &'static str,
    },
    /// A send on a UD QP needs a destination: call `ud_addr` on the work request.
    #[error("a send on a UD QP needs ud_addr(address handle, remote QPN, remote Q_Key)")]
    MissingUdAddress,
    /// `ud_addr` was given on a QP that is not UD.
    #[error("ud_addr is for UD QPs; this one is {qp_type}")]
    UdAddressOnConnectedQp {
        /// The QP's type.
        qp_type: QpType,
    },
}

/// Why a batch of work requests was not posted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The posting verb failed.
    #[error("{call} failed on QP {qp_num:#x} {}: {source}", which_failed(*index, *wr_id, *count))]
    Post {
        /// `ibv_post_send`, `ibv_wr_complete` or `ibv_post_recv`.
        call: &'static str,
        /// The QP number.
        qp_num: u32,
        /// Requests in the batch.
        count: usize,
        /// The index in the batch of the first request not posted (`bad_wr`), when the verb
        /// says; those before it were posted. `None` for `ibv_wr_complete`, which posts all
        /// or nothing.
        index: Option<usize>,
        /// That request's `wr_id`.
        wr_id: Option<u64>,
        /// The errno.
        source: io::Error,
    },
    /// A request was refused while the batch was built; nothing was posted.
    #[error("work request {index} (wr_id {wr_id}) of a batch on QP {qp_num:#x} is invalid, nothing was posted: {reason}")]
    Invalid {
        /// The QP number.
        qp_num: u32,
        /// The request's index in the batch.
        index: usize,
        /// Its `wr_id`.
        wr_id: u64,
        /// What is wrong with it.
        reason: InvalidWorkRequest,
    },
}

fn which_failed(index: Option<usize>, wr_id: Option<u64>, count: usize) -> String {
    match (index, wr_id) {
        (Some(i), Some(id)) => {
            format!("at work request {i} (wr_id {id}) of {count}; the {i} before it were posted")
        }
        (Some(i), None) => format!("at work request {i} of {count}"),
        _ => format!("for a batch of {count} work requests (none was posted)"),
    }
}

/// A batch's operation and its remote operands.
#[derive(Clone, Copy)]
enum Op {
    Send,
    SendImm(u32),
    Write {
        rkey: u32,
        addr: u64,
    },
    WriteImm {
        rkey: u32,
        addr: u64,
        imm: u32,
    },
    Read {
        rkey: u32,
        addr: u64,
    },
    CmpSwp {
        rkey: u32,
        addr: u64,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        rkey: u32,
        addr: u64,
        add: u64,
    },
    SendInv(u32),
    LocalInv(u32),
    BindMw {
        mw: *mut ffi::ibv_mw,
        rkey: u32,
        info: ffi::ibv_mw_bind_info,
    },
}

/// The destination of a UD send: an address handle borrowed until posting, the remote QP
/// number and Q_Key.
#[derive(Clone, Copy)]
struct UdAddr {
    ah: *mut ffi::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Send => "SEND",
            Op::SendImm(_) => "SEND with immediate",
            Op::Write { .. } => "RDMA WRITE",
            Op::WriteImm { .. } => "RDMA WRITE with immediate",
            Op::Read { .. } => "RDMA READ",
            Op::CmpSwp { .. } => "atomic compare-and-swap",
            Op::FetchAdd { .. } => "atomic fetch-and-add",
            Op::SendInv(_) => "SEND with invalidate",
            Op::LocalInv(_) => "local invalidate",
            Op::BindMw { .. } => "memory window bind",
        }
    }

    #[inline]
    fn allows_inline(self) -> bool {
        matches!(
            self,
            Op::Send | Op::SendImm(_) | Op::Write { .. } | Op::WriteImm { .. }
        )
    }

    #[inline]
    fn send_ops_flag(self) -> SendOpsFlags {
        match self {
            Op::Send => SendOpsFlags::SEND,
            Op::SendImm(_) => SendOpsFlags::SEND_WITH_IMM,
            Op::Write { .. } => SendOpsFlags::RDMA_WRITE,
            Op::WriteImm { .. } => SendOpsFlags::RDMA_WRITE_WITH_IMM,
            Op::Read { .. } => SendOpsFlags::RDMA_READ,
            Op::CmpSwp { .. } => SendOpsFlags::ATOMIC_CMP_AND_SWP,
            Op::FetchAdd { .. } => SendOpsFlags::ATOMIC_FETCH_AND_ADD,
            Op::SendInv(_) => SendOpsFlags::SEND_WITH_INV,
            Op::LocalInv(_) => SendOpsFlags::LOCAL_INV,
            Op::BindMw { .. } => SendOpsFlags::BIND_MW,
        }
    }

    #[inline]
    fn opcode(self) -> ffi::ibv_wr_opcode::Type {
        use ffi::ibv_wr_opcode as o;
        match self {
            Op::Send => o::IBV_WR_SEND,
            Op::SendImm(_) => o::IBV_WR_SEND_WITH_IMM,
            Op::Write { .. } => o::IBV_WR_RDMA_WRITE,
            Op::WriteImm { .. } => o::IBV_WR_RDMA_WRITE_WITH_IMM,
            Op::Read { .. } => o::IBV_WR_RDMA_READ,
            Op::CmpSwp { .. } => o::IBV_WR_ATOMIC_CMP_AND_SWP,
            Op::FetchAdd { .. } => o::IBV_WR_ATOMIC_FETCH_AND_ADD,
            Op::SendInv(_) => o::IBV_WR_SEND_WITH_INV,
            Op::LocalInv(_) => o::IBV_WR_LOCAL_INV,
            Op::BindMw { .. } => o::IBV_WR_BIND_MW,
        }
    }

    /// What a QP of `qp_type` allows, or `None` when it allows `self`.
    #[inline]
    fn refused_by(self, qp_type: QpType) -> Option<&'static str> {
        match qp_type {
            QpType::Ud => (!matches!(self, Op::Send | Op::SendImm(_)))
                .then_some("SEND and SEND with immediate only"),
            QpType::Uc => (!matches!(
                self,
                Op::Send
                    | Op::SendImm(_)
                    | Op::Write { .. }
                    | Op::WriteImm { .. }
                    | Op::LocalInv(_)
                    | Op::BindMw { .. }
            ))
            .then_some("SEND and RDMA WRITE, with or without immediate, only"),
            _ => None,
        }
    }
}

/// Where a classic QP's send batches are built; allocated once, with the QP.
/// A QP's provider `post_send` and `post_recv` (`ibv_context_ops`), read once when the QP
/// is wrapped.
///
/// verbs.h's `ibv_post_send` and `ibv_post_recv` load `qp->context->ops.post_*` on every
/// call (two dependent loads), and rdma-mummy-sys's also test the pointer for NULL. A
/// provider fills its context's ops when the context opens and never changes them, so the
/// pointers read here are the ones every call would load; a provider without one gets a
/// function that refuses every post with `EOPNOTSUPP`, as the missing verb would.
#[derive(Clone, Copy)]
pub(super) struct ProviderPosts {
    pub(super) post_send: unsafe extern "C" fn(
        *mut ffi::ibv_qp,
        *mut ffi::ibv_send_wr,
        *mut *mut ffi::ibv_send_wr,
    ) -> c_int,
    pub(super) post_recv: unsafe extern "C" fn(
        *mut ffi::ibv_qp,
        *mut ffi::ibv_recv_wr,
        *mut *mut ffi::ibv_recv_wr,
    ) -> c_int,
}

impl ProviderPosts {
    /// Reads `qp`'s provider functions.
    ///
    /// # Safety
    ///
    /// `qp` is a live QP of an open context.
    pub(super) unsafe fn of(qp: NonNull<ffi::ibv_qp>) -> Self {
        // SAFETY: the caller's promise: qp and its context are live.
        let ops = unsafe { &(*(*qp.as_ptr()).context).ops };
        ProviderPosts {
            post_send: ops.post_send.unwrap_or(post_unsupported),
            post_recv: ops.post_recv.unwrap_or(post_unsupported),
        }
    }
}

/// `post_send` or `post_recv` (`W` is the request type) of a provider that has none:
/// refuses the whole chain.
unsafe extern "C" fn post_unsupported<W>(
    _qp: *mut ffi::ibv_qp,
    wr: *mut W,
    bad: *mut *mut W,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: bad is the caller's valid out-pointer.
        unsafe { *bad = wr };
    }
    libc::EOPNOTSUPP
}

pub(super) struct SendStorage {
    wrs: Box<[ffi::ibv_send_wr]>,
    /// `max_sge` entries per request, request `i` at `i * max_sge`.
    sges: Box<[ffi::ibv_sge]>,
    /// An extended QP's inline-list scratch (`max_inline_data` bytes): a list is gathered
    /// here and set with one `ibv_wr_set_inline_data`, because rxe's
    /// `ibv_wr_set_inline_data_list` (rdma-core 56 and older) reports a length of 0.
    /// Providers copy inline data when it is set, so one scratch serves the whole batch.
    inline: Box<[u8]>,
    max_sge: usize,
    /// The requests one batch may hold: `wrs.len()` on a classic QP, and `capacity *
    /// max_sge <= sges.len()`, so a request's slot and entries are in bounds whenever its
    /// index is below it. Unlimited on an extended QP (the provider holds the batch).
    capacity: usize,
    /// What an extended QP can post, and the provider functions it posts with (on a
    /// classic QP: nothing, and functions that are never called).
    ex: ExOps,
}

#[inline]
fn zeroed_send_wr() -> ffi::ibv_send_wr {
    // SAFETY: ibv_send_wr is a C struct of integers, raw pointers and unions of those, for
    // all of which the all-zero bit pattern is valid (NULL pointers, zero values).
    unsafe { MaybeUninit::<ffi::ibv_send_wr>::zeroed().assume_init() }
}

impl SendStorage {
    /// Storage for a classic QP's batches, or for an extended QP's (`ex` given).
    pub(super) fn new(max_wr: u32, max_sge: u32, max_inline: u32, ex: Option<ExOps>) -> Self {
        let max_wr = max_wr as usize;
        let max_sge = max_sge as usize;
        if let Some(ex) = ex {
            return SendStorage {
                wrs: Box::new([]),
                sges: Box::new([]),
                inline: vec![0; max_inline as usize].into_boxed_slice(),
                max_sge,
                capacity: usize::MAX,
                ex,
            };
        }
        let wrs = vec![zeroed_send_wr(); max_wr].into_boxed_slice();
        let sges = vec![ffi::ibv_sge::default(); max_wr.saturating_mul(max_sge)].into_boxed_slice();
        SendStorage {
            capacity: slots(wrs.len(), sges.len(), max_sge),
            wrs,
            sges,
            inline: Box::new([]),
            max_sge,
            ex: ExOps::none(),
        }
    }
}

/// How many requests of `max_sge` entries fit in `wrs` requests and `sges` entries.
fn slots(wrs: usize, sges: usize, max_sge: usize) -> usize {
    match sges.checked_div(max_sge) {
        Some(fit) => wrs.min(fit),
        None => wrs,
    }
}

/// Where receive batches are built, for a QP's receive queue and for an SRQ alike;
/// allocated once, with the queue, so posting receives allocates nothing.
pub(crate) struct RecvStorage {
    wrs: Box<[ffi::ibv_recv_wr]>,
    /// `max_sge` entries per request, request `i` at `i * max_sge`.
    sges: Box<[ffi::ibv_sge]>,
    max_sge: usize,
    /// The receives one batch may hold, as `SendStorage::capacity`: `wrs.len()`, and
    /// `capacity * max_sge <= sges.len()`.
    capacity: usize,
}

impl RecvStorage {
    pub(crate) fn new(max_wr: u32, max_sge: u32) -> Self {
        let max_wr = max_wr as usize;
        let max_sge = max_sge as usize;
        let wr = ffi::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let wrs = vec![wr; max_wr].into_boxed_slice();
        let sges = vec![ffi::ibv_sge::default(); max_wr.saturating_mul(max_sge)].into_boxed_slice();
        RecvStorage {
            capacity: slots(wrs.len(), sges.len(), max_sge),
            wrs,
            sges,
            max_sge,
        }
    }

    /// Writes receive `i` of the batch (scattered over `sges`, copied), linked to the slot
    /// after it; refuses, naming `queue`, what the storage cannot hold.
    #[inline]
    pub(crate) fn push(
        &mut self,
        i: usize,
        wr_id: u64,
        sges: &[Sge],
        queue: &'static str,
    ) -> Result<(), InvalidWorkRequest> {
        if i >= self.capacity {
            return Err(batch_full(self.capacity, queue));
        }
        if sges.len() > self.max_sge {
            return Err(InvalidWorkRequest::TooManySge {
                given: sges.len(),
                max: self.max_sge,
                queue,
            });
        }
        // SAFETY: i < capacity, so slot i and its max_sge entries at i * max_sge lie inside
        // wrs and sges (RecvStorage::capacity), and slot + 1 is at most one past the end.
        let (slot, next, entries) = unsafe {
            let slot = self.wrs.as_mut_ptr().add(i);
            (
                slot,
                slot.add(1),
                self.sges.as_mut_ptr().add(i * self.max_sge),
            )
        };
        for (j, src) in sges.iter().enumerate() {
            // SAFETY: j < sges.len() <= max_sge: inside this receive's entries (above).
            unsafe { entries.add(j).write(*src.as_raw()) };
        }
        let wr = ffi::ibv_recv_wr {
            wr_id,
            // finish() ends the chain at the last receive.
            next,
            sg_list: if sges.is_empty() {
                std::ptr::null_mut()
            } else {
                entries
            },
            // sges.len() <= max_sge, which came from a u32.
            num_sge: sges.len() as c_int,
        };
        // SAFETY: slot is in bounds (above) and nothing else borrows the storage.
        unsafe { slot.write(wr) };
        Ok(())
    }

    /// Ends the chain of the first `count` receives and returns its head, for the post verb.
    ///
    /// # Safety
    ///
    /// `push` wrote receives `0..count` since this storage was last reused, and `count > 0`.
    #[inline]
    pub(crate) unsafe fn finish(&mut self, count: usize) -> *mut ffi::ibv_recv_wr {
        let head = self.wrs.as_mut_ptr();
        // SAFETY: by the caller, 0 < count and receive count - 1 was pushed, so it lies
        // inside wrs (push checked its index against capacity <= wrs.len()).
        unsafe { (*head.add(count - 1)).next = std::ptr::null_mut() };
        head
    }

    /// Which of the first `count` receives `bad` (the post verb's out-parameter) points at,
    /// and its `wr_id`.
    pub(crate) fn locate(
        &self,
        bad: *const ffi::ibv_recv_wr,
        count: usize,
    ) -> Option<(usize, u64)> {
        let index = chain_index(self.wrs.as_ptr(), bad, count)?;
        Some((index, self.wrs[index].wr_id))
    }
}

/// A batch of send work requests being built; from [`QueuePair::start_post_send`].
///
/// Add requests with [`wr`](Self::wr), then [`post`](Self::post) them with one doorbell.
/// A request the batch cannot take (too many SGEs, inline data too long, ...) is remembered
/// and reported by `post`, which then posts nothing. Dropping the guard without posting
/// discards the batch (`ibv_wr_abort` on extended QPs). Inline data is borrowed for `'a`.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::RegisteredBuffer,
/// #         rkey: u32, raddr: u64) -> Result<(), Box<dyn std::error::Error>> {
/// use sideway::queue_pair::SendFlags;
/// let mut batch = qp.start_post_send();
/// batch
///     .wr(1, SendFlags::empty())
///     .rdma_write(rkey, raddr, buf.sge(0..4096).unwrap())
///     .wr(2, SendFlags::SIGNALED)
///     .send(b"done")
///     .wr(3, SendFlags::SIGNALED)
///     .atomic_fetch_add(rkey, raddr, 1, buf.sge(0..8).unwrap());
/// batch.post()?;
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_send_wr")]
#[must_use = "work requests reach the device only through post(); dropping the guard discards them"]
pub struct PostSendGuard<'a> {
    qp: &'a mut QueuePair,
    /// Requests added. On an extended QP, `ibv_wr_start` was called (and not yet completed
    /// or aborted) exactly when this is above 0: the first request that passes its checks
    /// starts the batch, and every request that passes them is added.
    count: usize,
    /// The count at which a request takes the slow path: the storage's capacity, or 0 once a
    /// request was refused (recorded in `invalid`, which only `post` reads, and only then).
    /// One comparison per request thus both bounds the storage and stops every request
    /// after a refused one.
    limit: usize,
    invalid: Option<(usize, u64, InvalidWorkRequest)>,
}

impl fmt::Debug for PostSendGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostSendGuard")
            .field("qp_num", &format_args!("{:#x}", self.qp.qp_num()))
            .field("count", &self.count)
            .field("invalid", &self.invalid)
            .finish()
    }
}

/// One send work request being described: pick its operation. From [`PostSendGuard::wr`].
#[doc(alias = "ibv_send_wr")]
#[must_use = "a work request is added only by one of its operation methods"]
pub struct WorkRequestBuilder<'g, 'a> {
    guard: &'g mut PostSendGuard<'a>,
    wr_id: u64,
    flags: SendFlags,
    ud: Option<UdAddr>,
}

impl fmt::Debug for WorkRequestBuilder<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkRequestBuilder")
            .field("wr_id", &self.wr_id)
            .field("flags", &self.flags)
            .finish()
    }
}

impl<'g, 'a> WorkRequestBuilder<'g, 'a> {
    #[inline(always)]
    fn add(self, op: Op, data: SendData<'a>) -> PostSendChain<'g, 'a> {
        self.guard.push(self.wr_id, self.flags, op, data, self.ud);
        PostSendChain { guard: self.guard }
    }

    /// Sends this request of a UD QP to `remote_qpn` with Q_Key `remote_qkey` through `ah`
    /// (`wr.ud` of `ibv_send_wr`; `ibv_wr_set_ud_addr` on extended QPs). Required on UD QPs,
    /// refused on others. The handle is borrowed until the batch is posted.
    #[doc(alias = "ibv_wr_set_ud_addr")]
    #[inline]
    pub fn ud_addr(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdAddr {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// A SEND with invalidate (`IBV_WR_SEND_WITH_INV`, `ibv_wr_send_inv`): also invalidates
    /// the peer's memory window or region of `invalidate_rkey`, which the peer's receive
    /// completion reports.
    #[doc(alias = "ibv_wr_send_inv")]
    #[inline]
    pub fn send_with_invalidate(
        self,
        invalidate_rkey: u32,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a> {
        self.add(Op::SendInv(invalidate_rkey), data.into())
    }

    /// A local invalidate (`IBV_WR_LOCAL_INV`, `ibv_wr_local_inv`) of this side's memory
    /// window (type 2) or region with `invalidate_rkey`.
    #[doc(alias = "ibv_wr_local_inv")]
    #[inline]
    pub fn local_invalidate(self, invalidate_rkey: u32) -> PostSendChain<'g, 'a> {
        self.add(Op::LocalInv(invalidate_rkey), SendData::Empty)
    }

    /// Binds a type 2 memory window (`IBV_WR_BIND_MW`, `ibv_wr_bind_mw`) to `range` of
    /// `mr` with `access`, under the new rkey `rkey` (from
    /// [`MemoryWindow::next_rkey`](crate::memory_window::MemoryWindow::next_rkey)). The
    /// window and region are borrowed until posting; the bind's completion says whether it
    /// took effect. `mr` must be registered with `AccessFlags::MW_BIND`. From this call on,
    /// the window holds `mr` (an `Arc` clone) until it is bound again or dropped, so the
    /// region outlives the binding (see [`crate::memory_window`]).
    #[doc(alias = "ibv_wr_bind_mw")]
    #[inline]
    pub fn bind_mw(
        self,
        mw: &'a crate::verbs::memory_window::MemoryWindow,
        rkey: u32,
        mr: &'a std::sync::Arc<crate::verbs::memory_region::MemoryRegion>,
        range: std::ops::Range<u64>,
        access: crate::verbs::memory_region::AccessFlags,
    ) -> PostSendChain<'g, 'a> {
        mw.hold(mr);
        let info = ffi::ibv_mw_bind_info {
            mr: mr.as_raw(),
            addr: range.start,
            length: range.end.saturating_sub(range.start),
            mw_access_flags: access.bits(),
        };
        self.add(
            Op::BindMw {
                mw: mw.as_raw(),
                rkey,
                info,
            },
            SendData::Empty,
        )
    }

    /// A SEND (`IBV_WR_SEND`, `ibv_wr_send`) of `data`, consuming a receive at the peer.
    #[doc(alias = "ibv_wr_send")]
    #[inline]
    pub fn send(self, data: impl Into<SendData<'a>>) -> PostSendChain<'g, 'a> {
        self.add(Op::Send, data.into())
    }

    /// A SEND with immediate data (`IBV_WR_SEND_WITH_IMM`, `ibv_wr_send_imm`); `imm` is
    /// in host order and arrives as [`WorkCompletion::imm_data`](crate::WorkCompletion::imm_data).
    #[doc(alias = "ibv_wr_send_imm")]
    #[inline]
    pub fn send_with_imm(self, imm: u32, data: impl Into<SendData<'a>>) -> PostSendChain<'g, 'a> {
        self.add(Op::SendImm(imm), data.into())
    }

    /// An RDMA WRITE (`IBV_WR_RDMA_WRITE`, `ibv_wr_rdma_write`) of `data` to the peer's
    /// `remote_addr` in the region of `rkey`.
    #[doc(alias = "ibv_wr_rdma_write")]
    #[inline]
    pub fn rdma_write(
        self,
        rkey: u32,
        remote_addr: u64,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a> {
        self.add(
            Op::Write {
                rkey,
                addr: remote_addr,
            },
            data.into(),
        )
    }

    /// An RDMA WRITE with immediate data (`IBV_WR_RDMA_WRITE_WITH_IMM`,
    /// `ibv_wr_rdma_write_imm`): consumes a receive at the peer, which sees `imm`.
    #[doc(alias = "ibv_wr_rdma_write_imm")]
    #[inline]
    pub fn rdma_write_with_imm(
        self,
        rkey: u32,
        remote_addr: u64,
        imm: u32,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a> {
        self.add(
            Op::WriteImm {
                rkey,
                addr: remote_addr,
                imm,
            },
            data.into(),
        )
    }

    /// An RDMA READ (`IBV_WR_RDMA_READ`, `ibv_wr_rdma_read`) of the peer's `remote_addr`
    /// into the local entries `data` (no inline data).
    #[doc(alias = "ibv_wr_rdma_read")]
    #[inline]
    pub fn rdma_read(
        self,
        rkey: u32,
        remote_addr: u64,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a> {
        self.add(
            Op::Read {
                rkey,
                addr: remote_addr,
            },
            data.into(),
        )
    }

    /// An atomic compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`, `ibv_wr_atomic_cmp_swp`) of
    /// the 8 bytes at the peer's `remote_addr` (8-byte aligned): if they equal `compare`
    /// they become `swap`. The old value lands in `local` (8 bytes).
    #[doc(alias = "ibv_wr_atomic_cmp_swp")]
    #[inline]
    pub fn atomic_cmp_swp(
        self,
        rkey: u32,
        remote_addr: u64,
        compare: u64,
        swap: u64,
        local: Sge,
    ) -> PostSendChain<'g, 'a> {
        self.add(
            Op::CmpSwp {
                rkey,
                addr: remote_addr,
                compare,
                swap,
            },
            SendData::Sge(local),
        )
    }

    /// An atomic fetch-and-add (`IBV_WR_ATOMIC_FETCH_AND_ADD`, `ibv_wr_atomic_fetch_add`)
    /// of `add` to the 8 bytes at the peer's `remote_addr` (8-byte aligned). The old value
    /// lands in `local` (8 bytes).
    #[doc(alias = "ibv_wr_atomic_fetch_add")]
    #[inline]
    pub fn atomic_fetch_add(
        self,
        rkey: u32,
        remote_addr: u64,
        add: u64,
        local: Sge,
    ) -> PostSendChain<'g, 'a> {
        self.add(
            Op::FetchAdd {
                rkey,
                addr: remote_addr,
                add,
            },
            SendData::Sge(local),
        )
    }
}

/// The batch after a request was added to it: add the next one with [`wr`](Self::wr), or
/// [`post`](Self::post) them all. Returned by each operation method of
/// [`WorkRequestBuilder`], so that a batch can be built and posted in one expression; it
/// is the guard under another name, and discarding it keeps the batch in the guard.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::RegisteredBuffer,
/// #         rkey: u32, raddr: u64) -> Result<(), sideway::PostError> {
/// use sideway::SendFlags;
/// // One expression: a guard, two requests, one doorbell.
/// qp.start_post_send()
///     .wr(1, SendFlags::empty())
///     .rdma_write(rkey, raddr, buf.sge(0..64).unwrap())
///     .wr(2, SendFlags::SIGNALED)
///     .send(b"done")
///     .post()?;
/// // Statement by statement, the guard posts itself.
/// let mut guard = qp.start_post_send();
/// for i in 0..4u64 {
///     guard.wr(10 + i, SendFlags::SIGNALED).send(b"ping");
/// }
/// guard.post()?;
/// # Ok(()) }
/// ```
///
/// Posting through a chain leaves the guard empty: a named guard can go on to a next batch.
/// The chain borrows its guard, so it cannot outlive a guard made in the same expression:
///
/// ```compile_fail,E0716
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair) {
/// let chain = qp.start_post_send().wr(1, sideway::SendFlags::SIGNALED).send(b"x");
/// let _ = chain.post(); // the guard was dropped at the end of the line above
/// # }
/// ```
pub struct PostSendChain<'g, 'a> {
    guard: &'g mut PostSendGuard<'a>,
}

impl fmt::Debug for PostSendChain<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.guard, f)
    }
}

impl<'g, 'a> PostSendChain<'g, 'a> {
    /// Starts the next work request, as [`PostSendGuard::wr`].
    #[inline]
    pub fn wr(self, wr_id: u64, flags: SendFlags) -> WorkRequestBuilder<'g, 'a> {
        self.guard.wr(wr_id, flags)
    }

    /// Posts the batch with one doorbell, as [`PostSendGuard::post`], and leaves the guard
    /// empty.
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline(always)]
    pub fn post(self) -> Result<(), PostError> {
        self.guard.post_batch()
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.guard.len()
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.guard.is_empty()
    }

    /// The guard, to go on with it by name.
    pub fn into_guard(self) -> &'g mut PostSendGuard<'a> {
        self.guard
    }
}

impl<'a> PostSendGuard<'a> {
    #[inline]
    pub(super) fn new(qp: &'a mut QueuePair) -> Self {
        let limit = qp.send.capacity;
        PostSendGuard {
            qp,
            count: 0,
            limit,
            invalid: None,
        }
    }

    /// Starts the next work request: its `wr_id` (reported by its completion) and flags.
    /// Pick the operation on the returned builder.
    #[inline]
    pub fn wr(&mut self, wr_id: u64, flags: SendFlags) -> WorkRequestBuilder<'_, 'a> {
        WorkRequestBuilder {
            guard: self,
            wr_id,
            flags,
            ud: None,
        }
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    #[inline(always)]
    fn check(
        &self,
        op: Op,
        data: &SendData<'a>,
        ud: Option<UdAddr>,
    ) -> Result<(), InvalidWorkRequest> {
        let qp = &*self.qp;
        if let Some(allowed) = op.refused_by(qp.qp_type) {
            return Err(InvalidWorkRequest::NotForQpType {
                op: op.name(),
                qp_type: qp.qp_type,
                allowed,
            });
        }
        match (qp.qp_type == QpType::Ud, ud.is_some()) {
            (true, false) => return Err(InvalidWorkRequest::MissingUdAddress),
            (false, true) => {
                return Err(InvalidWorkRequest::UdAddressOnConnectedQp {
                    qp_type: qp.qp_type,
                })
            }
            _ => {}
        }
        let entries = data.entries();
        let max_sge = qp.send.max_sge;
        if entries > max_sge {
            return Err(InvalidWorkRequest::TooManySge {
                given: entries,
                max: max_sge,
                queue: "send",
            });
        }
        if data.is_inline() {
            if !op.allows_inline() {
                return Err(InvalidWorkRequest::InlineNotAllowed { op: op.name() });
            }
            let len = data.inline_len();
            if len > qp.cap.max_inline_data as usize {
                return Err(InvalidWorkRequest::InlineTooLong {
                    len,
                    max: qp.cap.max_inline_data,
                });
            }
        }
        if qp.ex.is_some() && !qp.send.ex.ready.allows(op, data, ud.is_some()) {
            return Err(InvalidWorkRequest::NotEnabled { op: op.name() });
        }
        Ok(())
    }

    #[inline(always)]
    fn push(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        op: Op,
        data: SendData<'a>,
        ud: Option<UdAddr>,
    ) {
        if self.count >= self.limit {
            // The storage is full, unless a request was refused already (limit 0).
            if self.limit != 0 {
                self.refuse(wr_id, batch_full(self.qp.send.capacity, "send"));
            }
            return;
        }
        if let Err(reason) = self.check(op, &data, ud) {
            self.refuse(wr_id, reason);
            return;
        }
        let mut flags = flags - SendFlags::INLINE;
        if data.is_inline() {
            flags |= SendFlags::INLINE;
        }
        match self.qp.ex {
            Some(ex) => self.push_ex(ex, wr_id, flags, op, data, ud),
            None => self.push_classic(wr_id, flags, op, data, ud),
        }
        self.count += 1;
    }

    /// Remembers the first refused request for `post`, and stops taking requests. Inlined,
    /// as the rest of the request path: a call taking the guard (or a field of it) by
    /// reference kept the whole guard in memory, and every batch loop with it
    /// (docs/benchmarks.md, "The posting guard").
    #[inline(always)]
    fn refuse(&mut self, wr_id: u64, reason: InvalidWorkRequest) {
        self.invalid = Some((self.count, wr_id, reason));
        self.limit = 0;
    }

    #[inline(always)]
    fn push_classic(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        op: Op,
        data: SendData<'a>,
        ud: Option<UdAddr>,
    ) {
        let i = self.count;
        let st = &mut self.qp.send;
        let m = st.max_sge;
        // SAFETY: push() saw i < limit <= capacity, so slot i and its max_sge entries at
        // i * max_sge lie inside wrs and sges (SendStorage::capacity), and slot + 1 is at
        // most one past the end of wrs.
        let (slot, next, entries) = unsafe {
            let slot = st.wrs.as_mut_ptr().add(i);
            (slot, slot.add(1), st.sges.as_mut_ptr().add(i * m))
        };
        let inline = |b: &[u8]| ffi::ibv_sge {
            addr: b.as_ptr() as u64,
            // check() bounded inline lengths by max_inline_data, a u32.
            length: b.len() as u32,
            lkey: 0,
        };
        // check() bounded the entries by max_sge, so entry j < max_sge of this request lies
        // inside `sges`.
        let n = match data {
            SendData::Empty => 0,
            SendData::Sge(s) => {
                // SAFETY: entry 0 of at most max_sge, as above (max_sge >= 1 since check()
                // let one entry through).
                unsafe { entries.write(*s.as_raw()) };
                1
            }
            SendData::SgeList(list) => {
                for (j, src) in list.iter().enumerate() {
                    // SAFETY: j < list.len() <= max_sge, as above.
                    unsafe { entries.add(j).write(*src.as_raw()) };
                }
                list.len()
            }
            SendData::Inline(b) => {
                // SAFETY: entry 0 of at most max_sge, as for Sge.
                unsafe { entries.write(inline(b)) };
                1
            }
            SendData::InlineBuffer(b) => {
                let entry = ffi::ibv_sge {
                    addr: b.ptr.as_ptr() as u64,
                    // check() bounded inline lengths by max_inline_data, a u32.
                    length: b.len as u32,
                    lkey: 0,
                };
                // SAFETY: entry 0 of at most max_sge, as for Sge.
                unsafe { entries.write(entry) };
                1
            }
            SendData::InlineList(list) => {
                for (j, src) in list.iter().enumerate() {
                    // SAFETY: j < list.len() <= max_sge, as above.
                    unsafe { entries.add(j).write(inline(src)) };
                }
                list.len()
            }
        };
        let mut wr = zeroed_send_wr();
        wr.wr_id = wr_id;
        // Each request links to the slot after it; post() ends the chain at the last one.
        wr.next = next;
        wr.sg_list = if n == 0 {
            std::ptr::null_mut()
        } else {
            entries
        };
        // n <= max_sge, which came from a u32.
        wr.num_sge = n as c_int;
        wr.opcode = op.opcode();
        wr.send_flags = flags.bits();
        match op {
            Op::Send | Op::Read { .. } | Op::Write { .. } => {}
            Op::SendImm(imm) | Op::WriteImm { imm, .. } => {
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            Op::SendInv(rkey) | Op::LocalInv(rkey) => {
                wr.__bindgen_anon_1.invalidate_rkey = rkey;
            }
            _ => {}
        }
        match op {
            Op::Write { rkey, addr }
            | Op::WriteImm { rkey, addr, .. }
            | Op::Read { rkey, addr } => {
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: addr,
                    rkey,
                };
            }
            Op::CmpSwp {
                rkey,
                addr,
                compare,
                swap,
            } => {
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
            Op::FetchAdd { rkey, addr, add } => {
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            Op::BindMw { mw, rkey, info } => {
                wr.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw,
                    rkey,
                    bind_info: info,
                };
            }
            Op::Send | Op::SendImm(_) | Op::SendInv(_) | Op::LocalInv(_) => {}
        }
        if let Some(ud) = ud {
            // check() allowed only SEND and SEND with immediate here, which use no other
            // member of this union.
            wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah: ud.ah,
                remote_qpn: ud.remote_qpn,
                remote_qkey: ud.remote_qkey,
            };
        }
        // SAFETY: slot is in bounds (above) and nothing else borrows the storage.
        unsafe { slot.write(wr) };
    }

    #[inline(always)]
    fn push_ex(
        &mut self,
        ex: NonNull<ffi::ibv_qp_ex>,
        wr_id: u64,
        flags: SendFlags,
        op: Op,
        data: SendData<'a>,
        ud: Option<UdAddr>,
    ) {
        let ex = ex.as_ptr();
        let f = &self.qp.send.ex;
        // The safety argument of every block below: ex is the live extended QP of this
        // guard's QP, which the guard borrows mutably, so no other batch is open on it; the
        // calls follow the batch order (start, then per request: wr_id/wr_flags, one opcode
        // call, its data setter); check() verified, against `f.ready`, that the operation is
        // in send_ops_flags and that the provider filled its entry, the data setter's and
        // the batch entries, so each function called is the provider's own, read from `ex`
        // when the QP was wrapped (ExOps: what verbs.h's inline would load now). Inline
        // data is borrowed for 'a, beyond this call.
        if self.count == 0 {
            // SAFETY: as above; opens the batch once, for its first request.
            unsafe { (f.start)(ex) };
        }
        // SAFETY: as above; plain field writes the next opcode call reads.
        unsafe {
            (*ex).wr_id = wr_id;
            (*ex).wr_flags = flags.bits();
        }
        // SAFETY: as above.
        unsafe {
            match op {
                Op::Send => (f.send)(ex),
                Op::SendImm(imm) => (f.send_imm)(ex, imm.to_be()),
                Op::Write { rkey, addr } => (f.rdma_write)(ex, rkey, addr),
                Op::WriteImm { rkey, addr, imm } => (f.rdma_write_imm)(ex, rkey, addr, imm.to_be()),
                Op::Read { rkey, addr } => (f.rdma_read)(ex, rkey, addr),
                Op::CmpSwp {
                    rkey,
                    addr,
                    compare,
                    swap,
                } => (f.atomic_cmp_swp)(ex, rkey, addr, compare, swap),
                Op::FetchAdd { rkey, addr, add } => (f.atomic_fetch_add)(ex, rkey, addr, add),
                Op::SendInv(rkey) => (f.send_inv)(ex, rkey),
                Op::LocalInv(rkey) => (f.local_inv)(ex, rkey),
                // The provider copies the bind info while the call runs.
                Op::BindMw { mw, rkey, info } => (f.bind_mw)(ex, mw, rkey, &info),
            }
        }
        if let Some(ud) = ud {
            // SAFETY: as above; the destination follows the opcode call, and the address
            // handle is borrowed for 'a.
            unsafe { (f.set_ud_addr)(ex, ud.ah, ud.remote_qpn, ud.remote_qkey) };
        }
        match data {
            SendData::Empty => {}
            // SAFETY: as above; the SGE is passed by value.
            SendData::Sge(s) => unsafe { (f.set_sge)(ex, s.lkey(), s.addr(), s.length()) },
            // SAFETY: as above; Sge is repr(transparent) over ibv_sge, and the list is
            // borrowed for 'a.
            SendData::SgeList(list) => unsafe {
                (f.set_sge_list)(ex, list.len(), list.as_ptr().cast())
            },
            // SAFETY: as above; the provider only reads the bytes (the C prototype lacks
            // const).
            SendData::Inline(b) => unsafe {
                (f.set_inline_data)(ex, b.as_ptr() as *mut c_void, b.len())
            },
            // SAFETY: as above; the bytes lie in a buffer borrowed for 'a, and the provider
            // copies them through the pointer, forming no reference.
            SendData::InlineBuffer(b) => unsafe {
                (f.set_inline_data)(ex, b.ptr.as_ptr().cast(), b.len)
            },
            SendData::InlineList(list) => {
                let set_inline_data = f.set_inline_data;
                let scratch = &mut self.qp.send.inline;
                let mut len = 0;
                for part in list {
                    // check() bounded the total by max_inline_data, the scratch's length.
                    scratch[len..len + part.len()].copy_from_slice(part);
                    len += part.len();
                }
                // SAFETY: as above; scratch[..len] is initialised and lives with the QP.
                unsafe { set_inline_data(ex, scratch.as_mut_ptr().cast(), len) }
            }
        }
    }

    /// Posts the batch with one doorbell: `ibv_wr_complete` on an extended QP, one chained
    /// `ibv_post_send` on a classic one. An empty batch posts nothing and succeeds.
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline(always)]
    pub fn post(mut self) -> Result<(), PostError> {
        self.post_batch()
    }

    /// What [`post`](Self::post) and [`PostSendChain::post`] do: posts the batch and leaves
    /// the guard empty, whatever the outcome, so a guard that goes on living (under a chain)
    /// starts a new batch and its drop has nothing to abort.
    #[inline(always)]
    fn post_batch(&mut self) -> Result<(), PostError> {
        if self.limit == 0 {
            if let Some((index, wr_id, reason)) = self.invalid.take() {
                // Nothing is posted: abort what an extended QP already holds, and empty
                // the guard so that it can start again. Inline, as the request path: a
                // call taking the guard by reference would keep it in memory.
                if let (true, Some(ex)) = (self.count > 0, self.qp.ex) {
                    // SAFETY: ex is live and inside the batch this guard started
                    // (count > 0), never completed; a request passed check(), so the
                    // provider filled wr_abort (ExReady), and `abort` is its entry.
                    unsafe { (self.qp.send.ex.abort)(ex.as_ptr()) };
                }
                self.count = 0;
                self.limit = self.qp.send.capacity;
                return Err(PostError::Invalid {
                    qp_num: self.qp.qp_num(),
                    index,
                    wr_id,
                    reason,
                });
            }
        }
        let count = self.count;
        if count == 0 {
            return Ok(());
        }
        // The QP number is read only for an error, after the call: it never changes, and
        // reading it first would put one more load in front of every post.
        let post_err =
            |qp: &QueuePair, call, index: Option<usize>, wr_id, source| PostError::Post {
                call,
                qp_num: qp.qp_num(),
                count,
                index,
                wr_id,
                source,
            };
        if let Some(ex) = self.qp.ex {
            // The batch ends here, whatever complete says: Drop must not abort it.
            self.count = 0;
            // SAFETY: ex is live and inside the batch this guard started (count > 0);
            // complete ends it. A request passed check(), so the provider filled
            // wr_complete (ExReady), and `complete` is its entry.
            let ret = unsafe { (self.qp.send.ex.complete)(ex.as_ptr()) };
            return from_post_ret(ret)
                .map_err(|e| post_err(self.qp, "ibv_wr_complete", None, None, e));
        }
        // The chain is handed over below, whatever the verb says: the next request starts
        // a new one.
        self.count = 0;
        let qp = self.qp.raw.as_ptr();
        let wrs = self.qp.send.wrs.as_mut_ptr();
        // SAFETY: push_classic wrote wrs[..count] (count <= capacity <= wrs.len()), each
        // linking to the slot after it; the last one's link ends the chain.
        unsafe { (*wrs.add(count - 1)).next = std::ptr::null_mut() };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: qp is live; wrs[..count] is a NULL-terminated chain whose sg_lists point
        // into `sges` (alive with the QP) at entries naming registered memory or inline bytes
        // borrowed for 'a; bad is a valid out-pointer.
        let ret = unsafe { (self.qp.posts.post_send)(qp, wrs, &mut bad) };
        from_post_ret(ret).map_err(|e| {
            let st = &self.qp.send;
            let index = chain_index(st.wrs.as_ptr(), bad, count);
            let wr_id = index.map(|i| st.wrs[i].wr_id);
            post_err(self.qp, "ibv_post_send", index, wr_id, e)
        })
    }
}

/// The error of a request that finds its batch's storage full; the slow path only.
#[cold]
fn batch_full(capacity: usize, queue: &'static str) -> InvalidWorkRequest {
    InvalidWorkRequest::BatchFull { capacity, queue }
}

/// Which request of a chain starting at `base` `bad` points at, if any.
fn chain_index<T>(base: *const T, bad: *const T, count: usize) -> Option<usize> {
    let size = std::mem::size_of::<T>();
    let off = (bad as usize).checked_sub(base as usize)?;
    (off % size == 0 && off / size < count).then_some(off / size)
}

/// What an extended QP can post: the operations of its `send_ops_flags` whose `qp_ex`
/// entries the provider filled, and the data setters it filled; found once, when the QP is
/// wrapped, so a request tests one mask instead of loading and testing each entry. Empty
/// when `wr_start`, `wr_complete` or `wr_abort` is missing: then nothing can be posted.
/// A request the mask does not allow is refused ([`InvalidWorkRequest::NotEnabled`])
/// before any provider call; calling a missing entry's stand-in in [`ExOps`] instead would
/// silently drop the request. Providers fill these entries when they create the QP and
/// never change them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ExReady(u64);

impl ExReady {
    // Operations are the bits of their SendOpsFlags, which stay below these.
    const SGE: u64 = 1 << 60;
    const SGE_LIST: u64 = 1 << 61;
    const INLINE: u64 = 1 << 62;
    const UD_ADDR: u64 = 1 << 63;

    /// Reads `ex`'s entries for the operations of `ops`.
    ///
    /// # Safety
    ///
    /// `ex` is a live extended QP.
    pub(super) unsafe fn probe(ex: NonNull<ffi::ibv_qp_ex>, ops: SendOpsFlags) -> Self {
        // SAFETY: the caller keeps ex live; only its function-pointer fields are read.
        let q = unsafe { &*ex.as_ptr() };
        if q.wr_start.is_none() || q.wr_complete.is_none() || q.wr_abort.is_none() {
            return ExReady(0);
        }
        let mut ready = 0;
        for (flag, set) in [
            (SendOpsFlags::SEND, q.wr_send.is_some()),
            (SendOpsFlags::SEND_WITH_IMM, q.wr_send_imm.is_some()),
            (SendOpsFlags::RDMA_WRITE, q.wr_rdma_write.is_some()),
            (
                SendOpsFlags::RDMA_WRITE_WITH_IMM,
                q.wr_rdma_write_imm.is_some(),
            ),
            (SendOpsFlags::RDMA_READ, q.wr_rdma_read.is_some()),
            (
                SendOpsFlags::ATOMIC_CMP_AND_SWP,
                q.wr_atomic_cmp_swp.is_some(),
            ),
            (
                SendOpsFlags::ATOMIC_FETCH_AND_ADD,
                q.wr_atomic_fetch_add.is_some(),
            ),
            (SendOpsFlags::SEND_WITH_INV, q.wr_send_inv.is_some()),
            (SendOpsFlags::LOCAL_INV, q.wr_local_inv.is_some()),
            (SendOpsFlags::BIND_MW, q.wr_bind_mw.is_some()),
        ] {
            if set && ops.contains(flag) {
                ready |= flag.bits();
            }
        }
        for (bit, set) in [
            (Self::SGE, q.wr_set_sge.is_some()),
            (Self::SGE_LIST, q.wr_set_sge_list.is_some()),
            // Inline lists are gathered and set as one buffer.
            (Self::INLINE, q.wr_set_inline_data.is_some()),
            (Self::UD_ADDR, q.wr_set_ud_addr.is_some()),
        ] {
            if set {
                ready |= bit;
            }
        }
        ExReady(ready)
    }

    /// Whether a request of `op` with `data` (and a UD destination when `ud`) can be posted.
    #[inline(always)]
    fn allows(self, op: Op, data: &SendData<'_>, ud: bool) -> bool {
        let data_bit = match data {
            SendData::Empty => 0,
            SendData::Sge(_) => Self::SGE,
            SendData::SgeList(_) => Self::SGE_LIST,
            SendData::Inline(_) | SendData::InlineList(_) | SendData::InlineBuffer(_) => {
                Self::INLINE
            }
        };
        let need = op.send_ops_flag().bits() | data_bit | if ud { Self::UD_ADDR } else { 0 };
        self.0 & need == need
    }
}

/// Defines [`ExOps`] from its entries: `name => qp_ex field(argument types) [-> return
/// type, what its stand-in returns]`.
macro_rules! ex_ops {
    ($(
        $(#[$doc:meta])*
        $name:ident => $field:ident($($ty:ty),*) $(-> $ret:ty, or $or:expr)?;
    )*) => {
        /// An extended QP's provider functions, read from its `ibv_qp_ex` once, when the QP
        /// is wrapped, and called on the data path with no test, as a C program that reads
        /// them once calls them.
        ///
        /// verbs.h's `ibv_wr_*` inlines load `qp->wr_<op>` on every call, and
        /// rdma-mummy-sys's also test it for NULL (three instructions per call). Here a
        /// request is checked once against [`ExReady`] (one mask test, which refuses an
        /// operation outside `send_ops_flags` or one the provider left out, with the same
        /// [`InvalidWorkRequest::NotEnabled`] as before), and then calls these.
        ///
        /// Why a pointer read at wrapping time is the one verbs.h would call for the QP's
        /// whole life: the provider fills these entries while it creates the QP (mlx5's
        /// `mlx5_qp_fill_wr_pfns`, rxe's and efa's create paths) and nothing in libibverbs
        /// or the providers writes them again; the code they point to belongs to the
        /// provider library, which libibverbs never unloads (and the QP holds its PD, which
        /// holds the open context). An entry the provider left NULL gets a stand-in that
        /// does nothing (`wr_complete`'s fails with `EOPNOTSUPP`), rdma-mummy-sys's
        /// behaviour for a NULL entry; [`ExReady`] keeps every request that would need one
        /// from reaching it.
        #[derive(Clone, Copy)]
        pub(super) struct ExOps {
            /// What the QP can post (empty on a classic QP).
            pub(super) ready: ExReady,
            $(
                $(#[$doc])*
                pub(super) $name: unsafe extern "C" fn(*mut ffi::ibv_qp_ex $(, $ty)*) $(-> $ret)?,
            )*
        }

        impl ExOps {
            /// `ex`'s entries, and what it can post with `ops` (its `send_ops_flags`).
            ///
            /// # Safety
            ///
            /// `ex` is a live extended QP whose entries are the provider's functions or
            /// NULL, and which no other thread is changing.
            pub(super) unsafe fn of(ex: NonNull<ffi::ibv_qp_ex>, ops: SendOpsFlags) -> Self {
                // SAFETY: the caller's promise; only function-pointer fields are read.
                let q = unsafe { ex.as_ref() };
                ExOps {
                    // SAFETY: as above.
                    ready: unsafe { ExReady::probe(ex, ops) },
                    $($name: match q.$field {
                        Some(f) => f,
                        None => {
                            unsafe extern "C" fn missing(
                                _qp: *mut ffi::ibv_qp_ex $(, _: $ty)*
                            ) $(-> $ret)? {
                                $($or)?
                            }
                            missing
                        }
                    },)*
                }
            }

            /// A classic QP's: nothing can be posted, and every function is a stand-in.
            pub(super) fn none() -> Self {
                // SAFETY: a zeroed ibv_qp_ex is a valid value (integers, NULL pointers and
                // None function pointers), live for the call, changed by nobody.
                unsafe {
                    let q: ffi::ibv_qp_ex = MaybeUninit::zeroed().assume_init();
                    let mut ops = ExOps::of(NonNull::from(&q), SendOpsFlags::empty());
                    ops.ready = ExReady::default();
                    ops
                }
            }
        }
    };
}

ex_ops! {
    /// `wr_start`.
    start => wr_start();
    /// `wr_complete`.
    complete => wr_complete() -> c_int, or libc::EOPNOTSUPP;
    /// `wr_abort`.
    abort => wr_abort();
    /// `wr_send`.
    send => wr_send();
    /// `wr_send_imm`.
    send_imm => wr_send_imm(ffi::__be32);
    /// `wr_rdma_write`.
    rdma_write => wr_rdma_write(u32, u64);
    /// `wr_rdma_write_imm`.
    rdma_write_imm => wr_rdma_write_imm(u32, u64, ffi::__be32);
    /// `wr_rdma_read`.
    rdma_read => wr_rdma_read(u32, u64);
    /// `wr_atomic_cmp_swp`.
    atomic_cmp_swp => wr_atomic_cmp_swp(u32, u64, u64, u64);
    /// `wr_atomic_fetch_add`.
    atomic_fetch_add => wr_atomic_fetch_add(u32, u64, u64);
    /// `wr_send_inv`.
    send_inv => wr_send_inv(u32);
    /// `wr_local_inv`.
    local_inv => wr_local_inv(u32);
    /// `wr_bind_mw`.
    bind_mw => wr_bind_mw(*mut ffi::ibv_mw, u32, *const ffi::ibv_mw_bind_info);
    /// `wr_set_ud_addr`.
    set_ud_addr => wr_set_ud_addr(*mut ffi::ibv_ah, u32, u32);
    /// `wr_set_sge`.
    set_sge => wr_set_sge(u32, u64, u32);
    /// `wr_set_sge_list`.
    set_sge_list => wr_set_sge_list(usize, *const ffi::ibv_sge);
    /// `wr_set_inline_data`.
    set_inline_data => wr_set_inline_data(*mut c_void, usize);
}

impl Drop for PostSendGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let (true, Some(ex)) = (self.count > 0, self.qp.ex) {
            // SAFETY: ex is live and inside the batch this guard started (count > 0) and
            // never completed (post() resets count); a request passed check(), so the
            // provider filled wr_abort (ExReady), and `abort` is its entry.
            unsafe { (self.qp.send.ex.abort)(ex.as_ptr()) };
        }
        // A classic batch lives only in the QP's storage: nothing to undo.
    }
}

/// A batch of receive work requests being built; from [`QueuePair::start_post_recv`].
/// [`post`](Self::post) posts them with one `ibv_post_recv`; dropping the guard discards
/// them.
#[doc(alias = "ibv_recv_wr")]
#[must_use = "receives reach the device only through post(); dropping the guard discards them"]
pub struct PostRecvGuard<'a> {
    qp: &'a mut QueuePair,
    count: usize,
    invalid: Option<(usize, u64, InvalidWorkRequest)>,
}

impl fmt::Debug for PostRecvGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostRecvGuard")
            .field("qp_num", &format_args!("{:#x}", self.qp.qp_num()))
            .field("count", &self.count)
            .field("invalid", &self.invalid)
            .finish()
    }
}

impl<'a> PostRecvGuard<'a> {
    #[inline]
    pub(super) fn new(qp: &'a mut QueuePair) -> Self {
        PostRecvGuard {
            qp,
            count: 0,
            invalid: None,
        }
    }

    /// Adds a receive work request (`struct ibv_recv_wr`) for up to the entries' total
    /// length, scattered over `sges` in order (empty for a receive that only takes immediate
    /// data). The entries are copied: the slice need not outlive the call.
    ///
    /// Returns the batch as a [`PostRecvChain`], to add the next receive or post in the
    /// same expression: `qp.start_post_recv().recv(1, &[sge]).post()?`.
    #[doc(alias = "ibv_recv_wr")]
    #[inline]
    pub fn recv(&mut self, wr_id: u64, sges: &[Sge]) -> PostRecvChain<'_, 'a> {
        if self.invalid.is_none() {
            match self.qp.recv.push(self.count, wr_id, sges, "recv") {
                Ok(()) => self.count += 1,
                Err(reason) => self.invalid = Some((self.count, wr_id, reason)),
            }
        }
        PostRecvChain { guard: self }
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Posts the batch with one `ibv_post_recv`. An empty batch posts nothing and succeeds.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post(mut self) -> Result<(), PostError> {
        self.post_batch()
    }

    /// What [`post`](Self::post) and [`PostRecvChain::post`] do: posts the batch and leaves
    /// the guard empty, whatever the outcome.
    #[inline(always)]
    fn post_batch(&mut self) -> Result<(), PostError> {
        if let Some((index, wr_id, reason)) = self.invalid.take() {
            self.count = 0;
            return Err(PostError::Invalid {
                qp_num: self.qp.qp_num(),
                index,
                wr_id,
                reason,
            });
        }
        let count = self.count;
        if count == 0 {
            return Ok(());
        }
        self.count = 0;
        let qp = self.qp.raw.as_ptr();
        // SAFETY: recv() pushed receives 0..count (count > 0) into this QP's storage, which
        // this guard has held since it was empty.
        let head = unsafe { self.qp.recv.finish(count) };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: qp is live; head is a NULL-terminated chain of count receives whose
        // sg_lists point into the storage (alive with the QP); the device checks every
        // SGE's lkey and bounds.
        let ret = unsafe { (self.qp.posts.post_recv)(qp, head, &mut bad) };
        // The QP number is read only for an error, after the call (as in the send post).
        from_post_ret(ret).map_err(|source| {
            let located = self.qp.recv.locate(bad, count);
            PostError::Post {
                call: "ibv_post_recv",
                qp_num: self.qp.qp_num(),
                count,
                index: located.map(|(i, _)| i),
                wr_id: located.map(|(_, id)| id),
                source,
            }
        })
    }
}

/// A receive batch after a receive was added to it: add the next one or post them all.
/// Returned by [`PostRecvGuard::recv`]; discarding it keeps the batch in the guard.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::RegisteredBuffer)
/// #     -> Result<(), sideway::PostError> {
/// // One expression: a guard, two receives, one ibv_post_recv.
/// qp.start_post_recv()
///     .recv(1, &[buf.sge(0..2048).unwrap()])
///     .recv(2, &[buf.sge(2048..4096).unwrap()])
///     .post()?;
/// // Or statement by statement.
/// let mut guard = qp.start_post_recv();
/// guard.recv(3, &[buf.sge(0..4096).unwrap()]);
/// guard.post()?;
/// # Ok(()) }
/// ```
pub struct PostRecvChain<'g, 'a> {
    guard: &'g mut PostRecvGuard<'a>,
}

impl fmt::Debug for PostRecvChain<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.guard, f)
    }
}

impl<'g, 'a> PostRecvChain<'g, 'a> {
    /// Adds the next receive, as [`PostRecvGuard::recv`].
    #[inline]
    pub fn recv(self, wr_id: u64, sges: &[Sge]) -> Self {
        self.guard.recv(wr_id, sges);
        self
    }

    /// Posts the batch with one `ibv_post_recv`, as [`PostRecvGuard::post`], and leaves the
    /// guard empty.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post(self) -> Result<(), PostError> {
        self.guard.post_batch()
    }

    /// How many receives the batch holds.
    pub fn len(&self) -> usize {
        self.guard.len()
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.guard.is_empty()
    }

    /// The guard, to go on with it by name.
    pub fn into_guard(self) -> &'g mut PostRecvGuard<'a> {
        self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_without_post_functions_refuses_every_post() {
        let mut wr = zeroed_send_wr();
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the stub touches only bad, a valid out-pointer.
        let ret = unsafe { post_unsupported(std::ptr::null_mut(), &mut wr, &mut bad) };
        assert_eq!((ret, bad), (libc::EOPNOTSUPP, &mut wr as *mut _));
        let mut rwr = ffi::ibv_recv_wr::default();
        let mut rbad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as above.
        let ret = unsafe { post_unsupported(std::ptr::null_mut(), &mut rwr, &mut rbad) };
        assert_eq!((ret, rbad), (libc::EOPNOTSUPP, &mut rwr as *mut _));
    }

    #[test]
    fn chain_index_finds_the_bad_request() {
        let arr = [0u64; 4];
        let base = arr.as_ptr();
        assert_eq!(chain_index(base, &arr[2], 4), Some(2));
        assert_eq!(chain_index(base, &arr[3], 3), None);
        assert_eq!(chain_index(base, std::ptr::null(), 4), None);
    }

    #[test]
    fn capacity_keeps_every_slot_and_its_entries_in_bounds() {
        assert_eq!(slots(4, 8, 2), 4);
        assert_eq!(slots(4, 6, 2), 3, "entries for three requests only");
        assert_eq!(
            slots(4, 0, 0),
            4,
            "no entries: every request is refused any data"
        );
        assert_eq!(slots(0, 0, 3), 0);
        let st = SendStorage::new(16, 3, 0, None);
        assert_eq!(st.capacity, 16);
        assert!(st.capacity <= st.wrs.len() && st.capacity * st.max_sge <= st.sges.len());
        let ex = SendStorage::new(16, 3, 64, Some(ExOps::none()));
        assert_eq!(
            (ex.capacity, ex.wrs.len(), ex.inline.len()),
            (usize::MAX, 0, 64)
        );
        let rs = RecvStorage::new(8, 2);
        assert_eq!(rs.capacity, 8);
        assert!(rs.capacity <= rs.wrs.len() && rs.capacity * rs.max_sge <= rs.sges.len());
    }

    extern "C" fn never_called() {}

    /// Marks a `qp_ex` function entry as set; the entry is only ever tested, never called.
    fn set<T>(entry: &mut Option<T>) {
        assert_eq!(
            std::mem::size_of::<Option<T>>(),
            std::mem::size_of::<usize>()
        );
        // SAFETY: entry is an Option of a function pointer (the size check above), for
        // which any non-zero address is a valid Some; probe() never calls it.
        unsafe {
            (entry as *mut Option<T>)
                .cast::<usize>()
                .write(never_called as *const () as usize)
        };
    }

    #[test]
    fn ex_ready_needs_the_batch_entries_the_operation_and_its_data() {
        // SAFETY: ibv_qp_ex is a C struct of integers, pointers and function pointers, all
        // valid when zero (NULL, None).
        let mut q: ffi::ibv_qp_ex = unsafe { MaybeUninit::zeroed().assume_init() };
        set(&mut q.wr_rdma_write);
        set(&mut q.wr_send);
        set(&mut q.wr_set_sge);
        let write = Op::Write { rkey: 0, addr: 0 };
        let sge = SendData::Empty;
        let all = SendOpsFlags::all();
        let probe = |q: &mut ffi::ibv_qp_ex, ops| {
            // SAFETY: q is a live (stack) ibv_qp_ex whose entries are tested, never called.
            unsafe { ExReady::probe(NonNull::from(q), ops) }
        };
        assert_eq!(
            probe(&mut q, all),
            ExReady(0),
            "no wr_start: nothing can be posted"
        );
        set(&mut q.wr_start);
        set(&mut q.wr_complete);
        set(&mut q.wr_abort);
        let ready = probe(&mut q, all);
        assert!(ready.allows(write, &sge, false));
        // SAFETY: the entry is only tested against the mask, never posted.
        let one = SendData::Sge(unsafe { Sge::from_raw_parts(0, 0, 0) });
        assert!(ready.allows(Op::Send, &one, false));
        assert!(
            !ready.allows(Op::Send, &SendData::Inline(b"x"), false),
            "no inline setter"
        );
        assert!(!ready.allows(Op::Send, &sge, true), "no ud_addr setter");
        assert!(!ready.allows(Op::Read { rkey: 0, addr: 0 }, &sge, false));
        let only_send = probe(&mut q, SendOpsFlags::SEND);
        assert!(
            !only_send.allows(write, &sge, false),
            "not in send_ops_flags"
        );
        assert!(only_send.allows(Op::Send, &sge, false));
    }

    /// The invariant the posting path relies on: whenever `ready` lets a request through,
    /// every function it calls (start, its operation, its data setter, complete, abort) is
    /// the provider's entry read at creation, never a stand-in (which would drop the
    /// request silently); and the stand-ins of missing entries are harmless.
    #[test]
    fn ex_ops_call_the_provider_s_entry_for_everything_ready_allows() {
        // SAFETY: as in ex_ready_needs_the_batch_entries_the_operation_and_its_data.
        let mut q: ffi::ibv_qp_ex = unsafe { MaybeUninit::zeroed().assume_init() };
        for entry in [&mut q.wr_start, &mut q.wr_abort, &mut q.wr_send] {
            set(entry);
        }
        set(&mut q.wr_complete);
        set(&mut q.wr_rdma_write);
        set(&mut q.wr_set_sge);
        set(&mut q.wr_set_inline_data);
        let provider = never_called as *const () as usize;
        // SAFETY: q is a live (stack) ibv_qp_ex whose entries are compared, never called.
        let ops = unsafe { ExOps::of(NonNull::from(&mut q), SendOpsFlags::all()) };
        let sge = SendData::Sge(
            // SAFETY: never posted.
            unsafe { Sge::from_raw_parts(0, 0, 0) },
        );
        let addr = |f: usize| f == provider;
        let write = Op::Write { rkey: 0, addr: 0 };
        let read = Op::Read { rkey: 0, addr: 0 };
        let cases: [(Op, &SendData<'_>, bool, usize); 6] = [
            (Op::Send, &SendData::Empty, true, ops.send as usize),
            (Op::Send, &sge, true, ops.send as usize),
            (write, &sge, true, ops.rdma_write as usize),
            (
                write,
                &SendData::Inline(b"x"),
                true,
                ops.rdma_write as usize,
            ),
            (read, &sge, false, ops.rdma_read as usize),
            (Op::SendInv(0), &sge, false, ops.send_inv as usize),
        ];
        for (op, data, allowed, entry) in cases {
            assert_eq!(ops.ready.allows(op, data, false), allowed, "{}", op.name());
            if allowed {
                assert!(addr(entry), "{}: not the provider's entry", op.name());
                let setter = match data {
                    SendData::Empty => provider,
                    SendData::Sge(_) => ops.set_sge as usize,
                    _ => ops.set_inline_data as usize,
                };
                assert!(addr(setter), "{}: its data setter", op.name());
            } else {
                assert!(!addr(entry), "{}: a stand-in", op.name());
            }
        }
        for batch in [
            ops.start as usize,
            ops.complete as usize,
            ops.abort as usize,
        ] {
            assert!(addr(batch));
        }
        // A classic QP's: nothing allowed; its stand-ins do nothing, complete refuses.
        let none = ExOps::none();
        assert_eq!(none.ready, ExReady::default());
        // SAFETY: the stand-ins touch nothing, not even the QP pointer.
        unsafe {
            (none.start)(std::ptr::null_mut());
            (none.rdma_write)(std::ptr::null_mut(), 1, 2);
            assert_eq!((none.complete)(std::ptr::null_mut()), libc::EOPNOTSUPP);
        }
    }

    #[test]
    fn data_kinds_and_inline_limits() {
        let bytes = [1u8; 10];
        let two: [&[u8]; 2] = [&bytes[..4], &bytes[4..]];
        let d: SendData<'_> = (&two[..]).into();
        assert!(d.is_inline());
        assert_eq!((d.entries(), d.inline_len()), (2, 10));
        let d: SendData<'_> = (&bytes).into();
        assert_eq!((d.entries(), d.inline_len()), (1, 10));
        assert!(!SendData::Empty.is_inline());
        assert!(!Op::Read { rkey: 0, addr: 0 }.allows_inline());
        assert!(Op::WriteImm {
            rkey: 0,
            addr: 0,
            imm: 1
        }
        .allows_inline());
    }

    #[test]
    fn transports_refuse_what_they_cannot_carry() {
        let read = Op::Read { rkey: 0, addr: 0 };
        let write = Op::Write { rkey: 0, addr: 0 };
        assert!(read.refused_by(QpType::Uc).is_some());
        assert!(write.refused_by(QpType::Uc).is_none());
        assert!(Op::SendImm(1).refused_by(QpType::Uc).is_none());
        assert!(write.refused_by(QpType::Ud).is_some());
        assert!(Op::Send.refused_by(QpType::Ud).is_none());
        assert!(read.refused_by(QpType::Rc).is_none());
        let e = InvalidWorkRequest::NotForQpType {
            op: read.name(),
            qp_type: QpType::Uc,
            allowed: read.refused_by(QpType::Uc).unwrap(),
        };
        assert!(
            e.to_string()
                .starts_with("RDMA READ is not available on a UC QP (SEND and RDMA WRITE"),
            "{e}"
        );
    }

    #[test]
    fn post_errors_name_the_failed_request() {
        let e = PostError::Post {
            call: "ibv_post_send",
            qp_num: 0x11,
            count: 8,
            index: Some(3),
            wr_id: Some(42),
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "ibv_post_send failed on QP 0x11 at work request 3 (wr_id 42) of 8; the 3 \
                 before it were posted: "
            ),
            "{text}"
        );
        let e = PostError::Invalid {
            qp_num: 0x11,
            index: 1,
            wr_id: 7,
            reason: InvalidWorkRequest::InlineTooLong { len: 100, max: 64 },
        };
        assert!(e.to_string().contains("100 bytes of inline data"), "{e}");
    }
}
