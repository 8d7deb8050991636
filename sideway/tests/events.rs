//! Device tests: completion events, eight CQs on one channel; timeouts and the
//! non-blocking mode. Loopback UD on one device.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::address_handle::GRH_LEN;
use sideway::async_event::EventError;
use sideway::completion_queue::CompletionQueue;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{QpType, QueuePair, SendFlags};

const QKEY: u32 = 0x1111_1111;
const CQS: usize = 8;

fn ud_qp(
    pd: &Arc<sideway::protection_domain::ProtectionDomain>,
    ctx: &sideway::device::DeviceContext,
    cq: &Arc<CompletionQueue>,
) -> QueuePair {
    let qp = pd
        .create_qp_builder()
        .qp_type(QpType::Ud)
        .send_cq(cq)
        .recv_cq(cq)
        .build()
        .unwrap();
    let mut opts = pairs::options(ctx, 1);
    opts.qkey(QKEY);
    qp.connect(&opts, &Default::default()).unwrap();
    qp
}

#[test]
fn eight_cqs_on_one_channel_each_event_names_its_cq() {
    let Some(ctx) = common::device_or_skip("eight_cqs_on_one_channel_each_event_names_its_cq")
    else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    assert!(channel.fd() >= 0);
    // try_get_cq_event no longer sets O_NONBLOCK on every call: the channel must have it
    // from its creation, or the look below would sleep until an event came.
    // SAFETY: F_GETFL on the channel's descriptor, open while `channel` lives, reads flags.
    let flags = unsafe { libc::fcntl(channel.fd(), libc::F_GETFL) };
    assert!(
        flags >= 0 && flags & libc::O_NONBLOCK != 0,
        "a new completion channel is non-blocking (flags {flags:#x})"
    );
    let cqs: Vec<Arc<CompletionQueue>> = (0..CQS)
        .map(|i| {
            let mut b = ctx.create_cq_builder();
            b.cqe(16).channel(&channel);
            // Half classic, half extended (where the device has them).
            if i % 2 == 1 {
                b.build_ex().or_else(|_| b.build()).unwrap()
            } else {
                b.build().unwrap()
            }
        })
        .collect();
    let mut receivers: Vec<QueuePair> = cqs.iter().map(|cq| ud_qp(&pd, &ctx, cq)).collect();
    let send_cq = ctx.create_cq_builder().cqe(64).build().unwrap();
    let mut sender = ud_qp(&pd, &ctx, &send_cq);
    let ah = pd.create_ah(&pairs::loopback_av(&ctx)).unwrap();
    let buf = pd.reg_buffer(CQS * 128, AccessFlags::LOCAL_WRITE).unwrap();
    let send_buf = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    for (i, qp) in receivers.iter_mut().enumerate() {
        let mut r = qp.start_post_recv();
        r.recv(i as u64, &[buf.sge(i * 128..(i + 1) * 128).unwrap()]);
        r.post().unwrap();
    }
    for cq in &cqs {
        cq.req_notify(false).unwrap();
    }
    assert!(
        channel.try_get_cq_event().unwrap().is_none(),
        "nothing fired yet"
    );

    // Wake the CQs in a scrambled order; each event must name the CQ that was sent to.
    for &i in &[5usize, 0, 7, 2, 6, 1, 4, 3] {
        let mut s = sender.start_post_send();
        s.wr(i as u64, SendFlags::SIGNALED)
            .ud_addr(&ah, receivers[i].qp_num(), QKEY)
            .send(send_buf.sge(0..16).unwrap());
        s.post().unwrap();
        pairs::wait_for(&send_cq, 1)[0].ok().unwrap();
        let fired = channel.get_cq_event(Some(pairs::WAIT)).unwrap();
        assert!(
            Arc::ptr_eq(&fired, &cqs[i]),
            "the event for CQ {i} named another CQ"
        );
        assert_eq!(fired.unacked_events(), 1);
        let wc = pairs::wait_for(&fired, 1)[0];
        wc.ok().unwrap();
        assert_eq!(
            (wc.wr_id(), wc.byte_len() as usize),
            (i as u64, GRH_LEN + 16)
        );
        fired.ack_events();
        assert_eq!(fired.unacked_events(), 0);
    }

    // Arm, fire, and drop the CQ's last handle of ours without acknowledging by hand:
    // the drop acknowledges (ibv_destroy_cq would wait for ever otherwise).
    let mut r = receivers[3].start_post_recv();
    r.recv(33, &[buf.sge(0..128).unwrap()]);
    r.post().unwrap();
    cqs[3].req_notify(false).unwrap();
    let mut s = sender.start_post_send();
    s.wr(9, SendFlags::SIGNALED)
        .ud_addr(&ah, receivers[3].qp_num(), QKEY)
        .send(send_buf.sge(0..16).unwrap());
    s.post().unwrap();
    let fired = channel.get_cq_event(Some(pairs::WAIT)).unwrap();
    assert!(Arc::ptr_eq(&fired, &cqs[3]));
    assert_eq!(fired.unacked_events(), 1);
    drop(fired);
    let started = Instant::now();
    drop(receivers);
    drop(cqs);
    assert!(started.elapsed() < pairs::WAIT, "destroying the CQs hung");
}

#[test]
fn get_event_times_out_instead_of_hanging() {
    let Some(ctx) = common::device_or_skip("get_event_times_out_instead_of_hanging") else {
        return;
    };
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx
        .create_cq_builder()
        .cqe(8)
        .channel(&channel)
        .build()
        .unwrap();
    cq.req_notify(true).unwrap();
    let started = Instant::now();
    let err = channel
        .get_cq_event(Some(Duration::from_millis(300)))
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, EventError::Timeout { .. }), "{err}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    assert!(channel.try_get_cq_event().unwrap().is_none());

    let started = Instant::now();
    let err = ctx
        .get_async_event(Some(Duration::from_millis(200)))
        .unwrap_err();
    assert!(matches!(err, EventError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(ctx.try_get_async_event().unwrap().is_none());
    assert!(ctx.async_fd() >= 0);
}
