//! Memory regions (`struct ibv_mr`): memory the device may read and write.
//!
//! Two ways in:
//! - [`ProtectionDomain::reg_mr`] registers memory the caller owns. It is `unsafe`: the
//!   device keeps the address after the call and may write there until the region is
//!   deregistered, so the caller must keep that memory alive and not let Rust assume it
//!   unchanged. GPU and device memory need exactly this freedom. [`ProtectionDomain::reg_dmabuf_mr`]
//!   registers a dma-buf (GPU memory exported by its driver) and is safe: no process memory
//!   is named.
//! - [`ProtectionDomain::reg_buffer`] allocates page-aligned memory and registers it: a
//!   [`RegisteredBuffer`] owns both and deregisters before it frees, so the device can never
//!   reach freed memory.

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::errno::{from_ret, non_null};
use crate::protection_domain::ProtectionDomain;

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
        Some(libc::EOPNOTSUPP) | Some(libc::EFAULT) => {
            " (the device or its driver cannot register this kind of memory)"
        }
        _ => "",
    }
}

/// A registered memory region. Holds its protection domain; deregistered on drop.
#[doc(alias = "ibv_mr")]
pub struct MemoryRegion {
    raw: NonNull<ffi::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    /// The address work requests use for the region's first byte: the registered address
    /// for `ibv_reg_mr`, the iova for `ibv_reg_dmabuf_mr` (whose `ibv_mr.addr` libibverbs
    /// sets to the dma-buf offset instead).
    iova: u64,
}

// SAFETY: an MR is immutable after registration, and verbs objects may be used from any
// thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// The device may read (and, with write access, write) `addr..addr + len` at any time
    /// until the returned region is dropped. The memory must stay allocated until then, and
    /// while remote or local write access is granted, nothing may rely on its contents being
    /// unchanged (no `&` references the compiler could treat as immutable).
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        let access_c = c_int::from_ne_bytes(access.bits().to_ne_bytes());
        // SAFETY: the PD is alive; the caller vouches for the memory.
        let mr = unsafe { ffi::ibv_reg_mr(self.as_raw(), addr.cast(), len, access_c) };
        self.wrap_mr(mr, "ibv_reg_mr", addr as u64, len, access, None)
    }

    /// Registers `len` bytes at `offset` of a dma-buf (`ibv_reg_dmabuf_mr`), the way GPU
    /// memory reaches the device without peer-memory support. `iova` is the address work
    /// requests will use for the region's first byte.
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn reg_dmabuf_mr(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        let access_c = c_int::from_ne_bytes(access.bits().to_ne_bytes());
        // SAFETY: the PD is alive and fd is an open descriptor for the call's duration; the
        // region names dma-buf memory, never this process's memory.
        let mr = unsafe {
            ffi::ibv_reg_dmabuf_mr(self.as_raw(), offset, len, iova, fd.as_raw_fd(), access_c)
        };
        self.wrap_mr(mr, "ibv_reg_dmabuf_mr", offset, len, access, Some(iova))
    }

    /// Allocates `len` bytes of zeroed, page-aligned memory and registers it
    /// (`ibv_reg_mr`): the safe way to get registered memory.
    #[doc(alias = "ibv_reg_mr")]
    pub fn reg_buffer(
        self: &Arc<Self>,
        len: usize,
        access: AccessFlags,
    ) -> Result<RegisteredBuffer, MemoryRegionError> {
        let layout = Layout::from_size_align(len.max(1), PAGE_ALIGN)
            .map_err(|_| MemoryRegionError::Allocate { len })?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or(MemoryRegionError::Allocate { len })?;
        let memory = OwnedMemory { ptr: mem, layout };
        // SAFETY: the memory is owned by the RegisteredBuffer together with the region, which
        // is deregistered (field order) before the memory is freed.
        let mr = unsafe { self.reg_mr(mem.as_ptr(), len, access)? };
        Ok(RegisteredBuffer { mr, memory, len })
    }

    fn wrap_mr(
        self: &Arc<Self>,
        mr: *mut ffi::ibv_mr,
        call: &'static str,
        addr: u64,
        len: usize,
        access: AccessFlags,
        iova: Option<u64>,
    ) -> Result<Arc<MemoryRegion>, MemoryRegionError> {
        let raw = non_null(mr).map_err(|source| MemoryRegionError::Register {
            call,
            device: self.context().name().to_owned(),
            addr,
            len,
            access,
            source,
        })?;
        // SAFETY: raw is the live MR the verb just returned; reading a plain field.
        let iova = iova.unwrap_or_else(|| unsafe { (*raw.as_ptr()).addr as u64 });
        Ok(Arc::new(MemoryRegion {
            raw,
            pd: Arc::clone(self),
            iova,
        }))
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

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while this region is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    /// A scatter/gather entry for `range` (byte offsets into the region), or `None` when the
    /// range does not lie inside it.
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(Sge(ffi::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: u32::try_from(range.end - range.start).ok()?,
            lkey: self.lkey(),
        }))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: raw came from a registration verb and is deregistered exactly once.
        let ret = unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) };
        if let Err(e) = from_ret(ret) {
            crate::report_drop_failure("ibv_dereg_mr", "a memory region", &e);
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// A scatter/gather entry (`struct ibv_sge`): a stretch of registered memory for one work
/// request. Built safely from a region ([`MemoryRegion::sge`], [`RegisteredBuffer::sge`]),
/// which checks the bounds.
#[doc(alias = "ibv_sge")]
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct Sge(ffi::ibv_sge);

impl PartialEq for Sge {
    fn eq(&self, other: &Self) -> bool {
        (self.addr(), self.length(), self.lkey()) == (other.addr(), other.length(), other.lkey())
    }
}

impl Eq for Sge {}

impl Sge {
    /// An entry from raw parts.
    ///
    /// # Safety
    ///
    /// `addr..addr + length` must lie inside the live memory region whose local key is
    /// `lkey`, and stay valid until every work request using the entry has completed.
    pub unsafe fn from_raw_parts(addr: u64, length: u32, lkey: u32) -> Self {
        Sge(ffi::ibv_sge { addr, length, lkey })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.0.length
    }

    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }

    /// The C struct, for posting.
    pub fn as_raw(&self) -> &ffi::ibv_sge {
        &self.0
    }
}

struct OwnedMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for OwnedMemory {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Page-aligned memory this crate allocated, registered with the device.
///
/// Field order is the safety argument: the region is deregistered (so the device can no
/// longer reach the memory) before the memory is freed.
pub struct RegisteredBuffer {
    mr: Arc<MemoryRegion>,
    memory: OwnedMemory,
    len: usize,
}

// SAFETY: the buffer owns its memory exclusively (no other alias exists outside the device),
// and the region is Send + Sync.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: shared access only hands out shared slices.
unsafe impl Sync for RegisteredBuffer {}

impl RegisteredBuffer {
    /// The memory region.
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
        self.memory.ptr.as_ptr() as u64
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. With remote or receive access granted, the device may change them at any
    /// moment; read them after the completion that says it wrote them.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the memory is allocated, initialised (zeroed) and len bytes long.
        unsafe { std::slice::from_raw_parts(self.memory.ptr.as_ptr(), self.len) }
    }

    /// The bytes, for writing what the device will send.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice; &mut self excludes other Rust references.
        unsafe { std::slice::from_raw_parts_mut(self.memory.ptr.as_ptr(), self.len) }
    }

    /// A scatter/gather entry for `range` of the buffer, `None` when out of bounds.
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        self.mr.sge(range)
    }
}

impl fmt::Debug for RegisteredBuffer {
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
