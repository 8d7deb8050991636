//! XRC against the test provider (`csrc/null_provider_xrc.c`, reached through verbs.h's
//! inlines `ibv_open_xrcd`, `ibv_close_xrcd`, `ibv_create_srq_ex`, `ibv_get_srq_num`,
//! `ibv_create_qp_ex`): the attributes each verb is given, who holds what, the order the
//! domain is closed in, and the remote SRQ number in every work request posted on an XRC send
//! QP, classic and extended. Needs no device and no rdma-core library.

use std::os::fd::AsFd;
use std::sync::Arc;

use benches::null_provider::NullProvider;
use benches::null_provider_xrc::{c_seen_size, XrcSeen, XRC_RECV_QPN, XRC_SEND_REFUSED, XRC_SRQN};
use sideway::completion_queue::WcFlagsEx;
use sideway::memory_region::Sge;
use sideway::queue_pair::{InvalidWorkRequest, PostError, QpType, QueuePairError, SendFlags};
use sideway::shared_receive_queue::SharedReceiveQueueError;
use sideway::sys::{ibv_qp_init_attr_mask as qpm, ibv_qp_type, ibv_srq_init_attr_mask as srqm};

/// Linux's `O_CREAT`.
const O_CREAT: i32 = 0o100;

fn null_sge() -> Sge {
    // SAFETY: the test provider never touches the memory.
    unsafe { Sge::from_raw_parts(0x20_0000, 64, 0x5678) }
}

#[test]
fn the_seen_record_matches_its_c_layout() {
    assert_eq!(std::mem::size_of::<XrcSeen>(), c_seen_size());
}

#[test]
fn a_domain_srq_and_receive_qp_pass_their_attributes_and_the_domain_closes_last() {
    let np = NullProvider::new();
    np.enable_xrc();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let file = tempfile_for("a_domain_srq");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let xrcd = ctx
        .open_xrcd(Some(file.as_fd()), O_CREAT)
        .expect("the test provider has XRC");
    let seen = np.xrc_seen();
    assert_eq!(seen.open_xrcd_calls, 1);
    assert_eq!(seen.xrcd_comp_mask, 3, "IBV_XRCD_INIT_ATTR_FD | _OFLAGS");
    assert_eq!((seen.xrcd_fd, seen.xrcd_oflags), (fd, O_CREAT));
    drop(file); // the kernel holds its own reference: the fd need not outlive the call

    let cq = np.cq(false, WcFlagsEx::default_ex()).unwrap();
    let srq = pd
        .create_srq_builder()
        .xrcd(&xrcd)
        .cq(&cq)
        .max_wr(4)
        .max_sge(1)
        .build()
        .expect("the test provider makes XRC SRQs");
    let seen = np.xrc_seen();
    assert_eq!(seen.create_srq_ex_calls, 1);
    assert_eq!(
        seen.srq_comp_mask,
        srqm::IBV_SRQ_INIT_ATTR_TYPE
            | srqm::IBV_SRQ_INIT_ATTR_XRCD
            | srqm::IBV_SRQ_INIT_ATTR_CQ
            | srqm::IBV_SRQ_INIT_ATTR_PD
    );
    assert_eq!(seen.srq_type, sideway::sys::ibv_srq_type::IBV_SRQT_XRC);
    assert_eq!(seen.srq_pd, pd.as_raw());
    assert_eq!(seen.srq_xrcd, xrcd.as_raw());
    assert_eq!(seen.srq_cq, cq.as_raw());
    assert_eq!((seen.srq_max_wr, seen.srq_max_sge), (4, 1));
    assert_eq!(srq.srq_num().unwrap(), XRC_SRQN);
    assert_eq!(np.xrc_seen().get_srq_num_calls, 1);
    assert!(Arc::ptr_eq(srq.xrcd().unwrap(), &xrcd));
    assert!(Arc::ptr_eq(srq.cq().unwrap(), &cq));
    assert!(Arc::ptr_eq(srq.pd(), &pd));

    let recv_qp = xrcd
        .create_recv_qp()
        .expect("the test provider makes XRC receive QPs");
    let seen = np.xrc_seen();
    assert_eq!(seen.create_qp_ex_calls, 1);
    assert_eq!(
        seen.qp_comp_mask,
        qpm::IBV_QP_INIT_ATTR_XRCD,
        "no PD, only the domain"
    );
    assert_eq!(seen.qp_type, ibv_qp_type::IBV_QPT_XRC_RECV);
    assert_eq!(seen.qp_xrcd, xrcd.as_raw());
    assert!(seen.qp_send_cq.is_null() && seen.qp_recv_cq.is_null() && seen.qp_srq.is_null());
    assert_eq!(recv_qp.qp_num(), XRC_RECV_QPN);
    assert_eq!(recv_qp.qp_type(), QpType::XrcRecv);
    assert_eq!(
        Arc::strong_count(&xrcd),
        3,
        "the SRQ and the receive QP hold the domain"
    );
    assert_eq!(Arc::strong_count(&cq), 2, "the SRQ holds its CQ");

    // The domain is closed only when the last of them goes, whatever the order they go in.
    drop(xrcd);
    assert_eq!(np.xrc_seen().close_xrcd_calls, 0);
    drop(srq);
    assert_eq!(
        np.xrc_seen().close_xrcd_calls,
        0,
        "the receive QP still holds it"
    );
    assert_eq!(Arc::strong_count(&cq), 1, "the SRQ let its CQ go");
    drop(recv_qp);
    let seen = np.xrc_seen();
    assert_eq!((seen.close_xrcd_calls, seen.xrcd_live), (1, 0));
}

#[test]
fn a_private_domain_is_opened_without_a_file() {
    let np = NullProvider::new();
    np.enable_xrc();
    let ctx = np.sideway_context();
    let xrcd = ctx.open_xrcd(None, O_CREAT).unwrap();
    assert_eq!(
        (np.xrc_seen().xrcd_fd, np.xrc_seen().xrcd_oflags),
        (-1, O_CREAT)
    );
    drop(xrcd);
    assert_eq!(np.xrc_seen().close_xrcd_calls, 1);
}

#[test]
fn an_xrc_srq_needs_its_cq_and_a_basic_srq_is_untouched() {
    let np = NullProvider::new();
    np.enable_xrc();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let xrcd = ctx.open_xrcd(None, O_CREAT).unwrap();
    let err = pd.create_srq_builder().xrcd(&xrcd).build().unwrap_err();
    assert!(matches!(err, SharedReceiveQueueError::MissingCq), "{err:?}");
    assert_eq!(
        np.xrc_seen().create_srq_ex_calls,
        0,
        "refused before the verb"
    );
    assert_eq!(Arc::strong_count(&xrcd), 1, "nothing kept the domain");
}

#[test]
fn a_provider_without_xrc_says_not_supported() {
    let np = NullProvider::new(); // XRC never enabled: verbs_context has no open_xrcd
    let ctx = np.sideway_context();
    let err = ctx.open_xrcd(None, O_CREAT).unwrap_err();
    assert!(err.is_not_supported(), "{err}");
    assert_eq!(err.errno(), 95);
    assert!(
        err.to_string().contains("not supported by this device"),
        "{err}"
    );
}

#[test]
fn an_xrc_send_qp_is_made_on_a_pd_with_a_send_cq_and_no_receive_queue() {
    let np = NullProvider::new();
    np.enable_xrc();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let cq = np.cq(true, WcFlagsEx::default_ex()).unwrap();
    let err = pd
        .create_qp_builder()
        .qp_type(QpType::XrcSend)
        .send_cq(&cq)
        .max_send_wr(10)
        .max_recv_wr(64)
        .build_ex()
        .expect_err("the test provider refuses XRC send QPs after recording them");
    match &err {
        QueuePairError::Create {
            call: "ibv_create_qp_ex",
            qp_type: QpType::XrcSend,
            source,
            ..
        } => assert_eq!(source.raw_os_error(), Some(XRC_SEND_REFUSED)),
        other => panic!("not the test provider's refusal: {other:?}"),
    }
    let seen = np.xrc_seen();
    assert_eq!(seen.qp_type, ibv_qp_type::IBV_QPT_XRC_SEND);
    assert_eq!(
        seen.qp_comp_mask,
        qpm::IBV_QP_INIT_ATTR_PD | qpm::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
    );
    assert_eq!(seen.qp_pd, pd.as_raw());
    assert_eq!(seen.qp_send_cq, cq.as_raw());
    assert!(seen.qp_recv_cq.is_null(), "no receive CQ was given");
    assert_eq!(seen.qp_max_send_wr, 10);
    assert_eq!(
        (seen.qp_max_recv_wr, seen.qp_max_recv_sge),
        (0, 0),
        "an XRC send QP has no receive queue"
    );
    assert_ne!(seen.send_qp_ops_flags, 0);

    // An XRC receive QP belongs on a domain, not a PD: refused before any verb.
    let err = pd
        .create_qp_builder()
        .qp_type(QpType::XrcRecv)
        .send_cq(&cq)
        .recv_cq(&cq)
        .build_ex()
        .unwrap_err();
    assert!(matches!(err, QueuePairError::XrcRecvOnPd), "{err:?}");
    assert_eq!(np.xrc_seen().create_qp_ex_calls, 1);
}

#[test]
fn every_send_on_an_xrc_send_qp_names_the_remote_srq_classic_and_extended() {
    for extended in [false, true] {
        let np = NullProvider::new();
        np.enable_xrc();
        let ctx = np.sideway_context();
        let pd = np.sideway_pd(&ctx);
        let cq = np.cq(extended, WcFlagsEx::default_ex()).unwrap();
        let mut qp = np.sideway_xrc_send_qp(&pd, &cq, extended);
        assert_eq!(qp.qp_type(), QpType::XrcSend);
        assert!(
            Arc::ptr_eq(qp.recv_cq(), &cq),
            "no receive CQ: the send CQ stands in"
        );
        qp.start_post_send()
            .wr(1, SendFlags::SIGNALED)
            .xrc_remote_srqn(0x123)
            .send(null_sge())
            .wr(2, SendFlags::empty())
            .xrc_remote_srqn(0x456)
            .send(null_sge())
            .post()
            .unwrap();
        let seen = np.xrc_seen();
        assert_eq!(seen.last_remote_srqn, 0x456, "extended: {extended}");
        assert_eq!(seen.srqn_sum, 0x123 + 0x456, "extended: {extended}");
        if extended {
            assert_eq!(
                (seen.wr_xrc_srqns, seen.wr_sends, seen.wr_completes),
                (2, 2, 1)
            );
            assert_eq!(seen.post_send_calls, 0);
        } else {
            assert_eq!((seen.post_send_calls, seen.send_wrs), (1, 2));
            assert_eq!(seen.last_opcode, sideway::sys::ibv_wr_opcode::IBV_WR_SEND);
        }

        // A send without the remote SRQ is refused, and nothing is posted.
        let err = qp
            .start_post_send()
            .wr(3, SendFlags::SIGNALED)
            .xrc_remote_srqn(1)
            .send(null_sge())
            .wr(4, SendFlags::SIGNALED)
            .send(null_sge())
            .post()
            .unwrap_err();
        assert!(
            matches!(
                err,
                PostError::Invalid {
                    index: 1,
                    wr_id: 4,
                    reason: InvalidWorkRequest::MissingXrcSrqn,
                    ..
                }
            ),
            "{err:?}"
        );
        let after = np.xrc_seen();
        assert_eq!(
            after.post_send_calls, seen.post_send_calls,
            "nothing was posted"
        );
        assert_eq!(after.wr_completes, seen.wr_completes, "nothing was posted");
        if extended {
            // The first request reached the provider's open batch, which was aborted.
            assert_eq!(after.wr_aborts, 1);
        } else {
            assert_eq!(after.srqn_sum, seen.srqn_sum);
        }
    }
}

#[test]
fn a_remote_srq_on_a_qp_that_is_not_xrc_is_refused() {
    let np = NullProvider::new();
    for extended in [false, true] {
        let (mut qp, _cq) = np.sideway(extended);
        let before = np.counters();
        let err = qp
            .start_post_send()
            .wr(1, SendFlags::SIGNALED)
            .xrc_remote_srqn(7)
            .send(null_sge())
            .post()
            .unwrap_err();
        assert!(
            matches!(
                err,
                PostError::Invalid {
                    reason: InvalidWorkRequest::XrcSrqnOnOtherQp {
                        qp_type: QpType::Rc
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(np.counters(), before, "nothing reached the provider");
    }
}

/// A fresh file in the temporary directory for an XRC domain to be bound to.
fn tempfile_for(name: &str) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("sideway-xrc-{name}-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("the temporary directory is writable");
    let _ = std::fs::remove_file(&path);
    file
}
