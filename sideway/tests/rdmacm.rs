//! Device tests for `sideway::rdmacm`: connections with private data on connect, accept and
//! reject, typed connection errors, event-channel timeouts and polling, UD datagrams and
//! multicast, over a real RDMA device's IPv4 address (`RDMA_TEST_IP`).
//!
//! Each test uses its own rdma_cm ports (tests run in parallel), and every wait is bounded.

mod common;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::connection::{CompletionWaiter, RemoteBuffer};
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QpAttrMask, QpState, QpType, QueuePair, SendFlags};
use sideway::rdmacm::{
    CmError, CmId, ConnParam, EventChannel, EventType, IbRejectReason, PortSpace, QpTargetState,
};
use sideway::sys as ffi;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const RESOLVE: Duration = Duration::from_secs(2);
/// Room for the GRH in front of every UD receive.
const GRH: usize = 40;

/// Bytes with no zero among them, so the zero padding after them is telling.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)) | 1)
        .collect()
}

/// Private data as received: the sent bytes, then only zeros up to the transport's length.
fn assert_private(got: &[u8], sent: &[u8]) {
    assert!(
        got.len() >= sent.len(),
        "got {} bytes of private data, sent {}",
        got.len(),
        sent.len()
    );
    assert_eq!(&got[..sent.len()], sent);
    assert!(
        got[sent.len()..].iter().all(|&b| b == 0),
        "padding after the private data is not zero: {got:?}"
    );
}

fn listen_on(addr: SocketAddr, ps: PortSpace) -> (Arc<EventChannel>, Arc<CmId>) {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(ps).unwrap();
    id.bind_addr(addr).unwrap();
    id.listen(8).unwrap();
    assert_eq!(id.local_addr(), Some(addr));
    (ch, id)
}

fn client_to(addr: SocketAddr, ps: PortSpace) -> (Arc<EventChannel>, Arc<CmId>) {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(ps).unwrap();
    id.resolve_addr(None, addr, RESOLVE).unwrap();
    let ev = ch.wait_for(EventType::AddrResolved, WAIT).unwrap();
    assert!(Arc::ptr_eq(ev.id(), &id));
    id.resolve_route(RESOLVE).unwrap();
    ch.wait_for(EventType::RouteResolved, WAIT).unwrap();
    assert_eq!(id.peer_addr(), Some(addr));
    (ch, id)
}

/// A QP made on an id, and (for the tests' convenience) its PD and CQ, which it holds too.
struct Qp {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    _qp: QueuePair,
}

/// A QP on the id (`rdma_create_qp`), with a PD and CQ from the id's device context.
fn give_qp(id: &Arc<CmId>) -> Qp {
    let ctx = id.device_context().unwrap();
    assert!(
        Arc::ptr_eq(&ctx, &id.device_context().unwrap()),
        "one wrapper per device"
    );
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().build().unwrap();
    let qp_type = match id.port_space() {
        PortSpace::Tcp => QpType::Rc,
        PortSpace::Udp => QpType::Ud,
    };
    let qp = id
        .create_qp(
            pd.create_qp_builder()
                .send_cq(&cq)
                .recv_cq(&cq)
                .qp_type(qp_type)
                .max_send_wr(8)
                .max_recv_wr(8),
        )
        .unwrap();
    let cap = qp.cap();
    assert!(cap.max_send_wr >= 8 && cap.max_recv_wr >= 8, "{cap:?}");
    assert_eq!(id.qp_num(), Some(qp.qp_num()));
    assert_eq!(id.qp_as_raw(), qp.as_raw());
    Qp { pd, cq, _qp: qp }
}

fn connect_param(data: &[u8]) -> ConnParam {
    let mut p = ConnParam::new();
    p.private_data(data)
        .responder_resources(2)
        .initiator_depth(3)
        .flow_control(1)
        .retry_count(5)
        .rnr_retry_count(6);
    p
}

/// Client and server up to the server's CONNECT_REQUEST, which is checked against `data`.
struct Pair {
    sch: Arc<EventChannel>,
    listener: Arc<CmId>,
    cch: Arc<EventChannel>,
    cid: Arc<CmId>,
    _cqp: Qp,
    sid: Arc<CmId>,
}

fn request(addr: SocketAddr, data: &[u8]) -> Pair {
    let (sch, listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let cqp = give_qp(&cid);
    cid.connect(&connect_param(data)).unwrap();

    let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
    assert!(Arc::ptr_eq(req.listener().unwrap(), &listener));
    assert!(
        !Arc::ptr_eq(req.id(), &listener),
        "a connect request brings a new id"
    );
    assert_private(req.private_data(), data);
    let peer = req.conn_param().unwrap();
    // The server's view of the client's parameters: depth and resources trade places.
    assert_eq!(peer.responder_resources(), 3);
    assert_eq!(peer.initiator_depth(), 2);
    assert_eq!(peer.flow_control(), 1);
    assert_eq!(peer.retry_count(), 5);
    assert_eq!(peer.rnr_retry_count(), 6);
    assert!(!peer.srq());
    assert_eq!(Some(peer.qp_num()), cid.qp_num());
    let sid = Arc::clone(req.id());
    drop(req);
    assert_eq!(sid.local_addr(), Some(addr));
    assert_eq!(sid.peer_addr(), cid.local_addr());
    Pair {
        sch,
        listener,
        cch,
        cid,
        _cqp: cqp,
        sid,
    }
}

fn connect_accept(addr: SocketAddr, connect_data: &[u8], accept_data: &[u8]) {
    let p = request(addr, connect_data);

    // What a QP of the server's own would need, per state, for this connection.
    let init = p.sid.init_qp_attr(QpTargetState::Init).unwrap();
    let need = |mask: u32, bits: u32| assert_eq!(mask & bits, bits, "mask {mask:#x}");
    need(
        init.mask().bits(),
        ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
    );
    assert_eq!(init.qp_state(), QpState::Init);
    assert_eq!(init.port_num(), p.sid.port_num());
    let rtr = p.sid.init_qp_attr(QpTargetState::Rtr).unwrap();
    need(
        rtr.mask().bits(),
        ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN,
    );
    assert_eq!(Some(rtr.dest_qp_num()), p.cid.qp_num());
    assert!(rtr.path_mtu().bytes().is_some(), "{rtr:?}");
    assert_eq!(rtr.max_dest_rd_atomic(), 3, "the client's initiator depth");

    let _sqp = give_qp(&p.sid);
    let mut ap = ConnParam::new();
    ap.private_data(accept_data)
        .responder_resources(1)
        .initiator_depth(1)
        .rnr_retry_count(4);
    p.sid.accept(&ap).unwrap();

    let est = p.cch.wait_for(EventType::Established, WAIT).unwrap();
    assert!(Arc::ptr_eq(est.id(), &p.cid));
    assert_private(est.private_data(), accept_data);
    let peer = est.conn_param().unwrap();
    assert_eq!(Some(peer.qp_num()), p.sid.qp_num());
    assert_eq!(peer.rnr_retry_count(), 4);
    let est = p.sch.wait_for(EventType::Established, WAIT).unwrap();
    assert!(Arc::ptr_eq(est.id(), &p.sid));
    // Established already: rdma_notify's EISCONN is not an error.
    p.sid
        .notify(ffi::ibv_event_type::IBV_EVENT_COMM_EST)
        .unwrap();

    // The active side's DREQ reaches the server, whose own disconnect answers it (DREP).
    p.cid.disconnect().unwrap();
    let ev = p.sch.wait_for(EventType::Disconnected, WAIT).unwrap();
    assert!(Arc::ptr_eq(ev.id(), &p.sid));
    p.sid.disconnect().unwrap();
    let ev = p.cch.wait_for(EventType::Disconnected, WAIT).unwrap();
    assert!(Arc::ptr_eq(ev.id(), &p.cid));
    drop(p.listener);
}

#[test]
fn private_data_of_one_byte_arrives_on_connect_and_accept() {
    let Some(ip) = common::ip_or_skip("private_data_of_one_byte_arrives_on_connect_and_accept")
    else {
        return;
    };
    connect_accept(SocketAddr::new(ip, 7471), &[0xa5], &[0x5a]);
}

#[test]
fn private_data_of_the_maximum_length_arrives_on_connect_and_accept() {
    let Some(ip) =
        common::ip_or_skip("private_data_of_the_maximum_length_arrives_on_connect_and_accept")
    else {
        return;
    };
    connect_accept(
        SocketAddr::new(ip, 7472),
        &pattern(sideway::rdmacm::MAX_PRIVATE_DATA_TCP_CONNECT, 3),
        &pattern(sideway::rdmacm::MAX_PRIVATE_DATA_TCP_ACCEPT, 11),
    );
}

fn reject_with(addr: SocketAddr, data: &[u8]) {
    let p = request(addr, b"please");
    p.sid.reject(data).unwrap();
    let ev = p.cch.get_event(WAIT).unwrap();
    assert_eq!(ev.event_type(), EventType::Rejected);
    assert!(Arc::ptr_eq(ev.id(), &p.cid));
    assert_private(ev.private_data(), data);
    match ev.into_result() {
        Err(CmError::Rejected {
            remote,
            reason,
            private_data,
        }) => {
            assert_eq!(remote, Some(addr));
            assert!(reason.is_consumer_reject(), "{reason:?}");
            assert_private(&private_data, data);
        }
        other => panic!("expected a typed reject, got {other:?}"),
    }
}

#[test]
fn an_id_without_a_qp_connects_with_establish() {
    let Some(ip) = common::ip_or_skip("an_id_without_a_qp_connects_with_establish") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7482);
    let (sch, _listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    // No QP on the client id: the connection names a QP number of the user's own.
    let mut cp = connect_param(b"no qp here");
    cp.qp_num(0x1234).srq(true);
    cid.connect(&cp).unwrap();
    let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
    let peer = req.conn_param().unwrap();
    assert_eq!(peer.qp_num(), 0x1234);
    assert!(peer.srq());
    let sid = Arc::clone(req.id());
    drop(req);
    let _sqp = give_qp(&sid);
    sid.accept(ConnParam::new().private_data(b"ok")).unwrap();
    let resp = cch.wait_for(EventType::ConnectResponse, WAIT).unwrap();
    assert_private(resp.private_data(), b"ok");
    assert_eq!(resp.conn_param().unwrap().qp_num(), sid.qp_num().unwrap());
    // The client would move its own QP with these before finishing the connection.
    let rtr = cid.init_qp_attr(QpTargetState::Rtr).unwrap();
    assert_eq!(Some(rtr.dest_qp_num()), sid.qp_num());
    cid.establish().unwrap();
    sch.wait_for(EventType::Established, WAIT).unwrap();
}

#[test]
fn reject_carries_its_reason_and_one_byte_of_private_data() {
    let Some(ip) = common::ip_or_skip("reject_carries_its_reason_and_one_byte_of_private_data")
    else {
        return;
    };
    reject_with(SocketAddr::new(ip, 7473), &[0x42]);
}

#[test]
fn reject_carries_the_maximum_private_data() {
    let Some(ip) = common::ip_or_skip("reject_carries_the_maximum_private_data") else {
        return;
    };
    reject_with(
        SocketAddr::new(ip, 7474),
        &pattern(sideway::rdmacm::MAX_PRIVATE_DATA_TCP_REJECT, 29),
    );
}

#[test]
fn too_long_private_data_is_an_error_before_sending() {
    let Some(ip) = common::ip_or_skip("too_long_private_data_is_an_error_before_sending") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7475);
    let (sch, _listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let _cqp = give_qp(&cid);
    match cid.connect(&connect_param(&[1; 57])) {
        Err(
            e @ CmError::PrivateDataTooLong {
                len: 57, max: 56, ..
            },
        ) => {
            assert!(e.to_string().contains("nothing was sent"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Nothing reached the server.
    match sch.get_event(Some(Duration::from_millis(500))) {
        Err(CmError::Timeout { .. }) => {}
        other => panic!("the server saw {other:?}"),
    }

    cid.connect(&connect_param(&[2; 56])).unwrap();
    let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
    let sid = Arc::clone(req.id());
    let _sqp = give_qp(&sid);
    let mut too_long = ConnParam::new();
    too_long.private_data(&[3; 197]);
    assert!(matches!(
        sid.accept(&too_long),
        Err(CmError::PrivateDataTooLong {
            len: 197,
            max: 196,
            ..
        })
    ));
    assert!(matches!(
        sid.reject(&[4; 149]),
        Err(CmError::PrivateDataTooLong {
            len: 149,
            max: 148,
            ..
        })
    ));
    // The request is still pending: the client has heard nothing.
    assert!(cch.try_get_event().unwrap().is_none());
    sid.reject(&[]).unwrap();
    let ev = cch.get_event(WAIT).unwrap();
    assert_eq!(ev.event_type(), EventType::Rejected);
    assert!(ev.private_data().iter().all(|&b| b == 0));
}

#[test]
fn connecting_where_nobody_listens_is_a_typed_error_in_time() {
    let Some(ip) = common::ip_or_skip("connecting_where_nobody_listens_is_a_typed_error_in_time")
    else {
        return;
    };
    let addr = SocketAddr::new(ip, 7476);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let _cqp = give_qp(&cid);
    let start = Instant::now();
    cid.connect(&connect_param(b"anyone?")).unwrap();
    match cch.wait_for(EventType::Established, WAIT) {
        Err(e @ CmError::Rejected { .. }) => {
            if let CmError::Rejected { reason, remote, .. } = &e {
                assert_eq!(*remote, Some(addr));
                assert!(!reason.is_consumer_reject(), "{e}");
                if let Some(r) = reason.ib_reason() {
                    assert_eq!(r, IbRejectReason::InvalidServiceId, "{e}");
                }
            }
            println!("no listener: {e}");
        }
        Err(e @ CmError::Unreachable { .. }) => println!("no listener: {e}"),
        other => panic!("expected a reject or unreachable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_unroutable_address_says_so() {
    let Some(_ip) = common::ip_or_skip("an_unroutable_address_says_so") else {
        return;
    };
    // 192.0.2.0/24 (TEST-NET-1) is routed nowhere in the rig, and normally nowhere else.
    let dst: SocketAddr = "192.0.2.7:7477".parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let err = match id.resolve_addr(None, dst, RESOLVE) {
        Err(e) => e,
        Ok(()) => match ch.wait_for(EventType::AddrResolved, WAIT) {
            Err(e) => e,
            Ok(ev) => {
                println!("skipped: {dst} resolves on this host ({ev:?})");
                return;
            }
        },
    };
    let text = err.to_string();
    println!("{text}");
    assert!(
        matches!(err, CmError::AddrUnresolvable { dst: d, .. } if d == dst),
        "{err:?}"
    );
    assert!(
        text.contains("192.0.2.7") && text.contains("cannot resolve"),
        "{text}"
    );
}

#[test]
fn get_event_with_a_timeout_and_no_events_times_out() {
    if common::device_or_skip("get_event_with_a_timeout_and_no_events_times_out").is_none() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let _id = ch.create_id(PortSpace::Tcp).unwrap();
    assert!(ch.try_get_event().unwrap().is_none());
    let start = Instant::now();
    match ch.get_event(Some(Duration::from_millis(200))) {
        Err(CmError::Timeout { timeout, .. }) => assert_eq!(timeout, Duration::from_millis(200)),
        other => panic!("{other:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn polling_the_channel_fd_from_another_thread_wakes_on_an_event() {
    let Some(ip) =
        common::ip_or_skip("polling_the_channel_fd_from_another_thread_wakes_on_an_event")
    else {
        return;
    };
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let fd = ch.as_raw_fd();
    let (tx, rx) = mpsc::channel();
    let poller = std::thread::spawn(move || {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd; the channel (and its fd) outlives this thread,
        // which is joined below.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        let _ = tx.send(());
        (n, pfd.revents)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(rx.try_recv().is_err(), "poll returned before any event");
    id.resolve_addr(None, SocketAddr::new(ip, 7478), RESOLVE)
        .unwrap();
    let (n, revents) = poller.join().unwrap();
    assert_eq!(n, 1, "poll timed out: no wake-up");
    assert_ne!(revents & libc::POLLIN, 0);
    let ev = ch
        .try_get_event()
        .unwrap()
        .expect("a readable fd has an event");
    assert_eq!(ev.event_type(), EventType::AddrResolved);
    assert!(Arc::ptr_eq(ev.id(), &id));
    assert!(id.device_context().is_ok());
}

/// Posts one receive of `len` bytes at the start of `buf` (`ibv_post_recv`).
fn post_recv(qp: *mut ffi::ibv_qp, buf: &RegisteredBuffer, len: usize, wr_id: u64) {
    let mut sge = *buf.sge(0..len).unwrap().as_raw();
    let mut wr = ffi::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: qp is a live QP; the SGE lies in buf's registered memory, which the caller
    // keeps alive until the receive completes.
    let ret = unsafe { ffi::ibv_post_recv(qp, &mut wr, &mut bad) };
    assert_eq!(ret, 0, "ibv_post_recv");
}

/// Posts one signalled UD send of `buf[..len]` (`ibv_post_send`).
fn post_ud_send(
    qp: *mut ffi::ibv_qp,
    buf: &RegisteredBuffer,
    len: usize,
    ah: *mut ffi::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    let mut sge = *buf.sge(0..len).unwrap().as_raw();
    // SAFETY: ibv_send_wr is plain data (pointers and integers); all zeros is valid.
    let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = 7;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
    wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED;
    wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
        ah,
        remote_qpn,
        remote_qkey,
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: qp is a live UD QP, ah a live address handle; the SGE lies in buf's registered
    // memory, which the caller keeps alive until the send completes.
    let ret = unsafe { ffi::ibv_post_send(qp, &mut wr, &mut bad) };
    assert_eq!(ret, 0, "ibv_post_send");
}

/// The next completion on `cq`, checked successful, within 10 s.
fn completion(cq: &CompletionQueue, what: &str) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll().unwrap().next() {
            assert!(wc.is_success(), "{what}: {wc:?}");
            return wc;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no completion within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn ud_ids_exchange_datagrams() {
    let Some(ip) = common::ip_or_skip("ud_ids_exchange_datagrams") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7479);
    let (sch, listener) = listen_on(addr, PortSpace::Udp);
    let (cch, cid) = client_to(addr, PortSpace::Udp);
    let cqp = give_qp(&cid);
    cid.connect(ConnParam::new().private_data(b"ud-hello"))
        .unwrap();

    let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
    assert!(Arc::ptr_eq(req.listener().unwrap(), &listener));
    assert_private(req.private_data(), b"ud-hello");
    let sid = Arc::clone(req.id());
    drop(req);
    assert_eq!(sid.port_space(), PortSpace::Udp);
    let sqp = give_qp(&sid);
    let srecv = sqp
        .pd
        .reg_buffer(GRH + 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    post_recv(sid.qp_as_raw(), &srecv, GRH + 64, 1);
    sid.accept(ConnParam::new().private_data(b"ud-welcome"))
        .unwrap();

    let est = cch.wait_for(EventType::Established, WAIT).unwrap();
    assert_private(est.private_data(), b"ud-welcome");
    let ud = *est.ud_param().unwrap();
    assert_eq!(Some(ud.qp_num()), sid.qp_num());
    assert_eq!(ud.qkey(), ffi::RDMA_UDP_QKEY);
    let ah = ud.create_ah(&cqp.pd).unwrap();

    // Client -> server, through the address handle the ESTABLISHED event described.
    let mut crecv = cqp
        .pd
        .reg_buffer(GRH + 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    post_recv(cid.qp_as_raw(), &crecv, GRH + 64, 2);
    let msg = b"a datagram from the client";
    let mut csend = cqp.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    csend.write_at(0, msg).unwrap();
    post_ud_send(
        cid.qp_as_raw(),
        &csend,
        msg.len(),
        ah.as_raw(),
        ud.qp_num(),
        ud.qkey(),
    );
    let wc = completion(&cqp.cq, "client send");
    assert_eq!(wc.wr_id(), 7);
    let wc = completion(&sqp.cq, "server receive");
    assert_eq!(wc.byte_len() as usize, GRH + msg.len());
    assert_eq!(Some(wc.src_qp()), cid.qp_num());
    assert_eq!(&common::bytes(&srecv)[GRH..GRH + msg.len()], msg);

    // Server -> client: the server learns the client's address from the datagram itself.
    let mut wc_raw = *wc.as_raw();
    // SAFETY: the PD and the completion are live; the GRH is the first 40 bytes of the
    // receive buffer, as the completion says (IBV_WC_GRH on RoCE).
    let reply_ah = unsafe {
        ffi::ibv_create_ah_from_wc(
            sqp.pd.as_raw(),
            &mut wc_raw,
            srecv.as_ptr().cast(),
            sid.port_num(),
        )
    };
    assert!(!reply_ah.is_null(), "ibv_create_ah_from_wc");
    let reply = b"and one back from the server";
    let mut ssend = sqp.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    ssend.write_at(0, reply).unwrap();
    post_ud_send(
        sid.qp_as_raw(),
        &ssend,
        reply.len(),
        reply_ah,
        wc.src_qp(),
        ffi::RDMA_UDP_QKEY,
    );
    completion(&sqp.cq, "server send");
    let wc = completion(&cqp.cq, "client receive");
    assert_eq!(wc.byte_len() as usize, GRH + reply.len());
    assert_eq!(&common::bytes(&crecv)[GRH..GRH + reply.len()], reply);
    // SAFETY: the reply's send completed; nothing uses the handle any more.
    assert_eq!(unsafe { ffi::ibv_destroy_ah(reply_ah) }, 0);
    let _ = &mut crecv;
}

#[test]
fn multicast_join_sends_and_receives() {
    let Some(ip) = common::ip_or_skip("multicast_join_sends_and_receives") else {
        return;
    };
    let group: SocketAddr = "239.255.74.80:0".parse().unwrap();
    let member = |port: u16| {
        let ch = EventChannel::new().unwrap();
        let id = ch.create_id(PortSpace::Udp).unwrap();
        id.bind_addr(SocketAddr::new(ip, port)).unwrap();
        let qp = give_qp(&id);
        id.join_multicast(group).unwrap();
        let ev = ch.wait_for(EventType::MulticastJoin, WAIT).unwrap();
        assert!(Arc::ptr_eq(ev.id(), &id));
        let ud = *ev.ud_param().unwrap();
        assert_eq!(ud.qp_num(), 0xff_ffff, "{ud:?}");
        (ch, id, qp, ud)
    };
    let (_rch, rid, rqp, _) = member(7480);
    let (_sch, sid, sqp, ud) = member(7481);

    let mut recv = rqp
        .pd
        .reg_buffer(GRH + 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    post_recv(rid.qp_as_raw(), &recv, GRH + 64, 3);
    let msg = b"to everyone in the group";
    let mut send = sqp.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    send.write_at(0, msg).unwrap();
    let ah = ud.create_ah(&sqp.pd).unwrap();
    post_ud_send(
        sid.qp_as_raw(),
        &send,
        msg.len(),
        ah.as_raw(),
        ud.qp_num(),
        ud.qkey(),
    );
    completion(&sqp.cq, "multicast send");
    let wc = completion(&rqp.cq, "multicast receive");
    assert_eq!(wc.byte_len() as usize, GRH + msg.len());
    assert_eq!(&common::bytes(&recv)[GRH..GRH + msg.len()], msg);
    rid.leave_multicast(group).unwrap();
    let _ = &mut recv;
}

#[test]
fn dropping_an_unanswered_request_or_its_listener_refuses_the_peer() {
    let Some(ip) =
        common::ip_or_skip("dropping_an_unanswered_request_or_its_listener_refuses_the_peer")
    else {
        return;
    };
    let refused = |cch: &EventChannel, what: &str| match cch.wait_for(EventType::Established, WAIT)
    {
        Err(e @ (CmError::Rejected { .. } | CmError::Unreachable { .. })) => {
            println!("{what}: {e}")
        }
        other => panic!("{what}: expected a reject, got {other:?}"),
    };

    // The request's event (holding the only Arc of the new id) is dropped unanswered.
    let addr = SocketAddr::new(ip, 7483);
    let (sch, _listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let _cqp = give_qp(&cid);
    cid.connect(&connect_param(b"hello?")).unwrap();
    drop(sch.wait_for(EventType::ConnectRequest, WAIT).unwrap());
    refused(&cch, "request dropped");

    // The listener (and its channel) go away with a request still queued, never retrieved.
    let addr = SocketAddr::new(ip, 7484);
    let (sch, listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let _cqp = give_qp(&cid);
    cid.connect(&connect_param(b"hello?")).unwrap();
    // Let the request arrive (the server's descriptor turns readable) before dropping.
    let mut pfd = libc::pollfd {
        fd: sch.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is one valid pollfd on the channel's open descriptor.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 10_000) }, 1);
    drop(listener);
    drop(sch);
    refused(&cch, "listener dropped");
}

/// A QP of the program's own on `id`'s device, moved to `states` with the id's
/// `init_qp_attr`, which gives a `QueuePairAttribute`.
fn own_qp(id: &Arc<CmId>, states: &[QpTargetState]) -> (Arc<ProtectionDomain>, QueuePair) {
    let ctx = id.device_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().build().unwrap();
    let qp = pd
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    for &state in states {
        let attr = id.init_qp_attr(state).unwrap();
        assert!(attr.mask().contains(QpAttrMask::STATE), "{attr:?}");
        qp.modify(&attr)
            .unwrap_or_else(|e| panic!("moving to {state:?}: {e}"));
    }
    (pd, qp)
}

#[test]
fn own_qps_follow_the_connection_through_init_qp_attr() {
    let Some(ip) = common::ip_or_skip("own_qps_follow_the_connection_through_init_qp_attr") else {
        return;
    };
    use QpTargetState::{Init, Rtr, Rts};
    let addr = SocketAddr::new(ip, 7485);
    let (sch, _listener) = listen_on(addr, PortSpace::Tcp);
    let (cch, cid) = client_to(addr, PortSpace::Tcp);
    let (cpd, mut cqp) = own_qp(&cid, &[Init]);
    assert_eq!(cqp.state().unwrap(), QpState::Init);
    cid.connect(ConnParam::new().qp_num(cqp.qp_num()).rnr_retry_count(6))
        .unwrap();

    let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
    assert_eq!(req.conn_param().unwrap().qp_num(), cqp.qp_num());
    let sid = Arc::clone(req.id());
    drop(req);
    let (spd, mut sqp) = own_qp(&sid, &[Init, Rtr, Rts]);
    assert_eq!(sqp.state().unwrap(), QpState::Rts);
    let mut srecv = spd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut guard = sqp.start_post_recv();
    guard.recv(1, &[srecv.sge(0..64).unwrap()]);
    guard.post().unwrap();
    let mut sdata = spd
        .reg_buffer(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    sdata.write_at(0, b"fetch").unwrap();
    sid.accept(ConnParam::new().qp_num(sqp.qp_num())).unwrap();

    let resp = cch.wait_for(EventType::ConnectResponse, WAIT).unwrap();
    assert_eq!(resp.conn_param().unwrap().qp_num(), sqp.qp_num());
    // Init again first: the remote access for the server's RDMA READ comes with the
    // responder resources, agreed only now.
    let init = cid.init_qp_attr(Init).unwrap();
    assert!(
        init.qp_access_flags().contains(AccessFlags::REMOTE_READ),
        "{init:?}"
    );
    for state in [Init, Rtr, Rts] {
        cqp.modify(&cid.init_qp_attr(state).unwrap()).unwrap();
    }
    assert_eq!(cqp.state().unwrap(), QpState::Rts);
    cid.establish().unwrap();
    sch.wait_for(EventType::Established, WAIT).unwrap();

    // A SEND, and an RDMA READ, over the QPs the ids never owned.
    let mut cbuf = cpd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    cbuf.write_at(0, b"hello").unwrap();
    let mut batch = cqp.start_post_send();
    batch
        .wr(2, SendFlags::SIGNALED)
        .send(cbuf.sge(0..5).unwrap())
        .wr(3, SendFlags::SIGNALED)
        .rdma_read(sdata.rkey(), sdata.addr(), cbuf.sge(8..13).unwrap());
    batch.post().unwrap();
    assert_eq!(completion(cqp.send_cq(), "client send").wr_id(), 2);
    assert_eq!(completion(cqp.send_cq(), "client read").wr_id(), 3);
    let wc = completion(sqp.recv_cq(), "server receive");
    assert_eq!(wc.byte_len(), 5);
    assert_eq!(&common::bytes(&srecv)[..5], b"hello");
    assert_eq!(&common::bytes(&cbuf)[8..13], b"fetch");

    // And the other way: the server READs the client's memory.
    let mut cdata = cpd
        .reg_buffer(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    cdata.write_at(0, b"back").unwrap();
    let mut batch = sqp.start_post_send();
    batch.wr(4, SendFlags::SIGNALED).rdma_read(
        cdata.rkey(),
        cdata.addr(),
        srecv.sge(16..20).unwrap(),
    );
    batch.post().unwrap();
    assert_eq!(completion(sqp.send_cq(), "server read").wr_id(), 4);
    assert_eq!(&common::bytes(&srecv)[16..20], b"back");
    let _ = (&mut srecv, &mut sdata, &mut cbuf);
}

/// Clients served at once by the concurrent-accept pattern.
const CONCURRENT_CLIENTS: u8 = 8;

/// The server's side of one connection, on its own thread and channel: a QP (the id's own
/// or one of the program's, as the client's private data asks), a receive posted before
/// `accept_qp`, the buffer the client WRITEs into advertised in the accept's private data;
/// then the client's WRITE and SEND checked, the SEND answered, and the disconnect awaited.
fn serve_one(id: Arc<CmId>, own_qp: bool, n: u8) -> Result<(), String> {
    let ctx = id.device_context().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx
        .create_cq_builder()
        .cqe(16)
        .build()
        .map_err(|e| e.to_string())?;
    let mut builder = pd.create_qp_builder();
    builder
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(4)
        .max_recv_wr(4);
    let mut qp = if own_qp {
        let qp = builder.build().map_err(|e| e.to_string())?;
        // Out of Reset, so that it takes receives.
        id.modify_qp(&qp, &[QpTargetState::Init])
            .map_err(|e| e.to_string())?;
        qp
    } else {
        id.create_qp(&builder).map_err(|e| e.to_string())?
    };
    let mut msg = pd
        .reg_buffer(64, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let target = pd
        .reg_buffer(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let mut recv = qp.start_post_recv();
    recv.recv(1, &[msg.sge(0..32).ok_or("sge")?]);
    recv.post().map_err(|e| e.to_string())?;
    let advert = RemoteBuffer {
        addr: target.addr(),
        rkey: target.rkey(),
        len: 64,
    };
    id.accept_qp(&qp, ConnParam::new().private_data(&advert.to_bytes()), WAIT)
        .map_err(|e| format!("server {n}: accept: {e}"))?;
    let mut waiter = CompletionWaiter::new(&cq, Duration::from_secs(10));
    let wc = waiter.wait(1).map_err(|e| format!("server {n}: {e}"))?;
    let said = msg
        .to_vec(0..wc.byte_len() as usize)
        .map_err(|e| e.to_string())?;
    let written = common::bytes(&target);
    if said != format!("client {n}").as_bytes() || &written[..7] != format!("write {n}").as_bytes()
    {
        return Err(format!("server {n}: got {said:?} and {written:?}"));
    }
    msg.write_at(32, format!("server {n}").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut send = qp.start_post_send();
    send.wr(2, SendFlags::SIGNALED)
        .send(msg.sge(32..40).ok_or("sge")?);
    send.post().map_err(|e| e.to_string())?;
    waiter.wait(2).map_err(|e| format!("server {n}: {e}"))?;
    let ev = id
        .wait_for(EventType::Disconnected, WAIT)
        .map_err(|e| format!("server {n}: waiting for the disconnect: {e}"))?;
    drop(ev);
    // An id-owned QP goes first; the id outlives it (the QP holds it).
    drop(qp);
    Ok(())
}

/// One client: its own channel, a QP (the id's, or one of its own for odd `n`), connect
/// with `connect_qp`, WRITE into the buffer the server advertised, SEND, read the answer.
fn client_one(addr: SocketAddr, n: u8) -> Result<(), String> {
    let own_qp = n % 2 == 1;
    let (_ch, id) = client_to(addr, PortSpace::Tcp);
    let ctx = id.device_context().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx
        .create_cq_builder()
        .cqe(16)
        .build()
        .map_err(|e| e.to_string())?;
    let mut builder = pd.create_qp_builder();
    builder
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(4)
        .max_recv_wr(4);
    let mut qp = if own_qp {
        let qp = builder.build().map_err(|e| e.to_string())?;
        // Out of Reset, so that it takes receives.
        id.modify_qp(&qp, &[QpTargetState::Init])
            .map_err(|e| e.to_string())?;
        qp
    } else {
        id.create_qp(&builder).map_err(|e| e.to_string())?
    };
    let mut buf = pd
        .reg_buffer(64, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let mut recv = qp.start_post_recv();
    recv.recv(1, &[buf.sge(32..64).ok_or("sge")?]);
    recv.post().map_err(|e| e.to_string())?;
    let answer = id
        .connect_qp(
            &qp,
            ConnParam::new().private_data(&[n, u8::from(own_qp)]),
            WAIT,
        )
        .map_err(|e| format!("client {n}: connect: {e}"))?;
    if own_qp {
        assert_eq!(answer.event_type(), EventType::ConnectResponse);
        assert_eq!(qp.state().unwrap(), QpState::Rts);
    } else {
        assert_eq!(answer.event_type(), EventType::Established);
    }
    let target =
        RemoteBuffer::from_private_data(answer.private_data()).map_err(|e| e.to_string())?;
    drop(answer);
    buf.write_at(0, format!("write {n}").as_bytes())
        .map_err(|e| e.to_string())?;
    buf.write_at(16, format!("client {n}").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut send = qp.start_post_send();
    send.wr(2, SendFlags::SIGNALED)
        .rdma_write(target.rkey, target.addr, buf.sge(0..7).ok_or("sge")?)
        .wr(3, SendFlags::SIGNALED)
        .send(buf.sge(16..24).ok_or("sge")?);
    send.post().map_err(|e| e.to_string())?;
    let mut waiter = CompletionWaiter::new(&cq, Duration::from_secs(10));
    // The answer may complete before the sends are reaped: the waiter keeps it.
    let got = waiter
        .wait_all(&[1, 2, 3])
        .map_err(|e| format!("client {n}: {e}"))?;
    let answer = buf
        .to_vec(32..32 + got[0].byte_len() as usize)
        .map_err(|e| e.to_string())?;
    if answer != format!("server {n}").as_bytes() {
        return Err(format!("client {n}: the server answered {answer:?}"));
    }
    id.disconnect().map_err(|e| e.to_string())?;
    Ok(())
}

/// The concurrent-accept pattern: one listener; each connection request's id migrated
/// (`rdma_migrate_id`) to a channel of its own and served on its own thread, while the
/// listener's channel keeps taking requests. Eight clients connect at once (half with QPs
/// made on their ids, half with QPs of their own; the server alike, as each client asks)
/// and each exchanges a WRITE and a SEND each way with its server thread.
#[test]
fn many_clients_are_accepted_at_once_on_migrated_ids() {
    let Some(ip) = common::ip_or_skip("many_clients_are_accepted_at_once_on_migrated_ids") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7490);
    let (listen_ch, listener) = listen_on(addr, PortSpace::Tcp);
    std::thread::scope(|s| {
        let acceptor = s.spawn(|| {
            let mut servers = Vec::new();
            for _ in 0..CONCURRENT_CLIENTS {
                let req = listen_ch
                    .wait_for(EventType::ConnectRequest, WAIT)
                    .map_err(|e| format!("waiting for a request: {e}"))?;
                let (n, own) = match req.private_data() {
                    [n, own, ..] => (*n, *own == 1),
                    other => return Err(format!("private data {other:?}")),
                };
                let id = Arc::clone(req.id());
                drop(req);
                let own_channel = EventChannel::new().map_err(|e| e.to_string())?;
                id.migrate(&own_channel).map_err(|e| e.to_string())?;
                assert!(Arc::ptr_eq(&id.channel(), &own_channel));
                servers.push(s.spawn(move || serve_one(id, own, n)));
            }
            servers
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a server thread panicked".into()))
                })
                .collect::<Result<Vec<()>, String>>()
        });
        let clients: Vec<_> = (0..CONCURRENT_CLIENTS)
            .map(|n| s.spawn(move || client_one(addr, n)))
            .collect();
        for (n, c) in clients.into_iter().enumerate() {
            c.join()
                .unwrap_or_else(|_| panic!("client {n} panicked"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let served = acceptor
            .join()
            .expect("the acceptor panicked")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(served.len(), usize::from(CONCURRENT_CLIENTS));
    });
    // The listener's channel saw only the requests: every later event went to its id's own.
    assert!(listen_ch.try_get_event().unwrap().is_none());
    drop(listener);
}

/// A second QP on an id that has one is refused, dropping the QP frees the id for another,
/// and a builder of the wrong type for the port space is refused with the type to set.
#[test]
fn an_id_takes_one_qp_of_its_type_at_a_time() {
    let Some(ip) = common::ip_or_skip("an_id_takes_one_qp_of_its_type_at_a_time") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7491);
    let (_sch, _listener) = listen_on(addr, PortSpace::Tcp);
    let (_cch, cid) = client_to(addr, PortSpace::Tcp);
    let ctx = cid.device_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().build().unwrap();
    let mut builder = pd.create_qp_builder();
    builder
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(2)
        .max_recv_wr(2);
    let first = cid.create_qp(&builder).unwrap();
    assert_eq!(first.state().unwrap(), QpState::Init);
    let e = cid.create_qp(&builder).unwrap_err();
    assert!(
        matches!(e, CmError::QpExists { qp_num, .. } if qp_num == first.qp_num()),
        "{e}"
    );
    drop(first);
    assert_eq!(cid.qp_num(), None);
    assert!(cid.qp_as_raw().is_null());
    let second = cid.create_qp(&builder).unwrap();
    assert_eq!(cid.qp_num(), Some(second.qp_num()));
    let e = cid.create_qp(builder.qp_type(QpType::Ud)).unwrap_err();
    assert!(e.to_string().contains("qp_type(Rc)"), "{e}");
}
