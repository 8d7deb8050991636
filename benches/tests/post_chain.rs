//! Posting chains (`qp.start_post_send().wr(..).send(..).post()`) post exactly what the
//! statement-by-statement guard posts, allocate nothing, and leave a named guard empty and
//! ready for the next batch, also after a refused request. Over the null provider: needs
//! no device and no rdma-core library.

use benches::alloc_counter::{count_allocations, CountingAllocator};
use benches::null_provider::{Counters, NullProvider};
use sideway::queue_pair::{InvalidWorkRequest, PostError, SendFlags};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn null_sge() -> sideway::memory_region::Sge {
    // SAFETY: posted only to the null provider, which reads only the length.
    unsafe { sideway::memory_region::Sge::from_raw_parts(0x20_0000, 64, 0x5678) }
}

/// What a batch of two WRITEs (wr_id 1 unsignaled, 2 signaled) hands the provider, posted
/// by `post`.
fn two_writes(extended: bool, post: impl FnOnce(&mut sideway::queue_pair::QueuePair)) -> Counters {
    let np = NullProvider::new();
    let (mut qp, _cq) = np.sideway(extended);
    post(&mut qp);
    np.counters()
}

#[test]
fn a_one_expression_chain_posts_what_the_guard_posts() {
    for extended in [false, true] {
        let by_statement = two_writes(extended, |qp| {
            let mut guard = qp.start_post_send();
            guard.wr(1, SendFlags::empty()).rdma_write(1, 2, null_sge());
            guard
                .wr(2, SendFlags::SIGNALED)
                .rdma_write(1, 2, null_sge());
            guard.post().unwrap();
        });
        let chained = two_writes(extended, |qp| {
            qp.start_post_send()
                .wr(1, SendFlags::empty())
                .rdma_write(1, 2, null_sge())
                .wr(2, SendFlags::SIGNALED)
                .rdma_write(1, 2, null_sge())
                .post()
                .unwrap();
        });
        assert_eq!(chained, by_statement, "extended: {extended}");
        let doorbells = if extended {
            chained.wr_completes
        } else {
            chained.post_send_calls
        };
        assert_eq!(
            (doorbells, chained.signaled),
            (1, 1),
            "extended: {extended}"
        );
    }
}

#[test]
fn a_named_guard_posted_through_its_chain_starts_a_new_batch() {
    for extended in [false, true] {
        let np = NullProvider::new();
        let (mut qp, _cq) = np.sideway(extended);
        let mut guard = qp.start_post_send();
        guard
            .wr(1, SendFlags::SIGNALED)
            .rdma_write(1, 2, null_sge())
            .post()
            .unwrap();
        assert!(guard.is_empty(), "extended: {extended}");
        guard
            .wr(2, SendFlags::SIGNALED)
            .rdma_write(1, 2, null_sge())
            .wr(3, SendFlags::SIGNALED)
            .rdma_write(1, 2, null_sge());
        guard.post().unwrap();
        let c = np.counters();
        let (doorbells, wrs) = if extended {
            (c.wr_completes, c.wr_ops)
        } else {
            (c.post_send_calls, c.send_wrs)
        };
        assert_eq!(
            (doorbells, wrs, c.wr_id_sum),
            (2, 3, 6),
            "extended: {extended}"
        );
        assert_eq!(c.wr_aborts, 0, "extended: {extended}");
    }
}

#[test]
fn a_refused_request_ends_the_chain_s_batch_and_the_guard_goes_on() {
    let two = [null_sge(), null_sge()];
    for extended in [false, true] {
        let np = NullProvider::new();
        let (mut qp, _cq) = np.sideway(extended);
        let mut guard = qp.start_post_send();
        let refused = guard
            .wr(1, SendFlags::empty())
            .rdma_write(1, 2, null_sge())
            .wr(2, SendFlags::empty())
            .rdma_write(1, 2, &two)
            .post();
        assert!(
            matches!(
                refused,
                Err(PostError::Invalid {
                    index: 1,
                    wr_id: 2,
                    reason: InvalidWorkRequest::TooManySge { .. },
                    ..
                })
            ),
            "extended: {extended}: {refused:?}"
        );
        // An extended QP had started the batch with request 1: it was aborted at once.
        assert_eq!(np.counters().wr_aborts, u64::from(extended));
        guard
            .wr(3, SendFlags::SIGNALED)
            .rdma_write(1, 2, null_sge())
            .post()
            .unwrap();
        drop(guard);
        let c = np.counters();
        let (doorbells, wrs) = if extended {
            (c.wr_completes, c.wr_ops - 1) // the aborted request reached wr_rdma_write
        } else {
            (c.post_send_calls, c.send_wrs)
        };
        assert_eq!(
            (doorbells, wrs, c.signaled),
            (1, 1, 1),
            "extended: {extended}"
        );
        assert_eq!(c.wr_aborts, u64::from(extended), "no second abort on drop");
    }
}

#[test]
fn receive_chains_post_one_chain_and_leave_the_guard_empty() {
    let np = NullProvider::new();
    let (mut qp, _cq) = np.sideway(false);
    qp.start_post_recv()
        .recv(1, &[null_sge()])
        .recv(2, &[])
        .post()
        .unwrap();
    let mut guard = qp.start_post_recv();
    guard.recv(3, &[null_sge()]).post().unwrap();
    assert!(guard.is_empty());
    guard.post().unwrap(); // empty: nothing reaches the provider
    let c = np.counters();
    assert_eq!((c.post_recv_calls, c.recv_wrs, c.wr_id_sum), (2, 3, 6));
}

#[test]
fn chains_allocate_nothing() {
    for extended in [false, true] {
        let np = NullProvider::new();
        let (mut qp, _cq) = np.sideway(extended);
        let sge = null_sge();
        // The first post may set up what the QP keeps; steady state starts after it.
        qp.start_post_send()
            .wr(0, SendFlags::SIGNALED)
            .rdma_write(1, 2, sge)
            .post()
            .unwrap();
        let ((), allocations) = count_allocations(|| {
            for i in 0..100 {
                qp.start_post_send()
                    .wr(i, SendFlags::empty())
                    .rdma_write(1, 2, sge)
                    .wr(i, SendFlags::SIGNALED)
                    .send(sge)
                    .post()
                    .unwrap();
                if !extended {
                    qp.start_post_recv().recv(i, &[sge]).post().unwrap();
                }
            }
        });
        assert_eq!(allocations, 0, "extended: {extended}");
    }
}

/// The operations an extended QP refuses: one outside its `send_ops_flags`, and one its
/// provider left out (the null provider has no `wr_send_inv` or `wr_local_inv`). Each is
/// refused with `NotEnabled` before the provider sees anything of its batch, as before the
/// QP kept the provider's functions (`ExOps`); a refusal after a request aborts the batch.
#[test]
fn an_extended_qp_refuses_what_it_was_not_created_for_before_any_provider_call() {
    use sideway::queue_pair::SendOpsFlags;
    let not_enabled = |r: Result<(), PostError>, op: &str| match r {
        Err(PostError::Invalid {
            reason: InvalidWorkRequest::NotEnabled { op: got },
            ..
        }) => assert_eq!(got, op),
        other => panic!("{op}: {other:?}"),
    };
    let np = NullProvider::new();
    let (mut only_write, _cq) = np.sideway_with(true, |b| {
        b.send_ops_flags(SendOpsFlags::RDMA_WRITE);
    });
    let send = only_write
        .start_post_send()
        .wr(1, SendFlags::SIGNALED)
        .send(null_sge())
        .post();
    not_enabled(send, "SEND");
    let (mut all, _cq2) = np.sideway(true);
    let inv = all
        .start_post_send()
        .wr(2, SendFlags::SIGNALED)
        .send_with_invalidate(7, null_sge())
        .post();
    not_enabled(inv, "SEND with invalidate");
    let local = all
        .start_post_send()
        .wr(3, SendFlags::SIGNALED)
        .local_invalidate(7)
        .post();
    not_enabled(local, "local invalidate");
    assert_eq!(
        np.counters(),
        Counters::default(),
        "the provider saw nothing of the refused batches"
    );
    // After a request the QP may post, the refusal aborts the started batch.
    let mixed = only_write
        .start_post_send()
        .wr(4, SendFlags::empty())
        .rdma_write(1, 2, null_sge())
        .wr(5, SendFlags::SIGNALED)
        .send(null_sge())
        .post();
    not_enabled(mixed, "SEND");
    let c = np.counters();
    assert_eq!(
        (c.wr_starts, c.wr_ops, c.wr_aborts, c.wr_completes),
        (1, 1, 1, 0)
    );
    // And what it was created for goes through the functions read at creation.
    only_write
        .start_post_send()
        .wr(6, SendFlags::SIGNALED)
        .rdma_write(1, 2, null_sge())
        .post()
        .unwrap();
    let c = np.counters();
    assert_eq!(
        (c.wr_starts, c.wr_ops, c.wr_sges, c.wr_completes, c.signaled),
        (2, 2, 2, 1, 1)
    );
}
