//! The data-path static inlines of verbs.h, as Rust `#[inline]` functions.
//!
//! verbs.h implements posting, polling and the extended work-request and completion
//! interfaces as one-line static inlines that call a function pointer the provider stored in
//! the object (`qp->context->ops.post_send`, `qp_ex->wr_rdma_write`, `cq_ex->start_poll`).
//! bindgen cannot bind static inlines, and routing them through the C shim would add a call
//! per work request, so each is written here with the same body: read the provider's pointer,
//! call it with the same arguments, return what it returns.
//!
//! Where C would call a NULL pointer (a provider that does not implement the operation) these
//! functions do not jump to address zero: the ones that return an error number return
//! `EOPNOTSUPP` (negated for `ibv_poll_cq`, whose errors are negative), the reads return 0,
//! and the `void` ones do nothing. The safety contracts below exclude that case anyway (an
//! extended QP provides exactly the operations requested in `send_ops_flags`), so callers
//! that keep them see verbs.h's behaviour.

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::{
    __be32, ibv_ah, ibv_cq, ibv_cq_ex, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_poll_cq_attr,
    ibv_qp, ibv_qp_ex, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc, ibv_wc_opcode,
    ibv_wc_tm_info, ibv_wq, EOPNOTSUPP,
};

/// The error number a missing provider operation reports (`EOPNOTSUPP` fits in `c_int`).
const NOT_SUPPORTED: c_int = EOPNOTSUPP as c_int;

/// Posts a chain of send work requests to a QP: `qp->context->ops.post_send(qp, wr, bad_wr)`.
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request not posted.
///
/// # Safety
///
/// `qp` must point to a live QP whose context is open; `wr` must head a valid,
/// NULL-terminated chain whose scatter/gather entries name registered memory that stays
/// valid until the requests complete (inline data only until this returns); `bad_wr` must be
/// valid for a write.
#[inline]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees qp and its context are live, so the provider's ops table
    // can be read, and that the arguments are what post_send requires.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(post_send) => post_send(qp, wr, bad_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Posts a chain of receive work requests to a QP: `qp->context->ops.post_recv(qp, wr, bad_wr)`.
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request not posted.
///
/// # Safety
///
/// `qp` must point to a live QP whose context is open; `wr` must head a valid,
/// NULL-terminated chain whose buffers are registered and stay valid until the requests
/// complete; `bad_wr` must be valid for a write.
#[inline]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees qp and its context are live and the arguments valid.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(post_recv) => post_recv(qp, wr, bad_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Posts receive work requests to a shared receive queue:
/// `srq->context->ops.post_srq_recv(srq, recv_wr, bad_recv_wr)`.
///
/// Returns 0, or an errno value with `*bad_recv_wr` set to the first request not posted.
///
/// # Safety
///
/// `srq` must point to a live SRQ whose context is open; `recv_wr` must head a valid,
/// NULL-terminated chain whose buffers are registered and stay valid until the requests
/// complete; `bad_recv_wr` must be valid for a write.
#[inline]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees srq and its context are live and the arguments valid.
    unsafe {
        match (*(*srq).context).ops.post_srq_recv {
            Some(post_srq_recv) => post_srq_recv(srq, recv_wr, bad_recv_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Posts receive work requests to a work queue: `wq->post_recv(wq, recv_wr, bad_recv_wr)`.
///
/// Returns 0, or an errno value with `*bad_recv_wr` set to the first request not posted.
///
/// # Safety
///
/// `wq` must point to a live WQ; `recv_wr` must head a valid, NULL-terminated chain whose
/// buffers are registered and stay valid until the requests complete; `bad_recv_wr` must be
/// valid for a write.
#[inline]
pub unsafe fn ibv_post_wq_recv(
    wq: *mut ibv_wq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees wq is live and the arguments valid.
    unsafe {
        match (*wq).post_recv {
            Some(post_recv) => post_recv(wq, recv_wr, bad_recv_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Polls a CQ for up to `num_entries` completions:
/// `cq->context->ops.poll_cq(cq, num_entries, wc)`.
///
/// Returns the number of completions written to `wc` (0 when the CQ is empty), or a negative
/// value on error.
///
/// # Safety
///
/// `cq` must point to a live CQ whose context is open, and `wc` must be valid for writing
/// `num_entries` entries.
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller guarantees cq and its context are live and wc large enough.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(poll_cq) => poll_cq(cq, num_entries, wc),
            None => -NOT_SUPPORTED,
        }
    }
}

/// Requests a completion event on the CQ's channel for the next (solicited, when
/// `solicited_only` is non-zero) completion: `cq->context->ops.req_notify_cq(cq, solicited_only)`.
///
/// Returns 0, or an errno value.
///
/// # Safety
///
/// `cq` must point to a live CQ whose context is open.
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller guarantees cq and its context are live.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(req_notify_cq) => req_notify_cq(cq, solicited_only),
            None => NOT_SUPPORTED,
        }
    }
}

/// Defines the `ibv_wr_*` functions whose verbs.h body is `qp->wr_<op>(qp, args...)`.
macro_rules! qp_ex_ops {
    ($(
        $(#[$doc:meta])*
        fn $name:ident => $field:ident($($arg:ident: $ty:ty),*);
    )*) => {$(
        $(#[$doc])*
        #[doc = concat!("\n\nCalls the provider's `qp->", stringify!($field), "`, as verbs.h does.")]
        ///
        /// # Safety
        ///
        /// `qp` must point to the live extended QP (`ibv_qp_to_qp_ex`) of a QP created with
        /// this operation in `send_ops_flags` (or, for `ibv_wr_start`, `ibv_wr_complete` and
        /// `ibv_wr_abort`, any such QP), and the call must respect the batch order:
        /// `ibv_wr_start`, then for each request an opcode call followed by its setters, then
        /// `ibv_wr_complete` or `ibv_wr_abort`, with no other thread using the QP's send
        /// queue in between. Pointers passed on must be valid as the verb requires; memory an
        /// SGE names must be registered and stay valid until the request completes.
        #[inline]
        pub unsafe fn $name(qp: *mut ibv_qp_ex, $($arg: $ty),*) {
            // SAFETY: the caller guarantees qp is a live extended QP, so its provider-filled
            // operation table can be read, and that this call is valid at this point of the
            // batch with these arguments.
            unsafe {
                if let Some(op) = (*qp).$field {
                    op(qp, $($arg),*)
                }
            }
        }
    )*};
}

qp_ex_ops! {
    /// Adds an atomic compare-and-swap work request to the batch.
    fn ibv_wr_atomic_cmp_swp => wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64);
    /// Adds an atomic fetch-and-add work request to the batch.
    fn ibv_wr_atomic_fetch_add => wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64);
    /// Adds a memory-window bind work request to the batch.
    fn ibv_wr_bind_mw => wr_bind_mw(mw: *mut ibv_mw, rkey: u32, bind_info: *const ibv_mw_bind_info);
    /// Adds a local-invalidate work request to the batch.
    fn ibv_wr_local_inv => wr_local_inv(invalidate_rkey: u32);
    /// Adds an RDMA READ work request to the batch.
    fn ibv_wr_rdma_read => wr_rdma_read(rkey: u32, remote_addr: u64);
    /// Adds an RDMA WRITE work request to the batch.
    fn ibv_wr_rdma_write => wr_rdma_write(rkey: u32, remote_addr: u64);
    /// Adds an RDMA WRITE with immediate data work request to the batch.
    fn ibv_wr_rdma_write_imm => wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: __be32);
    /// Adds a SEND work request to the batch.
    fn ibv_wr_send => wr_send();
    /// Adds a SEND with immediate data work request to the batch.
    fn ibv_wr_send_imm => wr_send_imm(imm_data: __be32);
    /// Adds a SEND with invalidate work request to the batch.
    fn ibv_wr_send_inv => wr_send_inv(invalidate_rkey: u32);
    /// Adds a TSO (large send offload) SEND work request to the batch.
    fn ibv_wr_send_tso => wr_send_tso(hdr: *mut c_void, hdr_sz: u16, mss: u16);
    /// Sets the address handle and remote QP of the current UD work request.
    fn ibv_wr_set_ud_addr => wr_set_ud_addr(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32);
    /// Sets the remote SRQ number of the current XRC work request.
    fn ibv_wr_set_xrc_srqn => wr_set_xrc_srqn(remote_srqn: u32);
    /// Copies `length` bytes at `addr` inline into the current work request.
    fn ibv_wr_set_inline_data => wr_set_inline_data(addr: *mut c_void, length: usize);
    /// Copies a list of buffers inline into the current work request.
    fn ibv_wr_set_inline_data_list => wr_set_inline_data_list(num_buf: usize, buf_list: *const ibv_data_buf);
    /// Sets the single scatter/gather entry of the current work request.
    fn ibv_wr_set_sge => wr_set_sge(lkey: u32, addr: u64, length: u32);
    /// Sets the scatter/gather list of the current work request.
    fn ibv_wr_set_sge_list => wr_set_sge_list(num_sge: usize, sg_list: *const ibv_sge);
    /// Starts a batch of work requests on the extended QP.
    fn ibv_wr_start => wr_start();
    /// Drops the work requests added since `ibv_wr_start`.
    fn ibv_wr_abort => wr_abort();
    /// Adds an atomic write work request (8 bytes at `atomic_wr`) to the batch.
    fn ibv_wr_atomic_write => wr_atomic_write(rkey: u32, remote_addr: u64, atomic_wr: *const c_void);
}

/// Posts the batch built since `ibv_wr_start` and rings the doorbell once:
/// `qp->wr_complete(qp)`.
///
/// Returns 0, or an errno value, in which case no request of the batch was posted.
///
/// # Safety
///
/// `qp` must point to a live extended QP inside a batch opened by `ibv_wr_start`, with every
/// request of the batch fully described.
#[inline]
pub unsafe fn ibv_wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the caller guarantees qp is a live extended QP inside a batch.
    unsafe {
        match (*qp).wr_complete {
            Some(wr_complete) => wr_complete(qp),
            None => NOT_SUPPORTED,
        }
    }
}

/// Starts polling an extended CQ: `cq->start_poll(cq, attr)`.
///
/// Returns 0 when a completion is available (read it with the `ibv_wc_read_*` functions and
/// `cq.status`/`cq.wr_id`), `ENOENT` when the CQ is empty (and then `ibv_end_poll` must not
/// be called), or another errno value.
///
/// # Safety
///
/// `cq` must point to a live extended CQ not being polled by another thread, and `attr` to a
/// valid `ibv_poll_cq_attr` (its `comp_mask` 0).
#[inline]
pub unsafe fn ibv_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller guarantees cq is a live extended CQ that it polls exclusively.
    unsafe {
        match (*cq).start_poll {
            Some(start_poll) => start_poll(cq, attr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Moves to the next completion of a poll started by `ibv_start_poll`: `cq->next_poll(cq)`.
///
/// Returns 0 when one is available, `ENOENT` when the CQ is drained, or another errno value.
///
/// # Safety
///
/// `cq` must point to a live extended CQ on which `ibv_start_poll` returned 0 and
/// `ibv_end_poll` has not been called since.
#[inline]
pub unsafe fn ibv_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller guarantees cq is a live extended CQ inside a poll.
    unsafe {
        match (*cq).next_poll {
            Some(next_poll) => next_poll(cq),
            None => NOT_SUPPORTED,
        }
    }
}

/// Ends a poll started by a successful `ibv_start_poll`: `cq->end_poll(cq)`.
///
/// # Safety
///
/// `cq` must point to a live extended CQ on which `ibv_start_poll` returned 0 and
/// `ibv_end_poll` has not been called since.
#[inline]
pub unsafe fn ibv_end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller guarantees cq is a live extended CQ inside a poll.
    unsafe {
        if let Some(end_poll) = (*cq).end_poll {
            end_poll(cq)
        }
    }
}

/// Defines the `ibv_wc_read_*` functions whose verbs.h body is `return cq->read_<x>(cq)`.
macro_rules! cq_ex_reads {
    ($(
        $(#[$doc:meta])*
        fn $name:ident => $field:ident -> $ret:ty;
    )*) => {$(
        $(#[$doc])*
        #[doc = concat!("\n\nCalls the provider's `cq->", stringify!($field), "`, as verbs.h does.")]
        ///
        /// # Safety
        ///
        /// `cq` must point to a live extended CQ created with the matching `wc_flags` bit,
        /// positioned on a completion (`ibv_start_poll` or `ibv_next_poll` returned 0 and
        /// `ibv_end_poll` has not been called since).
        #[inline]
        pub unsafe fn $name(cq: *mut ibv_cq_ex) -> $ret {
            // SAFETY: the caller guarantees cq is a live extended CQ positioned on a
            // completion, so its provider-filled reader can be called.
            unsafe {
                match (*cq).$field {
                    Some(read) => read(cq),
                    None => 0,
                }
            }
        }
    )*};
}

cq_ex_reads! {
    /// The opcode of the current completion (an `ibv_wc_opcode` value).
    fn ibv_wc_read_opcode => read_opcode -> ibv_wc_opcode::Type;
    /// The vendor error syndrome of the current (failed) completion.
    fn ibv_wc_read_vendor_err => read_vendor_err -> u32;
    /// The number of bytes transferred by the current completion.
    fn ibv_wc_read_byte_len => read_byte_len -> u32;
    /// The immediate data (network byte order) of the current completion.
    fn ibv_wc_read_imm_data => read_imm_data -> __be32;
    /// The local QP number of the current completion.
    fn ibv_wc_read_qp_num => read_qp_num -> u32;
    /// The remote QP number of the current (UD) completion.
    fn ibv_wc_read_src_qp => read_src_qp -> u32;
    /// The `ibv_wc_flags` of the current completion.
    fn ibv_wc_read_wc_flags => read_wc_flags -> c_uint;
    /// The source LID of the current completion.
    fn ibv_wc_read_slid => read_slid -> u32;
    /// The service level of the current completion.
    fn ibv_wc_read_sl => read_sl -> u8;
    /// The destination LID path bits of the current completion.
    fn ibv_wc_read_dlid_path_bits => read_dlid_path_bits -> u8;
    /// The device timestamp of the current completion.
    fn ibv_wc_read_completion_ts => read_completion_ts -> u64;
    /// The wall-clock timestamp (ns) of the current completion.
    fn ibv_wc_read_completion_wallclock_ns => read_completion_wallclock_ns -> u64;
    /// The CVLAN of the current completion.
    fn ibv_wc_read_cvlan => read_cvlan -> u16;
    /// The flow tag of the current completion.
    fn ibv_wc_read_flow_tag => read_flow_tag -> u32;
}

/// The rkey invalidated by the current completion (a SEND with invalidate).
///
/// verbs.h reads it through `cq->read_imm_data(cq)`, the field it shares with the immediate
/// data, and so does this function.
///
/// # Safety
///
/// `cq` must point to a live extended CQ positioned on a completion (`ibv_start_poll` or
/// `ibv_next_poll` returned 0 and `ibv_end_poll` has not been called since).
#[inline]
pub unsafe fn ibv_wc_read_invalidated_rkey(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller guarantees cq is a live extended CQ positioned on a completion.
    unsafe {
        match (*cq).read_imm_data {
            Some(read) => read(cq),
            None => 0,
        }
    }
}

/// Copies the tag-matching information of the current completion into `*tm_info`:
/// `cq->read_tm_info(cq, tm_info)`.
///
/// # Safety
///
/// `cq` must point to a live extended CQ created with `IBV_WC_EX_WITH_TM_INFO`, positioned on
/// a completion, and `tm_info` must be valid for a write.
#[inline]
pub unsafe fn ibv_wc_read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info) {
    // SAFETY: the caller guarantees cq is positioned on a completion and tm_info writable.
    unsafe {
        if let Some(read) = (*cq).read_tm_info {
            read(cq, tm_info)
        }
    }
}
