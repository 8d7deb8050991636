//! Device memory against the test provider (`csrc/null_provider_dm.c`: the `verbs_context` ops
//! `alloc_dm`, `free_dm`, `reg_dm_mr` and the `ibv_dm` copy functions, reached through
//! verbs.h's inlines): the arguments each verb passes, the bounds checked before the
//! provider is called, the typed errors, zero-based regions, and that a region keeps its
//! device memory until it goes. Needs no device and no rdma-core library.

use std::sync::Arc;

use benches::null_provider::NullProvider;
use benches::null_provider_dm::{NullDm, DM_LKEY_BASE, DM_MAX};
use sideway::device_memory::DeviceMemoryError;
use sideway::memory_region::AccessFlags;

const ZERO_BASED: u32 = 1 << 5; // IBV_ACCESS_ZERO_BASED

#[test]
fn alloc_passes_its_arguments_and_copies_round_trip_inside_the_bounds() {
    let np = NullProvider::new();
    let dm_ops = NullDm::enable(&np);
    let ctx = np.sideway_context();
    let mut dm = ctx
        .alloc_dm(4096, 6)
        .expect("the test provider has device memory");
    let c = dm_ops.counters();
    assert_eq!(c.alloc_dm_calls, 1);
    assert_eq!(
        (
            c.last_alloc_length,
            c.last_log_align_req,
            c.last_alloc_comp_mask
        ),
        (4096, 6, 0)
    );
    assert_eq!(dm.len(), 4096);
    assert!(Arc::ptr_eq(dm.context(), &ctx));
    assert_eq!(dm.handle(), 1);

    dm.copy_to(100, b"device memory").unwrap();
    let c = dm_ops.counters();
    assert_eq!(
        (c.copy_to_calls, c.last_copy_offset, c.last_copy_length),
        (1, 100, 13)
    );
    let mut back = [0u8; 13];
    dm.copy_from(100, &mut back).unwrap();
    assert_eq!(&back, b"device memory");
    assert_eq!(dm_ops.counters().copy_from_calls, 1);
    // The last byte, and an empty copy at the end, are inside.
    dm.copy_to(4095, b"z").unwrap();
    dm.copy_from(4096, &mut []).unwrap();

    // Outside: refused before the provider is called, overflow included.
    let calls = dm_ops.counters();
    for (offset, len) in [(4096, 1), (4000, 97), (usize::MAX, 2)] {
        let e = dm.copy_to(offset, &vec![0; len]).expect_err("out of range");
        assert!(
            matches!(e, DeviceMemoryError::OutOfRange { dm_len: 4096, .. }),
            "{e}"
        );
        let e = dm
            .copy_from(offset, &mut vec![0; len])
            .expect_err("out of range");
        assert!(
            e.to_string()
                .contains("outside the 4096-byte device memory"),
            "{e}"
        );
    }
    let after = dm_ops.counters();
    assert_eq!(
        (after.copy_to_calls, after.copy_from_calls),
        (calls.copy_to_calls, calls.copy_from_calls)
    );

    // A copy the provider refuses is a typed error naming the call and the range.
    dm_ops.fail_copies(5); // EIO
    match dm.copy_to(0, b"x").expect_err("the provider refuses") {
        DeviceMemoryError::Copy {
            call,
            offset,
            len,
            source,
            ..
        } => {
            assert_eq!((call, offset, len), ("ibv_memcpy_to_dm", 0, 1));
            assert_eq!(source.raw_os_error(), Some(5));
        }
        other => panic!("unexpected error {other}"),
    }
    match dm
        .copy_from(8, &mut [0; 2])
        .expect_err("the provider refuses")
    {
        DeviceMemoryError::Copy { call, .. } => assert_eq!(call, "ibv_memcpy_from_dm"),
        other => panic!("unexpected error {other}"),
    }
    dm_ops.fail_copies(0);

    drop(dm);
    let c = dm_ops.counters();
    assert_eq!((c.free_dm_calls, c.live_dms), (1, 0));
    drop(ctx);
}

#[test]
fn a_region_over_device_memory_is_zero_based_and_keeps_the_memory_until_it_goes() {
    let np = NullProvider::new();
    let dm_ops = NullDm::enable(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let dm = ctx.alloc_dm(8192, 0).unwrap();
    let mr = pd
        .reg_dm_mr(
            &dm,
            1024,
            2048,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .expect("the test provider registers device memory");
    let c = dm_ops.counters();
    assert_eq!(c.reg_dm_mr_calls, 1);
    assert_eq!((c.last_reg_offset, c.last_reg_length), (1024, 2048));
    assert_eq!(c.last_reg_pd, pd.as_raw());
    assert_eq!(c.last_reg_dm, dm.as_raw());
    // ZERO_BASED is added: the verb requires it.
    assert_eq!(c.last_reg_access, 1 | 4 | ZERO_BASED);
    assert!(mr.access().contains(AccessFlags::ZERO_BASED));
    // Work requests address the region from 0, whatever the offset into the memory.
    assert_eq!(mr.addr(), 0);
    assert_eq!(mr.len(), 2048);
    assert_eq!(mr.lkey(), DM_LKEY_BASE);
    let sge = mr.sge(16..80).expect("inside the region");
    assert_eq!(
        (sge.addr(), sge.length(), sge.lkey()),
        (16, 64, DM_LKEY_BASE)
    );
    assert!(mr.sge(0..2049).is_none());
    assert!(!mr.is_imported());
    assert!(Arc::ptr_eq(mr.pd(), &pd));

    // The region holds the device memory: dropping the handle frees nothing...
    drop(dm);
    assert_eq!(dm_ops.counters().free_dm_calls, 0);
    assert_eq!(dm_ops.counters().live_mrs, 1);
    // ...until the region goes.
    drop(mr);
    let c = dm_ops.counters();
    assert_eq!((c.free_dm_calls, c.live_dms, c.live_mrs), (1, 0, 0));
}

#[test]
fn registrations_outside_the_memory_on_demand_or_on_another_context_are_refused_first() {
    let np = NullProvider::new();
    let dm_ops = NullDm::enable(&np);
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let dm = ctx.alloc_dm(4096, 0).unwrap();
    for (offset, len) in [(0, 4097), (4096, 1), (usize::MAX, 2)] {
        let e = pd
            .reg_dm_mr(&dm, offset, len, AccessFlags::LOCAL_WRITE)
            .expect_err("out of range");
        assert!(matches!(e, DeviceMemoryError::OutOfRange { .. }), "{e}");
    }
    let e = pd
        .reg_dm_mr(
            &dm,
            0,
            64,
            AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND,
        )
        .expect_err("device memory cannot be on demand");
    assert!(matches!(e, DeviceMemoryError::OnDemand { .. }), "{e}");
    assert!(e.to_string().contains("cannot be on demand"), "{e}");

    let other = NullProvider::new();
    let other_ctx = other.sideway_context();
    let other_pd = other.sideway_pd(&other_ctx);
    let e = other_pd
        .reg_dm_mr(&dm, 0, 64, AccessFlags::LOCAL_WRITE)
        .expect_err("another context's PD");
    assert!(matches!(e, DeviceMemoryError::OtherContext { .. }), "{e}");
    assert_eq!(dm_ops.counters().reg_dm_mr_calls, 0);

    // A registration the provider refuses is a typed error with its arguments.
    let dm_small = ctx.alloc_dm(64, 0).unwrap();
    let mut regions = Vec::new();
    for _ in 0..4 {
        regions.push(
            pd.reg_dm_mr(&dm_small, 0, 64, AccessFlags::empty())
                .unwrap(),
        );
    }
    match pd.reg_dm_mr(&dm_small, 0, 32, AccessFlags::LOCAL_WRITE) {
        Err(DeviceMemoryError::Register {
            offset,
            len,
            access,
            source,
            ..
        }) => {
            assert_eq!((offset, len), (0, 32));
            assert_eq!(access, AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED);
            assert_eq!(source.raw_os_error(), Some(28)); // ENOSPC from the provider
        }
        other => panic!("unexpected result {other:?}"),
    }
    drop(dm_small);
    assert_eq!(dm_ops.counters().free_dm_calls, 0, "four regions hold it");
    regions.clear();
    assert_eq!(dm_ops.counters().free_dm_calls, 1);
}

#[test]
fn allocation_failures_are_typed_and_a_provider_without_device_memory_says_so() {
    let np = NullProvider::new();
    let ctx = np.sideway_context();
    // Device memory not enabled: verbs.h's ibv_alloc_dm answers EOPNOTSUPP, as on rxe.
    let e = ctx.alloc_dm(4096, 0).expect_err("no alloc_dm");
    assert!(e.is_not_supported(), "{e}");
    let text = e.to_string();
    assert!(text.contains("not supported by this device"), "{text}");
    assert!(text.contains("ibv_alloc_dm of 4096 bytes"), "{text}");

    let dm_ops = NullDm::enable(&np);
    let e = ctx
        .alloc_dm(DM_MAX + 1, 0)
        .expect_err("more than the device has");
    match &e {
        DeviceMemoryError::Alloc { len, source, .. } => {
            assert_eq!(*len, DM_MAX + 1);
            assert_eq!(source.raw_os_error(), Some(12)); // ENOMEM
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(!e.is_not_supported());
    assert!(e.to_string().contains("max_dm_size"), "{e}");
    assert_eq!(dm_ops.counters().live_dms, 0);

    // Device memory outlives the provider's device-memory state being taken away.
    let mut dm = ctx.alloc_dm(64, 0).unwrap();
    drop(dm_ops);
    dm.copy_to(0, b"still here").unwrap();
    drop(dm);
}
