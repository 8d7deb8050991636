//! Memory regions (`struct ibv_mr`): memory the device may read and write.
//!
//! # The rule
//!
//! **Registered memory outlives its registration, and a registration outlives every window
//! bound to it and every posted request that names it, as far as safe code can reach.**
//! The types keep it by construction:
//!
//! - A [`MemoryRegion`] owns its backing memory: the page-aligned heap memory of
//!   [`ProtectionDomain::reg_buffer`], or whatever owner the caller handed to
//!   [`reg_mr_owned`](ProtectionDomain::reg_mr_owned),
//!   [`reg_buffer_owned`](ProtectionDomain::reg_buffer_owned) or
//!   [`reg_dmabuf_mr_owned`](ProtectionDomain::reg_dmabuf_mr_owned) (huge pages, GPU memory).
//!   The owner is dropped only after `ibv_dereg_mr` succeeded. Cloning the region's `Arc`
//!   (from [`RegisteredBuffer::mr`], say) keeps the memory alive with it: the memory cannot be
//!   split from its registration.
//! - A failed deregistration means the device may still reach the memory: the owner is then
//!   leaked on purpose, never freed, and the failure is reported and counted
//!   ([`leaked_memory`]).
//! - A [`MemoryWindow`](crate::memory_window::MemoryWindow) holds an `Arc` of every region it was
//!   asked to bind until it is dropped, so a region with bound windows is never deregistered (the
//!   kernel would refuse).
//! - A posted request names memory by local key: once the region is deregistered, the device
//!   rejects the key (a protection-error completion) instead of touching the memory, so
//!   requests need not keep it alive.
//! - No safe `&[u8]`/`&mut [u8]` exists over memory the device may write
//!   ([`RegisteredBuffer`], the default kind): it offers copies in and out, volatile reads for
//!   spin loops, inline sends straight from the buffer, and an `unsafe` view for protocol
//!   owners. Memory the device can only read ([`RegisteredBuffer<DeviceReadOnly>`], from
//!   [`reg_read_only_buffer`](ProtectionDomain::reg_read_only_buffer)) keeps safe slices.
//!
//! - An imported region ([`ProtectionDomain::import_mr`]) owns nothing: its memory is the
//!   exporter's, and the exporter may be this process. It makes no safe scatter/gather
//!   entry ([`MemoryRegion::sge`] is `None`; [`MemoryRegion::imported_sge`] is `unsafe`).
//!
//! [`ProtectionDomain::reg_mr`] registers memory nobody hands over; it is `unsafe`, and its
//! caller keeps the rule by hand. [`ProtectionDomain::reg_dmabuf_mr`] registers a dma-buf
//! (GPU memory exported by its driver) and is safe: no process memory is named.
//!
//! ```compile_fail,E0599
//! // A buffer the device may write has no safe slice...
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) {
//! let buf = pd.reg_buffer(64, sideway::memory_region::AccessFlags::LOCAL_WRITE).unwrap();
//! let bytes: &[u8] = buf.as_slice();
//! # }
//! ```
//!
//! ```compile_fail,E0133
//! // ...and its view is unsafe.
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) {
//! let buf = pd.reg_buffer(64, sideway::memory_region::AccessFlags::LOCAL_WRITE).unwrap();
//! let bytes: &[u8] = buf.view();
//! # }
//! ```
//!
//! ```no_run
//! // Memory the device only reads keeps its slices.
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) -> Result<(), sideway::memory_region::MemoryRegionError> {
//! let mut buf = pd.reg_read_only_buffer(64, sideway::memory_region::AccessFlags::REMOTE_READ)?;
//! buf.as_mut_slice().fill(7);
//! assert_eq!(buf.as_slice()[0], 7);
//! # Ok(())
//! # }
//! ```

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
pub use crate::scatter_gather::Sge;
use crate::scatter_gather::{BufferBytes, SendData};
use crate::verbs::device::OdpCaps;
use crate::verbs::protection_domain::ProtectionDomain;

bitflags! {
    /// What the device may do with a memory region (`ibv_access_flags`).
    #[doc(alias = "ibv_access_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: receives and RDMA READ responses may write here.
        const LOCAL_WRITE = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE here (needs `LOCAL_WRITE`).
        const REMOTE_WRITE = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from here.
        const REMOTE_READ = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics here (needs `LOCAL_WRITE`).
        const REMOTE_ATOMIC = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to this region.
        const MW_BIND = ffi::ibv_access_flags::IBV_ACCESS_MW_BIND;
        /// `IBV_ACCESS_ZERO_BASED`: remote addresses are offsets from the region's start.
        const ZERO_BASED = ffi::ibv_access_flags::IBV_ACCESS_ZERO_BASED;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = ffi::ibv_access_flags::IBV_ACCESS_ON_DEMAND;
        /// `IBV_ACCESS_HUGETLB`: the memory is huge pages.
        const HUGETLB = ffi::ibv_access_flags::IBV_ACCESS_HUGETLB;
        /// `IBV_ACCESS_RELAXED_ORDERING`: PCIe relaxed ordering, where the device allows.
        const RELAXED_ORDERING = ffi::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

impl AccessFlags {
    /// The flags that let the device write the memory: receives and RDMA READ responses
    /// (`LOCAL_WRITE`), peers' writes and atomics, and bits this crate does not know (a newer
    /// rdma-core's flag might grant writes too).
    fn device_may_write(self) -> bool {
        let read_only = AccessFlags::REMOTE_READ
            | AccessFlags::MW_BIND
            | AccessFlags::ZERO_BASED
            | AccessFlags::ON_DEMAND
            | AccessFlags::HUGETLB
            | AccessFlags::RELAXED_ORDERING;
        !read_only.contains(self)
    }
}

/// Why a memory region could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryRegionError {
    /// The registration verb failed.
    #[error("{call} of {len} bytes at {}{addr:#x} with access {access:?} failed on {device}: {source}{}",
        where_kind(call), hint(source, *access))]
    Register {
        /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
        call: &'static str,
        /// The device's name.
        device: String,
        /// Start address (or dma-buf offset).
        addr: u64,
        /// Length in bytes.
        len: usize,
        /// The access asked for.
        access: AccessFlags,
        /// The errno.
        source: io::Error,
    },
    /// The buffer could not be allocated.
    #[error("cannot allocate a {len}-byte buffer to register")]
    Allocate {
        /// The size asked for.
        len: usize,
    },
    /// [`ProtectionDomain::reg_read_only_buffer`] was asked for access that lets the device
    /// write.
    #[error(
        "a read-only buffer cannot be registered with {access:?}: it lets the device write \
             the memory (use reg_buffer for memory the device writes)"
    )]
    WritableAccess {
        /// The access asked for.
        access: AccessFlags,
    },
    /// [`ProtectionDomain::reg_implicit_odp`] on a device whose attributes do not offer
    /// implicit on-demand regions (`IBV_ODP_SUPPORT_IMPLICIT`); nothing was registered.
    #[error(
        "an implicit on-demand region is not supported by this device ({device}): {}",
        describe_odp(caps)
    )]
    ImplicitOdpNotSupported {
        /// The device's name.
        device: String,
        /// What the device says it supports.
        caps: OdpCaps,
    },
}

/// What a device without implicit on-demand regions offers instead, in words.
fn describe_odp(caps: &OdpCaps) -> String {
    if caps.is_supported() {
        format!(
            "its on-demand paging has no implicit regions (general caps {:?})",
            caps.general
        )
    } else {
        "it has no on-demand paging at all".to_owned()
    }
}

impl MemoryRegionError {
    /// True when the device does not support what was asked (`EOPNOTSUPP`): on-demand
    /// paging (`AccessFlags::ON_DEMAND`, implicit regions) on a device without it, or a kind
    /// of memory its driver cannot register.
    pub fn is_not_supported(&self) -> bool {
        match self {
            MemoryRegionError::Register { source, .. } => {
                source.raw_os_error() == Some(libc::EOPNOTSUPP)
            }
            MemoryRegionError::ImplicitOdpNotSupported { .. } => true,
            _ => false,
        }
    }
}

/// How the error names `addr`: an address, or (dma-buf) an offset into the dma-buf.
fn where_kind(call: &str) -> &'static str {
    if call == "ibv_reg_dmabuf_mr" {
        "dma-buf offset "
    } else {
        ""
    }
}

fn hint(source: &io::Error, access: AccessFlags) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::EAGAIN) => {
            " (the locked-memory limit may be too low: check `ulimit -l`)"
        }
        Some(libc::EINVAL)
            if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !access.contains(AccessFlags::LOCAL_WRITE) =>
        {
            " (REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too)"
        }
        Some(libc::EOPNOTSUPP) if access.contains(AccessFlags::ON_DEMAND) => {
            " (not supported by this device: it has no on-demand paging; \
             DeviceAttr::odp_caps says what it supports)"
        }
        Some(libc::EOPNOTSUPP) | Some(libc::EFAULT) => {
            " (the device or its driver cannot register this kind of memory)"
        }
        _ => "",
    }
}

/// What a region keeps alive until the device can no longer reach it.
pub(crate) type Owner = Box<dyn Send + Sync>;

/// A registered memory region. Holds its protection domain and the owner of its memory;
/// deregistered on drop, and the memory freed only once that succeeded (see the
/// [module's rule](self)).
#[doc(alias = "ibv_mr")]
#[doc(alias = "ibv_dereg_mr")]
pub struct MemoryRegion {
    raw: NonNull<ffi::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    /// The address work requests use for the region's first byte: the registered address
    /// for `ibv_reg_mr`, the iova for `ibv_reg_dmabuf_mr` (whose `ibv_mr.addr` libibverbs
    /// sets to the dma-buf offset instead).
    iova: u64,
    access: AccessFlags,
    /// An implicit on-demand region ([`ProtectionDomain::reg_implicit_odp`]): it covers the
    /// whole address space, so no entry may be made from its bounds ([`MemoryRegion::sge`]
    /// refuses); entries come from the buffers it hands out.
    implicit: bool,
    /// The memory's owner, dropped after a successful deregistration, leaked after a failed
    /// one. `None` for [`ProtectionDomain::reg_mr`], whose caller owns the memory.
    owner: Option<Owner>,
    /// Imported (`ibv_import_mr`): released with `ibv_unimport_mr`, never deregistered. Its
    /// memory is the exporter's: another process's, or this one's (a context may be
    /// imported from this process's own [`cmd_fd`](crate::device::DeviceContext::cmd_fd)), and no
    /// type tells which; its bounds may even be the whole address space (an implicit
    /// on-demand region's handle). So no safe entry is made from its bounds
    /// ([`MemoryRegion::sge`] refuses; [`MemoryRegion::imported_sge`] is `unsafe`).
    imported: bool,
}

// SAFETY: an MR is immutable after registration, verbs objects may be used from any thread,
// and the owner is Send + Sync.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

/// Memory that regions failed to deregister and so leaked on purpose: see [`leaked_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeakedMemory {
    /// Regions whose deregistration failed.
    pub regions: u64,
    /// Their bytes.
    pub bytes: u64,
}

static LEAKED_REGIONS: AtomicU64 = AtomicU64::new(0);
static LEAKED_BYTES: AtomicU64 = AtomicU64::new(0);

/// How much memory this process leaked because `ibv_dereg_mr` failed: the device might still
/// reach it, so it is never freed (each case is also reported when it happens). A long-running
/// program can export this as a health metric.
pub fn leaked_memory() -> LeakedMemory {
    LeakedMemory {
        regions: LEAKED_REGIONS.load(Ordering::Relaxed),
        bytes: LEAKED_BYTES.load(Ordering::Relaxed),
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` (`ibv_reg_mr`) that the caller owns.
    ///
    /// Prefer [`reg_buffer`](Self::reg_buffer), or [`reg_mr_owned`](Self::reg_mr_owned) /
    /// [`reg_buffer_owned`](Self::reg_buffer_owned) for memory allocated elsewhere: those
    /// keep the rule of the [module](crate::memory_region) by themselves.
    ///
    /// # Safety
    ///
    /// The device may read (and, with write access, write) `addr..addr + len` at any time
    /// until the region is deregistered: the memory must stay allocated while the returned
    /// region or any clone of its `Arc` lives (windows bound to it hold one), and for ever if
    /// the deregistration fails (see [`leaked_memory`]). While remote or local write access
    /// is granted, nothing may rely on its contents being unchanged (no `&` or `&mut`
    /// references the compiler could treat as unaliased).
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        // SAFETY: forwarded: the caller vouches for the memory and owns it.
        unsafe { self.register(addr, len, access, None) }
    }

    /// Registers `len` bytes at `addr` (`ibv_reg_mr`) and hands the region `owner`, the
    /// value whose drop frees that memory: the region drops it only after a successful
    /// deregistration, and leaks it after a failed one. For device memory the CPU cannot
    /// address (GPU memory through GPUDirect); host memory is better served by
    /// [`reg_buffer_owned`](Self::reg_buffer_owned).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must stay valid for the device to read and (with write access)
    /// write for as long as `owner` is alive, and no Rust reference may cover it while write
    /// access is granted. Dropping `owner` is what frees it.
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn reg_mr_owned<O: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: O,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        // SAFETY: forwarded; the region keeps owner until the device cannot reach the memory.
        unsafe { self.register(addr, len, access, Some(Box::new(owner))) }
    }

    /// # Safety
    ///
    /// As for [`reg_mr`](Self::reg_mr), with `owner` (when given) keeping the memory valid.
    unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owner: Option<Owner>,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        let access_c = c_int::from_ne_bytes(access.bits().to_ne_bytes());
        // SAFETY: the PD is alive; the caller vouches for the memory.
        let mr = fresh(|| unsafe { ffi::ibv_reg_mr(self.as_raw(), addr.cast(), len, access_c) });
        let raw = non_null(mr).map_err(|source| {
            self.register_error("ibv_reg_mr", addr as u64, len, access, source)
        })?;
        // SAFETY: raw is the live MR the verb just returned; reading a plain field.
        let iova = unsafe { (*raw.as_ptr()).addr as u64 };
        Ok(self.wrap_mr(raw, iova, access, owner))
    }

    /// Registers `len` bytes at `offset` of a dma-buf (`ibv_reg_dmabuf_mr`), the way GPU
    /// memory reaches the device without peer-memory support. `iova` is the address work
    /// requests will use for the region's first byte.
    ///
    /// The dma-buf keeps its memory alive for the device by itself; to also tie the memory's
    /// owner (the GPU allocation, the descriptor) to the region, use
    /// [`reg_dmabuf_mr_owned`](Self::reg_dmabuf_mr_owned).
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn reg_dmabuf_mr(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        self.register_dmabuf(fd, offset, len, iova, access, None)
    }

    /// As [`reg_dmabuf_mr`](Self::reg_dmabuf_mr), and the region keeps `owner` (the GPU
    /// allocation and the dma-buf descriptor, say) until it is deregistered: dropped after a
    /// successful deregistration, leaked after a failed one.
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn reg_dmabuf_mr_owned<O: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: O,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        self.register_dmabuf(fd, offset, len, iova, access, Some(Box::new(owner)))
    }

    fn register_dmabuf(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
        owner: Option<Owner>,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        let access_c = c_int::from_ne_bytes(access.bits().to_ne_bytes());
        // SAFETY: the PD is alive and fd is an open descriptor for the call's duration; the
        // region names dma-buf memory, never this process's memory.
        let mr = fresh(|| unsafe {
            ffi::ibv_reg_dmabuf_mr(self.as_raw(), offset, len, iova, fd.as_raw_fd(), access_c)
        });
        let raw = non_null(mr).map_err(|source| {
            self.register_error("ibv_reg_dmabuf_mr", offset, len, access, source)
        })?;
        Ok(self.wrap_mr(raw, iova, access, owner))
    }

    /// Allocates `len` bytes of zeroed, page-aligned memory and registers it
    /// (`ibv_reg_mr`): the safe way to get registered memory. The region owns the memory;
    /// the buffer is the CPU's handle on it.
    #[doc(alias = "ibv_reg_mr")]
    pub fn reg_buffer(
        self: &Arc<Self>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer, MemoryRegionError> {
        self.heap_buffer(len, access)
    }

    /// As [`reg_buffer`](Self::reg_buffer), for memory the device only reads (the source of
    /// SENDs and RDMA WRITEs, the target of a peer's RDMA READs): `access` may not contain
    /// `LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC` or bits this crate does not know
    /// ([`MemoryRegionError::WritableAccess`]). Such a buffer keeps safe slices.
    #[doc(alias = "ibv_reg_mr")]
    pub fn reg_read_only_buffer(
        self: &Arc<Self>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer<DeviceReadOnly>, MemoryRegionError> {
        if access.device_may_write() {
            return Err(MemoryRegionError::WritableAccess { access });
        }
        self.heap_buffer(len, access)
    }

    fn heap_buffer<A: BufferAccess>(
        self: &Arc<Self>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer<A>, MemoryRegionError> {
        let memory = HeapMemory::zeroed(len)?;
        let ptr = memory.ptr;
        // SAFETY: the heap memory is len zeroed bytes owned by `memory` alone, freed only when
        // it drops, at a fixed address.
        unsafe { self.buffer(memory, ptr, len, access) }
    }

    /// Registers `len` bytes of host memory at `ptr` that `owner` frees when dropped (huge
    /// pages from `mmap`, memory from another allocator), as a [`RegisteredBuffer`]: the
    /// region drops `owner` only after a successful deregistration, and leaks it after a
    /// failed one.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be memory that `owner` owns: initialised, valid for reads and
    /// writes, at a fixed address, touched by nothing else while `owner` lives (the buffer
    /// becomes its only handle), and freed only by dropping `owner`.
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn reg_buffer_owned<O: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: O,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer, MemoryRegionError> {
        // SAFETY: forwarded.
        unsafe { self.buffer(owner, ptr, len, access) }
    }

    /// # Safety
    ///
    /// As for [`reg_buffer_owned`](Self::reg_buffer_owned).
    unsafe fn buffer<A: BufferAccess, O: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: O,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer<A>, MemoryRegionError> {
        // SAFETY: the region owns `owner` and with it the memory, which it frees only once
        // the device can no longer reach it.
        let mr = unsafe { self.register(ptr.as_ptr(), len, access, Some(Box::new(owner)))? };
        Ok(RegisteredBuffer {
            mr,
            ptr,
            len,
            _access: PhantomData,
        })
    }

    pub(crate) fn register_error(
        &self,
        call: &'static str,
        addr: u64,
        len: usize,
        access: AccessFlags,
        source: io::Error,
    ) -> MemoryRegionError {
        MemoryRegionError::Register {
            call,
            device: self.context().name().to_owned(),
            addr,
            len,
            access,
            source,
        }
    }

    /// Wraps a region a registration verb just returned: `iova` is the address work requests
    /// use for its first byte, `owner` what keeps its memory valid (see the module's rule).
    pub(crate) fn wrap_mr(
        self: &Arc<Self>,
        raw: NonNull<ffi::ibv_mr>,
        iova: u64,
        access: AccessFlags,
        owner: Option<Owner>,
    ) -> Arc<MemoryRegion> {
        Arc::new(MemoryRegion {
            raw,
            pd: Arc::clone(self),
            iova,
            access,
            implicit: false,
            owner,
            imported: false,
        })
    }

    /// Wraps a region `ibv_import_mr` just returned: dropping it calls `ibv_unimport_mr`.
    /// Its memory is the exporter's, which may be this process: it makes no safe entries.
    ///
    /// # Safety
    ///
    /// `raw` is a live imported region of this PD, released by nothing else.
    pub(crate) unsafe fn wrap_imported_mr(
        self: &Arc<Self>,
        raw: NonNull<ffi::ibv_mr>,
        access: AccessFlags,
    ) -> Arc<MemoryRegion> {
        // SAFETY: raw is the live MR the caller vouches for; reading a plain field.
        let iova = unsafe { (*raw.as_ptr()).addr as u64 };
        Arc::new(MemoryRegion {
            raw,
            pd: Arc::clone(self),
            iova,
            access,
            implicit: false,
            owner: None,
            imported: true,
        })
    }

    /// Wraps an implicit on-demand region (`ibv_reg_mr(pd, NULL, SIZE_MAX, ..)`) that keeps
    /// `owner` (the memory of the buffers handed out on it) until it is deregistered.
    pub(crate) fn wrap_implicit_mr(
        self: &Arc<Self>,
        raw: NonNull<ffi::ibv_mr>,
        access: AccessFlags,
        owner: Owner,
    ) -> Arc<MemoryRegion> {
        Arc::new(MemoryRegion {
            raw,
            pd: Arc::clone(self),
            iova: 0,
            access,
            implicit: true,
            owner: Some(owner),
            imported: false,
        })
    }
}

const PAGE_ALIGN: usize = 4096;

/// The system's page size (`sysconf(_SC_PAGESIZE)`); 4096 where the system does not say.
pub fn page_size() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

impl MemoryRegion {
    /// The local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: raw is a live MR; reading a plain field.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// The remote key, for peers' RDMA operations.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The start address work requests use for the region: the registered address, or for
    /// a dma-buf region the iova it was registered with.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: as for lkey.
        unsafe { (*self.raw.as_ptr()).length }
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The access the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while this region is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    /// The kernel's handle of this region: what another process imports it by
    /// ([`ProtectionDomain::import_mr`](crate::protection_domain::ProtectionDomain::import_mr)).
    pub fn handle(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.raw.as_ptr()).handle }
    }

    /// True for an imported region (`ibv_import_mr`): its addresses are the exporter's
    /// (another process's, or this one's), it makes no safe scatter/gather entries
    /// ([`sge`](Self::sge) is `None`, [`imported_sge`](Self::imported_sge) is `unsafe`), and
    /// dropping it releases only this process's handle (`ibv_unimport_mr`).
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// True for an implicit on-demand region, which covers the whole address space
    /// ([`ProtectionDomain::reg_implicit_odp`]).
    pub fn is_implicit_odp(&self) -> bool {
        self.implicit
    }

    /// A scatter/gather entry for `range` (byte offsets into the region), or `None` when the
    /// range does not lie inside it.
    ///
    /// Always `None` for an implicit on-demand region: every address lies inside it, so its
    /// entries come only from the buffers it hands out
    /// ([`ImplicitOdpRegion::alloc_buffer`](crate::odp::ImplicitOdpRegion::alloc_buffer)).
    ///
    /// Always `None` for an imported region ([`is_imported`](Self::is_imported)): its memory
    /// is the exporter's, which may be this very process (importing this process's own
    /// context, PD and region is safe), and its bounds may be the whole address space (an
    /// implicit region's handle imported): an entry from them could let a receive land in
    /// any Rust object, live or freed. Entries over an imported region are
    /// [`imported_sge`](Self::imported_sge), whose caller vouches for the memory.
    ///
    /// ```no_run
    /// # fn f(ctx: &std::sync::Arc<sideway::device::DeviceContext>) -> Result<(), Box<dyn std::error::Error>> {
    /// let pd = ctx.alloc_pd()?;
    /// let odp = pd.reg_implicit_odp()?;
    /// let imported = sideway::device::DeviceContext::import_device(ctx.cmd_fd().try_clone_to_owned()?)?;
    /// let mr = imported.import_pd(pd.handle())?.import_mr(odp.mr().handle())?;
    /// assert!(mr.sge(0x1000..0x2000).is_none()); // no entry from another registration's bounds
    /// # Ok(()) }
    /// ```
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        if self.implicit || self.imported {
            return None;
        }
        self.sge_in_bounds(range)
    }

    /// A scatter/gather entry for `range` (byte offsets) of an imported region
    /// ([`ProtectionDomain::import_mr`](crate::protection_domain::ProtectionDomain::import_mr)), or
    /// `None` when the region is not imported (use [`sge`](Self::sge)) or the range does not lie
    /// inside its bounds. The entry names the exporter's addresses, `addr() + range`, with the
    /// region's local key.
    ///
    /// # Safety
    ///
    /// The exporter may be this process (a context imported from its own
    /// [`cmd_fd`](crate::device::DeviceContext::cmd_fd)), and the bounds may be the whole address
    /// space (an implicit on-demand region's handle), so the entry may name any memory of
    /// this process. Where the memory it names is this process's, the caller vouches that it
    /// stays valid (allocated, not freed) for as long as any work request naming the entry
    /// may be outstanding (until its completion is polled, or its queue pair is destroyed),
    /// and, where the request lets the device write it (a receive, an RDMA READ's
    /// destination, an atomic's result), that no Rust reference, shared or mutable, covers it
    /// for that long. Where it is another process's memory, this process's soundness does not
    /// rest on it: that process's protocol does.
    #[doc(alias = "ibv_import_mr")]
    pub unsafe fn imported_sge(&self, range: Range<usize>) -> Option<Sge> {
        if !self.imported {
            return None;
        }
        self.sge_in_bounds(range)
    }

    /// The entry for `range` when it lies inside the region's bounds; no other check.
    fn sge_in_bounds(&self, range: Range<usize>) -> Option<Sge> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(Sge(ffi::ibv_sge {
            addr: self.addr().checked_add(range.start as u64)?,
            length: u32::try_from(range.end - range.start).ok()?,
            lkey: self.lkey(),
        }))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if self.imported {
            // The exporter owns the registration and its memory; this process only lets go of
            // its handle.
            // SAFETY: raw came from ibv_import_mr and is released exactly once.
            unsafe { ffi::ibv_unimport_mr(self.raw.as_ptr()) };
            return;
        }
        if !self.pd.context().owns_objects() {
            // A test double's region (over a test provider's device memory, or
            // ImplicitOdpRegion::from_raw_parts): its provider cannot answer libibverbs'
            // ibv_dereg_mr. The owner drops with the region.
            return;
        }
        let len = self.len();
        // SAFETY: raw came from a registration verb and is deregistered exactly once.
        let ret = fresh(|| unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            // The device may still reach the memory: never free it.
            if let Some(owner) = self.owner.take() {
                std::mem::forget(owner);
            }
            LEAKED_REGIONS.fetch_add(1, Ordering::Relaxed);
            LEAKED_BYTES.fetch_add(len as u64, Ordering::Relaxed);
            crate::diagnostics::report_drop_failure(
                "ibv_dereg_mr",
                "a memory region (its memory is leaked, not freed, as the device may still reach it)",
                &e,
            );
        }
        // Otherwise the owner drops with the region, now that the device cannot reach it.
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .field("imported", &self.imported)
            .finish()
    }
}

/// Page-aligned, zeroed heap memory: the owner behind [`ProtectionDomain::reg_buffer`].
pub(crate) struct HeapMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the memory is owned exclusively; moving or sharing this value only moves or shares
// the right to free it, which needs `&mut` (drop).
unsafe impl Send for HeapMemory {}
// SAFETY: as above: `&HeapMemory` gives no access to the bytes.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    pub(crate) fn zeroed(len: usize) -> Result<Self, MemoryRegionError> {
        let layout = Layout::from_size_align(len.max(1), PAGE_ALIGN)
            .map_err(|_| MemoryRegionError::Allocate { len })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or(MemoryRegionError::Allocate { len })?;
        Ok(HeapMemory { ptr, layout })
    }

    /// The first byte.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The bytes asked for (at least 1 is allocated).
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

mod sealed {
    pub trait Sealed {}
}

/// What the device may do with a [`RegisteredBuffer`]'s memory, as a type: decides whether
/// the CPU gets safe slices. Implemented by [`DeviceWritable`] and [`DeviceReadOnly`] only.
pub trait BufferAccess: sealed::Sealed + Send + Sync + 'static {}

/// The device may write the memory (receives, RDMA READ responses, peers' WRITEs and
/// atomics): no safe slices. The default kind of [`RegisteredBuffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceWritable {}

/// The device only reads the memory (registered without any write access): the CPU keeps
/// safe slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceReadOnly {}

impl sealed::Sealed for DeviceWritable {}
impl sealed::Sealed for DeviceReadOnly {}
impl BufferAccess for DeviceWritable {}
impl BufferAccess for DeviceReadOnly {}

/// Plain integers the device may write and the CPU may read in place
/// ([`RegisteredBuffer::read_volatile`]): any bit pattern is a valid value.
pub trait Plain: sealed::Sealed + Copy + Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8, u16, u32, u64, i8, i16, i32, i64);

/// Why a [`RegisteredBuffer`] access was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// The range does not lie inside the buffer.
    #[error("bytes {start}..{end} are outside the {len}-byte buffer")]
    OutOfRange {
        /// First byte asked for.
        start: usize,
        /// One past the last.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// An in-place read at an offset its type's alignment does not allow.
    #[error("offset {offset} is not aligned to {align} bytes for an in-place read")]
    Misaligned {
        /// The offset asked for.
        offset: usize,
        /// The alignment the type needs.
        align: usize,
    },
}

/// Registered host memory: the CPU's handle on it, with the region that owns it.
///
/// The [`MemoryRegion`] owns the memory (see the [module's rule](self)); the buffer is the
/// only way the CPU reaches the bytes. For the default kind, [`DeviceWritable`], the device
/// may write them at any moment, so there is no safe slice. Instead:
///
/// - copies: [`write_at`](Self::write_at), [`fill`](Self::fill) (`&mut self`, so no two
///   CPU writers race), [`read_at`](Self::read_at), [`to_vec`](Self::to_vec);
/// - [`read_volatile`](Self::read_volatile) for a flag or counter the device writes (a
///   ping-pong's last byte, an atomic's result), re-read on every call;
/// - [`inline`](Self::inline) to send bytes straight from the buffer as inline data;
/// - [`view`](Self::view) / [`view_mut`](Self::view_mut): `unsafe` slices for code that
///   knows, from its protocol, that the device is not writing them.
///
/// A buffer from [`ProtectionDomain::reg_read_only_buffer`] (`RegisteredBuffer<DeviceReadOnly>`)
/// also has [`as_slice`](RegisteredBuffer::as_slice) and
/// [`as_mut_slice`](RegisteredBuffer::as_mut_slice).
///
/// ```no_run
/// # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) -> Result<(), Box<dyn std::error::Error>> {
/// use sideway::memory_region::AccessFlags;
/// let mut buf = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// buf.write_at(0, b"hello")?;            // what a SEND will carry
/// let sge = buf.sge(0..5).expect("inside the buffer");
/// // ... post the SEND with `sge`, and a receive into buf.sge(1024..2048) ...
/// let mut got = [0u8; 16];
/// buf.read_at(1024, &mut got)?;          // after the receive's completion
/// let flag: u8 = buf.read_volatile(4095)?; // a byte a peer's WRITE sets
/// # let _ = (sge, flag);
/// # Ok(())
/// # }
/// ```
pub struct RegisteredBuffer<A: BufferAccess = DeviceWritable> {
    mr: Arc<MemoryRegion>,
    /// The first byte; `len` bytes owned by `mr`'s owner, alive as long as `mr`.
    ptr: NonNull<u8>,
    len: usize,
    _access: PhantomData<A>,
}

// SAFETY: the memory is kept alive by the region (Send + Sync); the buffer is the only CPU
// handle on it, and writes through it need `&mut self`.
unsafe impl<A: BufferAccess> Send for RegisteredBuffer<A> {}
// SAFETY: shared access only copies out, reads in place (volatile) or hands out `unsafe`
// views: no CPU write can race with it.
unsafe impl<A: BufferAccess> Sync for RegisteredBuffer<A> {}

impl RegisteredBuffer {
    /// A buffer over `len` bytes at `ptr` that `mr` keeps alive (its owner holds them).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is initialised memory, inside what `mr` registered, owned by `mr`'s
    /// owner (freed only after the region is deregistered, never while it is), and reached by
    /// nothing else: the returned buffer is its only handle.
    pub(crate) unsafe fn from_region_memory(
        mr: Arc<MemoryRegion>,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Self {
        RegisteredBuffer {
            mr,
            ptr,
            len,
            _access: PhantomData,
        }
    }
}

impl<A: BufferAccess> RegisteredBuffer<A> {
    /// The memory region, which owns the memory: a clone of it keeps the memory registered
    /// and alive after the buffer is dropped (for a window, or a peer that still holds the
    /// rkey), never the other way round.
    pub fn mr(&self) -> &Arc<MemoryRegion> {
        &self.mr
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// The start address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A raw pointer to the first byte, for FFI; what may be done through it is what
    /// [`view`](Self::view) and [`view_mut`](Self::view_mut) require.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// A scatter/gather entry for `range` of the buffer, `None` when out of bounds.
    ///
    /// Made from the buffer's own bounds, not the region's: a buffer handed out by an
    /// implicit on-demand region ([`ImplicitOdpRegion`](crate::odp::ImplicitOdpRegion)) is
    /// a small part of a region that covers every address.
    #[inline]
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        let n = self.check_range(&range).ok()?;
        Some(Sge(ffi::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: u32::try_from(n).ok()?,
            lkey: self.mr.lkey(),
        }))
    }

    #[inline]
    fn check(&self, start: usize, n: usize) -> Result<(), BufferError> {
        match start.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            end => Err(BufferError::OutOfRange {
                start,
                end: end.unwrap_or(usize::MAX),
                len: self.len,
            }),
        }
    }

    /// `range`'s length, when it lies inside the buffer.
    #[inline]
    fn check_range(&self, range: &Range<usize>) -> Result<usize, BufferError> {
        let n = range
            .end
            .checked_sub(range.start)
            .ok_or(BufferError::OutOfRange {
                start: range.start,
                end: range.end,
                len: self.len,
            })?;
        self.check(range.start, n)?;
        Ok(n)
    }

    /// Copies `data` into the buffer at `offset` (what the device will send, or what a peer
    /// may READ).
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), BufferError> {
        self.check(offset, data.len())?;
        // SAFETY: offset + data.len() <= len (checked), so the destination lies inside the
        // live memory; `data` is a Rust slice, so it cannot overlap memory only the buffer
        // reaches; `&mut self` excludes every other CPU access through the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Sets every byte of `range` to `byte`.
    pub fn fill(&mut self, range: Range<usize>, byte: u8) -> Result<(), BufferError> {
        let n = self.check_range(&range)?;
        // SAFETY: the range lies inside the live memory (checked); `&mut self` excludes every
        // other CPU access through the buffer.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(range.start), byte, n) };
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out`. Bytes the device is writing at that
    /// moment may be copied half old, half new: read after the completion (or the flag) that
    /// says the device is done.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), BufferError> {
        self.check(offset, out.len())?;
        // SAFETY: the source lies inside the live memory (checked); it is read through the
        // raw pointer, never through a reference, so the device writing it does not break
        // Rust's aliasing rules; `out` is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// A copy of `range`, as [`read_at`](Self::read_at) reads it.
    pub fn to_vec(&self, range: Range<usize>) -> Result<Vec<u8>, BufferError> {
        let n = self.check_range(&range)?;
        let mut out = vec![0; n];
        self.read_at(range.start, &mut out)?;
        Ok(out)
    }

    /// Reads the integer at `offset` from memory every call (a volatile read), followed by
    /// an acquire fence so that later reads are not moved before it: the way to spin on a
    /// flag a peer's RDMA WRITE sets, or to read an atomic's result. `offset` must be aligned
    /// for `T`.
    #[inline(always)]
    pub fn read_volatile<T: Plain>(&self, offset: usize) -> Result<T, BufferError> {
        self.check(offset, std::mem::size_of::<T>())?;
        let align = std::mem::align_of::<T>();
        // SAFETY: inside the live memory (checked).
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        if (p as usize) % align != 0 {
            return Err(BufferError::Misaligned { offset, align });
        }
        // SAFETY: p is in bounds and aligned for T, every bit pattern is a valid T (Plain),
        // and the read goes through the raw pointer: no reference to memory the device
        // writes.
        let value = unsafe { std::ptr::read_volatile(p.cast::<T>()) };
        std::sync::atomic::fence(Ordering::Acquire);
        Ok(value)
    }

    /// `range` of the buffer as inline data for a send
    /// ([`SendData::InlineBuffer`]): the CPU copies the bytes into the request while posting,
    /// straight from registered memory. `None` when out of bounds.
    #[inline]
    pub fn inline(&self, range: Range<usize>) -> Option<SendData<'_>> {
        let n = self.check_range(&range).ok()?;
        // SAFETY: inside the live memory (checked).
        let ptr = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(range.start)) };
        Some(SendData::InlineBuffer(BufferBytes::new(ptr, n)))
    }

    /// The bytes, as a slice.
    ///
    /// # Safety
    ///
    /// For as long as the slice lives the device must not write the memory: no receive may
    /// be posted into it and no RDMA READ or atomic may target it, and no peer may be able
    /// to WRITE or run an atomic there (its rkey unknown to peers, or the protocol
    /// guaranteeing they are idle). Otherwise the compiler's assumption that the bytes do not
    /// change under a `&[u8]` is broken: undefined behaviour.
    pub unsafe fn view(&self) -> &[u8] {
        // SAFETY: the memory is len initialised bytes alive as long as self; the caller
        // guarantees the device does not write it meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, as a mutable slice.
    ///
    /// # Safety
    ///
    /// As for [`view`](Self::view): the device must not write the memory while the slice
    /// lives. (It may read it: what it sends is then whatever the CPU had written.)
    pub unsafe fn view_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for view; `&mut self` excludes every other CPU access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl RegisteredBuffer<DeviceReadOnly> {
    /// The bytes. The device only reads them (the region has no write access), so a plain
    /// slice is sound.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len initialised bytes alive as long as self; nothing writes them while
        // `&self` is borrowed (CPU writes need `&mut self`, the device has no write access).
        unsafe { self.view() }
    }

    /// The bytes, for writing what the device will send.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice; `&mut self` excludes every other CPU access, and the
        // device only reads.
        unsafe { self.view_mut() }
    }
}

impl<A: BufferAccess> fmt::Debug for RegisteredBuffer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("mr", &self.mr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_match_c() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::from_bits_retain(1 << 30).bits(), 1 << 30);
    }

    #[test]
    fn registration_errors_hint_at_causes() {
        let e = MemoryRegionError::Register {
            call: "ibv_reg_mr",
            device: "rxe0".into(),
            addr: 0x1000,
            len: 64,
            access: AccessFlags::REMOTE_WRITE,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_reg_mr of 64 bytes at 0x1000"),
            "{text}"
        );
        assert!(text.contains("need LOCAL_WRITE too"), "{text}");
        let e = MemoryRegionError::Register {
            call: "ibv_reg_mr",
            device: "rxe0".into(),
            addr: 0,
            len: 1 << 30,
            access: AccessFlags::LOCAL_WRITE,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        assert!(e.to_string().contains("ulimit -l"));
        let e = MemoryRegionError::Register {
            call: "ibv_reg_dmabuf_mr",
            device: "rxe0".into(),
            addr: 0,
            len: 65536,
            access: AccessFlags::LOCAL_WRITE,
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_reg_dmabuf_mr of 65536 bytes at dma-buf offset 0x0 "),
            "{text}"
        );
    }
}
