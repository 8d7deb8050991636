//! Sharing a device context, a protection domain and memory regions between processes
//! (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`).
//!
//! The exporting process hands over three things: a duplicate of its context's command
//! descriptor ([`DeviceContext::cmd_fd`], duplicated with `try_clone_to_owned` and sent over a
//! Unix socket with `SCM_RIGHTS`), and the kernel handles of the PD
//! ([`ProtectionDomain::handle`]) and of each region ([`MemoryRegion::handle`]). The
//! importing process rebuilds them:
//!
//! ```no_run
//! # fn demo(cmd_fd: std::os::fd::OwnedFd, pd_handle: u32, mr_handle: u32)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = sideway::device::DeviceContext::import_device(cmd_fd)?; // the descriptor is the context's now
//! let pd = ctx.import_pd(pd_handle)?;
//! let mr = pd.import_mr(mr_handle)?;
//! assert!(mr.sge(0..64).is_none()); // no safe entry over the exporter's memory
//! // SAFETY: the exporter is another process, which keeps the region's memory registered
//! // and set aside for these requests (its protocol's promise).
//! let sge = unsafe { mr.imported_sge(0..64) }.expect("inside the region");
//! // Post with `sge` on QPs of `pd`: the addresses are the exporter's.
//! # let _ = sge;
//! # Ok(()) }
//! ```
//!
//! # Ownership
//!
//! The exporter owns the PD and the regions: an imported PD or region is released with
//! `ibv_unimport_pd` / `ibv_unimport_mr` when its last `Arc` goes, never deallocated or
//! deregistered ([`ProtectionDomain::is_imported`], [`MemoryRegion::is_imported`]). The
//! imported context is closed with `ibv_close_device`, which closes the descriptor.
//!
//! # Soundness
//!
//! An imported region's memory belongs to the exporter, and the exporter may be this very
//! process: [`DeviceContext::cmd_fd`], [`import_device`](DeviceContext::import_device),
//! [`import_pd`](DeviceContext::import_pd) and [`import_mr`](ProtectionDomain::import_mr)
//! are safe and work within one process, and no type can tell the two cases apart. Its
//! bounds are the exporter's registration's, which may be the whole address space (the
//! handle of an implicit on-demand region, [`crate::odp`]). So an imported region hands out
//! nothing safe over its memory:
//!
//! - no slice or view: it is a plain [`MemoryRegion`], which has none;
//! - no safe scatter/gather entry: [`MemoryRegion::sge`] is `None` for it, as for an
//!   implicit region, since an entry from its bounds could let a receive land in any Rust
//!   object of this process, live or freed. [`MemoryRegion::imported_sge`] makes the entry
//!   and is `unsafe`: its caller vouches for the memory the entry names.
//!
//! Its keys stay readable ([`lkey`](MemoryRegion::lkey), [`rkey`](MemoryRegion::rkey)):
//! they are the exporter's own keys, which grant no access the exporter's registration did
//! not, and an entry made from the local key by hand is [`Sge::from_raw_parts`], `unsafe`.
//!
//! ```compile_fail,E0599
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) {
//! let mr = pd.import_mr(7).unwrap();
//! let bytes: &[u8] = unsafe { mr.view() }; // no view of another process's memory
//! # }
//! ```
//!
//! ```compile_fail,E0133
//! // An entry over an imported region is the caller's promise, not the type's.
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) {
//! let mr = pd.import_mr(7).unwrap();
//! let sge = mr.imported_sge(0..64);
//! # }
//! ```
//!
//! [`Sge::from_raw_parts`]: crate::memory_region::Sge::from_raw_parts

use std::io;
use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, non_null};
use crate::verbs::device::{ensure_ibverbs, DeviceContext, DeviceError};
use crate::verbs::memory_region::{AccessFlags, MemoryRegion};
use crate::verbs::protection_domain::ProtectionDomain;

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// libibverbs could not be loaded.
    #[error(transparent)]
    Library(#[from] DeviceError),
    /// The import verb failed.
    #[error("{call}{} failed{}: {source}{}",
        handle.map(|h| format!(" of handle {h:#x}")).unwrap_or_default(),
        device.as_ref().map(|d| format!(" on {d}")).unwrap_or_default(),
        import_hint(source))]
    Import {
        /// `ibv_import_device`, `ibv_import_pd` or `ibv_import_mr`.
        call: &'static str,
        /// The device's name (`None` for `ibv_import_device`, which finds the device).
        device: Option<String>,
        /// The handle asked for (`None` for `ibv_import_device`).
        handle: Option<u32>,
        /// The errno.
        source: io::Error,
    },
}

fn import_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            " (not supported by this device: its provider cannot import objects of another \
             process; mlx5 can, rxe and siw cannot)"
        }
        Some(libc::ENODEV) => " (the descriptor is not the command descriptor of an RDMA device)",
        Some(libc::EINVAL) => {
            " (not a command descriptor, or no object with this handle in the exporter's context)"
        }
        _ => "",
    }
}

impl ImportError {
    /// True when the device cannot import (`EOPNOTSUPP`).
    pub fn is_not_supported(&self) -> bool {
        matches!(self, ImportError::Import { source, .. }
            if source.raw_os_error() == Some(libc::EOPNOTSUPP))
    }
}

impl DeviceContext {
    /// The context's command descriptor (`ibv_context.cmd_fd`), for another process to import
    /// the context: duplicate it (`try_clone_to_owned`) and send the duplicate over a Unix
    /// socket (`SCM_RIGHTS`), or hand it to [`import_device`](Self::import_device) here.
    /// Regions imported through it make no safe scatter/gather entries, whichever process
    /// imports them (see the [module's soundness](crate::sharing)).
    pub fn cmd_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the context is open for as long as self lives, and its cmd_fd with it;
        // reading a plain field.
        let fd = unsafe { (*self.as_raw()).cmd_fd };
        // SAFETY: cmd_fd is open until ibv_close_device, which runs only when self is
        // dropped, after the borrow ends.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// Imports the context another process exported (`ibv_import_device`): `cmd_fd` is a
    /// duplicate of its [`cmd_fd`](Self::cmd_fd). The descriptor is the context's from then
    /// on, as the verb requires: closed by `ibv_close_device` when the context goes. When the
    /// import fails it is not closed either (libibverbs' provider may already have closed
    /// it, and closing it again could close another thread's descriptor): one descriptor
    /// leaks. Devices whose provider cannot import (rxe, siw) fail with `EOPNOTSUPP`
    /// ([`ImportError::is_not_supported`]).
    #[doc(alias = "ibv_import_device")]
    pub fn import_device(cmd_fd: OwnedFd) -> Result<Arc<DeviceContext>, ImportError> {
        ensure_ibverbs()?;
        let fd = cmd_fd.into_raw_fd();
        // SAFETY: fd is an open descriptor whose ownership passes to the verb.
        let ctx = fresh(|| unsafe { ffi::ibv_import_device(fd) });
        let raw = non_null(ctx).map_err(|source| ImportError::Import {
            call: "ibv_import_device",
            device: None,
            handle: None,
            source,
        })?;
        // SAFETY: raw is the context the verb just opened; only the wrapper closes it.
        let ctx = unsafe { DeviceContext::from_opened(raw) };
        ctx.refuse_if_unlocked()?;
        Ok(ctx)
    }

    /// Imports the protection domain with kernel handle `pd_handle` of the exporting
    /// process (`ibv_import_pd`); this context must be imported from that process's
    /// ([`import_device`](Self::import_device)). Dropping the returned PD releases only this
    /// process's handle (`ibv_unimport_pd`).
    #[doc(alias = "ibv_import_pd")]
    #[doc(alias = "ibv_unimport_pd")]
    pub fn import_pd(
        self: &Arc<Self>,
        pd_handle: u32,
    ) -> Result<Arc<ProtectionDomain>, ImportError> {
        // SAFETY: the context is open for as long as self lives.
        let pd = fresh(|| unsafe { ffi::ibv_import_pd(self.as_raw(), pd_handle) });
        let raw = non_null(pd).map_err(|source| ImportError::Import {
            call: "ibv_import_pd",
            device: Some(self.name().to_owned()),
            handle: Some(pd_handle),
            source,
        })?;
        // SAFETY: raw is the PD the verb just imported; only the wrapper releases it.
        Ok(unsafe { ProtectionDomain::from_import(raw, self) })
    }
}

impl ProtectionDomain {
    /// Imports the memory region with kernel handle `mr_handle` of the exporting process
    /// (`ibv_import_mr`) into this (imported) PD. Its addresses are the exporter's, which may
    /// be this process: it hands out no view of the memory and no safe scatter/gather entry
    /// ([`MemoryRegion::sge`] is `None`; [`MemoryRegion::imported_sge`] is `unsafe`; see the
    /// [module's soundness](self)). Dropping it releases only this process's handle
    /// (`ibv_unimport_mr`). Its
    /// [`access`](MemoryRegion::access) reads empty: the verb does not say what the exporter
    /// registered it with.
    #[doc(alias = "ibv_import_mr")]
    #[doc(alias = "ibv_unimport_mr")]
    pub fn import_mr(self: &Arc<Self>, mr_handle: u32) -> Result<Arc<MemoryRegion>, ImportError> {
        // SAFETY: the PD is alive for as long as self lives.
        let mr = fresh(|| unsafe { ffi::ibv_import_mr(self.as_raw(), mr_handle) });
        let raw = non_null(mr).map_err(|source| ImportError::Import {
            call: "ibv_import_mr",
            device: Some(self.context().name().to_owned()),
            handle: Some(mr_handle),
            source,
        })?;
        // SAFETY: raw is the region the verb just imported into this PD; only the wrapper
        // releases it.
        Ok(unsafe { self.wrap_imported_mr(raw, AccessFlags::empty()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_the_handle_and_the_cause() {
        let e = ImportError::Import {
            call: "ibv_import_pd",
            device: Some("rxe0".into()),
            handle: Some(3),
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.is_not_supported());
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_import_pd of handle 0x3 failed on rxe0: "),
            "{text}"
        );
        assert!(text.contains("not supported by this device"), "{text}");
        let e = ImportError::Import {
            call: "ibv_import_device",
            device: None,
            handle: None,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert!(!e.is_not_supported());
        assert!(
            e.to_string().starts_with("ibv_import_device failed: "),
            "{e}"
        );
    }
}
