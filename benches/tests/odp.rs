//! On-demand paging against the test provider (`csrc/null_provider_odp.c`: the
//! `verbs_context` ops `query_device_ex` and `advise_mr`, reached through verbs.h's inlines,
//! and an in-memory implicit region): the ODP capabilities sideway reads, the arguments
//! `ibv_advise_mr` passes, the typed "not supported" errors, and the implicit region's
//! invariant (entries only over memory the region owns, kept until its context closes). Needs no
//! device and no rdma-core library.

use benches::null_provider::NullProvider;
use benches::null_provider_odp::{NullOdp, LKEY};
use sideway::device::{OdpGeneralCaps, OdpTransportCaps};
use sideway::memory_region::{BufferError, MemoryRegionError};
use sideway::odp::{AdviseError, AdviseFlags, AdviseMr};
use sideway::sys::{ibv_odp_general_caps as g, ibv_odp_transport_cap_bits as t};

/// Counts frees of blocks of [`ODD_LEN`] bytes (the size no other allocation of this
/// binary has), to see when an implicit region's buffer memory is given back.
struct FreeCounter;

/// A buffer length nothing else here allocates.
const ODD_LEN: usize = 3 * 4096 + 777;

static ODD_FREES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl std::alloc::GlobalAlloc for FreeCounter {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if layout.size() == ODD_LEN {
            ODD_FREES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        // SAFETY: ptr came from System with this layout (every allocation goes there).
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static FREES: FreeCounter = FreeCounter;

/// Linux's error numbers (the benches crate has no libc dependency).
const EOPNOTSUPP: i32 = 95;
const EINVAL: i32 = 22;

#[test]
fn odp_capabilities_come_from_query_device_ex() {
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let none = ctx.query_device().unwrap().odp_caps();
    assert!(
        !none.is_supported() && !none.supports_implicit(),
        "{none:?}"
    );
    assert!(none.rc.is_empty() && none.xrc.is_empty());

    let unknown = 1 << 20;
    odp.set_caps(
        u64::from(g::IBV_ODP_SUPPORT | g::IBV_ODP_SUPPORT_IMPLICIT) | unknown,
        t::IBV_ODP_SUPPORT_SEND | t::IBV_ODP_SUPPORT_RECV | t::IBV_ODP_SUPPORT_SRQ_RECV,
        t::IBV_ODP_SUPPORT_WRITE,
        t::IBV_ODP_SUPPORT_READ | t::IBV_ODP_SUPPORT_ATOMIC,
        t::IBV_ODP_SUPPORT_SEND | (1 << 30),
    );
    let caps = ctx.query_device().unwrap().odp_caps();
    assert!(caps.is_supported() && caps.supports_implicit());
    assert!(caps
        .general
        .contains(OdpGeneralCaps::SUPPORT | OdpGeneralCaps::SUPPORT_IMPLICIT));
    assert_eq!(
        caps.general.bits() & unknown,
        unknown,
        "unknown bits survive"
    );
    assert_eq!(
        caps.rc,
        OdpTransportCaps::SEND | OdpTransportCaps::RECV | OdpTransportCaps::SRQ_RECV
    );
    assert_eq!(caps.uc, OdpTransportCaps::WRITE);
    assert_eq!(caps.ud, OdpTransportCaps::READ | OdpTransportCaps::ATOMIC);
    assert_eq!(caps.xrc.bits(), t::IBV_ODP_SUPPORT_SEND | (1 << 30));
    // Implicit needs the general bit too.
    odp.set_caps(u64::from(g::IBV_ODP_SUPPORT_IMPLICIT), 0, 0, 0, 0);
    assert!(!ctx.query_device().unwrap().odp_caps().supports_implicit());
}

#[test]
fn advise_mr_passes_the_advice_the_flag_and_entries_inside_the_buffer() {
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let region = odp.implicit_region(&pd);
    let buf = region.alloc_buffer(3 * 4096).unwrap();

    buf.advise(AdviseMr::PrefetchWrite, AdviseFlags::FLUSH, 4096..8192)
        .unwrap();
    let seen = odp.seen();
    assert_eq!(seen.calls, 1);
    assert_eq!(seen.pd, pd.as_raw());
    assert_eq!((seen.advice, seen.flags, seen.num_sge), (1, 1, 1));
    assert_eq!(seen.sges[0].addr, buf.addr() + 4096);
    assert_eq!(seen.sges[0].length, 4096);
    assert_eq!(seen.sges[0].lkey, LKEY);

    for (advice, raw) in [
        (AdviseMr::Prefetch, 0),
        (AdviseMr::PrefetchWrite, 1),
        (AdviseMr::PrefetchNoFault, 2),
    ] {
        buf.advise(advice, AdviseFlags::empty(), 0..64).unwrap();
        assert_eq!((odp.seen().advice, odp.seen().flags), (raw, 0));
    }

    // Several entries in one call, in order.
    let other = region.alloc_buffer(64).unwrap();
    let sges = [buf.sge(0..16).unwrap(), other.sge(8..64).unwrap()];
    pd.advise_mr(AdviseMr::Prefetch, AdviseFlags::FLUSH, &sges)
        .unwrap();
    let seen = odp.seen();
    assert_eq!(seen.num_sge, 2);
    assert_eq!(
        (seen.sges[1].addr, seen.sges[1].length),
        (other.addr() + 8, 56)
    );

    // What is refused before the verb: a range outside the buffer, no entries.
    let calls = odp.seen().calls;
    let e = buf
        .advise(AdviseMr::Prefetch, AdviseFlags::empty(), 0..3 * 4096 + 1)
        .unwrap_err();
    assert!(
        matches!(
            e,
            AdviseError::Range(BufferError::OutOfRange { end: 12289, .. })
        ),
        "{e:?}"
    );
    let e = pd
        .advise_mr(AdviseMr::Prefetch, AdviseFlags::empty(), &[])
        .unwrap_err();
    assert!(matches!(e, AdviseError::NoEntries), "{e:?}");
    assert_eq!(
        odp.seen().calls,
        calls,
        "refused before calling the provider"
    );
}

#[test]
fn advise_mr_without_provider_support_is_a_typed_not_supported_error() {
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let region = odp.implicit_region(&pd);
    let buf = region.alloc_buffer(64).unwrap();
    odp.set_advise_ret(EOPNOTSUPP);
    let e = buf
        .advise(AdviseMr::PrefetchWrite, AdviseFlags::FLUSH, 0..64)
        .unwrap_err();
    assert!(e.is_not_supported(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with(
            "ibv_advise_mr (PrefetchWrite, flags AdviseFlags(FLUSH), 1 entries) failed on null:"
        ),
        "{text}"
    );
    assert!(text.contains("not supported by this device"), "{text}");
    odp.set_advise_ret(EINVAL);
    let e = buf
        .advise(AdviseMr::Prefetch, AdviseFlags::empty(), 0..64)
        .unwrap_err();
    assert!(!e.is_not_supported());
    assert!(e.to_string().contains("inside an on-demand region"), "{e}");
}

#[test]
fn an_implicit_region_makes_entries_only_over_the_memory_it_owns() {
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let region = odp.implicit_region(&pd);
    let mr = region.mr();
    assert!(mr.is_implicit_odp());
    assert_eq!((mr.addr(), mr.len()), (0, usize::MAX));
    assert_eq!(region.lkey(), LKEY);
    // The region covers every address: it makes no entry from its own bounds.
    assert!(mr.sge(0..64).is_none());
    assert!(mr.sge(0x1000..0x2000).is_none());

    let mut a = region.alloc_buffer(100).unwrap();
    let b = region.alloc_buffer(4096).unwrap();
    assert_eq!(a.addr() % 4096, 0, "page-aligned");
    for (buf, len) in [(&a, 100u64), (&b, 4096)] {
        let sge = buf.sge(0..len as usize).unwrap();
        assert_eq!(
            (sge.addr(), u64::from(sge.length()), sge.lkey()),
            (buf.addr(), len, LKEY)
        );
        assert!(
            buf.sge(0..len as usize + 1).is_none(),
            "no entry past the buffer"
        );
        #[allow(clippy::reversed_empty_ranges)] // a reversed range must be refused
        let reversed = 1..0;
        assert!(buf.sge(reversed).is_none());
    }
    let (a_end, b_end) = (a.addr() + 100, b.addr() + 4096);
    assert!(
        a_end <= b.addr() || b_end <= a.addr(),
        "buffers do not overlap"
    );

    // The CPU reaches the memory through copies, as with any device-writable buffer.
    a.write_at(0, b"ping").unwrap();
    assert_eq!(a.to_vec(0..4).unwrap(), b"ping");
    assert!(a.write_at(98, b"abc").is_err());

    // A dropped buffer's memory stays with the region (a receive may still be posted into
    // it), and after the region with its context (an_implicit_regions_memory_outlives_...).
    assert_eq!(region.allocated_bytes(), 4196);
    let mr_count = std::sync::Arc::strong_count(region.mr());
    drop(a);
    assert_eq!(region.allocated_bytes(), 4196);
    assert_eq!(std::sync::Arc::strong_count(region.mr()), mr_count - 1);
    // Buffers keep the region registered after the region value is gone.
    let weak = std::sync::Arc::downgrade(region.mr());
    drop(region);
    assert!(weak.upgrade().is_some(), "b still holds the region");
    assert_eq!(b.sge(0..8).unwrap().lkey(), LKEY);
    drop(b);
    assert!(
        weak.upgrade().is_none(),
        "the last buffer let the region go"
    );
}

#[test]
fn an_implicit_regions_memory_outlives_the_region_until_its_context_closes() {
    // mlx5 may give a deregistered implicit region's key to the next implicit region (same
    // shape: every address), which would revive a receive still queued into a buffer of
    // the old one; so the memory stays until no queue of the context can exist.
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let region = odp.implicit_region(&pd);
    let buf = region.alloc_buffer(ODD_LEN).unwrap();
    let weak = std::sync::Arc::downgrade(region.mr());
    drop(buf);
    drop(region);
    assert!(
        weak.upgrade().is_none(),
        "the region is gone (deregistered)"
    );
    assert_eq!(
        ODD_FREES.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "its buffers' memory is not"
    );
    drop(pd);
    drop(ctx);
    assert_eq!(
        ODD_FREES.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the context's close gives it back"
    );
}

#[test]
fn implicit_registration_is_refused_as_not_supported_when_the_device_lacks_it() {
    let np = NullProvider::new();
    let odp = NullOdp::attach(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    for (general, words) in [
        (0, "it has no on-demand paging at all"),
        (
            u64::from(g::IBV_ODP_SUPPORT),
            "its on-demand paging has no implicit regions",
        ),
    ] {
        odp.set_caps(general, t::IBV_ODP_SUPPORT_SEND, 0, 0, 0);
        let e = pd.reg_implicit_odp().unwrap_err();
        assert!(e.is_not_supported(), "{e:?}");
        assert!(
            matches!(&e, MemoryRegionError::ImplicitOdpNotSupported { device, .. } if device == "null"),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with(
                "an implicit on-demand region is not supported by this device (null): "
            ) && text.contains(words),
            "{text}"
        );
    }
}
