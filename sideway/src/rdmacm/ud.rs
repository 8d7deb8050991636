//! UD addressing from rdma_cm: the peer's (or a multicast group's) [`UdParam`] and the
//! address handle built from it.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use super::address::Endpoints;
use super::error::CmError;
use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::protection_domain::ProtectionDomain;

/// The UD parameters from an event of an `RDMA_PS_UDP` id (`param.ud`): how to address the
/// peer or the multicast group.
#[doc(alias = "rdma_ud_param")]
#[derive(Clone, Copy)]
pub struct UdParam {
    pub(super) ah_attr: ffi::ibv_ah_attr,
    pub(super) qp_num: u32,
    pub(super) qkey: u32,
}

impl fmt::Debug for UdParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdParam")
            .field("qp_num", &format_args!("{:#x}", self.qp_num))
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .field("dlid", &self.ah_attr.dlid)
            .field("is_global", &self.ah_attr.is_global)
            .field("port_num", &self.ah_attr.port_num)
            .finish_non_exhaustive()
    }
}

impl UdParam {
    /// Address attributes for the peer or group (`ah_attr`).
    pub fn ah_attr(&self) -> &ffi::ibv_ah_attr {
        &self.ah_attr
    }

    /// The remote QP number (`0xffffff` for a multicast group).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The Q_Key to send with.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Builds an address handle for these attributes (`ibv_create_ah`). The PD must be on
    /// the device of the id the event came from.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, pd: &Arc<ProtectionDomain>) -> Result<CmAddressHandle, CmError> {
        let mut attr = self.ah_attr;
        // SAFETY: the PD is alive; attr is a valid ah_attr the call only reads.
        let ah = fresh(|| unsafe { ffi::ibv_create_ah(pd.as_raw(), &mut attr) });
        let raw = non_null(ah).map_err(|source| CmError::Call {
            call: "ibv_create_ah",
            endpoints: Endpoints::default(),
            source,
        })?;
        Ok(CmAddressHandle {
            raw,
            pd: Arc::clone(pd),
        })
    }
}

/// An address handle (`struct ibv_ah`) built from an event's UD parameters; destroyed
/// (`ibv_destroy_ah`) on drop. Holds its protection domain.
#[doc(alias = "ibv_ah")]
pub struct CmAddressHandle {
    raw: NonNull<ffi::ibv_ah>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: address handles may be used from any thread; this one is only read after creation.
unsafe impl Send for CmAddressHandle {}
// SAFETY: as above.
unsafe impl Sync for CmAddressHandle {}

impl CmAddressHandle {
    /// The raw `ibv_ah`, for `wr.ud.ah`; valid while this handle is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.raw.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for CmAddressHandle {
    fn drop(&mut self) {
        // SAFETY: raw came from ibv_create_ah and is destroyed once, here.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_destroy_ah", "an address handle", &e);
        }
    }
}

impl fmt::Debug for CmAddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmAddressHandle")
            .field("pd", &self.pd)
            .finish()
    }
}
