//! The vocabulary and storage of posting: send flags, why a request or a batch is refused,
//! the provider's post functions read once, the arrays a classic QP's send batches are
//! written into, and the extended QP's `ibv_wr_*` entries. Below the queue pair, which owns
//! them; the guards of `send.rs` and the receive side use them.

use std::io;
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use super::attr::QpType;
use crate::receive_batch::{slots, RecvRefusal};
use crate::scatter_gather::SendData;
use crate::verbs::memory_region::AccessFlags;

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

bitflags! {
    /// The operations an extended QP may post (`ibv_qp_create_send_ops_flags`).
    #[doc(alias = "ibv_qp_create_send_ops_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SendOpsFlags: u64 {
        /// `IBV_QP_EX_WITH_RDMA_WRITE`
        const RDMA_WRITE = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE as u64;
        /// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`
        const RDMA_WRITE_WITH_IMM = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as u64;
        /// `IBV_QP_EX_WITH_SEND`
        const SEND = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND as u64;
        /// `IBV_QP_EX_WITH_SEND_WITH_IMM`
        const SEND_WITH_IMM = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM as u64;
        /// `IBV_QP_EX_WITH_RDMA_READ`
        const RDMA_READ = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`
        const ATOMIC_CMP_AND_SWP = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`
        const ATOMIC_FETCH_AND_ADD = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as u64;
        /// `IBV_QP_EX_WITH_LOCAL_INV`
        const LOCAL_INV = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV as u64;
        /// `IBV_QP_EX_WITH_BIND_MW`
        const BIND_MW = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_BIND_MW as u64;
        /// `IBV_QP_EX_WITH_SEND_WITH_INV`
        const SEND_WITH_INV = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV as u64;
        /// `IBV_QP_EX_WITH_TSO`
        const TSO = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_TSO as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_WRITE`
        const ATOMIC_WRITE = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_WRITE as u64;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

impl Default for SendOpsFlags {
    /// Every operation [`PostSendGuard`](crate::queue_pair::PostSendGuard) can post: sends and
    /// writes with and without immediate data, RDMA READ, and both atomics.
    fn default() -> Self {
        SendOpsFlags::RDMA_WRITE
            | SendOpsFlags::RDMA_WRITE_WITH_IMM
            | SendOpsFlags::SEND
            | SendOpsFlags::SEND_WITH_IMM
            | SendOpsFlags::RDMA_READ
            | SendOpsFlags::ATOMIC_CMP_AND_SWP
            | SendOpsFlags::ATOMIC_FETCH_AND_ADD
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
    /// A send on an XRC send QP needs the remote SRQ: call `xrc_remote_srqn` on the work
    /// request.
    #[error("a send on an XRC send QP needs xrc_remote_srqn(the peer's XRC SRQ number)")]
    MissingXrcSrqn,
    /// `xrc_remote_srqn` was given on a QP that is not an XRC send QP.
    #[error("xrc_remote_srqn is for XRC send QPs; this one is {qp_type}")]
    XrcSrqnOnOtherQp {
        /// The QP's type.
        qp_type: QpType,
    },
    /// A memory window bind asked for access its region does not allow: see
    /// [`bind_access_missing`](crate::memory_window::bind_access_missing).
    #[error("a memory window bind with {access:?} to a region registered with {region_access:?}: the region lacks {missing:?} ({})",
        crate::verbs::memory_window::BIND_ACCESS_RULE)]
    BindAccess {
        /// The window access asked for.
        access: AccessFlags,
        /// The region's access, as registered.
        region_access: AccessFlags,
        /// What the region lacks.
        missing: AccessFlags,
    },
}

impl InvalidWorkRequest {
    /// A receive batch's refusal, for the queue named `queue` (`recv` or `srq`).
    #[cold]
    pub(crate) fn from_refusal(why: RecvRefusal, queue: &'static str) -> Self {
        match why {
            RecvRefusal::BatchFull { capacity } => batch_full(capacity, queue),
            RecvRefusal::TooManySge { given, max } => {
                InvalidWorkRequest::TooManySge { given, max, queue }
            }
        }
    }
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

pub(crate) fn which_failed(index: Option<usize>, wr_id: Option<u64>, count: usize) -> String {
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
pub(super) enum Op {
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
pub(super) struct UdAddr {
    pub(super) ah: *mut ffi::ibv_ah,
    pub(super) remote_qpn: u32,
    pub(super) remote_qkey: u32,
}

/// Where one request goes beyond the QP's connection: a UD destination, the remote SRQ of an
/// XRC send, or nothing more (connected QPs).
#[derive(Clone, Copy)]
pub(super) enum Dest {
    None,
    Ud(UdAddr),
    Xrc(u32),
}

impl Dest {
    /// Which kind of destination this is: what [`dest_kind`] says a QP type needs.
    #[inline(always)]
    pub(super) fn kind(&self) -> u8 {
        match self {
            Dest::None => 0,
            Dest::Ud(_) => 1,
            Dest::Xrc(_) => 2,
        }
    }

    /// The [`ExReady`] bit of this destination's setter (`wr_set_ud_addr`,
    /// `wr_set_xrc_srqn`), or 0.
    #[inline(always)]
    pub(super) fn ready_bit(&self) -> u64 {
        match self {
            Dest::None => 0,
            Dest::Ud(_) => ExReady::UD_ADDR,
            Dest::Xrc(_) => ExReady::XRC_SRQN,
        }
    }
}

/// The kind of [`Dest`] every request of a `qp_type` QP carries: one compare per request
/// then checks it.
pub(super) fn dest_kind(qp_type: QpType) -> u8 {
    match qp_type {
        QpType::Ud => 1,
        QpType::XrcSend => 2,
        _ => 0,
    }
}

/// The operations a QP of `qp_type` allows ([`Op::refused_by`] of none of them), worked out
/// once when the QP is wrapped so that each request is checked with one mask test.
pub(super) fn allowed_ops(qp_type: QpType) -> SendOpsFlags {
    // SAFETY: ibv_mw_bind_info is a C struct of integers and a pointer, for all of which
    // all-zero bits are valid; the value is only matched on, never passed to C.
    let info = unsafe { MaybeUninit::<ffi::ibv_mw_bind_info>::zeroed().assume_init() };
    let every = [
        Op::Send,
        Op::SendImm(0),
        Op::Write { rkey: 0, addr: 0 },
        Op::WriteImm {
            rkey: 0,
            addr: 0,
            imm: 0,
        },
        Op::Read { rkey: 0, addr: 0 },
        Op::CmpSwp {
            rkey: 0,
            addr: 0,
            compare: 0,
            swap: 0,
        },
        Op::FetchAdd {
            rkey: 0,
            addr: 0,
            add: 0,
        },
        Op::SendInv(0),
        Op::LocalInv(0),
        Op::BindMw {
            mw: std::ptr::null_mut(),
            rkey: 0,
            info,
        },
    ];
    every
        .into_iter()
        .filter(|op| op.refused_by(qp_type).is_none())
        .fold(SendOpsFlags::empty(), |all, op| all | op.send_ops_flag())
}

/// Why `op` is not for a QP of `qp_type`; the slow path only.
#[cold]
pub(super) fn not_for_qp_type(op: Op, qp_type: QpType) -> InvalidWorkRequest {
    InvalidWorkRequest::NotForQpType {
        op: op.name(),
        qp_type,
        allowed: op
            .refused_by(qp_type)
            .unwrap_or("(internal error: the allowed set disagrees with the type)"),
    }
}

/// Why a request's destination does not fit its QP (kinds as [`Dest::kind`]); the slow path
/// only.
#[cold]
pub(super) fn dest_mismatch(qp_type: QpType, given: u8) -> InvalidWorkRequest {
    match (dest_kind(qp_type), given) {
        (1, _) => InvalidWorkRequest::MissingUdAddress,
        (2, 0) => InvalidWorkRequest::MissingXrcSrqn,
        (_, 1) => InvalidWorkRequest::UdAddressOnConnectedQp { qp_type },
        _ => InvalidWorkRequest::XrcSrqnOnOtherQp { qp_type },
    }
}

impl Op {
    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn allows_inline(self) -> bool {
        matches!(
            self,
            Op::Send | Op::SendImm(_) | Op::Write { .. } | Op::WriteImm { .. }
        )
    }

    #[inline]
    pub(super) fn send_ops_flag(self) -> SendOpsFlags {
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
    pub(super) fn opcode(self) -> ffi::ibv_wr_opcode::Type {
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
    pub(super) fn refused_by(self, qp_type: QpType) -> Option<&'static str> {
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
            QpType::Rc | QpType::XrcSend | QpType::RawPacket => None,
            // A DC initiator's requests need a DC address, which only its provider's guard
            // can give (`dv::mlx5::DcInitiator`).
            QpType::Driver => Some("none: post through its provider's guard in sideway::dv"),
            // A type this crate does not know (from a newer rdma-core) may need a destination
            // the guard cannot name, which the provider would read anyway: refuse, never guess.
            _ => Some("none: this crate does not know what its requests must carry"),
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

/// `wrs` and `sges` are `Vec`s for the reason [`RecvStorage`](crate::receive_batch::RecvStorage)'s
/// are: the `next` and `sg_list` pointers stored in them stay valid while later requests are
/// written.
pub(super) struct SendStorage {
    pub(super) wrs: Vec<ffi::ibv_send_wr>,
    /// `max_sge` entries per request, request `i` at `i * max_sge`.
    pub(super) sges: Vec<ffi::ibv_sge>,
    /// An extended QP's inline-list scratch (`max_inline_data` bytes): a list is gathered
    /// here and set with one `ibv_wr_set_inline_data`, because rxe's
    /// `ibv_wr_set_inline_data_list` (rdma-core 56 and older) reports a length of 0.
    /// Providers copy inline data when it is set, so one scratch serves the whole batch.
    pub(super) inline: Box<[u8]>,
    pub(super) max_sge: usize,
    /// The requests one batch may hold: `wrs.len()` on a classic QP, and `capacity *
    /// max_sge <= sges.len()`, so a request's slot and entries are in bounds whenever its
    /// index is below it. Unlimited on an extended QP (the provider holds the batch).
    pub(super) capacity: usize,
    /// What an extended QP can post, and the provider functions it posts with (on a
    /// classic QP: nothing, and functions that are never called).
    pub(super) ex: ExOps,
    /// The [`Dest`] kind every request needs ([`dest_kind`] of the QP's type).
    pub(super) dest_kind: u8,
    /// The operations the QP's type allows ([`allowed_ops`]).
    pub(super) allowed: SendOpsFlags,
}

#[inline]
pub(super) fn zeroed_send_wr() -> ffi::ibv_send_wr {
    // SAFETY: ibv_send_wr is a C struct of integers, raw pointers and unions of those, for
    // all of which the all-zero bit pattern is valid (NULL pointers, zero values).
    unsafe { MaybeUninit::<ffi::ibv_send_wr>::zeroed().assume_init() }
}

impl SendStorage {
    /// Storage for a classic QP's batches, or for an extended QP's (`ex` given), of type
    /// `qp_type`.
    pub(super) fn new(
        qp_type: QpType,
        max_wr: u32,
        max_sge: u32,
        max_inline: u32,
        ex: Option<ExOps>,
    ) -> Self {
        let max_wr = max_wr as usize;
        let max_sge = max_sge as usize;
        let dest_kind = dest_kind(qp_type);
        let allowed = allowed_ops(qp_type);
        if let Some(ex) = ex {
            return SendStorage {
                wrs: Vec::new(),
                sges: Vec::new(),
                inline: vec![0; max_inline as usize].into_boxed_slice(),
                max_sge,
                capacity: usize::MAX,
                ex,
                dest_kind,
                allowed,
            };
        }
        let wrs = vec![zeroed_send_wr(); max_wr];
        let sges = vec![ffi::ibv_sge::default(); max_wr.saturating_mul(max_sge)];
        SendStorage {
            capacity: slots(wrs.len(), sges.len(), max_sge),
            wrs,
            sges,
            inline: Box::new([]),
            max_sge,
            ex: ExOps::none(),
            dest_kind,
            allowed,
        }
    }
}

/// The error of a request that finds its batch's storage full; the slow path only.
#[cold]
pub(super) fn batch_full(capacity: usize, queue: &'static str) -> InvalidWorkRequest {
    InvalidWorkRequest::BatchFull { capacity, queue }
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
    pub(super) const UD_ADDR: u64 = 1 << 63;
    pub(super) const XRC_SRQN: u64 = 1 << 59;

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
            (Self::XRC_SRQN, q.wr_set_xrc_srqn.is_some()),
        ] {
            if set {
                ready |= bit;
            }
        }
        ExReady(ready)
    }

    /// Whether a request of `op` with `data` (and the destination setter `dest_need`, one of
    /// [`UD_ADDR`](Self::UD_ADDR), [`XRC_SRQN`](Self::XRC_SRQN) or 0) can be posted.
    #[inline(always)]
    pub(super) fn allows(self, op: Op, data: &SendData<'_>, dest_need: u64) -> bool {
        let data_bit = match data {
            SendData::Empty => 0,
            SendData::Sge(_) => Self::SGE,
            SendData::SgeList(_) => Self::SGE_LIST,
            SendData::Inline(_) | SendData::InlineList(_) | SendData::InlineBuffer(_) => {
                Self::INLINE
            }
        };
        let need = op.send_ops_flag().bits() | data_bit | dest_need;
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
    /// `wr_set_xrc_srqn`.
    set_xrc_srqn => wr_set_xrc_srqn(u32);
    /// `wr_set_sge`.
    set_sge => wr_set_sge(u32, u64, u32);
    /// `wr_set_sge_list`.
    set_sge_list => wr_set_sge_list(usize, *const ffi::ibv_sge);
    /// `wr_set_inline_data`.
    set_inline_data => wr_set_inline_data(*mut c_void, usize);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scatter_gather::Sge;

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
    fn a_destination_that_does_not_fit_its_qp_is_named() {
        let ud = Dest::Ud(UdAddr {
            ah: std::ptr::null_mut(),
            remote_qpn: 1,
            remote_qkey: 2,
        });
        for (qp_type, dest, want) in [
            (QpType::Ud, Dest::None, InvalidWorkRequest::MissingUdAddress),
            (
                QpType::Ud,
                Dest::Xrc(5),
                InvalidWorkRequest::MissingUdAddress,
            ),
            (
                QpType::XrcSend,
                Dest::None,
                InvalidWorkRequest::MissingXrcSrqn,
            ),
            (
                QpType::XrcSend,
                ud,
                InvalidWorkRequest::UdAddressOnConnectedQp {
                    qp_type: QpType::XrcSend,
                },
            ),
            (
                QpType::Rc,
                ud,
                InvalidWorkRequest::UdAddressOnConnectedQp {
                    qp_type: QpType::Rc,
                },
            ),
            (
                QpType::Uc,
                Dest::Xrc(5),
                InvalidWorkRequest::XrcSrqnOnOtherQp {
                    qp_type: QpType::Uc,
                },
            ),
        ] {
            assert_ne!(dest.kind(), dest_kind(qp_type));
            assert_eq!(dest_mismatch(qp_type, dest.kind()), want);
        }
        for (qp_type, dest) in [
            (QpType::Rc, Dest::None),
            (QpType::Ud, ud),
            (QpType::XrcSend, Dest::Xrc(5)),
        ] {
            assert_eq!(dest.kind(), dest_kind(qp_type), "{qp_type}");
        }
        assert_eq!(Dest::Xrc(5).ready_bit(), ExReady::XRC_SRQN);
        assert_eq!(ud.ready_bit(), ExReady::UD_ADDR);
        assert_eq!(Dest::None.ready_bit(), 0);
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
        let st = SendStorage::new(QpType::Rc, 16, 3, 0, None);
        assert_eq!(st.capacity, 16);
        assert!(st.capacity <= st.wrs.len() && st.capacity * st.max_sge <= st.sges.len());
        let ex = SendStorage::new(QpType::Rc, 16, 3, 64, Some(ExOps::none()));
        assert_eq!(
            (ex.capacity, ex.wrs.len(), ex.inline.len()),
            (usize::MAX, 0, 64)
        );
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
        assert!(ready.allows(write, &sge, 0));
        // SAFETY: the entry is only tested against the mask, never posted.
        let one = SendData::Sge(unsafe { Sge::from_raw_parts(0, 0, 0) });
        assert!(ready.allows(Op::Send, &one, 0));
        assert!(
            !ready.allows(Op::Send, &SendData::Inline(b"x"), 0),
            "no inline setter"
        );
        assert!(
            !ready.allows(Op::Send, &sge, ExReady::UD_ADDR),
            "no ud_addr setter"
        );
        assert!(!ready.allows(Op::Read { rkey: 0, addr: 0 }, &sge, 0));
        let only_send = probe(&mut q, SendOpsFlags::SEND);
        assert!(!only_send.allows(write, &sge, 0), "not in send_ops_flags");
        assert!(only_send.allows(Op::Send, &sge, 0));
    }

    /// The invariant the posting path relies on: whenever `ready` lets a request through,
    /// every function it calls (start, its operation, its data setter, complete, abort) is
    /// the provider's entry read at creation, never a stand-in (which would drop the
    /// request silently); and the stand-ins of missing entries are harmless.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "compares function pointers for equality, which Rust does not promise and Miri deliberately breaks"
    )]
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
            assert_eq!(ops.ready.allows(op, data, 0), allowed, "{}", op.name());
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
        // The mask the guard tests per request says the same as refused_by.
        assert_eq!(
            allowed_ops(QpType::Ud),
            SendOpsFlags::SEND | SendOpsFlags::SEND_WITH_IMM
        );
        assert!(allowed_ops(QpType::Rc).contains(read.send_ops_flag()));
        assert!(!allowed_ops(QpType::Uc).contains(read.send_ops_flag()));
        assert_eq!(allowed_ops(QpType::Driver), SendOpsFlags::empty());
        assert_eq!(allowed_ops(QpType::from(77)), SendOpsFlags::empty());
        // What the guard cannot address it refuses whole: a DC initiator (its provider's
        // guard carries the DC address) and any type this crate does not know.
        let ops = [Op::Send, Op::SendImm(1), write, read, Op::LocalInv(1)];
        for qp_type in [QpType::Driver, QpType::from(77), QpType::from(u32::MAX)] {
            for op in ops {
                assert!(
                    op.refused_by(qp_type).is_some(),
                    "{} on {qp_type}",
                    op.name()
                );
            }
        }
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
