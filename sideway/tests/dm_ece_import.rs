//! Device tests: device memory, enhanced connection establishment, importing a context, PD and
//! MR (and that an imported region makes no safe entry), and the data-in-order query. On rxe
//! (rdma-core's rxe provider has none of the first three) each must be refused with its typed "not
//! supported by this device" error, and the data-in-order query must answer "nothing guaranteed";
//! on a device that has them (mlx5), each must work end to end.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;

use sideway::device::DeviceContext;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{
    DataInOrderCaps, DataInOrderFlags, DataInOrderOp, Ece, QueuePair, SendFlags,
};

fn is_rxe(ctx: &DeviceContext) -> bool {
    sideway::dv::driver_name(ctx) == "rxe"
}

fn rc_qp(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<sideway::protection_domain::ProtectionDomain>,
) -> QueuePair {
    let cq = ctx.create_cq_builder().cqe(16).build().unwrap();
    pd.create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap()
}

#[test]
fn device_memory_works_or_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("device_memory_works_or_is_refused_as_not_supported")
    else {
        return;
    };
    let max = ctx.query_device().unwrap().max_dm_size();
    let pd = ctx.alloc_pd().unwrap();
    let mut dm = match ctx.alloc_dm(4096, 0) {
        Ok(dm) => dm,
        Err(e) => {
            assert!(e.is_not_supported(), "ibv_alloc_dm failed otherwise: {e}");
            let text = e.to_string();
            assert!(text.contains("not supported by this device"), "{text}");
            assert_eq!(max, 0, "a device without device memory says max_dm_size 0");
            println!("{}: max_dm_size {max}; {text}", ctx.name());
            assert!(!is_rxe(&ctx) || max == 0);
            return;
        }
    };
    assert!(!is_rxe(&ctx), "rxe allocated device memory");
    assert!(
        max >= 4096,
        "max_dm_size {max} but 4096 bytes were allocated"
    );
    dm.copy_to(0, b"from the device's own memory").unwrap();
    let mut back = [0u8; 28];
    dm.copy_from(0, &mut back).unwrap();
    assert_eq!(&back, b"from the device's own memory");

    // A SEND from device memory into host memory, over a loopback RC pair.
    let mr = pd
        .reg_dm_mr(&dm, 0, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.addr(), 0);
    let mut a = rc_qp(&ctx, &pd);
    let mut b = rc_qp(&ctx, &pd);
    pairs::connect(&ctx, &a, &b);
    let rbuf = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut recv = b.start_post_recv();
    recv.recv(1, &[rbuf.sge(0..64).unwrap()]);
    recv.post().unwrap();
    let mut send = a.start_post_send();
    send.wr(2, SendFlags::SIGNALED).send(mr.sge(0..28).unwrap());
    send.post().unwrap();
    for wc in pairs::wait_for(a.send_cq(), 1)
        .into_iter()
        .chain(pairs::wait_for(b.recv_cq(), 1))
    {
        wc.ok().unwrap();
    }
    assert_eq!(
        &rbuf.to_vec(0..28).unwrap()[..],
        b"from the device's own memory"
    );
    drop(dm);
    drop(mr); // frees the device memory
    println!(
        "{}: device memory round trip and SEND from it passed",
        ctx.name()
    );
}

#[test]
fn ece_works_or_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("ece_works_or_is_refused_as_not_supported") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let qp = rc_qp(&ctx, &pd);
    match qp.query_ece() {
        Ok(ece) => {
            assert!(!is_rxe(&ctx), "rxe answered ibv_query_ece: {ece:?}");
            qp.set_ece(ece).expect("setting what the device offers");
            println!("{}: ECE {ece:?}", ctx.name());
        }
        Err(e) => {
            assert!(e.is_not_supported(), "ibv_query_ece failed otherwise: {e}");
            assert_eq!((e.call, e.qp_num), ("ibv_query_ece", qp.qp_num()));
            assert!(
                e.to_string().contains("not supported by this device"),
                "{e}"
            );
            let e = qp
                .set_ece(Ece::default())
                .expect_err("a device without ECE accepted ibv_set_ece");
            assert!(e.is_not_supported(), "ibv_set_ece failed otherwise: {e}");
            assert_eq!(e.call, "ibv_set_ece");
            println!("{}: {e}", ctx.name());
        }
    }
}

#[test]
fn importing_works_or_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("importing_works_or_is_refused_as_not_supported") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let buf = pd
        .reg_buffer(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let fd = ctx.cmd_fd().try_clone_to_owned().unwrap();
    match DeviceContext::import_device(fd) {
        Ok(imported) => {
            assert!(!is_rxe(&ctx), "rxe imported a context");
            assert_eq!(imported.name(), ctx.name());
            let ipd = imported.import_pd(pd.handle()).unwrap();
            assert!(ipd.is_imported());
            assert_eq!(ipd.handle(), pd.handle());
            let imr = ipd.import_mr(buf.mr().handle()).unwrap();
            assert!(imr.is_imported());
            assert_eq!(
                (imr.lkey(), imr.rkey(), imr.len(), imr.addr()),
                (buf.lkey(), buf.rkey(), buf.len(), buf.addr())
            );
            // Unimported (not deregistered, not deallocated): the exporter's still work.
            drop(imr);
            drop(ipd);
            drop(imported);
            let mr2 = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
            assert_ne!(mr2.lkey(), 0);
            println!("{}: imported context, PD and MR", ctx.name());
        }
        Err(e) => {
            assert!(
                e.is_not_supported(),
                "ibv_import_device failed otherwise: {e}"
            );
            assert!(
                e.to_string().contains("not supported by this device"),
                "{e}"
            );
            // A provider that cannot import contexts cannot import PDs or MRs either.
            let e = ctx
                .import_pd(pd.handle())
                .expect_err("a provider without import_context imported a PD");
            assert!(e.is_not_supported(), "ibv_import_pd failed otherwise: {e}");
            let e = pd
                .import_mr(buf.mr().handle())
                .expect_err("a provider without import_context imported an MR");
            assert!(e.is_not_supported(), "ibv_import_mr failed otherwise: {e}");
            println!("{}: {e}", ctx.name());
        }
    }
    // The exporter's objects are untouched by the attempts.
    assert!(!pd.is_imported());
    assert!(!buf.mr().is_imported());
}

/// The program a review found: a process imports its own context, PD and regions (every
/// step safe), among them an implicit on-demand region's, whose bounds hold every address.
/// No imported region may make a safe entry, or a receive could land in any Rust object.
#[test]
fn a_self_imported_region_makes_no_safe_entry() {
    let Some(ctx) = common::device_or_skip("a_self_imported_region_makes_no_safe_entry") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let buf = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let odp = match pd.reg_implicit_odp() {
        Ok(odp) => Some(odp),
        Err(e) => {
            assert!(
                e.is_not_supported(),
                "reg_implicit_odp failed otherwise: {e}"
            );
            println!("{}: {e}", ctx.name());
            None
        }
    };
    let fd = ctx.cmd_fd().try_clone_to_owned().unwrap();
    let imported = match DeviceContext::import_device(fd) {
        Ok(imported) => imported,
        Err(e) => {
            assert!(
                e.is_not_supported(),
                "ibv_import_device failed otherwise: {e}"
            );
            assert!(!buf.mr().is_imported());
            println!(
                "{}: cannot import its own context ({e}): nothing imported, nothing to refuse",
                ctx.name()
            );
            return;
        }
    };
    let ipd = imported.import_pd(pd.handle()).unwrap();
    let imr = ipd.import_mr(buf.mr().handle()).unwrap();
    assert!(imr.is_imported());
    assert!(
        imr.sge(0..64).is_none(),
        "a safe entry over an imported region"
    );
    // SAFETY: the entry is only compared, never posted.
    let sge = unsafe { imr.imported_sge(0..64) }.expect("inside the region");
    assert_eq!(sge, buf.sge(0..64).unwrap());
    if let Some(odp) = &odp {
        let implicit = ipd.import_mr(odp.mr().handle()).unwrap();
        assert!(implicit.is_imported());
        let object = Box::new([0u8; 64]);
        let at = object.as_ptr() as usize;
        assert!(
            implicit.sge(at..at + 64).is_none(),
            "a safe entry over a Rust object, through the implicit region's imported handle"
        );
        assert!(implicit.sge(0..4096).is_none());
    }
    println!(
        "{}: imported its own regions{}; none made a safe entry",
        ctx.name(),
        if odp.is_some() {
            ", the implicit one included"
        } else {
            ""
        }
    );
}

#[test]
fn data_in_order_answers_for_every_operation() {
    let Some(ctx) = common::device_or_skip("data_in_order_answers_for_every_operation") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let a = rc_qp(&ctx, &pd);
    let b = rc_qp(&ctx, &pd);
    pairs::connect(&ctx, &a, &b);
    for op in [
        DataInOrderOp::Send,
        DataInOrderOp::SendWithImm,
        DataInOrderOp::RdmaWrite,
        DataInOrderOp::RdmaWriteWithImm,
        DataInOrderOp::RdmaRead,
    ] {
        let plain = a.query_data_in_order(op, DataInOrderFlags::empty());
        let caps = a.query_data_in_order(op, DataInOrderFlags::RETURN_CAPS);
        println!(
            "{}: {op:?}: {plain:?}, with RETURN_CAPS {caps:?}",
            ctx.name()
        );
        // Without RETURN_CAPS the answer is the whole-message bit or nothing.
        assert!(
            DataInOrderCaps::WHOLE_MSG.contains(plain),
            "{op:?}: {plain:?}"
        );
        if is_rxe(&ctx) {
            // rxe has no query_qp_data_in_order: libibverbs answers "nothing guaranteed".
            assert_eq!(plain, DataInOrderCaps::empty(), "{op:?}");
            assert_eq!(caps, DataInOrderCaps::empty(), "{op:?}");
        }
    }
}
