//! Memory windows (`struct ibv_mw`): a remote key for a slice of a memory region that can be
//! granted and revoked without re-registering.
//!
//! [`ProtectionDomain::alloc_mw`] allocates one of type 1 or type 2, checking the device's
//! capability flags first: a device without that type gives
//! [`MemoryWindowError::NotSupported`], as does a provider that answers `EOPNOTSUPP`.
//!
//! - Type 1 windows are bound with [`MemoryWindow::bind`] (`ibv_bind_mw`), and unbound by
//!   binding them with an empty range.
//! - Type 2 windows are bound through the send guard with
//!   [`WorkRequestBuilder::bind_mw`](crate::queue_pair::WorkRequestBuilder::bind_mw) under a
//!   new rkey from [`MemoryWindow::next_rkey`], and invalidated with
//!   [`local_invalidate`](crate::queue_pair::WorkRequestBuilder::local_invalidate) or by the
//!   peer's [`send_with_invalidate`](crate::queue_pair::WorkRequestBuilder::send_with_invalidate).
//!
//! The region a window is bound to must be registered with
//! [`AccessFlags::MW_BIND`](crate::AccessFlags::MW_BIND).
//!
//! A window holds an `Arc` of the region it was last bound to, from the moment the bind is
//! posted until it is bound again or dropped: the region's owner may drop every handle it
//! has, and a peer's access through the window's rkey still lands in live, registered memory
//! (the kernel refuses to deregister a region with bound windows, and a failed
//! deregistration would leak the memory). To retire a region from a window, rebind the
//! window elsewhere (or drop it) and wait for that bind's completion before dropping the
//! region.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::macros::c_enum;
use crate::verbs::device::DeviceCapFlags;
use crate::verbs::memory_region::MemoryRegion;
use crate::verbs::protection_domain::ProtectionDomain;

c_enum! {
    /// The kind of memory window.
    pub enum MwType: "ibv_mw_type" {
        /// Type 1: bound with `ibv_bind_mw`, by the QP-less bind verb.
        Type1 = ffi::ibv_mw_type::IBV_MW_TYPE_1,
        /// Type 2: bound by a work request on a QP, invalidated by one.
        Type2 = ffi::ibv_mw_type::IBV_MW_TYPE_2,
    }
}

/// Why a memory window operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryWindowError {
    /// The device does not offer this type of window.
    #[error("{device} does not support {mw_type:?} memory windows ({why})")]
    NotSupported {
        /// The device's name.
        device: String,
        /// The type asked for.
        mw_type: MwType,
        /// How that was found out.
        why: &'static str,
    },
    /// `ibv_alloc_mw` failed.
    #[error("ibv_alloc_mw of a {mw_type:?} window on {device} failed: {source}")]
    Alloc {
        /// The device's name.
        device: String,
        /// The type asked for.
        mw_type: MwType,
        /// The errno.
        source: io::Error,
    },
    /// Querying the device's capabilities failed.
    #[error("checking {device} for memory window support: {source}")]
    Query {
        /// The device's name.
        device: String,
        /// The query's error.
        source: Box<crate::verbs::device::DeviceError>,
    },
    /// `ibv_bind_mw` failed.
    #[error("ibv_bind_mw of window rkey {rkey:#x} to {len} bytes of MR {lkey:#x} on QP {qp_num:#x} failed: {source}{}",
        if source.raw_os_error() == Some(libc::EINVAL) { " (a type 2 window, an MR without MW_BIND access, or a range outside the MR?)" } else { "" })]
    Bind {
        /// The window's rkey before the bind.
        rkey: u32,
        /// The region's lkey.
        lkey: u32,
        /// Bytes to bind.
        len: u64,
        /// The QP.
        qp_num: u32,
        /// The errno.
        source: io::Error,
    },
}

impl ProtectionDomain {
    /// Allocates a memory window of `mw_type` (`ibv_alloc_mw`), after checking the device's
    /// capability flags (`IBV_DEVICE_MEM_WINDOW`, `_TYPE_2A`/`_TYPE_2B`).
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(
        self: &Arc<Self>,
        mw_type: MwType,
    ) -> Result<Arc<MemoryWindow>, MemoryWindowError> {
        let ctx = self.context();
        let device = || ctx.name().to_owned();
        let caps = ctx
            .query_device()
            .map_err(|e| MemoryWindowError::Query {
                device: device(),
                source: Box::new(e),
            })?
            .device_cap_flags();
        let needed = match mw_type {
            MwType::Type1 => DeviceCapFlags::MEM_WINDOW,
            _ => DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
        };
        if !caps.intersects(needed) {
            return Err(MemoryWindowError::NotSupported {
                device: device(),
                mw_type,
                why: "the device's capability flags lack it",
            });
        }
        // SAFETY: the PD is alive (the window holds its Arc).
        let mw = fresh(|| unsafe { ffi::ibv_alloc_mw(self.as_raw(), u32::from(mw_type)) });
        let raw = non_null(mw).map_err(|source| alloc_error(device(), mw_type, source))?;
        Ok(Arc::new(MemoryWindow {
            raw,
            mw_type,
            pd: Arc::clone(self),
            bound: Mutex::new(None),
        }))
    }
}

/// The error of a failed `ibv_alloc_mw`: `EOPNOTSUPP`/`ENOSYS` mean the provider has no
/// windows of that type.
fn alloc_error(device: String, mw_type: MwType, source: io::Error) -> MemoryWindowError {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => MemoryWindowError::NotSupported {
            device,
            mw_type,
            why: "the provider answered EOPNOTSUPP",
        },
        _ => MemoryWindowError::Alloc {
            device,
            mw_type,
            source,
        },
    }
}

/// The next rkey of the same window or region (`ibv_inc_rkey`: same index, next 8-bit
/// tag), so that binding under it makes the previous rkey stop working.
#[doc(alias = "ibv_inc_rkey")]
pub fn inc_rkey(rkey: u32) -> u32 {
    // SAFETY: a pure function of its argument.
    unsafe { ffi::ibv_inc_rkey(rkey) }
}

/// A memory window; deallocated (`ibv_dealloc_mw`) on drop. Holds its protection domain.
#[doc(alias = "ibv_mw")]
#[doc(alias = "ibv_dealloc_mw")]
pub struct MemoryWindow {
    raw: NonNull<ffi::ibv_mw>,
    mw_type: MwType,
    pd: Arc<ProtectionDomain>,
    /// The region of the last bind posted: kept alive (and registered) while the window may
    /// grant access to it.
    bound: Mutex<Option<Arc<MemoryRegion>>>,
}

// SAFETY: libibverbs memory windows may be used from any thread; binds go through a QP
// borrowed mutably or a send guard.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// The raw `ibv_mw`, valid while this window is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.raw.as_ptr()
    }

    /// The window's rkey as libibverbs keeps it: set at allocation and by each type 1
    /// bind. A type 2 bind posted through the send guard does not change it: the rkey a
    /// type 2 window is bound under is the one passed to the bind, which the caller keeps.
    pub fn rkey(&self) -> u32 {
        // SAFETY: raw is live; rkey is a plain field the provider updates on type 1 binds.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The region the window was last bound to, if any: it stays alive at least as long as
    /// the window or its next bind.
    pub fn bound_region(&self) -> Option<Arc<MemoryRegion>> {
        self.bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps `mr` alive as the window's region, from the moment a bind to it is posted.
    pub(crate) fn hold(&self, mr: &Arc<MemoryRegion>) {
        let mut bound = self.bound.lock().unwrap_or_else(PoisonError::into_inner);
        if !bound.as_ref().is_some_and(|b| Arc::ptr_eq(b, mr)) {
            *bound = Some(Arc::clone(mr));
        }
    }

    /// A fresh rkey for the first type 2 bind: [`inc_rkey`] of [`rkey`](Self::rkey).
    /// For each later bind, pass the previous bind's rkey to [`inc_rkey`].
    #[doc(alias = "ibv_inc_rkey")]
    pub fn next_rkey(&self) -> u32 {
        inc_rkey(self.rkey())
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: raw came from ibv_alloc_mw and is deallocated once, here.
        let ret = fresh(|| unsafe { ffi::ibv_dealloc_mw(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            // The window may still grant access to its region: keep the region (and its
            // memory) registered for ever rather than let it be freed.
            let bound = self.bound.get_mut().unwrap_or_else(PoisonError::into_inner);
            if let Some(region) = bound.take() {
                std::mem::forget(region);
            }
            crate::diagnostics::report_drop_failure(
                "ibv_dealloc_mw",
                "a memory window (the region it was bound to is kept, never freed)",
                &e,
            );
        }
        // Otherwise the region's Arc drops with the window, now that the window is gone.
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("mw_type", &self.mw_type)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls the C shim, which Miri cannot run")]
    fn inc_rkey_keeps_the_index_and_moves_the_tag() {
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
    }

    #[test]
    fn eopnotsupp_is_the_typed_not_supported_error() {
        let e = alloc_error(
            "dev0".into(),
            MwType::Type2,
            io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        );
        assert!(matches!(
            e,
            MemoryWindowError::NotSupported {
                mw_type: MwType::Type2,
                ..
            }
        ));
        assert!(
            e.to_string().starts_with("dev0 does not support Type2"),
            "{e}"
        );
        let e = alloc_error(
            "dev0".into(),
            MwType::Type1,
            io::Error::from_raw_os_error(libc::ENOMEM),
        );
        assert!(matches!(e, MemoryWindowError::Alloc { .. }), "{e}");
    }
}
