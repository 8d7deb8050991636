//! Protection domains (`struct ibv_pd`): the scope that memory regions, queue pairs and
//! address handles share.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::device::DeviceContext;

/// `ibv_alloc_pd` failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to allocate a protection domain on {device}: {source}")]
pub struct AllocPdError {
    /// The device's name.
    pub device: String,
    /// The errno.
    #[source]
    pub source: io::Error,
}

/// A protection domain. Holds its device context; memory regions and queue pairs hold it.
#[doc(alias = "ibv_pd")]
#[doc(alias = "ibv_dealloc_pd")]
pub struct ProtectionDomain {
    raw: NonNull<ffi::ibv_pd>,
    ctx: Arc<DeviceContext>,
    /// What a parent domain's PD keeps until after its `ibv_dealloc_pd`: the protection and
    /// thread domains it is built on and its allocator ([`crate::parent_domain`]).
    keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// A parent domain bound to a thread domain: its QPs must be `QueuePair<OneThread>`.
    thread_bound: bool,
    /// Imported from another process's context (`ibv_import_pd`): released with
    /// `ibv_unimport_pd`, never deallocated.
    imported: bool,
}

// SAFETY: verbs objects may be used from any thread; the PD is only read after creation.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl DeviceContext {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    #[doc(alias = "ibv_alloc_pd")]
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<ProtectionDomain>, AllocPdError> {
        // SAFETY: the context is open for as long as self lives.
        let pd = fresh(|| unsafe { ffi::ibv_alloc_pd(self.as_raw()) });
        let raw = non_null(pd).map_err(|source| AllocPdError {
            device: self.name().to_owned(),
            source,
        })?;
        Ok(Arc::new(ProtectionDomain {
            raw,
            ctx: Arc::clone(self),
            keep: None,
            thread_bound: false,
            imported: false,
        }))
    }
}

impl ProtectionDomain {
    /// The device context this PD belongs to.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// The raw `ibv_pd`, valid while this PD is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.raw.as_ptr()
    }

    /// Wraps a PD of a context made by [`DeviceContext::from_raw_parts`] (a test double's):
    /// dropping the wrapper calls no destroy verb.
    ///
    /// # Safety
    ///
    /// `ctx` comes from [`DeviceContext::from_raw_parts`], and `raw` is a PD of that context
    /// that stays valid until the context's owner is dropped. That constructor's contract
    /// (data path only) applies to the returned PD too.
    #[doc(hidden)]
    pub unsafe fn from_raw_parts(
        raw: NonNull<ffi::ibv_pd>,
        ctx: &Arc<DeviceContext>,
    ) -> Arc<ProtectionDomain> {
        Arc::new(ProtectionDomain {
            raw,
            ctx: Arc::clone(ctx),
            keep: None,
            thread_bound: false,
            imported: false,
        })
    }

    /// Wraps a parent domain (`ibv_alloc_parent_domain`) as a PD: deallocated with
    /// `ibv_dealloc_pd` like any PD, after which `keep` is dropped. `thread_bound` when it
    /// is bound to a thread domain.
    ///
    /// # Safety
    ///
    /// `raw` is a live parent domain of `ctx` that nothing else deallocates, and `keep` holds
    /// everything it depends on (the PD and thread domain it was made on, the allocator its
    /// `pd_context` points to).
    pub(crate) unsafe fn from_parent_domain(
        raw: NonNull<ffi::ibv_pd>,
        ctx: &Arc<DeviceContext>,
        keep: Box<dyn std::any::Any + Send + Sync>,
        thread_bound: bool,
    ) -> Arc<ProtectionDomain> {
        Arc::new(ProtectionDomain {
            raw,
            ctx: Arc::clone(ctx),
            keep: Some(keep),
            thread_bound,
            imported: false,
        })
    }

    /// Wraps a PD `ibv_import_pd` just returned: dropping it calls `ibv_unimport_pd`, never
    /// `ibv_dealloc_pd` (the exporting process owns the PD).
    ///
    /// # Safety
    ///
    /// `raw` is a live imported PD of `ctx`, released by nothing else.
    pub(crate) unsafe fn from_import(
        raw: NonNull<ffi::ibv_pd>,
        ctx: &Arc<DeviceContext>,
    ) -> Arc<ProtectionDomain> {
        Arc::new(ProtectionDomain {
            raw,
            ctx: Arc::clone(ctx),
            keep: None,
            thread_bound: false,
            imported: true,
        })
    }

    /// True for a PD imported from another process (`ibv_import_pd`): dropping it releases
    /// only this process's handle (`ibv_unimport_pd`); the exporter deallocates the PD.
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// True for a parent domain bound to a thread domain: queue pairs are made on it only as
    /// `QueuePair<OneThread>` (`ParentDomain::create_qp_builder`).
    pub fn is_thread_bound(&self) -> bool {
        self.thread_bound
    }
}

impl Drop for ProtectionDomain {
    // `keep` (a parent domain's PD, TD and allocator) is a field: dropped after this body, so
    // after the parent domain's ibv_dealloc_pd.
    fn drop(&mut self) {
        if self.imported {
            // SAFETY: raw came from ibv_import_pd and is released exactly once; every object
            // holding an Arc of this PD is gone.
            unsafe { ffi::ibv_unimport_pd(self.raw.as_ptr()) };
            return;
        }
        if !self.ctx.owns_objects() {
            // A test double's PD (from_raw_parts): its owner frees it.
            return;
        }
        // SAFETY: raw came from ibv_alloc_pd; every object holding an Arc of this PD is gone.
        let ret = fresh(|| unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_dealloc_pd", "a protection domain", &e);
        }
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .field("handle", &self.handle())
            .field("parent_domain", &self.keep.is_some())
            .field("imported", &self.imported)
            .finish()
    }
}

impl ProtectionDomain {
    /// The kernel's handle of this PD: what another process imports it by
    /// ([`DeviceContext::import_pd`]).
    pub fn handle(&self) -> u32 {
        // SAFETY: raw is a live PD; reading a plain field.
        unsafe { (*self.raw.as_ptr()).handle }
    }
}
