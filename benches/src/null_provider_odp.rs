//! On-demand paging on the null provider (`csrc/null_provider_odp.c`): the `verbs_context`
//! ops `query_device_ex` (answering with ODP capabilities a test sets) and `advise_mr`
//! (recording what it was given), and an in-memory `ibv_mr` standing for an implicit
//! on-demand region, for sideway's [`ImplicitOdpRegion::from_raw_parts`]. Calls no
//! libibverbs function.

use std::ptr::NonNull;
use std::sync::Arc;

use sideway::memory_region::AccessFlags;
use sideway::odp::ImplicitOdpRegion;
use sideway::protection_domain::ProtectionDomain;
use sideway::sys::{ibv_context, ibv_mr, ibv_pd, ibv_sge};

use crate::null_provider::NullProvider;

/// The fake implicit region's local key (`NULL_ODP_LKEY`).
pub const LKEY: u32 = 0x0d0d1;
/// Its remote key (`NULL_ODP_RKEY`).
pub const RKEY: u32 = 0x0d0d2;
/// How many entries of an `advise_mr` call are recorded (`NULL_ODP_MAX_SGES`).
pub const MAX_SGES: usize = 4;

/// What the last `advise_mr` got (`struct null_odp_advice`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Advice {
    /// `advise_mr` calls so far.
    pub calls: u64,
    /// The PD of the last one.
    pub pd: *mut ibv_pd,
    /// Its advice (`IBV_ADVISE_MR_ADVICE_*`).
    pub advice: u32,
    /// Its flags.
    pub flags: u32,
    /// Its `num_sge`.
    pub num_sge: u32,
    /// Its first [`MAX_SGES`] entries.
    pub sges: [ibv_sge; MAX_SGES],
}

#[repr(C)]
struct RawOdp {
    _private: [u8; 0],
}

extern "C" {
    fn null_odp_attach(ctx: *mut ibv_context, pd: *mut ibv_pd) -> *mut RawOdp;
    fn null_odp_detach(o: *mut RawOdp);
    fn null_odp_set_caps(o: *mut RawOdp, general: u64, rc: u32, uc: u32, ud: u32, xrc: u32);
    fn null_odp_set_advise_ret(o: *mut RawOdp, ret: i32);
    fn null_odp_mr(o: *mut RawOdp) -> *mut ibv_mr;
    fn null_odp_seen(o: *const RawOdp) -> *const Advice;
}

/// ODP ops attached to a [`NullProvider`]'s context; detached on drop. Keep it alive as
/// long as sideway objects of the provider are used, and drop it before the provider.
pub struct NullOdp {
    raw: NonNull<RawOdp>,
}

impl NullOdp {
    /// Attaches the ops to `np`'s context, with no ODP capability and `advise_mr`
    /// succeeding.
    ///
    /// # Panics
    ///
    /// When the C side is out of memory or of slots (64 providers at once).
    pub fn attach(np: &NullProvider) -> Self {
        let pd = np.sideway_pd(&np.sideway_context()).as_raw();
        // SAFETY: the context and PD are the provider's, alive while it is; the ops set on
        // the context find this struct by the context's address.
        let raw = unsafe { null_odp_attach(np.context_raw(), pd) };
        NullOdp {
            raw: NonNull::new(raw).expect("null_odp_attach: out of memory or slots"),
        }
    }

    /// What `query_device_ex` reports in `odp_caps` and `xrc_odp_caps`.
    pub fn set_caps(&self, general: u64, rc: u32, uc: u32, ud: u32, xrc: u32) {
        // SAFETY: raw is live until drop; plain stores.
        unsafe { null_odp_set_caps(self.raw.as_ptr(), general, rc, uc, ud, xrc) }
    }

    /// What `advise_mr` returns from now on (an errno, or 0).
    pub fn set_advise_ret(&self, ret: i32) {
        // SAFETY: as above.
        unsafe { null_odp_set_advise_ret(self.raw.as_ptr(), ret) }
    }

    /// What the last `advise_mr` got.
    pub fn seen(&self) -> Advice {
        // SAFETY: raw is live; the struct is copied out.
        unsafe { *null_odp_seen(self.raw.as_ptr()) }
    }

    /// The fake implicit region (addr NULL, length `SIZE_MAX`, [`LKEY`], [`RKEY`]) wrapped
    /// by sideway on `pd` (from [`NullProvider::sideway_pd`]), registered as local-only.
    pub fn implicit_region(&self, pd: &Arc<ProtectionDomain>) -> ImplicitOdpRegion {
        // SAFETY: raw is live; the MR is a field of it.
        let mr = NonNull::new(unsafe { null_odp_mr(self.raw.as_ptr()) }).expect("a field");
        // SAFETY: pd is a test double's PD (sideway_pd); the MR stays valid while this
        // struct lives, which the caller keeps alive with the provider's objects.
        unsafe {
            ImplicitOdpRegion::from_raw_parts(
                pd,
                mr,
                AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND,
            )
        }
    }
}

impl Drop for NullOdp {
    fn drop(&mut self) {
        // SAFETY: raw came from null_odp_attach and is detached once.
        unsafe { null_odp_detach(self.raw.as_ptr()) }
    }
}
