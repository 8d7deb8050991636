//! Receiver Not Ready: a SEND that reaches a QP with no receive posted. The responder
//! answers with an RNR NAK and the requester retries after the responder's `min_rnr_timer`,
//! `rnr_retry` times (7: for ever). The verbs define the outcome: with a finite count the
//! SEND completes with `IBV_WC_RNR_RETRY_EXC_ERR`, which sideway types and explains; with 7
//! it completes successfully once a receive is posted.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::completion_queue::{CompletionQueue, WcStatus};
use sideway::device::DeviceContext;
use sideway::memory_region::AccessFlags;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QueuePair, SendFlags};

struct Pair {
    sender: QueuePair,
    receiver: QueuePair,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

/// An RC pair whose sender retries RNR `rnr_retry` times, `min_rnr_timer` code 1 (0.01 ms)
/// apart as the receiver asks.
fn pair(ctx: &Arc<DeviceContext>, rnr_retry: u8) -> Pair {
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq_builder().cqe(8).build().unwrap();
    let recv_cq = ctx.create_cq_builder().cqe(8).build().unwrap();
    let new = |cq: &Arc<CompletionQueue>| {
        let mut b = pd.create_qp_builder();
        b.send_cq(cq).recv_cq(cq).max_send_wr(4).max_recv_wr(4);
        b.build().unwrap()
    };
    let (sender, receiver) = (new(&send_cq), new(&recv_cq));
    let (ps, pr) = (0x10, 0x20);
    let mut o = pairs::options(ctx, ps);
    o.rnr_retry(rnr_retry).min_rnr_timer(1);
    sender
        .connect(&o, &pairs::endpoint(ctx, &receiver, pr))
        .unwrap();
    let mut o = pairs::options(ctx, pr);
    o.rnr_retry(rnr_retry).min_rnr_timer(1);
    receiver
        .connect(&o, &pairs::endpoint(ctx, &sender, ps))
        .unwrap();
    Pair {
        sender,
        receiver,
        send_cq,
        recv_cq,
        pd,
    }
}

/// The completions of `cq` within `limit` (none is fine).
fn poll_for(
    cq: &CompletionQueue,
    limit: Duration,
) -> Vec<sideway::completion_queue::WorkCompletion> {
    let deadline = Instant::now() + limit;
    let mut wcs = [sideway::completion_queue::WorkCompletion::default(); 4];
    let mut out = Vec::new();
    while Instant::now() < deadline && out.is_empty() {
        let n = cq.poll_into(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..n]);
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

#[test]
fn a_send_without_a_receive_fails_with_a_typed_rnr_error_after_finite_retries() {
    let Some(ctx) = common::device_or_skip(
        "a_send_without_a_receive_fails_with_a_typed_rnr_error_after_finite_retries",
    ) else {
        return;
    };
    let mut p = pair(&ctx, 2);
    let mut buf = p.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    buf.write_at(0, b"no one is listening").unwrap();
    let started = Instant::now();
    let mut s = p.sender.start_post_send();
    s.wr(5, SendFlags::SIGNALED).send(buf.sge(0..19).unwrap());
    s.post().unwrap();
    let wc = pairs::wait_for(&p.send_cq, 1)[0];
    let took = started.elapsed();
    assert_eq!(wc.wr_id(), 5);
    assert_eq!(wc.status(), WcStatus::RnrRetryExcErr, "{wc:?}");
    let e = wc.ok().unwrap_err();
    let text = e.to_string();
    assert!(text.contains("receive buffer posted"), "{text}");
    // 3 tries 0.01 ms apart (plus the round trips): far below the test's own limit.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    println!("finite RNR retries failed after {took:?}: {text}");
    // The receiver saw nothing: there was nowhere to put it.
    assert!(poll_for(&p.recv_cq, Duration::from_millis(50)).is_empty());
}

#[test]
fn a_send_without_a_receive_completes_once_one_is_posted_with_infinite_retries() {
    let Some(ctx) = common::device_or_skip(
        "a_send_without_a_receive_completes_once_one_is_posted_with_infinite_retries",
    ) else {
        return;
    };
    let mut p = pair(&ctx, 7);
    let mut out = p.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    let into = p.pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    out.write_at(0, b"wait for me").unwrap();
    let mut s = p.sender.start_post_send();
    s.wr(6, SendFlags::SIGNALED).send(out.sge(0..11).unwrap());
    s.post().unwrap();
    // Retried for ever: nothing completes while no receive is posted.
    let early = poll_for(&p.send_cq, Duration::from_millis(300));
    assert!(early.is_empty(), "completed without a receive: {early:?}");
    let mut r = p.receiver.start_post_recv();
    r.recv(8, &[into.sge(0..64).unwrap()]);
    r.post().unwrap();
    let sent = pairs::wait_for(&p.send_cq, 1)[0];
    assert_eq!((sent.wr_id(), sent.status()), (6, WcStatus::Success));
    let got = pairs::wait_for(&p.recv_cq, 1)[0];
    assert_eq!(
        (got.wr_id(), got.status(), got.byte_len()),
        (8, WcStatus::Success, 11)
    );
    assert_eq!(into.to_vec(0..11).unwrap(), b"wait for me");
}
