//! Device tests: on-demand paging. What the device says (`odp_caps`) decides what is
//! expected: a device without on-demand paging (rxe on Linux 6.12) must refuse an
//! `IBV_ACCESS_ON_DEMAND` registration and an implicit region with a typed "not supported by
//! this device" error; a device with it must carry a SEND between two on-demand buffers (and,
//! with implicit support, between buffers of implicit regions). `ibv_advise_mr` is either
//! done or refused as not supported (rxe's provider has no `advise_mr`). A CQ asking for
//! completion timestamps on a device without them is refused as not supported.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;

use sideway::completion_queue::{WcFlagsEx, WcStatus};
use sideway::device::DeviceContext;
use sideway::memory_region::{AccessFlags, MemoryRegionError, RegisteredBuffer};
use sideway::odp::{AdviseFlags, AdviseMr};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QpType, SendFlags};

/// Sends 64 bytes from `src` to `dst` over a loopback RC pair and checks they arrived.
fn send_between(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<ProtectionDomain>,
    src: &mut RegisteredBuffer,
    dst: &RegisteredBuffer,
) {
    let cq = ctx.create_cq_builder().cqe(16).build().unwrap();
    let qp = |pd: &Arc<ProtectionDomain>| {
        pd.create_qp_builder()
            .qp_type(QpType::Rc)
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(4)
            .max_recv_wr(4)
            .build()
            .unwrap()
    };
    let (mut a, mut b) = (qp(pd), qp(pd));
    pairs::connect(ctx, &a, &b);
    src.write_at(0, &[0x5a; 64]).unwrap();
    let mut recv = b.start_post_recv();
    recv.recv(2, &[dst.sge(0..64).unwrap()]);
    recv.post().unwrap();
    let mut send = a.start_post_send();
    send.wr(1, SendFlags::SIGNALED)
        .send(src.sge(0..64).unwrap());
    send.post().unwrap();
    for wc in pairs::wait_for(&cq, 2) {
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    }
    assert_eq!(dst.to_vec(0..64).unwrap(), [0x5a; 64]);
}

#[test]
fn on_demand_paging_works_or_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("on_demand_paging_works_or_is_refused_as_not_supported")
    else {
        return;
    };
    let caps = ctx.query_device().unwrap().odp_caps();
    println!("{}: odp caps {caps:?}", ctx.name());
    let pd = ctx.alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;
    let explicit = pd.reg_buffer(4096, access);
    if !caps.is_supported() {
        let e = explicit.expect_err("a device without ODP registered an on-demand buffer");
        assert!(
            e.is_not_supported(),
            "ibv_reg_mr with ON_DEMAND failed otherwise: {e}"
        );
        let text = e.to_string();
        assert!(text.contains("not supported by this device"), "{text}");
        println!("{}: explicit ODP: {text}", ctx.name());
    } else {
        let mut src = explicit.expect("an ODP device registers an on-demand buffer");
        let dst = pd.reg_buffer(4096, access).unwrap();
        match dst.advise(AdviseMr::PrefetchWrite, AdviseFlags::FLUSH, 0..4096) {
            Ok(()) => println!("{}: ibv_advise_mr prefetched", ctx.name()),
            Err(e) => {
                assert!(e.is_not_supported(), "ibv_advise_mr failed otherwise: {e}");
                println!("{}: {e}", ctx.name());
            }
        }
        if caps.rc.contains(
            sideway::device::OdpTransportCaps::SEND | sideway::device::OdpTransportCaps::RECV,
        ) {
            send_between(&ctx, &pd, &mut src, &dst);
            println!("{}: a SEND between on-demand buffers arrived", ctx.name());
        }
    }

    match pd.reg_implicit_odp() {
        Err(e) => {
            assert!(
                !caps.supports_implicit(),
                "the device offers implicit ODP, yet: {e}"
            );
            assert!(e.is_not_supported(), "{e}");
            assert!(
                matches!(e, MemoryRegionError::ImplicitOdpNotSupported { .. }),
                "{e:?}"
            );
            println!("{}: implicit ODP: {e}", ctx.name());
        }
        Ok(region) => {
            assert!(caps.supports_implicit());
            assert!(region.mr().sge(0..64).is_none());
            let mut src = region.alloc_buffer(4096).unwrap();
            let dst = region.alloc_buffer(4096).unwrap();
            send_between(&ctx, &pd, &mut src, &dst);
            println!(
                "{}: a SEND between buffers of an implicit region arrived",
                ctx.name()
            );
        }
    }
}

#[test]
fn advise_mr_on_rxe_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("advise_mr_on_rxe_is_refused_as_not_supported") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let buf = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let result = buf.advise(AdviseMr::Prefetch, AdviseFlags::FLUSH, 0..4096);
    if ctx.name().starts_with("rxe") {
        let e = result.expect_err("rxe advised an MR");
        assert!(e.is_not_supported(), "{e}");
        assert!(
            e.to_string().contains("not supported by this device"),
            "{e}"
        );
        println!("{}: {e}", ctx.name());
    } else {
        // Elsewhere a region registered without ON_DEMAND is no place for advice.
        println!("{}: advice on a pinned region: {result:?}", ctx.name());
    }
}

#[test]
fn completion_timestamps_work_or_are_refused_as_not_supported() {
    let Some(ctx) =
        common::device_or_skip("completion_timestamps_work_or_are_refused_as_not_supported")
    else {
        return;
    };
    let mask = ctx.query_device().unwrap().completion_timestamp_mask();
    let cq = ctx
        .create_cq_builder()
        .cqe(16)
        .wc_flags(WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP)
        .build_ex();
    match cq {
        Ok(cq) => {
            assert_ne!(
                mask, 0,
                "a CQ with timestamps on a device with no timestamp mask"
            );
            assert!(cq.wc_flags().contains(WcFlagsEx::COMPLETION_TIMESTAMP));
        }
        Err(e) => {
            assert_eq!(mask, 0, "a device with timestamps refused them: {e}");
            assert!(e.is_not_supported(), "{e}");
            let text = e.to_string();
            assert!(text.contains("not supported by this device"), "{text}");
            println!("{}: completion timestamps: {text}", ctx.name());
        }
    }
}
