//! Device tests: XRC. Providers without it (rxe, siw) must refuse an XRC domain with a typed
//! "not supported by this device" error (`EOPNOTSUPP` from verbs.h's `ibv_open_xrcd`), with
//! or without a file to bind it to; on rxe that refusal is required. Providers with it
//! (mlx4, mlx5) must make the domain, an XRC SRQ with its number, an XRC receive QP on the
//! domain and an XRC send QP on a PD, and move both QPs to Init.

mod common;

use std::os::fd::AsFd;

use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{QpState, QpType, QueuePairAttribute};

#[test]
fn xrc_works_or_is_refused_as_not_supported() {
    let Some(ctx) = common::device_or_skip("xrc_works_or_is_refused_as_not_supported") else {
        return;
    };
    let path = std::env::temp_dir().join(format!("sideway-xrc-test-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("the temporary directory is writable");
    let _ = std::fs::remove_file(&path);
    let shared = ctx.open_xrcd(Some(file.as_fd()), libc::O_CREAT);
    let private = ctx.open_xrcd(None, libc::O_CREAT);
    let xrcd = match (shared, private) {
        (Ok(shared), Ok(_private)) => shared,
        (Err(e), Err(p)) => {
            assert!(e.is_not_supported(), "ibv_open_xrcd failed otherwise: {e}");
            assert!(p.is_not_supported(), "ibv_open_xrcd without a file: {p}");
            assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
            assert_eq!(e.device, ctx.name());
            let text = e.to_string();
            assert!(text.contains("not supported by this device"), "{text}");
            println!("{}: {text}", ctx.name());
            return;
        }
        (shared, private) => panic!(
            "XRC with a file and without one disagree: {:?} / {:?}",
            shared.err(),
            private.err()
        ),
    };
    assert!(
        !ctx.name().starts_with("rxe"),
        "rxe opened an XRC domain: it has no XRC; update this test and the README"
    );
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().cqe(16).build().unwrap();
    let srq = pd
        .create_srq_builder()
        .xrcd(&xrcd)
        .cq(&cq)
        .max_wr(4)
        .build()
        .expect("an XRC SRQ on a device with XRC");
    let srqn = srq.srq_num().expect("an XRC SRQ has a number");
    println!("{}: XRC SRQ number {srqn:#x}", ctx.name());
    let recv_qp = xrcd.create_recv_qp().expect("an XRC receive QP");
    let send_qp = pd
        .create_qp_builder()
        .qp_type(QpType::XrcSend)
        .send_cq(&cq)
        .max_send_wr(4)
        .build()
        .expect("an XRC send QP");
    let mut init = QueuePairAttribute::new();
    init.set_qp_state(QpState::Init)
        .set_pkey_index(0)
        .set_port_num(1)
        .set_qp_access_flags(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
    recv_qp.modify(&init).expect("XRC receive QP to Init");
    assert_eq!(recv_qp.state().unwrap(), QpState::Init);
    init.set_qp_access_flags(AccessFlags::empty());
    send_qp.modify(&init).expect("XRC send QP to Init");
    assert_eq!(send_qp.state().unwrap(), QpState::Init);
}
