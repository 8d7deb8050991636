//! Device memory (`struct ibv_dm`): memory on the NIC itself, which the CPU reaches only by
//! copy ([`DeviceMemory::copy_to`], [`DeviceMemory::copy_from`]) and the device through a
//! memory region registered over it ([`ProtectionDomain::reg_dm_mr`]).
//!
//! - [`DeviceContext::alloc_dm`] allocates it (`ibv_alloc_dm`); the device's
//!   [`max_dm_size`](crate::device::DeviceAttr::max_dm_size) says how much there is (0: none).
//!   Providers without device memory (rxe, siw) fail with `EOPNOTSUPP`
//!   ([`DeviceMemoryError::is_not_supported`]).
//! - Copies are bounds-checked before the provider is called; writing needs `&mut`, so two
//!   CPU writers never race.
//! - A region over device memory is zero-based, as the verbs require: work requests address
//!   its first byte as 0 ([`MemoryRegion::addr`] is 0, [`MemoryRegion::sge`] counts from 0).
//!   It holds the device memory, so the memory is freed (`ibv_free_dm`) only after the last
//!   region over it is deregistered. It is a plain [`MemoryRegion`], which has no view of any
//!   memory: there is no host memory behind it to hand out.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sideway::memory_region::AccessFlags;
//! let ctx = sideway::open_device(None)?;
//! if ctx.query_device()?.max_dm_size() < 4096 {
//!     return Ok(()); // no (or too little) device memory
//! }
//! let pd = ctx.alloc_pd()?;
//! let mut dm = ctx.alloc_dm(4096, 0)?;
//! dm.copy_to(0, b"hello")?;
//! let mr = pd.reg_dm_mr(&dm, 0, 4096, AccessFlags::LOCAL_WRITE)?;
//! let sge = mr.sge(0..5).expect("inside the region"); // address 0: the region's first byte
//! # let _ = sge;
//! let mut back = [0u8; 5];
//! dm.copy_from(0, &mut back)?;
//! # Ok(()) }
//! ```
//!
//! A region over device memory has no slice of it, nor has the device memory itself:
//!
//! ```compile_fail,E0599
//! # fn f(mr: &sideway::memory_region::MemoryRegion) {
//! let bytes: &[u8] = unsafe { mr.view() };
//! # }
//! ```
//!
//! ```compile_fail,E0599
//! # fn f(dm: &sideway::device_memory::DeviceMemory) {
//! let bytes: &[u8] = dm.as_slice();
//! # }
//! ```
//!
//! ```compile_fail,E0596
//! // Writing needs the device memory to itself.
//! # fn f(dm: &sideway::device_memory::DeviceMemory) {
//! dm.copy_to(0, b"x").unwrap();
//! # }
//! ```

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::device::DeviceContext;
use crate::verbs::memory_region::{AccessFlags, MemoryRegion};
use crate::verbs::protection_domain::ProtectionDomain;

/// Why a device-memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceMemoryError {
    /// `ibv_alloc_dm` failed; `EOPNOTSUPP` when the device has no device memory.
    #[error("ibv_alloc_dm of {len} bytes (log_align_req {log_align_req}) failed on {device}: {source}{}",
        alloc_hint(source))]
    Alloc {
        /// The device's name.
        device: String,
        /// The size asked for.
        len: usize,
        /// The alignment asked for, as a power of two.
        log_align_req: u32,
        /// The errno.
        source: io::Error,
    },
    /// A copy or registration of bytes outside the device memory; refused before the
    /// provider was called.
    #[error("bytes {offset}..{} are outside the {dm_len}-byte device memory",
        offset.saturating_add(*len))]
    OutOfRange {
        /// First byte asked for.
        offset: usize,
        /// How many bytes.
        len: usize,
        /// The device memory's length.
        dm_len: usize,
    },
    /// `ibv_memcpy_to_dm` or `ibv_memcpy_from_dm` failed.
    #[error("{call} of {len} bytes at offset {offset} failed on {device}: {source}")]
    Copy {
        /// `ibv_memcpy_to_dm` or `ibv_memcpy_from_dm`.
        call: &'static str,
        /// The device's name.
        device: String,
        /// Offset into the device memory.
        offset: usize,
        /// How many bytes.
        len: usize,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_reg_dm_mr` failed.
    #[error("ibv_reg_dm_mr of {len} bytes at device-memory offset {offset} with access {access:?} failed on {device}: {source}{}",
        alloc_hint(source))]
    Register {
        /// The device's name.
        device: String,
        /// Offset into the device memory.
        offset: usize,
        /// Length in bytes.
        len: usize,
        /// The access asked for (with `ZERO_BASED`, which the verb requires).
        access: AccessFlags,
        /// The errno.
        source: io::Error,
    },
    /// [`ProtectionDomain::reg_dm_mr`] was asked for on-demand paging, which device memory
    /// cannot have.
    #[error("a memory region over device memory cannot be on demand (ON_DEMAND in {access:?})")]
    OnDemand {
        /// The access asked for.
        access: AccessFlags,
    },
    /// The device memory and the protection domain belong to different device contexts.
    #[error(
        "the device memory belongs to {dm_device}'s context and the protection domain to \
         {pd_device}'s: register device memory on a PD of the context that allocated it"
    )]
    OtherContext {
        /// The device memory's device.
        dm_device: String,
        /// The protection domain's device.
        pd_device: String,
    },
}

fn alloc_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            " (not supported by this device: its provider has no device memory; mlx5 has it, \
             rxe and siw do not; query_device().max_dm_size() says how much a device has)"
        }
        Some(libc::ENOMEM) => " (more than the device has free: see query_device().max_dm_size())",
        _ => "",
    }
}

impl DeviceMemoryError {
    /// True when the device does not implement device memory (`EOPNOTSUPP`).
    pub fn is_not_supported(&self) -> bool {
        match self {
            DeviceMemoryError::Alloc { source, .. }
            | DeviceMemoryError::Register { source, .. }
            | DeviceMemoryError::Copy { source, .. } => {
                source.raw_os_error() == Some(libc::EOPNOTSUPP)
            }
            _ => false,
        }
    }
}

/// The allocation itself: freed (`ibv_free_dm`) when the handle and every region over it are
/// gone.
struct DmAllocation {
    raw: NonNull<ffi::ibv_dm>,
    ctx: Arc<DeviceContext>,
    len: usize,
}

// SAFETY: an ibv_dm may be used from any thread; the allocation only frees it (drop, once)
// and hands its pointer to the copy verbs, whose writers are serialised by `&mut
// DeviceMemory`.
unsafe impl Send for DmAllocation {}
// SAFETY: as above: `&DmAllocation` gives no access to the bytes.
unsafe impl Sync for DmAllocation {}

impl Drop for DmAllocation {
    fn drop(&mut self) {
        // ibv_free_dm is a verbs.h inline reaching the provider's free_dm, so it is called on a
        // test double's context too (whose provider implements it).
        // SAFETY: raw came from ibv_alloc_dm and is freed once; every region over it holds an
        // Arc of this allocation, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_free_dm(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_free_dm", "device memory", &e);
        }
    }
}

/// Memory on the device (`ibv_alloc_dm`). The CPU reaches it by copy only; the device through
/// regions registered over it ([`ProtectionDomain::reg_dm_mr`]), which keep it allocated.
#[doc(alias = "ibv_dm")]
#[doc(alias = "ibv_free_dm")]
pub struct DeviceMemory {
    alloc: Arc<DmAllocation>,
}

impl DeviceContext {
    /// Allocates `len` bytes of device memory (`ibv_alloc_dm`), aligned to
    /// `2^log_align_req` bytes (0: the device's default). Devices without device memory (rxe,
    /// siw) fail with `EOPNOTSUPP` ([`DeviceMemoryError::is_not_supported`]).
    #[doc(alias = "ibv_alloc_dm")]
    #[doc(alias = "ibv_alloc_dm_attr")]
    pub fn alloc_dm(
        self: &Arc<Self>,
        len: usize,
        log_align_req: u32,
    ) -> Result<DeviceMemory, DeviceMemoryError> {
        let mut attr = ffi::ibv_alloc_dm_attr {
            length: len,
            log_align_req,
            comp_mask: 0,
        };
        // SAFETY: the context is open for as long as self lives; attr is initialised and only
        // read by the verb.
        let dm = fresh(|| unsafe { ffi::ibv_alloc_dm(self.as_raw(), &mut attr) });
        let raw = non_null(dm).map_err(|source| DeviceMemoryError::Alloc {
            device: self.name().to_owned(),
            len,
            log_align_req,
            source,
        })?;
        Ok(DeviceMemory {
            alloc: Arc::new(DmAllocation {
                raw,
                ctx: Arc::clone(self),
                len,
            }),
        })
    }
}

/// `offset..offset + len` inside `dm_len` bytes.
fn check_range(offset: usize, len: usize, dm_len: usize) -> Result<(), DeviceMemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= dm_len => Ok(()),
        _ => Err(DeviceMemoryError::OutOfRange {
            offset,
            len,
            dm_len,
        }),
    }
}

impl DeviceMemory {
    /// The length in bytes, as allocated.
    pub fn len(&self) -> usize {
        self.alloc.len
    }

    /// True for zero bytes.
    pub fn is_empty(&self) -> bool {
        self.alloc.len == 0
    }

    /// The device context it was allocated on.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.alloc.ctx
    }

    /// The raw `ibv_dm`, valid while this device memory is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.alloc.raw.as_ptr()
    }

    /// The kernel's handle of this device memory.
    pub fn handle(&self) -> u32 {
        // SAFETY: raw is a live ibv_dm; reading a plain field.
        unsafe { (*self.alloc.raw.as_ptr()).handle }
    }

    /// Copies `data` into the device memory at `offset` (`ibv_memcpy_to_dm`).
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn copy_to(&mut self, offset: usize, data: &[u8]) -> Result<(), DeviceMemoryError> {
        check_range(offset, data.len(), self.len())?;
        // SAFETY: raw is live; offset + len lies inside it (checked); data is a valid slice
        // the verb only reads; `&mut self` excludes every other CPU writer.
        let ret = fresh(|| unsafe {
            ffi::ibv_memcpy_to_dm(
                self.as_raw(),
                offset as u64,
                data.as_ptr().cast(),
                data.len(),
            )
        });
        from_ret(ret)
            .map_err(|source| self.copy_error("ibv_memcpy_to_dm", offset, data.len(), source))
    }

    /// Copies `out.len()` bytes from `offset` of the device memory into `out`
    /// (`ibv_memcpy_from_dm`). Bytes the device is writing at that moment may be copied half
    /// old, half new: copy after the completion that says the device is done.
    #[doc(alias = "ibv_memcpy_from_dm")]
    pub fn copy_from(&self, offset: usize, out: &mut [u8]) -> Result<(), DeviceMemoryError> {
        check_range(offset, out.len(), self.len())?;
        let len = out.len();
        // SAFETY: raw is live; offset + len lies inside it (checked); out is a valid slice
        // the verb writes len bytes of.
        let ret = fresh(|| unsafe {
            ffi::ibv_memcpy_from_dm(out.as_mut_ptr().cast(), self.as_raw(), offset as u64, len)
        });
        from_ret(ret).map_err(|source| self.copy_error("ibv_memcpy_from_dm", offset, len, source))
    }

    fn copy_error(
        &self,
        call: &'static str,
        offset: usize,
        len: usize,
        source: io::Error,
    ) -> DeviceMemoryError {
        DeviceMemoryError::Copy {
            call,
            device: self.context().name().to_owned(),
            offset,
            len,
            source,
        }
    }
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("device", &self.context().name())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes of device memory from `offset` (`ibv_reg_dm_mr`), zero-based as
    /// the verb requires: `ZERO_BASED` is added to `access`, and work requests address the
    /// region's first byte (the device memory's byte `offset`) as 0. The region holds the
    /// device memory: it is freed only after every region over it is deregistered.
    ///
    /// Refused before the provider is called: a range outside the device memory
    /// ([`DeviceMemoryError::OutOfRange`]), `ON_DEMAND` ([`DeviceMemoryError::OnDemand`]), and
    /// device memory of another context ([`DeviceMemoryError::OtherContext`]).
    #[doc(alias = "ibv_reg_dm_mr")]
    pub fn reg_dm_mr(
        self: &Arc<Self>,
        dm: &DeviceMemory,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, DeviceMemoryError> {
        if access.contains(AccessFlags::ON_DEMAND) {
            return Err(DeviceMemoryError::OnDemand { access });
        }
        if dm.context().as_raw() != self.context().as_raw() {
            return Err(DeviceMemoryError::OtherContext {
                dm_device: dm.context().name().to_owned(),
                pd_device: self.context().name().to_owned(),
            });
        }
        check_range(offset, len, dm.len())?;
        let access = access | AccessFlags::ZERO_BASED;
        let access_c = access.bits();
        // SAFETY: the PD and the device memory are alive and of one context; the range lies
        // inside the device memory (checked). The region keeps the device memory (owner
        // below), so it is not freed while the device may reach it.
        let mr = fresh(|| unsafe {
            ffi::ibv_reg_dm_mr(self.as_raw(), dm.as_raw(), offset as u64, len, access_c)
        });
        let raw = non_null(mr).map_err(|source| DeviceMemoryError::Register {
            device: self.context().name().to_owned(),
            offset,
            len,
            access,
            source,
        })?;
        // Zero-based: the region's first byte is address 0 for work requests, whatever the
        // provider left in ibv_mr.addr.
        Ok(self.wrap_mr(raw, 0, access, Some(Box::new(Arc::clone(&dm.alloc)))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 64, 64).is_ok());
        assert!(check_range(64, 0, 64).is_ok());
        assert!(matches!(
            check_range(1, 64, 64),
            Err(DeviceMemoryError::OutOfRange {
                offset: 1,
                len: 64,
                dm_len: 64
            })
        ));
        let e = check_range(usize::MAX, 2, 64).unwrap_err();
        assert!(
            e.to_string().contains("outside the 64-byte device memory"),
            "{e}"
        );
    }

    #[test]
    fn not_supported_says_so() {
        let e = DeviceMemoryError::Alloc {
            device: "rxe0".into(),
            len: 4096,
            log_align_req: 0,
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.is_not_supported());
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_alloc_dm of 4096 bytes (log_align_req 0) failed on rxe0"),
            "{text}"
        );
        assert!(text.contains("not supported by this device"), "{text}");
        assert!(!DeviceMemoryError::OnDemand {
            access: AccessFlags::ON_DEMAND
        }
        .is_not_supported());
    }
}
