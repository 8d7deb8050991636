//! Device tests: UD queue pairs with address handles (from an attribute and from a received
//! completion), the GRH in front of UD receives, and UC's restrictions. Loopback on one
//! device.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;

use sideway::address_handle::{Grh, GrhKind, GRH_LEN};
use sideway::completion_queue::{CompletionQueue, WcFlags, WcOpcode};
use sideway::device::DeviceContext;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{InvalidWorkRequest, PostError, QpType, QueuePair, SendFlags};

const QKEY: u32 = 0x1111_1111;

fn ud_qp(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<sideway::protection_domain::ProtectionDomain>,
    extended: bool,
) -> (QueuePair, Arc<CompletionQueue>) {
    ud_qp_of_type(ctx, pd, extended, QpType::Ud)
}

/// A QP of `qp_type` (a UD one, however spelled) moved to RTS with [`QKEY`].
fn ud_qp_of_type(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<sideway::protection_domain::ProtectionDomain>,
    extended: bool,
    qp_type: QpType,
) -> (QueuePair, Arc<CompletionQueue>) {
    let cq = ctx.create_cq_builder().cqe(64).build().unwrap();
    let mut b = pd.create_qp_builder();
    b.qp_type(qp_type)
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(16)
        .max_recv_wr(16);
    let qp = if extended { b.build_ex() } else { b.build() }.unwrap();
    let mut opts = pairs::options(ctx, 0x42);
    opts.qkey(QKEY);
    qp.connect(&opts, &Default::default()).unwrap();
    (qp, cq)
}

fn ud_round_trip(test: &str, extended: bool) {
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let (mut a, cq_a) = ud_qp(&ctx, &pd, extended);
    let (mut b, cq_b) = ud_qp(&ctx, &pd, extended);
    let mut buf_a = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut buf_b = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let msg = b"hello over UD, through an address handle";

    // b receives into GRH room + message.
    let mut r = b.start_post_recv();
    r.recv(7, &[buf_b.sge(0..GRH_LEN + 256).unwrap()]);
    r.post().unwrap();
    let mut r = a.start_post_recv();
    r.recv(8, &[buf_a.sge(0..GRH_LEN + 256).unwrap()]);
    r.post().unwrap();

    let ah = pd.create_ah(&pairs::loopback_av(&ctx)).unwrap();
    buf_a.write_at(1024, msg).unwrap();
    let mut s = a.start_post_send();
    s.wr(1, SendFlags::SIGNALED)
        .ud_addr(&ah, b.qp_num(), QKEY)
        .send(buf_a.sge(1024..1024 + msg.len()).unwrap());
    s.post().unwrap();
    let wc = pairs::wait_for(&cq_a, 1)[0];
    wc.ok().unwrap();
    assert_eq!((wc.wr_id(), wc.opcode()), (1, WcOpcode::Send));

    let wc = pairs::wait_for(&cq_b, 1)[0];
    wc.ok().unwrap();
    assert_eq!(wc.wr_id(), 7);
    assert_eq!(wc.opcode(), WcOpcode::Recv);
    assert_eq!(
        wc.byte_len() as usize,
        GRH_LEN + msg.len(),
        "byte_len counts the GRH"
    );
    assert_eq!(wc.src_qp(), a.qp_num());
    assert!(wc.wc_flags().contains(WcFlags::GRH), "{wc:?}");
    assert_eq!(&common::bytes(&buf_b)[GRH_LEN..GRH_LEN + msg.len()], msg);
    let raw_grh = &common::bytes(&buf_b)[..GRH_LEN];
    let grh = Grh::parse(raw_grh).unwrap_or_else(|e| panic!("{e}: {raw_grh:02x?}"));
    assert_eq!(grh.sgid(), pairs::local_gid(&ctx), "GRH source: {grh:?}");
    if pairs::local_gid(&ctx).to_ipv4_mapped().is_some() {
        assert_eq!(grh.kind(), GrhKind::Ipv4, "{grh:?}");
    }

    // Answer the sender through an AH made from the completion.
    let reply_ah = pd
        .create_ah_from_wc(1, &wc, &common::bytes(&buf_b)[..GRH_LEN])
        .unwrap();
    assert_eq!(reply_ah.attr().dgid(), pairs::local_gid(&ctx));
    buf_b.write_at(2048, b"reply").unwrap();
    let mut s = b.start_post_send();
    s.wr(2, SendFlags::SIGNALED)
        .ud_addr(&reply_ah, wc.src_qp(), QKEY)
        .send(buf_b.sge(2048..2053).unwrap());
    s.post().unwrap();
    pairs::wait_for(&cq_b, 1)[0].ok().unwrap();
    let wc = pairs::wait_for(&cq_a, 1)[0];
    wc.ok().unwrap();
    assert_eq!((wc.wr_id(), wc.byte_len() as usize), (8, GRH_LEN + 5));
    assert_eq!(&common::bytes(&buf_a)[GRH_LEN..GRH_LEN + 5], b"reply");
    assert_eq!(wc.src_qp(), b.qp_num());

    // A GRH too short for ibv_init_ah_from_wc is refused before the call.
    let err = pd.create_ah_from_wc(1, &wc, &[0u8; 10]).unwrap_err();
    assert!(err.to_string().contains("40 bytes"), "{err}");

    // Refused before posting: a UD send without a destination, an RDMA WRITE on UD.
    let mut s = a.start_post_send();
    s.wr(3, SendFlags::SIGNALED).send(b"x");
    match s.post() {
        Err(PostError::Invalid {
            reason: InvalidWorkRequest::MissingUdAddress,
            ..
        }) => {}
        other => panic!("expected MissingUdAddress, got {other:?}"),
    }
    let mut s = a.start_post_send();
    s.wr(4, SendFlags::SIGNALED)
        .ud_addr(&ah, b.qp_num(), QKEY)
        .rdma_write(0, 0, buf_a.sge(0..8).unwrap());
    match s.post() {
        Err(PostError::Invalid {
            reason:
                InvalidWorkRequest::NotForQpType {
                    qp_type: QpType::Ud,
                    ..
                },
            ..
        }) => {}
        other => panic!("expected NotForQpType, got {other:?}"),
    }
}

#[test]
fn ud_send_recv_with_grh_classic() {
    ud_round_trip("ud_send_recv_with_grh_classic", false);
}

#[test]
fn ud_send_recv_with_grh_extended() {
    ud_round_trip("ud_send_recv_with_grh_extended", true);
}

/// A UD QP whose type is given as C's raw value (the only spelling left besides `QpType::Ud`:
/// `QpType::Unknown` cannot be written) is a UD QP to the posting guard: a SEND without an
/// address is refused before the provider could read its NULL address handle (rxe and mlx5
/// would), and one with an address arrives.
fn raw_ud_type_posts_as_ud(test: &str, extended: bool) {
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let raw_ud = QpType::from(sideway::sys::ibv_qp_type::IBV_QPT_UD);
    let (mut a, cq_a) = ud_qp_of_type(&ctx, &pd, extended, raw_ud);
    let (mut b, cq_b) = ud_qp_of_type(&ctx, &pd, extended, raw_ud);
    assert_eq!(a.qp_type(), QpType::Ud);

    let mut s = a.start_post_send();
    s.wr(1, SendFlags::SIGNALED).send(b"no address");
    match s.post() {
        Err(PostError::Invalid {
            reason: InvalidWorkRequest::MissingUdAddress,
            ..
        }) => {}
        other => panic!("expected MissingUdAddress, got {other:?}"),
    }

    let mut buf_a = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let buf_b = pd.reg_buffer(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut r = b.start_post_recv();
    r.recv(7, &[buf_b.sge(0..GRH_LEN + 64).unwrap()]);
    r.post().unwrap();
    let ah = pd.create_ah(&pairs::loopback_av(&ctx)).unwrap();
    buf_a.write_at(0, b"addressed").unwrap();
    let mut s = a.start_post_send();
    s.wr(2, SendFlags::SIGNALED)
        .ud_addr(&ah, b.qp_num(), QKEY)
        .send(buf_a.sge(0..9).unwrap());
    s.post().unwrap();
    pairs::wait_for(&cq_a, 1)[0].ok().unwrap();
    let wc = pairs::wait_for(&cq_b, 1)[0];
    wc.ok().unwrap();
    assert_eq!(wc.wr_id(), 7);
    assert_eq!(&common::bytes(&buf_b)[GRH_LEN..GRH_LEN + 9], b"addressed");
}

#[test]
fn raw_ud_type_posts_as_ud_classic() {
    raw_ud_type_posts_as_ud("raw_ud_type_posts_as_ud_classic", false);
}

#[test]
fn raw_ud_type_posts_as_ud_extended() {
    raw_ud_type_posts_as_ud("raw_ud_type_posts_as_ud_extended", true);
}

#[test]
fn uc_sends_and_writes_but_refuses_reads() {
    let Some(ctx) = common::device_or_skip("uc_sends_and_writes_but_refuses_reads") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().cqe(64).build().unwrap();
    let new = || {
        pd.create_qp_builder()
            .qp_type(QpType::Uc)
            .send_cq(&cq)
            .recv_cq(&cq)
            .build()
            .unwrap()
    };
    let (mut a, mut b) = (new(), new());
    pairs::connect(&ctx, &a, &b);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut buf_a = pd.reg_buffer(4096, access).unwrap();
    let buf_b = pd.reg_buffer(4096, access).unwrap();
    buf_a.write_at(0, b"write").unwrap();
    let mut r = b.start_post_recv();
    r.recv(9, &[buf_b.sge(1024..2048).unwrap()]);
    r.post().unwrap();
    let mut s = a.start_post_send();
    s.wr(1, SendFlags::SIGNALED)
        .rdma_write(buf_b.rkey(), buf_b.addr(), buf_a.sge(0..5).unwrap())
        .wr(2, SendFlags::SIGNALED)
        .send(buf_a.sge(0..5).unwrap());
    s.post().unwrap();
    let wcs = pairs::wait_for(&cq, 3);
    for wc in &wcs {
        wc.ok().unwrap();
    }
    assert_eq!(&common::bytes(&buf_b)[..5], b"write");
    assert_eq!(&common::bytes(&buf_b)[1024..1029], b"write");

    let mut s = a.start_post_send();
    s.wr(3, SendFlags::SIGNALED)
        .rdma_read(buf_b.rkey(), buf_b.addr(), buf_a.sge(0..8).unwrap());
    let err = s.post().unwrap_err();
    match &err {
        PostError::Invalid {
            reason:
                InvalidWorkRequest::NotForQpType {
                    qp_type: QpType::Uc,
                    ..
                },
            ..
        } => {}
        other => panic!("expected NotForQpType, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("RDMA READ is not available on a UC QP"),
        "{err}"
    );
}
