//! XRC on the null provider (`csrc/null_provider_xrc.c`): once [`NullProvider::enable_xrc`]
//! is called, verbs.h's `ibv_open_xrcd`, `ibv_close_xrcd`, `ibv_create_srq_ex`,
//! `ibv_get_srq_num` and `ibv_create_qp_ex` (XRC types) reach operations that record their
//! arguments ([`XrcSeen`]), and an XRC send QP records the remote SRQ number of every request
//! posted on it, classic or extended. A provider that was never enabled is unchanged, so the
//! benchmarks measure what they did.

use std::ptr::NonNull;
use std::sync::Arc;

use sideway::completion_queue::CompletionQueue;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QpType, QueuePair};
use sideway::sys::{ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_qp_ex, ibv_srq, ibv_xrcd};

use crate::null_provider::NullProvider;

/// The SRQ number `get_srq_num` reports (`NULL_XRC_SRQN`).
pub const XRC_SRQN: u32 = 0x2a5;
/// The QP number of the XRC receive QP (`NULL_XRC_RECV_QPN`).
pub const XRC_RECV_QPN: u32 = 0x31;
/// The errno `create_qp_ex` fails an XRC send QP with after recording its arguments
/// (`NULL_XRC_SEND_REFUSED`, ENOMSG on Linux).
pub const XRC_SEND_REFUSED: i32 = 42;

/// What the XRC operations saw (`struct null_xrc_seen`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XrcSeen {
    /// `open_xrcd` calls.
    pub open_xrcd_calls: u64,
    /// `close_xrcd` calls.
    pub close_xrcd_calls: u64,
    /// 1 while a domain is open.
    pub xrcd_live: u64,
    /// `comp_mask` of the last `open_xrcd`.
    pub xrcd_comp_mask: u32,
    /// Its `fd`.
    pub xrcd_fd: i32,
    /// Its `oflags`.
    pub xrcd_oflags: i32,
    /// `comp_mask` of the last `create_srq_ex`.
    pub srq_comp_mask: u32,
    /// `create_srq_ex` calls.
    pub create_srq_ex_calls: u64,
    /// Its `srq_type`.
    pub srq_type: u32,
    /// Its `attr.max_wr`.
    pub srq_max_wr: u32,
    /// Its `attr.max_sge`.
    pub srq_max_sge: u32,
    _pad: u32,
    /// Its `pd`.
    pub srq_pd: *mut ibv_pd,
    /// Its `xrcd`.
    pub srq_xrcd: *mut ibv_xrcd,
    /// Its `cq`.
    pub srq_cq: *mut ibv_cq,
    /// `get_srq_num` calls.
    pub get_srq_num_calls: u64,
    /// `create_qp_ex` calls for XRC QPs.
    pub create_qp_ex_calls: u64,
    /// `comp_mask` of the last of those.
    pub qp_comp_mask: u32,
    /// Its `qp_type`.
    pub qp_type: u32,
    /// Its `xrcd` (NULL without `IBV_QP_INIT_ATTR_XRCD`).
    pub qp_xrcd: *mut ibv_xrcd,
    /// Its `pd` (NULL without `IBV_QP_INIT_ATTR_PD`).
    pub qp_pd: *mut ibv_pd,
    /// Its `send_cq`.
    pub qp_send_cq: *mut ibv_cq,
    /// Its `recv_cq`.
    pub qp_recv_cq: *mut ibv_cq,
    /// Its `srq`.
    pub qp_srq: *mut ibv_srq,
    /// Its `cap.max_send_wr`.
    pub qp_max_send_wr: u32,
    /// Its `cap.max_recv_wr`.
    pub qp_max_recv_wr: u32,
    /// Its `cap.max_send_sge`.
    pub qp_max_send_sge: u32,
    /// Its `cap.max_recv_sge`.
    pub qp_max_recv_sge: u32,
    /// `send_ops_flags` of the last XRC send QP (0 without the comp_mask bit).
    pub send_qp_ops_flags: u64,
    /// The XRC send QP's `ops.post_send` calls.
    pub post_send_calls: u64,
    /// Requests in those chains.
    pub send_wrs: u64,
    /// `qp_ex->wr_set_xrc_srqn` calls.
    pub wr_xrc_srqns: u64,
    /// `qp_ex->wr_send` calls.
    pub wr_sends: u64,
    /// `qp_ex->wr_complete` calls.
    pub wr_completes: u64,
    /// The remote SRQ number of the last request, either API.
    pub last_remote_srqn: u32,
    /// The opcode of the last classic request.
    pub last_opcode: u32,
    /// The sum of the remote SRQ numbers of every request, either API.
    pub srqn_sum: u64,
    /// `qp_ex->wr_abort` calls.
    pub wr_aborts: u64,
}

extern "C" {
    fn null_xrc_enable(context: *mut ibv_context) -> i32;
    fn null_xrc_seen(context: *mut ibv_context) -> *const XrcSeen;
    fn null_xrc_send_qp(context: *mut ibv_context) -> *mut ibv_qp;
    fn null_xrc_send_qp_ex(context: *mut ibv_context) -> *mut ibv_qp_ex;
    fn null_xrc_seen_size() -> usize;
}

/// `sizeof(struct null_xrc_seen)` as the C compiler laid it out: [`XrcSeen`] must match.
pub fn c_seen_size() -> usize {
    // SAFETY: no preconditions.
    unsafe { null_xrc_seen_size() }
}

impl NullProvider {
    /// Installs the XRC operations (`null_xrc_enable`). Call before making sideway objects
    /// that use them.
    ///
    /// # Panics
    ///
    /// When the C allocation fails (out of memory).
    pub fn enable_xrc(&self) {
        // SAFETY: the context is the provider's, live; the call writes its verbs_context ops
        // while no operation runs (this thread holds the provider).
        let err = unsafe { null_xrc_enable(self.context_raw()) };
        assert_eq!(err, 0, "null_xrc_enable: out of memory");
    }

    /// What the XRC operations have seen so far.
    ///
    /// # Panics
    ///
    /// Before [`enable_xrc`](Self::enable_xrc).
    pub fn xrc_seen(&self) -> XrcSeen {
        // SAFETY: the context is live; the record lives with the provider and is copied out
        // while no operation runs (they run only inside calls on this thread).
        let seen = unsafe { null_xrc_seen(self.context_raw()) };
        assert!(!seen.is_null(), "enable_xrc() first");
        // SAFETY: non-NULL: the provider's live record.
        unsafe { *seen }
    }

    /// A sideway XRC send QP around the provider's (classic, or extended when `extended`),
    /// on `pd` (from [`sideway_pd`](Self::sideway_pd)), with `cq` as its send CQ and no
    /// receive CQ.
    ///
    /// # Panics
    ///
    /// Before [`enable_xrc`](Self::enable_xrc).
    pub fn sideway_xrc_send_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        extended: bool,
    ) -> QueuePair {
        // SAFETY: the context is live.
        let raw = NonNull::new(unsafe { null_xrc_send_qp(self.context_raw()) })
            .expect("enable_xrc() first");
        // SAFETY: as above.
        let ex = NonNull::new(unsafe { null_xrc_send_qp_ex(self.context_raw()) })
            .expect("enable_xrc() first");
        let mut builder = pd.create_qp_builder();
        builder.qp_type(QpType::XrcSend).send_cq(cq).max_send_wr(8);
        // SAFETY: pd's context came from this provider's from_raw_parts (sideway_pd); raw is
        // the provider's XRC send QP, whose context's ops.post_send and post_recv are set,
        // with no capacity limit, and ex the same object as ibv_qp_ex with wr_start,
        // wr_complete, wr_abort, wr_send, wr_set_sge and wr_set_xrc_srqn set
        // (null_xrc_enable), never changed after; both live as long as the provider.
        unsafe { builder.wrap_raw(raw, extended.then_some(ex)) }
            .expect("an XRC send QP needs only its send CQ")
    }
}
