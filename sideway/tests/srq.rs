//! Device tests: a shared receive queue fed to four RC queue pairs, and its limit event.
//! Loopback on one device.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use sideway::async_event::{AsyncEventKind, AsyncEventObject};
use sideway::completion_queue::WcOpcode;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{QueuePair, SendFlags};

const QPS: usize = 4;
const SLOT: usize = 256;

#[test]
fn srq_shared_by_four_qps_and_its_limit_event() {
    let Some(ctx) = common::device_or_skip("srq_shared_by_four_qps_and_its_limit_event") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq_builder()
        .max_wr(64)
        .max_sge(1)
        .build()
        .unwrap();
    assert!(srq.max_wr() >= 64);
    let recv_cq = ctx.create_cq_builder().cqe(128).build().unwrap();
    let send_cq = ctx.create_cq_builder().cqe(128).build().unwrap();
    let receivers: Vec<QueuePair> = (0..QPS)
        .map(|_| {
            pd.create_qp_builder()
                .send_cq(&send_cq)
                .recv_cq(&recv_cq)
                .srq(&srq)
                .build()
                .unwrap()
        })
        .collect();
    let mut senders: Vec<QueuePair> = (0..QPS)
        .map(|_| {
            pd.create_qp_builder()
                .send_cq(&send_cq)
                .recv_cq(&send_cq)
                .build()
                .unwrap()
        })
        .collect();
    for (r, s) in receivers.iter().zip(&senders) {
        assert!(Arc::ptr_eq(r.srq().unwrap(), &srq));
        pairs::connect(&ctx, s, r);
    }

    let recv_buf = pd.reg_buffer(32 * SLOT, AccessFlags::LOCAL_WRITE).unwrap();
    let mut send_buf = pd.reg_buffer(QPS * SLOT, AccessFlags::LOCAL_WRITE).unwrap();
    // 16 receives, then arm the limit at 10: once 7 are consumed, 9 < 10 are left.
    let mut g = srq.start_post_recv();
    for i in 0..16 {
        g.recv(
            100 + i as u64,
            &[recv_buf.sge(i * SLOT..(i + 1) * SLOT).unwrap()],
        );
    }
    assert_eq!(g.len(), 16);
    g.post().unwrap();
    srq.arm_limit(10).unwrap();
    assert_eq!(srq.query().unwrap().2, 10, "the armed limit reads back");

    // Each sender sends two messages naming itself.
    for (i, s) in senders.iter_mut().enumerate() {
        let text = format!("from sender {i}");
        send_buf.write_at(i * SLOT, text.as_bytes()).unwrap();
        let sge = send_buf.sge(i * SLOT..i * SLOT + text.len()).unwrap();
        let mut p = s.start_post_send();
        p.wr(i as u64, SendFlags::SIGNALED)
            .send(sge)
            .wr(i as u64, SendFlags::SIGNALED)
            .send(sge);
        p.post().unwrap();
    }
    for wc in pairs::wait_for(&send_cq, 2 * QPS) {
        wc.ok().unwrap();
    }
    let wcs = pairs::wait_for(&recv_cq, 2 * QPS);
    let mut from = HashSet::new();
    let mut slots = HashSet::new();
    for wc in &wcs {
        wc.ok().unwrap();
        assert_eq!(wc.opcode(), WcOpcode::Recv);
        let idx = receivers
            .iter()
            .position(|r| r.qp_num() == wc.qp_num())
            .unwrap_or_else(|| panic!("completion for a QP that is not a receiver: {wc:?}"));
        let slot = (wc.wr_id() - 100) as usize;
        assert!(slots.insert(slot), "slot {slot} used twice");
        let text = format!("from sender {idx}");
        assert_eq!(
            &common::bytes(&recv_buf)[slot * SLOT..slot * SLOT + text.len()],
            text.as_bytes(),
            "receiver {idx} got its own sender's message"
        );
        from.insert(idx);
    }
    assert_eq!(from.len(), QPS, "every QP received through the SRQ");

    // The limit event, naming this SRQ.
    let deadline = Instant::now() + pairs::WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = ctx
            .get_async_event(Some(left))
            .unwrap_or_else(|e| panic!("no SRQ limit event: {e}"));
        if ev.kind() != AsyncEventKind::SrqLimitReached {
            println!("skipping unrelated async event: {ev}");
            continue;
        }
        match ev.object() {
            AsyncEventObject::SharedReceiveQueue(s) => assert!(Arc::ptr_eq(s, &srq), "{ev}"),
            other => panic!("the event names {other:?}, not the SRQ"),
        }
        assert!(ev.to_string().contains("SRQ"), "{ev}");
        break;
    }
    assert_eq!(srq.query().unwrap().2, 0, "the limit disarms once it fires");

    // A batch larger than the SRQ is refused whole.
    let mut g = srq.start_post_recv();
    for i in 0..=srq.max_wr() as u64 {
        g.recv(i, &[recv_buf.sge(0..SLOT).unwrap()]);
    }
    let err = g.post().unwrap_err();
    assert!(err.to_string().contains("batch is full"), "{err}");
}
