//! Device tests: memory windows of type 1 and 2 (bind, remote access through the window,
//! unbind, local invalidate, send with invalidate) where the device has them, and the typed
//! `NotSupported` error where it does not. Loopback RC on one device.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;

use sideway::completion_queue::{CompletionQueue, WcOpcode, WcStatus};
use sideway::device::{DeviceCapFlags, DeviceContext};
use sideway::memory_region::AccessFlags;
use sideway::memory_window::{MemoryWindowError, MwType};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QueuePair, SendFlags, SendOpsFlags};

struct Rc {
    a: QueuePair,
    b: QueuePair,
    cq_a: Arc<CompletionQueue>,
    cq_b: Arc<CompletionQueue>,
}

fn rc_pair(ctx: &Arc<DeviceContext>, pd: &Arc<ProtectionDomain>, extended: bool) -> Rc {
    let cq_a = ctx.create_cq_builder().cqe(64).build().unwrap();
    let cq_b = ctx.create_cq_builder().cqe(64).build().unwrap();
    let new = |cq: &Arc<CompletionQueue>| {
        let mut b = pd.create_qp_builder();
        b.send_cq(cq).recv_cq(cq).max_send_wr(16).max_recv_wr(16);
        if extended {
            b.send_ops_flags(
                SendOpsFlags::default()
                    | SendOpsFlags::BIND_MW
                    | SendOpsFlags::LOCAL_INV
                    | SendOpsFlags::SEND_WITH_INV,
            );
            b.build_ex().unwrap()
        } else {
            b.build().unwrap()
        }
    };
    let (a, b) = (new(&cq_a), new(&cq_b));
    pairs::connect(ctx, &a, &b);
    Rc { a, b, cq_a, cq_b }
}

fn supported(ctx: &DeviceContext, t: MwType) -> bool {
    let caps = ctx.query_device().unwrap().device_cap_flags();
    match t {
        MwType::Type1 => caps.contains(DeviceCapFlags::MEM_WINDOW),
        _ => {
            caps.intersects(DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B)
        }
    }
}

/// b writes 8 bytes to a's `addr` through `rkey`; the status it completes with.
fn remote_write(
    rc: &mut Rc,
    src: &sideway::memory_region::RegisteredBuffer,
    rkey: u32,
    addr: u64,
) -> WcStatus {
    let mut s = rc.b.start_post_send();
    s.wr(77, SendFlags::SIGNALED)
        .rdma_write(rkey, addr, src.sge(0..8).unwrap());
    s.post().unwrap();
    pairs::wait_for(&rc.cq_b, 1)[0].status()
}

#[test]
fn memory_window_type1_bind_and_unbind() {
    let Some(ctx) = common::device_or_skip("memory_window_type1_bind_and_unbind") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    if !supported(&ctx, MwType::Type1) {
        let err = pd.alloc_mw(MwType::Type1).unwrap_err();
        assert!(
            matches!(err, MemoryWindowError::NotSupported { .. }),
            "{err}"
        );
        println!("skipped: type 1 memory windows unsupported here, and the error is typed: {err}");
        return;
    }
    let mut rc = rc_pair(&ctx, &pd, false);
    let target = pd
        .reg_buffer(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    let mut src = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"viawin01").unwrap();
    let mw = pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type1);
    let base = target.addr() + 1024;
    let rkey = mw
        .bind(
            &mut rc.a,
            5,
            SendFlags::SIGNALED,
            target.mr(),
            base..base + 512,
            AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let wc = pairs::wait_for(&rc.cq_a, 1)[0];
    wc.ok().unwrap();
    assert_eq!(wc.opcode(), WcOpcode::BindMw);
    assert_eq!(
        remote_write(&mut rc, &src, rkey, base + 8),
        WcStatus::Success
    );
    assert_eq!(&common::bytes(&target)[1032..1040], b"viawin01");

    mw.unbind(&mut rc.a, 6, SendFlags::SIGNALED, target.mr())
        .unwrap();
    pairs::wait_for(&rc.cq_a, 1)[0].ok().unwrap();
    let status = remote_write(&mut rc, &src, rkey, base + 8);
    assert_eq!(
        status,
        WcStatus::RemAccessErr,
        "the unbound window's rkey still worked"
    );
}

fn type2(test: &str, extended: bool) {
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    if !supported(&ctx, MwType::Type2) {
        let err = pd.alloc_mw(MwType::Type2).unwrap_err();
        assert!(
            matches!(err, MemoryWindowError::NotSupported { .. }),
            "{err}"
        );
        println!("skipped: type 2 memory windows unsupported here, and the error is typed: {err}");
        return;
    }
    let mut rc = rc_pair(&ctx, &pd, extended);
    let target = pd
        .reg_buffer(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    let mut src = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"window2!").unwrap();
    let recv = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();

    // Two windows: one invalidated locally, one by the peer's send with invalidate.
    let local = pd.alloc_mw(MwType::Type2).unwrap();
    let remote = pd.alloc_mw(MwType::Type2).unwrap();
    let (k_local, k_remote) = (local.next_rkey(), remote.next_rkey());
    let base = target.addr();
    let mut s = rc.a.start_post_send();
    s.wr(1, SendFlags::SIGNALED)
        .bind_mw(
            &local,
            k_local,
            target.mr(),
            base..base + 256,
            AccessFlags::REMOTE_WRITE,
        )
        .wr(2, SendFlags::SIGNALED)
        .bind_mw(
            &remote,
            k_remote,
            target.mr(),
            base + 256..base + 512,
            AccessFlags::REMOTE_WRITE,
        );
    s.post().unwrap();
    for wc in pairs::wait_for(&rc.cq_a, 2) {
        wc.ok().unwrap();
        assert_eq!(wc.opcode(), WcOpcode::BindMw);
    }
    assert_eq!(
        remote_write(&mut rc, &src, k_local, base),
        WcStatus::Success
    );
    assert_eq!(
        remote_write(&mut rc, &src, k_remote, base + 256),
        WcStatus::Success
    );
    assert_eq!(&common::bytes(&target)[256..264], b"window2!");

    // Local invalidate of the first.
    let mut s = rc.a.start_post_send();
    s.wr(3, SendFlags::SIGNALED).local_invalidate(k_local);
    s.post().unwrap();
    let wc = pairs::wait_for(&rc.cq_a, 1)[0];
    wc.ok().unwrap();
    assert_eq!(wc.opcode(), WcOpcode::LocalInv);

    // The peer's send with invalidate of the second.
    let mut r = rc.a.start_post_recv();
    r.recv(4, &[recv.sge(0..64).unwrap()]);
    r.post().unwrap();
    let mut s = rc.b.start_post_send();
    s.wr(5, SendFlags::SIGNALED)
        .send_with_invalidate(k_remote, src.sge(0..8).unwrap());
    s.post().unwrap();
    pairs::wait_for(&rc.cq_b, 1)[0].ok().unwrap();
    let wc = pairs::wait_for(&rc.cq_a, 1)[0];
    wc.ok().unwrap();
    match wc.invalidated_rkey() {
        Some(k) => assert_eq!(k, k_remote, "{wc:?}"),
        // rxe (Linux 6.12) copies the kernel's IB_WC_WITH_INVALIDATE bit (4) unchanged,
        // where user space reads IBV_WC_IP_CSUM_OK; the write below still proves the
        // invalidation.
        None => println!("note: the device did not flag the invalidation: {wc:?}"),
    }
    assert_eq!(&common::bytes(&recv)[..8], b"window2!");

    // Both rkeys are dead now (the first failure moves b's QP to error: check one).
    let status = remote_write(&mut rc, &src, k_remote, base + 256);
    assert_eq!(
        status,
        WcStatus::RemAccessErr,
        "the invalidated rkey still worked"
    );
}

#[test]
fn memory_window_type2_classic() {
    type2("memory_window_type2_classic", false);
}

#[test]
fn memory_window_type2_extended() {
    type2("memory_window_type2_extended", true);
}

/// A type 2 window bound to region A, a rebind to B aborted with its batch, and A's last
/// handle dropped: the window, still bound to A, keeps A (registered, never leaked), and a
/// peer's WRITE through the window still succeeds.
#[test]
fn memory_window_keeps_its_region_through_an_aborted_rebind() {
    let test = "memory_window_keeps_its_region_through_an_aborted_rebind";
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    if !supported(&ctx, MwType::Type2) {
        println!("skipped: {test}: type 2 memory windows unsupported here");
        return;
    }
    let mut rc = rc_pair(&ctx, &pd, false);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let a = pd.reg_buffer(4096, access).unwrap();
    let b = pd.reg_buffer(4096, access).unwrap();
    let src = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mw = pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = mw.next_rkey();
    let (base, a_mr) = (a.addr(), Arc::clone(a.mr()));
    let mut s = rc.a.start_post_send();
    s.wr(1, SendFlags::SIGNALED).bind_mw(
        &mw,
        rkey,
        a.mr(),
        base..base + 256,
        AccessFlags::REMOTE_WRITE,
    );
    s.post().unwrap();
    pairs::wait_for(&rc.cq_a, 1)[0].ok().unwrap();

    let mut s = rc.a.start_post_send();
    s.wr(2, SendFlags::SIGNALED).bind_mw(
        &mw,
        sideway::memory_window::inc_rkey(rkey),
        b.mr(),
        b.addr()..b.addr() + 256,
        AccessFlags::REMOTE_WRITE,
    );
    drop(s);

    let leaked = sideway::memory_region::leaked_memory();
    let weak_a = Arc::downgrade(&a_mr);
    drop((a, a_mr));
    assert!(
        weak_a.upgrade().is_some(),
        "the region the window is bound to went with its buffer"
    );
    assert_eq!(
        sideway::memory_region::leaked_memory(),
        leaked,
        "a region was deregistered"
    );
    assert_eq!(
        remote_write(&mut rc, &src, rkey, base + 8),
        WcStatus::Success
    );
    drop(mw);
    assert!(weak_a.upgrade().is_none(), "the window kept its region");
    assert_eq!(sideway::memory_region::leaked_memory(), leaked);
}

/// A bind asking for more than its region allows is refused before the provider: a window
/// with remote write on a region without local write.
#[test]
fn memory_window_bind_beyond_the_regions_access_is_typed() {
    let test = "memory_window_bind_beyond_the_regions_access_is_typed";
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let mut rc = rc_pair(&ctx, &pd, false);
    let target = pd.reg_buffer(4096, AccessFlags::MW_BIND).unwrap();
    let base = target.addr();
    let mut checked = 0;
    if supported(&ctx, MwType::Type1) {
        let mw = pd.alloc_mw(MwType::Type1).unwrap();
        let err = mw
            .bind(
                &mut rc.a,
                1,
                SendFlags::SIGNALED,
                target.mr(),
                base..base + 64,
                AccessFlags::REMOTE_WRITE,
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                MemoryWindowError::BindAccess {
                    missing: AccessFlags::LOCAL_WRITE,
                    ..
                }
            ),
            "{err}"
        );
        assert!(mw.held_regions().is_empty());
        checked += 1;
    }
    if supported(&ctx, MwType::Type2) {
        let mw = pd.alloc_mw(MwType::Type2).unwrap();
        let mut s = rc.a.start_post_send();
        s.wr(2, SendFlags::SIGNALED).bind_mw(
            &mw,
            mw.next_rkey(),
            target.mr(),
            base..base + 64,
            AccessFlags::REMOTE_ATOMIC,
        );
        let err = s.post().unwrap_err();
        assert!(
            matches!(
                err,
                sideway::queue_pair::PostError::Invalid {
                    reason: sideway::queue_pair::InvalidWorkRequest::BindAccess {
                        missing: AccessFlags::LOCAL_WRITE,
                        ..
                    },
                    ..
                }
            ),
            "{err}"
        );
        assert!(mw.held_regions().is_empty());
        checked += 1;
    }
    if checked == 0 {
        println!("skipped: {test}: no memory windows here");
    }
}
