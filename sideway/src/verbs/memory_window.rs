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
//! A bind asks for access the region must allow: a window with remote write or remote atomic
//! access needs a region registered with local write, and a bind to a non-empty range needs
//! [`AccessFlags::MW_BIND`](crate::memory_region::AccessFlags::MW_BIND) on the region. Both are
//! checked before anything reaches the provider ([`MemoryWindowError::BindAccess`] from
//! [`MemoryWindow::bind`],
//! [`InvalidWorkRequest::BindAccess`](crate::queue_pair::InvalidWorkRequest::BindAccess) from
//! the send guard; [`bind_access_missing`] states the rule).
//!
//! A window keeps an `Arc` of every region it was ever asked to bind, from the moment the
//! bind is attempted (a type 1 [`bind`](MemoryWindow::bind) or
//! [`unbind`](MemoryWindow::unbind), or a type 2 bind added to a send guard) until the window
//! is deallocated. Which of those
//! binds took effect, and when, only the device knows: a bind can be refused, aborted with
//! its batch, fail, or complete in error, and then the window stays bound to an earlier
//! region. Holding them all means the region's owner may drop every handle it has at any
//! time, and a peer's access through the window's rkey still lands in live, registered
//! memory (the kernel refuses to deregister a region with bound windows, and a failed
//! deregistration would leak the memory). No completion needs to be waited for.
//!
//! The cost: one `Arc` per distinct region a window was asked to bind (repeated binds to the
//! same region are counted once), and those regions stay registered, with their memory,
//! until the window is dropped. Dropping the window (`ibv_dealloc_mw`) releases them all. A
//! window rebound over many short-lived regions thus keeps them all: allocate a window per
//! region, or drop and reallocate the window, to let them go. Should `ibv_dealloc_mw` fail,
//! the regions are kept for ever.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::macros::c_enum;
use crate::verbs::device::DeviceCapFlags;
use crate::verbs::memory_region::{AccessFlags, MemoryRegion};
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
    /// The bind asked for access its region does not allow (checked before `ibv_bind_mw`,
    /// which was not called): see [`bind_access_missing`].
    #[error("binding window rkey {rkey:#x} with {access:?} to MR {lkey:#x}, registered with {region_access:?}: the region lacks {missing:?} ({BIND_ACCESS_RULE})")]
    BindAccess {
        /// The window's rkey.
        rkey: u32,
        /// The region's lkey.
        lkey: u32,
        /// The window access asked for.
        access: AccessFlags,
        /// The region's access, as registered.
        region_access: AccessFlags,
        /// What the region lacks.
        missing: AccessFlags,
    },
}

/// What [`bind_access_missing`] checks, for error messages.
pub(crate) const BIND_ACCESS_RULE: &str =
    "a window with remote write or remote atomic access needs LOCAL_WRITE on its region, \
     a bind to a non-empty range MW_BIND";

/// The access a bind of `len` bytes of a region registered with `region_access` needs, with
/// window access `access`, and the region lacks: `LOCAL_WRITE` when the window grants remote
/// write or remote atomic access, `MW_BIND` when the range is not empty (an unbind needs
/// neither). Empty when the bind may go ahead.
pub fn bind_access_missing(
    region_access: AccessFlags,
    len: u64,
    access: AccessFlags,
) -> AccessFlags {
    let mut needed = AccessFlags::empty();
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
        needed |= AccessFlags::LOCAL_WRITE;
    }
    if len > 0 {
        needed |= AccessFlags::MW_BIND;
    }
    needed - region_access
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
            held: Mutex::new(Vec::new()),
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
    /// Every region a bind was ever asked for, once each, the most recently asked last: kept
    /// alive (and registered) until the window is deallocated, since the window may be bound
    /// to any of them (a refused, aborted or failed bind leaves it bound to an earlier one).
    held: Mutex<Vec<Arc<MemoryRegion>>>,
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

    /// The region of the most recent bind asked for (attempted, or added to a send guard), if
    /// any. Whether that bind took effect only its completion (or `bind`'s result) says; the
    /// window keeps this region, and every other it was asked to bind, until it is dropped
    /// (see the [module](self)).
    pub fn bound_region(&self) -> Option<Arc<MemoryRegion>> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .cloned()
    }

    /// Every region the window was asked to bind, once each, the most recently asked last:
    /// all kept alive until the window is dropped.
    pub fn held_regions(&self) -> Vec<Arc<MemoryRegion>> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps `mr` alive until the window is deallocated: called before a bind to it can reach
    /// the device. A region already held is moved to the end (the most recent).
    pub(crate) fn hold(&self, mr: &Arc<MemoryRegion>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.iter().position(|r| Arc::ptr_eq(r, mr)) {
            Some(i) if i + 1 == held.len() => {}
            Some(i) => {
                let region = held.remove(i);
                held.push(region);
            }
            None => held.push(Arc::clone(mr)),
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
            // The window may still grant access to any of its regions: keep them (and their
            // memory) registered for ever rather than let them be freed.
            let held = self.held.get_mut().unwrap_or_else(PoisonError::into_inner);
            for region in held.drain(..) {
                std::mem::forget(region);
            }
            crate::diagnostics::report_drop_failure(
                "ibv_dealloc_mw",
                "a memory window (the regions it was asked to bind are kept, never freed)",
                &e,
            );
        }
        // Otherwise the regions' Arcs drop with the window, now that the window is gone.
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
    use crate::device::DeviceContext;
    use crate::queue_pair::{InvalidWorkRequest, PostError, QueuePair, SendFlags};
    use std::os::raw::c_int;
    use std::sync::Weak;

    /// The C objects a fake provider's window, regions and QP live in.
    struct FakeObjects {
        ctx: ffi::ibv_context,
        pd: ffi::ibv_pd,
        cq: ffi::ibv_cq,
        qp: ffi::ibv_qp,
        mw: ffi::ibv_mw,
        mr_a: ffi::ibv_mr,
        mr_b: ffi::ibv_mr,
    }

    /// Owns the [`FakeObjects`] through a raw pointer (moving a `Box` would invalidate the
    /// pointers the wrappers hold); the context's owner, so freed after every wrapper.
    struct FakeOwner(NonNull<FakeObjects>);

    // SAFETY: plain memory, touched only by the fake provider's functions and the test's
    // thread, one at a time.
    unsafe impl Send for FakeOwner {}
    // SAFETY: as above.
    unsafe impl Sync for FakeOwner {}

    impl Drop for FakeOwner {
        fn drop(&mut self) {
            // SAFETY: the pointer came from Box::leak in fake and is freed only here.
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
    }

    /// `ops.bind_mw`: counts its calls in the window's `handle`; fails the bind of wr_id
    /// 0xbad with EINVAL, as a provider refusing it.
    unsafe extern "C" fn fake_bind_mw(
        _qp: *mut ffi::ibv_qp,
        mw: *mut ffi::ibv_mw,
        bind: *mut ffi::ibv_mw_bind,
    ) -> c_int {
        // SAFETY: ibv_bind_mw passes the live window and bind it was given.
        unsafe {
            (*mw).handle += 1;
            if (*bind).wr_id == 0xbad {
                return libc::EINVAL;
            }
            (*mw).rkey = inc_rkey((*mw).rkey);
        }
        0
    }

    /// `ops.dealloc_mw`: succeeds.
    unsafe extern "C" fn fake_dealloc_mw(_mw: *mut ffi::ibv_mw) -> c_int {
        0
    }

    /// `ops.post_send`: counts its calls in the QP's `handle`, posts nothing.
    unsafe extern "C" fn fake_post_send(
        qp: *mut ffi::ibv_qp,
        _wr: *mut ffi::ibv_send_wr,
        _bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        // SAFETY: the QP is the live one the post was made on.
        unsafe { (*qp).handle += 1 };
        0
    }

    struct Fake {
        qp: QueuePair,
        mw: Arc<MemoryWindow>,
        a: Arc<MemoryRegion>,
        b: Arc<MemoryRegion>,
    }

    /// A window of `mw_type`, regions A and B (registered with `access_a` and `access_b`)
    /// and a classic RC QP taking `max_send_wr` requests a batch, over a fake provider.
    fn fake(
        mw_type: MwType,
        access_a: AccessFlags,
        access_b: AccessFlags,
        max_send_wr: u32,
    ) -> Fake {
        let objects = Box::new(FakeObjects {
            ctx: ffi::ibv_context::default(),
            pd: ffi::ibv_pd::default(),
            cq: ffi::ibv_cq::default(),
            qp: ffi::ibv_qp::default(),
            mw: ffi::ibv_mw::default(),
            mr_a: ffi::ibv_mr::default(),
            mr_b: ffi::ibv_mr::default(),
        });
        let owner = FakeOwner(NonNull::from(Box::leak(objects)));
        let o = owner.0.as_ptr();
        // SAFETY: o is a live, unshared allocation (just made); every pointer below is
        // derived from it, raw, so none invalidates another.
        let (ctx, pd, cq, qp, mw, mr_a, mr_b) = unsafe {
            let ctx = std::ptr::addr_of_mut!((*o).ctx);
            let pd = std::ptr::addr_of_mut!((*o).pd);
            (*o).ctx.ops.bind_mw = Some(fake_bind_mw);
            (*o).ctx.ops.dealloc_mw = Some(fake_dealloc_mw);
            (*o).ctx.ops.post_send = Some(fake_post_send);
            (*o).pd.context = ctx;
            (*o).cq.context = ctx;
            (*o).qp.context = ctx;
            (*o).qp.pd = pd;
            (*o).qp.qp_num = 0x11;
            (*o).mw.context = ctx;
            (*o).mw.pd = pd;
            (*o).mw.rkey = 0x100;
            (*o).mw.type_ = u32::from(mw_type);
            for (mr, addr, key) in [
                (std::ptr::addr_of_mut!((*o).mr_a), 0x1_0000, 0xa),
                (std::ptr::addr_of_mut!((*o).mr_b), 0x2_0000, 0xb),
            ] {
                (*mr).context = ctx;
                (*mr).pd = pd;
                (*mr).addr = addr as *mut _;
                (*mr).length = 4096;
                (*mr).lkey = key;
                (*mr).rkey = key;
            }
            (
                NonNull::new_unchecked(ctx),
                NonNull::new_unchecked(pd),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*o).cq)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*o).qp)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*o).mw)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*o).mr_a)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*o).mr_b)),
            )
        };
        // SAFETY: the objects live until the context's owner drops, after every wrapper (they
        // hold the context). Only the data path and verbs.h's inlines through `ops` are used
        // (ibv_bind_mw, ibv_dealloc_mw, post_send), which the fake functions serve.
        let ctx = unsafe { DeviceContext::from_raw_parts(ctx, "fake", Box::new(owner)) };
        // SAFETY: as above; the PD belongs to that context.
        let pd = unsafe { ProtectionDomain::from_raw_parts(pd, &ctx) };
        // SAFETY: as above; a classic CQ of that context.
        let cq = unsafe { ctx.create_cq_builder().wrap_raw(cq, None) }.expect("a classic CQ");
        let mut builder = pd.create_qp_builder();
        builder
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(max_send_wr)
            .max_recv_wr(1);
        // SAFETY: as above; a classic QP of that context whose post_send is set (post_recv
        // is never used), with room for the builder's capabilities.
        let qp = unsafe { builder.wrap_raw(qp, None) }.expect("a classic QP");
        let mw = Arc::new(MemoryWindow {
            raw: mw,
            mw_type,
            pd: Arc::clone(&pd),
            held: Mutex::new(Vec::new()),
        });
        let a = pd.wrap_mr(mr_a, 0x1_0000, access_a, None);
        let b = pd.wrap_mr(mr_b, 0x2_0000, access_b, None);
        Fake { qp, mw, a, b }
    }

    /// The fake provider's `post_send` calls on `qp`.
    fn posts(qp: &QueuePair) -> u32 {
        // SAFETY: the QP is live; handle is a plain field only the fake provider writes.
        unsafe { (*qp.as_raw()).handle }
    }

    /// The fake provider's `bind_mw` calls on `mw`.
    fn binds(mw: &MemoryWindow) -> u32 {
        // SAFETY: the window is live; handle is a plain field only the fake provider writes.
        unsafe { (*mw.as_raw()).handle }
    }

    const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::MW_BIND);
    const WINDOW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);

    /// Region A bound, a rebind to B that never took effect, A's last handle dropped: A must
    /// stay alive while the window (still bound to A in hardware) lives.
    fn assert_held_until_the_window_goes(mw: Arc<MemoryWindow>, a: Weak<MemoryRegion>) {
        assert!(
            a.upgrade().is_some(),
            "the region the window is bound to was freed while the window lives"
        );
        drop(mw);
        assert!(
            a.upgrade().is_none(),
            "the window kept its region after it was dropped"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "calls the C shim (ibv_inc_rkey), which Miri cannot run"
    )]
    fn a_region_outlives_an_aborted_or_refused_type2_rebind_until_the_window_goes() {
        let Fake { mut qp, mw, a, b } = fake(MwType::Type2, ALL, ALL, 1);
        let rkey = mw.next_rkey();
        let mut s = qp.start_post_send();
        s.wr(1, SendFlags::SIGNALED)
            .bind_mw(&mw, rkey, &a, a.addr()..a.addr() + 64, WINDOW);
        s.post().unwrap();
        assert_eq!(posts(&qp), 1);

        // A rebind to B in a batch dropped unposted (aborted).
        let next = inc_rkey(rkey);
        let mut s = qp.start_post_send();
        s.wr(2, SendFlags::SIGNALED)
            .bind_mw(&mw, next, &b, b.addr()..b.addr() + 64, WINDOW);
        drop(s);
        // A rebind to B in a batch refused as a whole (one request a batch, two given).
        let mut s = qp.start_post_send();
        s.wr(3, SendFlags::SIGNALED)
            .bind_mw(&mw, next, &b, b.addr()..b.addr() + 64, WINDOW)
            .wr(4, SendFlags::empty())
            .local_invalidate(rkey);
        let err = s.post().unwrap_err();
        assert!(
            matches!(
                err,
                PostError::Invalid {
                    index: 1,
                    wr_id: 4,
                    reason: InvalidWorkRequest::BatchFull { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(posts(&qp), 1, "nothing but A's bind reached the provider");
        assert!(Arc::ptr_eq(&mw.bound_region().unwrap(), &b));

        let weak_a = Arc::downgrade(&a);
        let weak_b = Arc::downgrade(&b);
        drop((a, b));
        assert_eq!(mw.held_regions().len(), 2, "A and B, once each");
        drop(qp);
        assert_held_until_the_window_goes(mw, weak_a);
        assert!(weak_b.upgrade().is_none());
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls the C shim (ibv_bind_mw), which Miri cannot run")]
    fn a_region_outlives_a_failed_type1_rebind_until_the_window_goes() {
        let Fake { mut qp, mw, a, b } = fake(MwType::Type1, ALL, ALL, 4);
        let rkey = mw
            .bind(
                &mut qp,
                1,
                SendFlags::SIGNALED,
                &a,
                a.addr()..a.addr() + 64,
                WINDOW,
            )
            .unwrap();
        assert_eq!(rkey, inc_rkey(0x100));
        let err = mw
            .bind(
                &mut qp,
                0xbad,
                SendFlags::SIGNALED,
                &b,
                b.addr()..b.addr() + 64,
                WINDOW,
            )
            .unwrap_err();
        assert!(
            matches!(&err, MemoryWindowError::Bind { rkey: r, .. } if *r == rkey),
            "{err}"
        );
        assert_eq!(binds(&mw), 2);
        // Binding A again keeps it once, as the most recent.
        mw.bind(
            &mut qp,
            2,
            SendFlags::SIGNALED,
            &a,
            a.addr()..a.addr() + 8,
            WINDOW,
        )
        .unwrap();
        let held = mw.held_regions();
        assert_eq!(held.len(), 2);
        assert!(Arc::ptr_eq(&held[0], &b) && Arc::ptr_eq(&held[1], &a));
        drop(held);

        let weak_a = Arc::downgrade(&a);
        drop((a, b));
        assert_held_until_the_window_goes(mw, weak_a);
    }

    #[test]
    fn bind_access_missing_names_what_the_region_lacks() {
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(
            bind_access_missing(remote, 64, AccessFlags::REMOTE_WRITE),
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
        );
        assert_eq!(
            bind_access_missing(AccessFlags::MW_BIND, 64, AccessFlags::REMOTE_ATOMIC),
            AccessFlags::LOCAL_WRITE
        );
        assert_eq!(
            bind_access_missing(AccessFlags::MW_BIND, 64, AccessFlags::REMOTE_READ),
            AccessFlags::empty()
        );
        assert_eq!(
            bind_access_missing(ALL, 64, WINDOW | AccessFlags::REMOTE_ATOMIC),
            AccessFlags::empty()
        );
        // An unbind (empty range, no access) needs nothing of its region.
        assert_eq!(
            bind_access_missing(AccessFlags::empty(), 0, AccessFlags::empty()),
            AccessFlags::empty()
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls the C shim (ibv_bind_mw), which Miri cannot run")]
    fn a_type1_bind_beyond_the_regions_access_is_refused_before_the_provider() {
        // A lacks LOCAL_WRITE, B lacks MW_BIND.
        let Fake { mut qp, mw, a, b } = fake(
            MwType::Type1,
            AccessFlags::MW_BIND | AccessFlags::REMOTE_READ,
            AccessFlags::LOCAL_WRITE,
            4,
        );
        let err = mw
            .bind(
                &mut qp,
                1,
                SendFlags::SIGNALED,
                &a,
                a.addr()..a.addr() + 64,
                WINDOW,
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                MemoryWindowError::BindAccess {
                    rkey: 0x100,
                    lkey: 0xa,
                    missing: AccessFlags::LOCAL_WRITE,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("lacks"), "{err}");
        let err = mw
            .bind(
                &mut qp,
                2,
                SendFlags::SIGNALED,
                &b,
                b.addr()..b.addr() + 64,
                AccessFlags::REMOTE_READ,
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                MemoryWindowError::BindAccess {
                    missing: AccessFlags::MW_BIND,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(binds(&mw), 0, "the provider was not called");
        assert!(mw.held_regions().is_empty(), "a refused bind holds nothing");
        // Read-only access on A is allowed, and an unbind needs nothing of its region.
        mw.bind(
            &mut qp,
            3,
            SendFlags::SIGNALED,
            &a,
            a.addr()..a.addr() + 64,
            AccessFlags::REMOTE_READ,
        )
        .unwrap();
        mw.unbind(&mut qp, 4, SendFlags::SIGNALED, &b).unwrap();
        assert_eq!(binds(&mw), 2);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "calls the C shim (ibv_inc_rkey), which Miri cannot run"
    )]
    fn a_type2_bind_beyond_the_regions_access_is_refused_by_the_batch() {
        let Fake { mut qp, mw, a, .. } = fake(
            MwType::Type2,
            AccessFlags::MW_BIND | AccessFlags::REMOTE_READ,
            ALL,
            4,
        );
        let rkey = mw.next_rkey();
        let mut s = qp.start_post_send();
        s.wr(7, SendFlags::SIGNALED).bind_mw(
            &mw,
            rkey,
            &a,
            a.addr()..a.addr() + 64,
            AccessFlags::REMOTE_ATOMIC,
        );
        let err = s.post().unwrap_err();
        match &err {
            PostError::Invalid {
                index: 0,
                wr_id: 7,
                reason:
                    InvalidWorkRequest::BindAccess {
                        access: AccessFlags::REMOTE_ATOMIC,
                        missing: AccessFlags::LOCAL_WRITE,
                        ..
                    },
                ..
            } => {}
            other => panic!("not the bind's refusal: {other:?}"),
        }
        assert!(err.to_string().contains("LOCAL_WRITE"), "{err}");
        assert_eq!(posts(&qp), 0, "nothing was posted");
        assert!(mw.held_regions().is_empty(), "a refused bind holds nothing");
    }

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
