//! Importing a context, PD and MR, ECE and the data-in-order query against a test double of
//! libibverbs (`tests/support/fake_libibverbs.c`, built here with the C compiler and loaded
//! through `RDMA_MUMMY_LIBIBVERBS` in a child process): what each verb is given, who releases
//! what (imported objects are unimported, never deallocated or deregistered; the imported
//! context closes the descriptor it was given, once), and how failures read. These verbs are
//! libibverbs' own functions, so the benches' null provider cannot answer them. The same
//! calls run on rxe in `dm_ece_import.rs`.

use std::env;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use sideway::device::DeviceContext;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{DataInOrderCaps, DataInOrderFlags, DataInOrderOp, Ece};

mod common;

const CHILD: &str = "SIDEWAY_FAKE_IBV_CHILD";

/// Builds the fake libibverbs.so.1, or says why it cannot (no C compiler: the guest).
fn fake_library() -> Option<PathBuf> {
    common::fake_library::build("fake_libibverbs.c", "libibverbs.so.1", &[])
}

#[test]
fn imports_ece_and_data_in_order_against_the_fake_libibverbs() {
    let Some(lib) = fake_library() else { return };
    let log = lib.with_file_name(format!("calls-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    common::fake_library::run_child(
        CHILD,
        "child_against_the_fake",
        &[("RDMA_MUMMY_LIBIBVERBS", &lib), ("FAKE_IBV_LOG", &log)],
    );
    let _ = std::fs::remove_file(&log);
}

/// The fake's log so far, one call per line, and emptied.
fn take_log() -> Vec<String> {
    let path = PathBuf::from(env::var_os("FAKE_IBV_LOG").expect("the parent sets it"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    text.lines().map(str::to_owned).collect()
}

#[test]
#[ignore = "run by imports_ece_and_data_in_order_against_the_fake_libibverbs"]
fn child_against_the_fake() {
    assert!(
        common::fake_library::in_child(CHILD),
        "run only as a child of this binary's tests"
    );
    // The exporter's descriptor, duplicated: the imported context owns the duplicate.
    let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let raw_fd = fd.as_raw_fd();
    let ctx = DeviceContext::import_device(fd).expect("the fake imports");
    assert_eq!(ctx.name(), "fakeverbs0");
    assert_eq!(ctx.cmd_fd().as_raw_fd(), raw_fd);
    assert_eq!(take_log(), ["ibv_import_device open=1"]);

    // PD and MR by handle.
    let pd = ctx.import_pd(7).expect("the fake imports PDs");
    assert!(pd.is_imported());
    assert_eq!(pd.handle(), 7);
    let e = ctx.import_pd(0).expect_err("handle 0 is refused");
    assert!(e.is_not_supported(), "{e}");
    assert!(
        e.to_string()
            .starts_with("ibv_import_pd of handle 0x0 failed on fakeverbs0: "),
        "{e}"
    );
    let mr = pd.import_mr(9).expect("the fake imports MRs");
    assert!(mr.is_imported());
    assert_eq!(
        (mr.handle(), mr.lkey(), mr.rkey(), mr.addr(), mr.len()),
        (9, 0x109, 0x209, 0x700_0000, 4096)
    );
    assert_eq!(mr.access(), AccessFlags::empty());
    // No safe entry: the exporter may be this process. The unsafe one names the exporter's
    // addresses, inside the region's bounds.
    assert!(mr.sge(16..48).is_none());
    // SAFETY: the entry is only compared, never posted.
    let sge = unsafe { mr.imported_sge(16..48) }.expect("inside the region");
    assert_eq!(
        (sge.addr(), sge.length(), sge.lkey()),
        (0x700_0010, 32, 0x109)
    );
    // SAFETY: as above.
    assert!(unsafe { mr.imported_sge(4090..4100) }.is_none());

    // An implicit on-demand region's handle (the fake's handle 10: NULL, SIZE_MAX bytes), as
    // a program that imports its own context, PD and implicit region would get: bounds that
    // hold every address, and still no safe entry over any of them.
    let implicit = pd.import_mr(10).expect("the fake imports MRs");
    assert!(implicit.is_imported());
    assert_eq!((implicit.addr(), implicit.len()), (0, usize::MAX));
    let object = Box::new([0u8; 64]);
    let at = object.as_ptr() as usize;
    assert!(implicit.sge(at..at + 64).is_none());
    assert!(implicit.sge(0..4096).is_none());
    drop(object);
    drop(implicit);

    let e = pd.import_mr(0).expect_err("handle 0 is refused");
    assert!(e.is_not_supported(), "{e}");
    assert_eq!(
        take_log(),
        [
            "ibv_import_pd handle=7",
            "ibv_import_pd handle=0",
            "ibv_import_mr pd=7 handle=9",
            "ibv_import_mr pd=7 handle=10",
            "ibv_unimport_mr handle=10",
            "ibv_import_mr pd=7 handle=0",
        ]
    );
    // The region holds the PD: unimported in that order, neither deregistered nor
    // deallocated.
    drop(pd);
    assert!(take_log().is_empty());
    drop(mr);
    assert_eq!(
        take_log(),
        ["ibv_unimport_mr handle=9", "ibv_unimport_pd handle=7"]
    );

    // ECE and the data-in-order query on a QP of a PD of this context (allocated, so
    // deallocated when dropped).
    let own = ctx.alloc_pd().unwrap();
    assert!(!own.is_imported());
    let cq = ctx.create_cq_builder().cqe(4).build().unwrap();
    let qp = own
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .build()
        .unwrap();
    let qpn = qp.qp_num();
    assert_eq!(
        qp.query_ece().unwrap(),
        Ece {
            vendor_id: 0x2c9,
            options: 5,
            comp_mask: 0
        }
    );
    qp.set_ece(Ece {
        vendor_id: 0x1234,
        options: 0x3,
        comp_mask: 0,
    })
    .unwrap();
    let e = qp
        .set_ece(Ece {
            vendor_id: 0x1234,
            options: 0xdead,
            comp_mask: 0,
        })
        .expect_err("the fake refuses these options");
    assert_eq!(
        (e.call, e.qp_num, e.source.raw_os_error()),
        ("ibv_set_ece", qpn, Some(22))
    );
    assert!(!e.is_not_supported());
    let write = DataInOrderOp::RdmaWrite;
    assert_eq!(
        qp.query_data_in_order(write, DataInOrderFlags::empty()),
        DataInOrderCaps::WHOLE_MSG
    );
    assert_eq!(
        qp.query_data_in_order(write, DataInOrderFlags::RETURN_CAPS),
        DataInOrderCaps::WHOLE_MSG | DataInOrderCaps::ALIGNED_128_BYTES
    );
    assert_eq!(
        qp.query_data_in_order(DataInOrderOp::RdmaRead, DataInOrderFlags::RETURN_CAPS),
        DataInOrderCaps::empty()
    );
    assert_eq!(
        take_log(),
        [
            "ibv_alloc_pd".to_owned(),
            format!("ibv_query_ece qp={qpn:#x}"),
            format!("ibv_set_ece qp={qpn:#x} vendor=0x1234 options=0x3 comp_mask=0"),
            format!("ibv_set_ece qp={qpn:#x} vendor=0x1234 options=0xdead comp_mask=0"),
            format!("ibv_query_qp_data_in_order qp={qpn:#x} op=0 flags=0"),
            format!("ibv_query_qp_data_in_order qp={qpn:#x} op=0 flags=1"),
            format!("ibv_query_qp_data_in_order qp={qpn:#x} op=4 flags=1"),
        ]
    );
    drop(qp);
    drop(cq);
    drop(own);
    assert_eq!(take_log(), ["ibv_dealloc_pd handle=66"]);

    // The context closes the descriptor it was given, once (the fake's close succeeds only
    // if nothing closed it before).
    drop(ctx);
    assert_eq!(take_log(), ["ibv_close_device closed=1"]);
    println!("child checks passed");
}
