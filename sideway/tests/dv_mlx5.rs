//! mlx5 direct verbs (`sideway::dv::mlx5`): what can be checked without an mlx5 NIC.
//!
//! - Against a test double of `libmlx5.so.1` (`tests/support/fake_libmlx5.c`, built here with
//!   the C compiler), which records every call's arguments: the DCT and DCI attribute
//!   plumbing (QP type, comp_mask bits, DC type, DCT access key, send_ops_flags), the posting
//!   order of a DCI's batch with `mlx5dv_wr_set_dc_addr`, `mlx5dv_query_device`'s typed
//!   answer, and the refusals (a device of another provider, a DCT without SRQ, a failing
//!   create, a request the DCI was not created for).
//! - With `libmlx5.so.1` pointed at a missing file: every call is a typed error naming the
//!   package to install.
//! - On a real device (the SoftRoCE guest's rxe): `is_supported` is false and every DC call
//!   is a typed error naming the device, its driver and the need for an mlx5 NIC, with or
//!   without the guest's libmlx5 (`ibverbs-providers`).
//!
//! A process loads libmlx5 once, so each double-based check runs in a child process of this
//! test binary with `RDMA_MUMMY_LIBMLX5` set. DC has never run on mlx5 hardware here.

mod common;

use std::env;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use sideway::address_handle::AddressHandle;
use sideway::completion_queue::CompletionQueue;
use sideway::device::DeviceContext;
use sideway::dv::{self, mlx5, DvError};
use sideway::memory_region::Sge;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{PostError, QpType, SendFlags, SendOpsFlags};
use sideway::sys as ffi;

const CHILD: &str = "SIDEWAY_DV_MLX5_CHILD";

/// Builds the fake libmlx5.so.1, or says why it cannot (no C compiler: the SoftRoCE guest).
fn fake_library() -> Option<PathBuf> {
    common::fake_library::build("fake_libmlx5.c", "libmlx5.so.1", &["-pthread"])
}

/// Runs the ignored test `child` in a child process with `envs`, and fails with its output
/// unless it passed and printed its marker.
fn run_child(child: &str, envs: &[(&str, &Path)]) {
    print!("{}", common::fake_library::run_child(CHILD, child, envs));
}

fn in_child() -> bool {
    common::fake_library::in_child(CHILD)
}

/// The C objects of a device that is not there: a device named `name`, its context, a PD,
/// a CQ, an SRQ and an address handle, zeroed but for the links between them. The device is
/// laid out as the start of libibverbs' `struct verbs_device` (the device, then its provider's
/// operation table, NULL here), which is what the real `mlx5dv_is_supported` reads.
#[repr(C)]
struct FakeVerbs {
    device: ffi::ibv_device,
    verbs_device_ops: *const std::ffi::c_void,
    verbs_device_rest: [u64; 8],
    context: ffi::ibv_context,
    pd: ffi::ibv_pd,
    cq: ffi::ibv_cq,
    srq: ffi::ibv_srq,
    ah: ffi::ibv_ah,
}

/// Keeps the fake objects alive as the contexts' owner.
struct Owner(#[allow(dead_code)] Box<FakeVerbs>);
// SAFETY: the objects are plain memory that only this test's thread touches.
unsafe impl Send for Owner {}
// SAFETY: as above.
unsafe impl Sync for Owner {}

struct Fake {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    srq: Arc<sideway::shared_receive_queue::SharedReceiveQueue>,
    ah: Arc<AddressHandle>,
}

fn fake(name: &str) -> Fake {
    let mut v = Box::new(FakeVerbs {
        device: ffi::ibv_device::default(),
        verbs_device_ops: std::ptr::null(),
        verbs_device_rest: [0; 8],
        context: ffi::ibv_context::default(),
        pd: ffi::ibv_pd::default(),
        cq: ffi::ibv_cq::default(),
        srq: ffi::ibv_srq::default(),
        ah: ffi::ibv_ah::default(),
    });
    for (dst, src) in v.device.name.iter_mut().zip(name.bytes()) {
        *dst = src as _;
    }
    let device: *mut ffi::ibv_device = &mut v.device;
    v.context.device = device;
    let context: *mut ffi::ibv_context = &mut v.context;
    v.pd.context = context;
    v.cq.context = context;
    v.srq.context = context;
    v.ah.context = context;
    v.ah.handle = 0xa4;
    let (pd, cq, srq, ah) = (
        NonNull::from(&mut v.pd),
        NonNull::from(&mut v.cq),
        NonNull::from(&mut v.srq),
        NonNull::from(&mut v.ah),
    );
    v.ah.pd = pd.as_ptr();
    let ctx_raw = NonNull::from(&mut v.context);
    // SAFETY: every object lives in the box the context owns, until the context and all
    // objects wrapped on it are dropped; only dv::mlx5 (the fake library) and plain field
    // reads touch them, never libibverbs' control path.
    unsafe {
        let ctx = DeviceContext::from_raw_parts(ctx_raw, name, Box::new(Owner(v)));
        let pd = ProtectionDomain::from_raw_parts(pd, &ctx);
        let cq = ctx
            .create_cq_builder()
            .wrap_raw(cq, None)
            .expect("a classic CQ");
        let srq = pd.create_srq_builder().wrap_raw(srq);
        let ah =
            AddressHandle::from_raw_parts(ah, &sideway::address_handle::AddressVector::new(), &pd);
        Fake {
            ctx,
            pd,
            cq,
            srq,
            ah,
        }
    }
}

/// The fake library's log, as lines.
fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn last_line(log: &Path, prefix: &str) -> String {
    log_lines(log)
        .into_iter()
        .rev()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("the fake library logged no {prefix} call"))
}

#[test]
fn dc_plumbing_against_the_fake_libmlx5() {
    let Some(lib) = fake_library() else { return };
    if let Err(e) = sideway::sys::Library::Ibverbs.load() {
        // ibv_qp_to_qp_ex is libibverbs' own; without the library nothing can run.
        println!("skipped: {e}");
        return;
    }
    let log = lib.with_file_name(format!("calls-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    run_child(
        "child_fake_dc",
        &[("RDMA_MUMMY_LIBMLX5", &lib), ("FAKE_MLX5_LOG", &log)],
    );
    let _ = std::fs::remove_file(&log);
}

#[test]
#[ignore = "run by dc_plumbing_against_the_fake_libmlx5 with the fake library"]
fn child_fake_dc() {
    assert!(in_child(), "run only as a child of this binary's tests");
    let log = PathBuf::from(env::var_os("FAKE_MLX5_LOG").expect("the parent sets it"));
    let f = fake("mlx5_0");

    // Which provider: the plugin layer asks each one.
    assert!(mlx5::is_supported(&f.ctx));
    assert_eq!(dv::provider_of(&f.ctx).map(|p| p.name), Some("mlx5"));
    assert!(dv::PROVIDERS.iter().all(|p| p.load_status().is_ok()));

    // mlx5dv_query_device: asked for the parts the type names, answered for three.
    let caps = mlx5::query_device(&f.ctx).expect("the fake answers");
    let asked = last_line(&log, "mlx5dv_query_device");
    use ffi::mlx5dv_context_comp_mask as m;
    let want = m::MLX5DV_CONTEXT_MASK_DYN_BFREGS
        | m::MLX5DV_CONTEXT_MASK_DC_ODP_CAPS
        | m::MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS
        | m::MLX5DV_CONTEXT_MASK_DCI_STREAMS
        | m::MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH;
    assert_eq!(asked, format!("mlx5dv_query_device comp_mask={want:#x}"));
    assert_eq!(caps.version, 1);
    assert!(caps.flags.contains(mlx5::ContextFlags::CQE_V1));
    assert_eq!(caps.max_dynamic_bfregs, Some(8));
    assert_eq!(caps.num_lag_ports, Some(2));
    assert_eq!(
        caps.dci_streams,
        Some(mlx5::DciStreamsCaps {
            max_log_num_concurrent: 4,
            max_log_num_errored: 2
        })
    );
    assert_eq!(caps.dc_odp_caps, None, "not answered, so not reported");
    assert_eq!(caps.max_wr_memcpy_length, None);

    // A DCT: IBV_QPT_DRIVER, comp_mask PD only, no send ops, the SRQ, DC type DCT and key.
    let err =
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .build_mlx5_dct(1)
            .expect_err("a DCT needs an SRQ");
    assert!(err.to_string().contains("srq()"), "{err}");
    let dct =
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .srq(&f.srq)
            .build_mlx5_dct(0x5eed_f00d)
            .expect("the fake creates it");
    let line = last_line(&log, "mlx5dv_create_qp");
    let driver = ffi::ibv_qp_type::IBV_QPT_DRIVER;
    let pd_bit = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD;
    let ops_bit = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let dc_bit = ffi::mlx5dv_qp_init_attr_mask::MLX5DV_QP_INIT_ATTR_MASK_DC;
    for field in [
        format!("qp_type={driver}"),
        format!("comp_mask={pd_bit:#x}"),
        "pd=1".to_owned(),
        "send_ops_flags=0x0".to_owned(),
        "srq=1".to_owned(),
        format!("dv_comp_mask={dc_bit:#x}"),
        format!("dc_type={}", ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCT),
        "dct_access_key=0x5eedf00d".to_owned(),
    ] {
        assert!(
            line.split(' ').any(|f| f == field),
            "{field} missing: {line}"
        );
    }
    assert_eq!(dct.access_key(), 0x5eed_f00d);
    assert_eq!(dct.dct_number(), dct.queue_pair().qp_num());
    assert_eq!(dct.queue_pair().qp_type(), QpType::Driver);
    assert!(dct.queue_pair().srq().is_some());

    // A DCI: comp_mask PD | SEND_OPS_FLAGS with the builder's operations, DC type DCI.
    let ops = SendOpsFlags::SEND
        | SendOpsFlags::RDMA_WRITE
        | SendOpsFlags::RDMA_READ
        | SendOpsFlags::ATOMIC_FETCH_AND_ADD;
    let mut dci =
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .max_send_wr(4)
            .max_send_sge(2)
            .send_ops_flags(ops)
            .build_mlx5_dci()
            .expect("the fake creates it");
    let line = last_line(&log, "mlx5dv_create_qp");
    for field in [
        format!("qp_type={driver}"),
        format!("comp_mask={:#x}", pd_bit | ops_bit),
        format!("send_ops_flags={:#x}", ops.bits()),
        "srq=0".to_owned(),
        "max_send_wr=4".to_owned(),
        "max_send_sge=2".to_owned(),
        format!("dv_comp_mask={dc_bit:#x}"),
        format!("dc_type={}", ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCI),
        "dct_access_key=0x0".to_owned(),
    ] {
        assert!(
            line.split(' ').any(|f| f == field),
            "{field} missing: {line}"
        );
    }
    assert!(dci.queue_pair().is_extended());
    assert_eq!(dci.send_ops(), ops);
    assert!(!dci.as_raw_mlx5().is_null());
    let handle = mlx5::qp_ex(dci.queue_pair()).expect("an extended QP of an mlx5 device");
    assert_eq!(handle.as_ptr(), dci.as_raw_mlx5());

    // Posting: opcode, then the DC address, then the SGEs; one complete per batch.
    // SAFETY: the fake records the SGE and never dereferences it.
    let sges = [unsafe { Sge::from_raw_parts(0x1000, 64, 0x77) }];
    let qpn = dci.queue_pair().qp_num();
    let before = log_lines(&log).len();
    let mut batch = dci.start_post_send();
    batch
        .wr(
            7,
            SendFlags::SIGNALED,
            mlx5::DcAddress::new(&f.ah, 0xd1, 0x5eed_f00d),
        )
        .rdma_write(0x42, 0x9000, &sges);
    batch
        .wr(
            8,
            SendFlags::empty(),
            mlx5::DcAddress::new(&f.ah, 0xd2, 0x1),
        )
        .atomic_fetch_add(0x43, 0xa000, 5, &sges[0]);
    assert_eq!(batch.len(), 2);
    batch.post().expect("the fake completes");
    let posted: Vec<String> = log_lines(&log).split_off(before);
    let signaled = SendFlags::SIGNALED.bits();
    assert_eq!(
        posted,
        [
            format!("wr_start qp={qpn:#x}"),
            format!("wr_rdma_write wr_id=7 flags={signaled:#x} rkey=0x42 addr=0x9000"),
            "wr_set_dc_addr ah_pd_handle=0xa4 dctn=0xd1 key=0x5eedf00d".to_owned(),
            "wr_set_sge_list n=1 lkey=0x77 addr=0x1000 length=64".to_owned(),
            "wr_atomic_fetch_add wr_id=8 rkey=0x43 addr=0xa000 add=5".to_owned(),
            "wr_set_dc_addr ah_pd_handle=0xa4 dctn=0xd2 key=0x1".to_owned(),
            "wr_set_sge_list n=1 lkey=0x77 addr=0x1000 length=64".to_owned(),
            format!("wr_complete qp={qpn:#x}"),
        ]
    );

    // A request the DCI was not created for is refused; the batch is aborted, not posted.
    let before = log_lines(&log).len();
    let mut batch = dci.start_post_send();
    batch
        .wr(1, SendFlags::empty(), mlx5::DcAddress::new(&f.ah, 0xd1, 2))
        .send(&sges);
    batch
        .wr(2, SendFlags::empty(), mlx5::DcAddress::new(&f.ah, 0xd1, 2))
        .send_with_imm(9, &sges);
    let err = batch
        .post()
        .expect_err("SEND with immediate is not in send_ops_flags");
    assert!(
        matches!(
            err,
            PostError::Invalid {
                index: 1,
                wr_id: 2,
                ..
            }
        ),
        "{err}"
    );
    let posted: Vec<String> = log_lines(&log).split_off(before);
    assert_eq!(
        posted.last().map(String::as_str),
        Some(&*format!("wr_abort qp={qpn:#x}"))
    );
    assert!(!posted.iter().any(|l| l.starts_with("wr_complete")));

    // More SGEs than max_send_sge, more requests than max_send_wr.
    let three = [sges[0], sges[0], sges[0]];
    let mut batch = dci.start_post_send();
    batch
        .wr(3, SendFlags::empty(), mlx5::DcAddress::new(&f.ah, 1, 2))
        .send(&three);
    let err = batch.post().expect_err("3 SGEs, max 2");
    assert!(err.to_string().contains("max_send_sge of 2"), "{err}");
    let mut batch = dci.start_post_send();
    for i in 0..5 {
        batch
            .wr(i, SendFlags::empty(), mlx5::DcAddress::new(&f.ah, 1, 2))
            .send(&sges);
    }
    let err = batch.post().expect_err("5 requests, max 4");
    assert!(matches!(err, PostError::Invalid { index: 4, .. }), "{err}");

    // Dropping an unposted batch aborts it.
    let before = log_lines(&log).len();
    {
        let mut batch = dci.start_post_send();
        batch
            .wr(1, SendFlags::empty(), mlx5::DcAddress::new(&f.ah, 1, 2))
            .rdma_read(1, 2, &sges);
    }
    assert_eq!(
        log_lines(&log).split_off(before).last().map(String::as_str),
        Some(&*format!("wr_abort qp={qpn:#x}"))
    );

    // Another provider's device: the typed error names it and its driver.
    let rxe = fake("rxe0");
    assert!(!mlx5::is_supported(&rxe.ctx));
    assert!(dv::provider_of(&rxe.ctx).is_none());
    let err = rxe
        .pd
        .create_qp_builder()
        .send_cq(&rxe.cq)
        .recv_cq(&rxe.cq)
        .build_mlx5_dci()
        .expect_err("rxe0 is not an mlx5 device");
    assert!(matches!(err, DvError::WrongProvider { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "rxe0 is a rxe device, not mlx5: DC transport needs an mlx5 NIC (ConnectX-4 or later)"
    );
    let err = mlx5::query_device(&rxe.ctx).expect_err("not mlx5");
    assert!(
        err.to_string()
            .starts_with("rxe0 is a rxe device, not mlx5"),
        "{err}"
    );

    // The create verb failing: its errno, named.
    // SAFETY: this child process runs one test on one thread; nothing reads the environment
    // concurrently.
    unsafe { env::set_var("FAKE_MLX5_CREATE_ERRNO", "22") };
    let err =
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .build_mlx5_dci()
            .expect_err("the fake fails");
    // SAFETY: as above.
    unsafe { env::remove_var("FAKE_MLX5_CREATE_ERRNO") };
    match &err {
        DvError::Verb {
            call,
            device,
            source,
        } => {
            assert_eq!((*call, device.as_str()), ("mlx5dv_create_qp", "mlx5_0"));
            assert_eq!(source.raw_os_error(), Some(22));
        }
        other => panic!("expected a verb error, got {other:?}"),
    }
    println!("child checks passed");
}

#[test]
fn the_real_libmlx5_refuses_a_device_that_is_not_its_own() {
    // The installed library (the default soname), asked about a device whose provider
    // table is not mlx5's: the host-side stand-in for the guest's rxe check below.
    run_child("child_real_libmlx5", &[]);
}

#[test]
#[ignore = "run by the_real_libmlx5_refuses_a_device_that_is_not_its_own"]
fn child_real_libmlx5() {
    assert!(in_child(), "run only as a child of this binary's tests");
    if let Err(e) = sideway::sys::Library::Mlx5.load() {
        println!("skipped: {e}");
        println!("child checks passed");
        return;
    }
    let f = fake("mlx5_0");
    assert!(
        !mlx5::is_supported(&f.ctx),
        "the real library checks the provider, not the name"
    );
    let err =
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .build_mlx5_dci()
            .expect_err("not an mlx5 device");
    assert!(matches!(err, DvError::WrongProvider { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("mlx5_0 is an unrecognised device, not mlx5: DC transport needs"),
        "{err}"
    );
    println!("{err}");
    println!("child checks passed");
}

#[test]
fn a_missing_libmlx5_is_a_typed_error() {
    run_child(
        "child_missing_libmlx5",
        &[("RDMA_MUMMY_LIBMLX5", Path::new("/nonexistent/libmlx5.so.1"))],
    );
}

#[test]
#[ignore = "run by a_missing_libmlx5_is_a_typed_error with libmlx5 pointed at a missing file"]
fn child_missing_libmlx5() {
    assert!(in_child(), "run only as a child of this binary's tests");
    let f = fake("mlx5_0");
    assert!(!mlx5::is_supported(&f.ctx));
    assert!(dv::provider_of(&f.ctx).is_none());
    let status = dv::PROVIDERS[0]
        .load_status()
        .expect_err("the file is missing");
    assert_eq!(status.path(), "/nonexistent/libmlx5.so.1");
    for err in [
        mlx5::query_device(&f.ctx).expect_err("no library"),
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .build_mlx5_dci()
            .expect_err("no library"),
        f.pd.create_qp_builder()
            .send_cq(&f.cq)
            .recv_cq(&f.cq)
            .srq(&f.srq)
            .build_mlx5_dct(1)
            .expect_err("no library"),
    ] {
        assert!(matches!(err, DvError::LibraryMissing { .. }), "{err:?}");
        let text = err.to_string();
        for needle in [
            "mlx5_0: mlx5 direct verbs are unavailable",
            "/nonexistent/libmlx5.so.1",
            "apt install ibverbs-providers",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
    }
    println!("child checks passed");
}

/// On a real device that is not mlx5 (SoftRoCE's rxe in the guest): no DC, typed errors.
#[test]
fn dc_is_refused_on_a_device_of_another_provider() {
    let Some(ctx) = common::device_or_skip("dc_is_refused_on_a_device_of_another_provider") else {
        return;
    };
    if mlx5::is_supported(&ctx) {
        println!(
            "skipped: {} is an mlx5 device; this test is for devices of other providers",
            ctx.name()
        );
        return;
    }
    let libmlx5 = sideway::sys::Library::Mlx5.load();
    println!(
        "{}: driver {}, libmlx5: {}",
        ctx.name(),
        dv::driver_name(&ctx),
        match &libmlx5 {
            Ok(()) => "loaded".to_owned(),
            Err(e) => e.to_string(),
        }
    );
    let pd = ctx.alloc_pd().expect("a PD");
    let cq = ctx.create_cq_builder().build().expect("a CQ");
    let srq = pd.create_srq_builder().build().expect("an SRQ");
    let errors = [
        mlx5::query_device(&ctx).expect_err("not mlx5"),
        pd.create_qp_builder()
            .send_cq(&cq)
            .recv_cq(&cq)
            .build_mlx5_dci()
            .expect_err("not mlx5"),
        pd.create_qp_builder()
            .send_cq(&cq)
            .recv_cq(&cq)
            .srq(&srq)
            .build_mlx5_dct(7)
            .expect_err("not mlx5"),
    ];
    for err in errors {
        println!("{err}");
        let text = err.to_string();
        assert!(text.starts_with(ctx.name()), "{text}");
        match (&libmlx5, &err) {
            (Ok(()), DvError::WrongProvider { driver, .. }) => {
                assert!(text.contains(" device, not mlx5: "), "{text}");
                assert_eq!(driver, &dv::driver_name(&ctx));
            }
            (Err(_), DvError::LibraryMissing { .. }) => {
                assert!(text.contains("ibverbs-providers"), "{text}");
            }
            _ => panic!("unexpected error for this device: {err:?}"),
        }
    }
    // The plain verbs still work on the same PD: the refusals created nothing.
    let qp = pd
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .build()
        .expect("an RC QP");
    assert!(mlx5::qp_ex(&qp).is_err());
}
