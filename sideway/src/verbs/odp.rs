//! On-demand paging: implicit on-demand regions ([`ImplicitOdpRegion`]) and prefetch advice
//! (`ibv_advise_mr`, [`ProtectionDomain::advise_mr`], [`RegisteredBuffer::advise`]).
//!
//! An *explicit* on-demand region is an ordinary registration with
//! [`AccessFlags::ON_DEMAND`]: `pd.reg_buffer(len, AccessFlags::LOCAL_WRITE |
//! AccessFlags::ON_DEMAND)`. The device then faults pages in as it touches them instead of
//! pinning them all at registration. What a device supports is in
//! [`DeviceAttr::odp_caps`](crate::device::DeviceAttr::odp_caps); a device without on-demand
//! paging refuses the registration with `EOPNOTSUPP`
//! ([`MemoryRegionError::is_not_supported`]).
//!
//! # Implicit regions, and why the safe one is local-only
//!
//! An implicit region (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | ..)`) covers
//! the process's whole address space: with its key the device may read and write *any*
//! address. Two things would let safe code turn that into memory corruption, and both are
//! closed:
//!
//! - **A local entry over memory the program does not own.** An entry with the region's
//!   local key may name any address, so no entry is made from the region's bounds
//!   ([`MemoryRegion::sge`] returns `None` for it; [`Sge::from_raw_parts`] is `unsafe`).
//!   Entries come only from buffers the region hands out
//!   ([`ImplicitOdpRegion::alloc_buffer`]): heap memory that the region owns, reached from
//!   the CPU only through the [`RegisteredBuffer`] (no safe slice: the device may write it),
//!   and freed only when the device context closes, after the region is deregistered, so a
//!   receive still posted into a dropped buffer never lands in freed memory. Deregistration
//!   alone would not do: mlx5 caches deregistered mkeys and gives the same value to the next
//!   registration of the same shape, and every implicit region has the same shape (`NULL`,
//!   `SIZE_MAX`), so a receive left queued with the old key would pass the key check again.
//!   No queue outlives its context (each holds the context's `Arc`). Dropping a buffer, or
//!   the region, therefore does not give the memory back: the context does, when it closes.
//!   The region's handle ([`MemoryRegion::handle`]) does not reopen the hole: a region
//!   imported from it ([`ProtectionDomain::import_mr`], which works within this process too,
//!   through [`DeviceContext::cmd_fd`](crate::device::DeviceContext::cmd_fd) and
//!   [`DeviceContext::import_device`](crate::device::DeviceContext::import_device)) has the same
//!   whole-address-space bounds, but no imported region makes safe entries
//!   ([`MemoryRegion::sge`] returns `None` for it too; [`MemoryRegion::imported_sge`] is
//!   `unsafe`; see [`sharing`](crate::sharing)).
//! - **A peer reaching any address.** [`ProtectionDomain::reg_implicit_odp`] grants local
//!   access only (`LOCAL_WRITE | ON_DEMAND`): no remote access and no window binding, so the
//!   region's remote key is useless to peers. Remote access over the whole address space
//!   cannot be made safe by types (a peer writes where its protocol says), so it is
//!   [`reg_implicit_odp_with_access`](ProtectionDomain::reg_implicit_odp_with_access), an
//!   `unsafe fn` whose caller vouches for the peers.
//!
//! ```compile_fail,E0133
//! // Remote access over the whole address space is the caller's promise, not the type's.
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) {
//! use sideway::memory_region::AccessFlags;
//! let odp = pd.reg_implicit_odp_with_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
//! # }
//! ```
//!
//! ```no_run
//! # fn f(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>) -> Result<(), Box<dyn std::error::Error>> {
//! use sideway::odp::{AdviseFlags, AdviseMr};
//! let odp = pd.reg_implicit_odp()?;          // local access only
//! assert!(odp.mr().sge(0..64).is_none());    // no entry over arbitrary addresses
//! let buf = odp.alloc_buffer(4096)?;         // memory the region owns
//! let sge = buf.sge(0..4096).expect("inside the buffer");
//! buf.advise(AdviseMr::PrefetchWrite, AdviseFlags::FLUSH, 0..4096)?;
//! # let _ = sge;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::ops::Range;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::scatter_gather::Sge;
use crate::verbs::memory_region::{
    AccessFlags, BufferError, HeapMemory, MemoryRegion, MemoryRegionError, RegisteredBuffer,
};
use crate::verbs::protection_domain::ProtectionDomain;

/// What `ibv_advise_mr` asks of the device (`enum ibv_advise_mr_advice`).
#[doc(alias = "ibv_advise_mr_advice")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdviseMr {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: fault the pages in for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: fault them in writable.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map the pages already present, faulting
    /// none in.
    PrefetchNoFault,
}

impl AdviseMr {
    fn raw(self) -> ffi::ib_uverbs_advise_mr_advice::Type {
        use ffi::ib_uverbs_advise_mr_advice as a;
        match self {
            AdviseMr::Prefetch => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            AdviseMr::PrefetchWrite => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            AdviseMr::PrefetchNoFault => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        }
    }
}

bitflags! {
    /// Flags of `ibv_advise_mr` (`ib_uverbs_advise_mr_flag`).
    #[doc(alias = "ib_uverbs_advise_mr_flag")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AdviseFlags: u32 {
        /// `IBV_ADVISE_MR_FLAG_FLUSH`: return only once the advice is carried out (without
        /// it the call may return first).
        const FLUSH = ffi::ib_uverbs_advise_mr_flag::IB_UVERBS_ADVISE_MR_FLAG_FLUSH;
        // Bits from newer rdma-core pass through.
        const _ = !0;
    }
}

/// `ibv_advise_mr` failed, or was not called.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdviseError {
    /// The verb failed; `EOPNOTSUPP` when the device's provider has no `ibv_advise_mr`
    /// ([`is_not_supported`](Self::is_not_supported)).
    #[error(
        "ibv_advise_mr ({advice:?}, flags {flags:?}, {entries} entries) failed on {device}: \
             {source}{}",
        advise_hint(source)
    )]
    Verb {
        /// The device's name.
        device: String,
        /// The advice.
        advice: AdviseMr,
        /// The flags.
        flags: AdviseFlags,
        /// How many scatter/gather entries it named.
        entries: usize,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// No entries: `ibv_advise_mr` needs at least one.
    #[error("ibv_advise_mr needs at least one scatter/gather entry")]
    NoEntries,
    /// More entries than the verb's `num_sge` can count.
    #[error("ibv_advise_mr takes at most 4294967295 scatter/gather entries, not {0}")]
    TooManyEntries(usize),
    /// The range given to [`RegisteredBuffer::advise`] is not inside the buffer.
    #[error(transparent)]
    Range(#[from] BufferError),
}

fn advise_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            " (not supported by this device: its provider or driver has no ibv_advise_mr)"
        }
        Some(libc::EINVAL) => {
            " (every entry must lie inside an on-demand region of this protection domain)"
        }
        _ => "",
    }
}

impl AdviseError {
    /// True when the device does not implement `ibv_advise_mr` (`EOPNOTSUPP`).
    pub fn is_not_supported(&self) -> bool {
        matches!(self, AdviseError::Verb { source, .. }
            if source.raw_os_error() == Some(libc::EOPNOTSUPP))
    }
}

impl ProtectionDomain {
    /// Gives the device advice about on-demand memory (`ibv_advise_mr`): prefetch the pages
    /// `sges` name into its page tables, so the first access does not fault. Each entry comes
    /// from a region or buffer ([`MemoryRegion::sge`], [`RegisteredBuffer::sge`]), so it lies
    /// inside registered memory; the device refuses (`EINVAL`) entries of regions that are
    /// not on-demand or not of this PD. The advice only maps pages: it never writes memory.
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise_mr(
        &self,
        advice: AdviseMr,
        flags: AdviseFlags,
        sges: &[Sge],
    ) -> Result<(), AdviseError> {
        if sges.is_empty() {
            return Err(AdviseError::NoEntries);
        }
        let n = u32::try_from(sges.len()).map_err(|_| AdviseError::TooManyEntries(sges.len()))?;
        // A copy: the C prototype takes a mutable list.
        let mut list: Vec<ffi::ibv_sge> = sges.iter().map(|s| *s.as_raw()).collect();
        // SAFETY: the PD is alive; list holds n initialised entries and outlives the call;
        // the verb only maps pages of registered memory, writing none of it.
        let ret = fresh(|| unsafe {
            ffi::ibv_advise_mr(
                self.as_raw(),
                advice.raw(),
                flags.bits(),
                list.as_mut_ptr(),
                n,
            )
        });
        from_ret(ret).map_err(|source| AdviseError::Verb {
            device: self.context().name().to_owned(),
            advice,
            flags,
            entries: sges.len(),
            source,
        })
    }
}

impl RegisteredBuffer {
    /// [`ProtectionDomain::advise_mr`] for `range` of this buffer (byte offsets): prefetch
    /// an on-demand buffer before its first use, as `ibv_rc_pingpong -P` does.
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(
        &self,
        advice: AdviseMr,
        flags: AdviseFlags,
        range: Range<usize>,
    ) -> Result<(), AdviseError> {
        let len = self.len();
        let sge = self
            .sge(range.clone())
            .ok_or(AdviseError::Range(BufferError::OutOfRange {
                start: range.start,
                end: range.end,
                len,
            }))?;
        self.mr().pd().advise_mr(advice, flags, &[sge])
    }
}

/// The memory of the buffers an implicit region handed out: freed once the region is
/// deregistered (leaked with it if that fails) and its device context has closed.
type Pool = Arc<Mutex<Vec<HeapMemory>>>;

/// An implicit on-demand region (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND)`):
/// one registration for the whole address space, from which buffers are handed out with no
/// registration each ([`alloc_buffer`](Self::alloc_buffer)). See the [module](self) for what
/// keeps it sound.
///
/// The region is deregistered when this value and every buffer handed out are gone; the
/// buffers' memory is freed when, after that, the device context closes.
pub struct ImplicitOdpRegion {
    mr: Arc<MemoryRegion>,
    memory: Pool,
}

impl ProtectionDomain {
    /// Registers an implicit on-demand region with local access only (`LOCAL_WRITE |
    /// ON_DEMAND`): receives and RDMA READ responses may land in its buffers, peers reach
    /// nothing. Devices without implicit on-demand paging
    /// ([`OdpCaps::supports_implicit`](crate::device::OdpCaps::supports_implicit)) are refused
    /// before the verb with [`MemoryRegionError::ImplicitOdpNotSupported`].
    #[doc(alias = "ibv_reg_mr")]
    #[doc(alias = "IBV_ODP_SUPPORT_IMPLICIT")]
    pub fn reg_implicit_odp(self: &Arc<Self>) -> Result<ImplicitOdpRegion, MemoryRegionError> {
        // SAFETY: local access only: no peer can reach the region, and the only local
        // entries are the region's own buffers (see the module's docs).
        unsafe { self.reg_implicit_odp_with_access(AccessFlags::LOCAL_WRITE) }
    }

    /// Registers an implicit on-demand region with `access` (`ON_DEMAND` is added).
    ///
    /// # Safety
    ///
    /// With remote access (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`) or `MW_BIND`, a
    /// peer holding the region's remote key (or a window's) may read or write *any* address
    /// of this process. The caller must make sure peers only ever touch memory the caller set
    /// aside for them: memory that stays allocated while they may reach it, that no Rust
    /// reference covers while they may write it, and that holds nothing they must not read.
    /// Local access alone (`LOCAL_WRITE`) needs no promise: that is
    /// [`reg_implicit_odp`](Self::reg_implicit_odp).
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn reg_implicit_odp_with_access(
        self: &Arc<Self>,
        access: AccessFlags,
    ) -> Result<ImplicitOdpRegion, MemoryRegionError> {
        if let Ok(attr) = self.context().query_device() {
            let caps = attr.odp_caps();
            if !caps.supports_implicit() {
                return Err(MemoryRegionError::ImplicitOdpNotSupported {
                    device: self.context().name().to_owned(),
                    caps,
                });
            }
        }
        // A device whose attributes cannot be read is left to the verb to judge.
        let access = access | AccessFlags::ON_DEMAND;
        let access_c = c_int::from_ne_bytes(access.bits().to_ne_bytes());
        // SAFETY: the PD is alive; NULL and SIZE_MAX is the documented implicit form, which
        // names no memory by itself; what may reach memory through it is the caller's
        // promise (remote access) or the region's own buffers (local access).
        let mr = fresh(|| unsafe {
            ffi::ibv_reg_mr(self.as_raw(), std::ptr::null_mut(), usize::MAX, access_c)
        });
        let raw = non_null(mr)
            .map_err(|source| self.register_error("ibv_reg_mr", 0, usize::MAX, access, source))?;
        // SAFETY: raw is the implicit region the verb just returned.
        Ok(unsafe { ImplicitOdpRegion::wrap(self, raw, access) })
    }
}

impl ImplicitOdpRegion {
    /// # Safety
    ///
    /// `raw` is a live implicit region of `pd` (or a test double's, see
    /// [`from_raw_parts`](Self::from_raw_parts)) that nothing else deregisters.
    unsafe fn wrap(
        pd: &Arc<ProtectionDomain>,
        raw: NonNull<ffi::ibv_mr>,
        access: AccessFlags,
    ) -> Self {
        let memory: Pool = Arc::default();
        // Two owners: the region (so a failed deregistration leaks the memory with it) and
        // the device context (so the memory outlives every queue that may still hold a
        // request naming it, whatever happens to the region's key; see the module's docs).
        pd.context()
            .keep_until_closed(Box::new(Arc::clone(&memory)));
        let mr = pd.wrap_implicit_mr(raw, access, Box::new(Arc::clone(&memory)));
        ImplicitOdpRegion { mr, memory }
    }

    /// Wraps an implicit region of a test double's PD ([`ProtectionDomain::from_raw_parts`]):
    /// dropping it calls no deregistration verb.
    ///
    /// # Safety
    ///
    /// `pd` comes from [`ProtectionDomain::from_raw_parts`], and `raw` is a region of it
    /// that stays valid until the context's owner is dropped; that constructor's contract
    /// applies. `access` is what the region was registered with.
    #[doc(hidden)]
    pub unsafe fn from_raw_parts(
        pd: &Arc<ProtectionDomain>,
        raw: NonNull<ffi::ibv_mr>,
        access: AccessFlags,
    ) -> Self {
        // SAFETY: forwarded.
        unsafe { Self::wrap(pd, raw, access) }
    }

    /// The region: its local key, its access. It makes no scatter/gather entries
    /// ([`MemoryRegion::sge`] is `None`); buffers do.
    pub fn mr(&self) -> &Arc<MemoryRegion> {
        &self.mr
    }

    /// The local key every buffer's entries carry.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Allocates `len` bytes of zeroed, page-aligned memory that the region owns and
    /// returns the CPU's handle on it: no registration verb runs (the region already covers
    /// it). Its entries ([`RegisteredBuffer::sge`]) carry the region's key and stay inside
    /// the buffer. The memory is freed when the device context closes (after the region is
    /// deregistered), not when the buffer is dropped: allocate what the program needs once,
    /// not per message, and register implicit regions once per context.
    pub fn alloc_buffer(&self, len: usize) -> Result<RegisteredBuffer, MemoryRegionError> {
        let memory = HeapMemory::zeroed(len)?;
        let ptr = memory.ptr();
        // A poisoned lock only means another thread panicked while pushing: the list itself
        // is still a list of live allocations.
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(memory);
        // SAFETY: the memory is len zeroed bytes, inside the region (which covers every
        // address), owned by the pool that the region's owner holds: freed only after the
        // region is deregistered. The buffer is its only handle.
        Ok(unsafe { RegisteredBuffer::from_region_memory(Arc::clone(&self.mr), ptr, len) })
    }

    /// How many bytes the buffers handed out so far hold (all kept until the region goes).
    pub fn allocated_bytes(&self) -> usize {
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(HeapMemory::len)
            .sum()
    }
}

impl fmt::Debug for ImplicitOdpRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImplicitOdpRegion")
            .field("mr", &self.mr)
            .field("allocated_bytes", &self.allocated_bytes())
            .finish()
    }
}
