//! XRC receive QPs (`IBV_QPT_XRC_RECV`): the target side of an XRC connection. Made on an
//! XRC domain, with no PD, CQ or queues of its own: what arrives on it lands in the XRC SRQ
//! of the same domain that the sender names, and completes on that SRQ's CQ. So it posts
//! nothing; it is only moved through its states (Reset, Init, RTR, and RTS for the
//! acknowledgements it sends). It holds its XRC domain, which is closed after it.
//!
//! The send side, `IBV_QPT_XRC_SEND`, is an ordinary [`QueuePair`](super::QueuePair) made on a
//! PD ([`QueuePairBuilder::qp_type`](super::QueuePairBuilder::qp_type)).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use super::attr::{QpAttrMask, QpCapabilities, QpState, QpType, QueuePairAttribute};
use super::error::{ModifyQpError, QueryQpError, QueuePairError};
use super::qp::{modify_qp, query_qp};
use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::xrc_domain::XrcDomain;

impl XrcDomain {
    /// Creates an XRC receive QP on this domain (`ibv_create_qp_ex` with
    /// `IBV_QP_INIT_ATTR_XRCD`, `qp_type` `IBV_QPT_XRC_RECV`). Move it to Init, RTR and RTS
    /// with [`XrcRecvQueuePair::modify`], pointing its RTR at the peer's XRC send QP.
    #[doc(alias = "ibv_create_qp_ex")]
    pub fn create_recv_qp(self: &Arc<Self>) -> Result<XrcRecvQueuePair, QueuePairError> {
        // SAFETY: ibv_qp_init_attr_ex is a C struct of integers, raw pointers and structs of
        // those, for which all zeroes is valid (NULL, 0): the fields an XRC receive QP does
        // not use stay so, as verbs.h asks.
        let mut init: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_XRC_RECV;
        init.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_XRCD;
        init.xrcd = self.as_raw();
        let ctx = self.context();
        // SAFETY: the context and the XRC domain are alive (the QP will hold the domain's
        // Arc, which holds the context); init is initialised and comp_mask names the one
        // extended field set.
        let qp = fresh(|| unsafe { ffi::ibv_create_qp_ex(ctx.as_raw(), &mut init) });
        let raw = non_null(qp).map_err(|source| QueuePairError::Create {
            call: "ibv_create_qp_ex (XRC)",
            device: ctx.name().to_owned(),
            qp_type: QpType::XrcRecv,
            cap: QpCapabilities::default(),
            source,
        })?;
        Ok(XrcRecvQueuePair {
            raw,
            xrcd: Arc::clone(self),
        })
    }
}

/// An XRC receive QP; from [`XrcDomain::create_recv_qp`]. Destroyed (`ibv_destroy_qp`) on
/// drop, before its XRC domain is closed (it holds the domain's `Arc`).
#[doc(alias = "IBV_QPT_XRC_RECV")]
pub struct XrcRecvQueuePair {
    raw: NonNull<ffi::ibv_qp>,
    xrcd: Arc<XrcDomain>,
}

// SAFETY: an XRC receive QP is only modified, queried and destroyed, which libibverbs allows
// from any thread; it has no posting state.
unsafe impl Send for XrcRecvQueuePair {}
// SAFETY: as above; `&self` methods call thread-safe verbs and read immutable fields.
unsafe impl Sync for XrcRecvQueuePair {}

impl XrcRecvQueuePair {
    /// The QP number, which the peer's XRC send QP connects to (its `dest_qp_num`).
    pub fn qp_num(&self) -> u32 {
        // SAFETY: raw is a live QP; qp_num is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// [`QpType::XrcRecv`].
    pub fn qp_type(&self) -> QpType {
        QpType::XrcRecv
    }

    /// The XRC domain.
    pub fn xrcd(&self) -> &Arc<XrcDomain> {
        &self.xrcd
    }

    /// The raw `ibv_qp`, valid while this QP is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.raw.as_ptr()
    }

    /// Modifies the QP's attributes and state (`ibv_modify_qp`), as
    /// [`QueuePair::modify`](super::QueuePair::modify), whose `EINVAL` diagnosis follows the
    /// XRC target's column of the state table.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&self, attr: &QueuePairAttribute) -> Result<(), ModifyQpError> {
        // SAFETY: raw is this live XRC receive QP.
        unsafe { modify_qp(self.raw, QpType::XrcRecv, attr) }
    }

    /// Queries the attributes in `mask` (`ibv_query_qp`).
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self, mask: QpAttrMask) -> Result<QueuePairAttribute, QueryQpError> {
        // SAFETY: raw is this live QP.
        unsafe { query_qp(self.raw, mask) }
    }

    /// The current state, from the device.
    pub fn state(&self) -> Result<QpState, QueryQpError> {
        Ok(self.query(QpAttrMask::STATE)?.qp_state())
    }
}

impl Drop for XrcRecvQueuePair {
    fn drop(&mut self) {
        if !self.xrcd.context().owns_objects() {
            // A test double's QP: ibv_destroy_qp is libibverbs', which its objects never
            // reach; its owner frees it.
            return;
        }
        // SAFETY: raw came from ibv_create_qp_ex and is destroyed once; the domain outlives
        // this call (a field).
        let ret = fresh(|| unsafe { ffi::ibv_destroy_qp(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_destroy_qp", "an XRC receive QP", &e);
        }
    }
}

impl fmt::Debug for XrcRecvQueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcRecvQueuePair")
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .finish_non_exhaustive()
    }
}
