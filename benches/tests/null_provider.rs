//! The benchmarks over the null provider measure what they claim: every Rust operation
//! reaches the provider with exactly what its C twin does (same calls, same requests, same
//! completions), and none allocates in steady state. Needs no device and no rdma-core
//! library.

use benches::alloc_counter::{count_allocations, CountingAllocator};
use benches::data_path::{
    run_c_style, run_rust, COp, CStyle, RawObjects, Write, MAX_BATCH, MAX_POLL,
};
use benches::null_provider::{Counters, NullProvider};
use sideway::completion_queue::CompletionQueueError;
use sideway::queue_pair::{InvalidWorkRequest, PostError, SendFlags};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const ITERS: u64 = 200;

/// Every operation the benchmarks time, with whether it has an extended form.
fn operations() -> Vec<(COp, bool)> {
    let mut ops = Vec::new();
    for extended in [false, true] {
        ops.push((COp::PostWrite, extended));
        for n in [1, 8, 32, MAX_BATCH] {
            ops.push((COp::PostWriteBatch(n), extended));
        }
        for n in [1, MAX_POLL] {
            ops.push((COp::PollIter(n), extended));
            ops.push((COp::PollBatch(n), extended));
        }
        ops.push((COp::Cycle, extended));
    }
    ops.push((COp::PostRecv, false));
    ops
}

fn rust_side(op: COp, extended: bool, iters: u64) -> (Counters, u64) {
    let np = NullProvider::new();
    let (mut qp, cq) = np.sideway(extended);
    assert_eq!(qp.is_extended(), extended);
    assert_eq!(cq.is_extended(), extended);
    // SAFETY: posted only to the null provider.
    let w = unsafe { Write::null() };
    let sum = run_rust(op, &mut qp, &cq, Some(&np), &w, iters)
        .unwrap_or_else(|e| panic!("{op:?} (extended: {extended}), Rust: {e}"));
    (np.counters(), sum)
}

fn c_side(style: CStyle, op: COp, extended: bool, iters: u64) -> (Counters, u64) {
    let np = NullProvider::new();
    let objs = RawObjects {
        qp: np.qp_raw(),
        qp_ex: np.qp_ex_raw(),
        cq: np.cq_raw(),
        cq_ex: np.cq_ex_raw(),
    };
    // SAFETY: posted only to the null provider.
    let w = unsafe { Write::null() };
    // SAFETY: objs are np's live objects, used only by this call on this thread; w goes to
    // the null provider only.
    let sum = unsafe { run_c_style(style, op, &objs, extended, &w, iters) }
        .unwrap_or_else(|e| panic!("{op:?} (extended: {extended}), C {style:?}: {e}"));
    (np.counters(), sum)
}

#[test]
fn rust_and_c_hand_the_provider_the_same_work() {
    for (op, extended) in operations() {
        let rust = rust_side(op, extended, ITERS);
        for style in [CStyle::Inline, CStyle::Cached] {
            let c = c_side(style, op, extended, ITERS);
            assert_eq!(
                rust, c,
                "{op:?} (extended: {extended}): Rust vs C {style:?}"
            );
        }
    }
}

#[test]
fn batches_ring_one_doorbell_and_signal_the_last_request() {
    for n in [1u32, 8, 64] {
        let (classic, _) = rust_side(COp::PostWriteBatch(n), false, ITERS);
        assert_eq!(
            classic.post_send_calls, ITERS,
            "one ibv_post_send per batch of {n}"
        );
        assert_eq!(classic.send_wrs, ITERS * u64::from(n));
        assert_eq!(classic.signaled, ITERS);
        assert_eq!(classic.length_sum, ITERS * u64::from(n) * 64);
        let requests = ITERS * u64::from(n);
        assert_eq!(
            classic.wr_id_sum,
            requests * (requests - 1) / 2,
            "wr_ids 0, 1, ..."
        );

        let (ex, _) = rust_side(COp::PostWriteBatch(n), true, ITERS);
        assert_eq!(
            (ex.wr_starts, ex.wr_completes, ex.wr_aborts),
            (ITERS, ITERS, 0)
        );
        assert_eq!((ex.wr_ops, ex.wr_sges), (requests, requests));
        assert_eq!(ex.signaled, ITERS);
        assert_eq!(
            ex.post_send_calls, 0,
            "extended QPs never use ibv_post_send"
        );
    }
}

#[test]
fn polls_return_every_completion_made_ready() {
    for extended in [false, true] {
        for n in [1u32, MAX_POLL] {
            for op in [COp::PollIter(n), COp::PollBatch(n)] {
                let (counters, sum) = rust_side(op, extended, ITERS);
                let total = ITERS * u64::from(n);
                assert_eq!(counters.completions, total, "{op:?} (extended: {extended})");
                assert_eq!(sum, total * (total - 1) / 2, "canned wr_ids 0, 1, ...");
            }
        }
        let (cycle, sum) = rust_side(COp::Cycle, extended, ITERS);
        assert_eq!((cycle.signaled, cycle.completions), (ITERS, ITERS));
        assert_eq!(sum, ITERS * (ITERS - 1) / 2);
    }
}

#[test]
fn the_data_path_allocates_nothing_per_operation() {
    for (op, extended) in operations() {
        let np = NullProvider::new();
        let (mut qp, cq) = np.sideway(extended);
        // SAFETY: posted only to the null provider.
        let w = unsafe { Write::null() };
        // Warm-up: anything lazily set up on first use is not steady state.
        run_rust(op, &mut qp, &cq, Some(&np), &w, 10).unwrap();
        let (result, allocations) =
            count_allocations(|| run_rust(op, &mut qp, &cq, Some(&np), &w, 1000));
        result.unwrap();
        assert_eq!(
            allocations, 0,
            "{op:?} (extended: {extended}) allocated {allocations} times in 1000 operations"
        );
    }
}

#[test]
fn the_allocation_check_sees_an_allocating_loop() {
    // The same measurement around a loop that does allocate must count it, or the test
    // above could not fail.
    let np = NullProvider::new();
    let (mut qp, cq) = np.sideway(false);
    // SAFETY: posted only to the null provider.
    let w = unsafe { Write::null() };
    let ((), allocations) = count_allocations(|| {
        for _ in 0..10 {
            // black_box: an optimised build would otherwise see that only the length is
            // used and never allocate the Vec.
            let wrs: Vec<u64> = std::hint::black_box((0..4).collect());
            run_rust(
                COp::PostWrite,
                &mut qp,
                &cq,
                Some(&np),
                &w,
                wrs.len() as u64,
            )
            .unwrap();
        }
    });
    assert_eq!(allocations, 10);
}

/// Classic CQs too: their provider may not lock the CQ (mlx5's single-threaded mode, thread
/// domains), so a second poller, on any thread, is refused while the first lives.
#[test]
fn every_cq_refuses_a_second_poller() {
    for extended in [false, true] {
        let np = NullProvider::new();
        let (_qp, cq) = np.sideway(extended);
        np.add_completions(1);
        let first = cq.poll().unwrap();
        assert!(
            matches!(cq.poll(), Err(CompletionQueueError::Busy)),
            "extended: {extended}"
        );
        let mut into = [sideway::completion_queue::WorkCompletion::default(); 1];
        assert!(matches!(
            cq.poll_into(&mut into),
            Err(CompletionQueueError::Busy)
        ));
        drop(first);
        assert!(cq.poll().is_ok(), "the flag is released with the poller");
    }
}

/// One 64-byte entry for the null provider, which never dereferences it.
fn null_sge() -> sideway::memory_region::Sge {
    // SAFETY: posted only to the null provider, which reads only the length.
    unsafe { sideway::memory_region::Sge::from_raw_parts(0x20_0000, 64, 0x5678) }
}

#[test]
fn a_batch_past_the_storage_is_refused_whole_and_the_next_one_posts() {
    let np = NullProvider::new();
    let (mut qp, _cq) = np.sideway(false);
    let capacity = qp.cap().max_send_wr as usize;
    let mut batch = qp.start_post_send();
    for k in 0..=capacity as u64 {
        batch.wr(k, SendFlags::empty()).rdma_write(1, 2, null_sge());
    }
    assert_eq!(
        batch.len(),
        capacity,
        "the request past the storage is not added"
    );
    match batch.post() {
        Err(PostError::Invalid {
            index,
            wr_id,
            reason: InvalidWorkRequest::BatchFull { capacity: c, .. },
            ..
        }) => assert_eq!((index, wr_id, c), (capacity, capacity as u64, capacity)),
        other => panic!("expected BatchFull, got {other:?}"),
    }
    assert_eq!(
        np.counters(),
        Counters::default(),
        "nothing reached the provider"
    );

    // The storage serves the next batch from its start, with a chain of exactly its own.
    let mut batch = qp.start_post_send();
    batch
        .wr(7, SendFlags::SIGNALED)
        .rdma_write(1, 2, null_sge());
    batch
        .wr(8, SendFlags::SIGNALED)
        .rdma_write(1, 2, null_sge());
    batch.post().unwrap();
    let c = np.counters();
    assert_eq!((c.post_send_calls, c.send_wrs, c.wr_id_sum), (1, 2, 15));
}

#[test]
fn nothing_after_a_refused_request_reaches_the_provider() {
    let two = [null_sge(), null_sge()];
    for extended in [false, true] {
        let np = NullProvider::new();
        let (mut qp, _cq) = np.sideway(extended);
        assert_eq!(
            qp.cap().max_send_sge,
            1,
            "the default QP takes one SGE per request"
        );
        let mut batch = qp.start_post_send();
        batch.wr(1, SendFlags::empty()).rdma_write(1, 2, null_sge());
        batch.wr(2, SendFlags::empty()).rdma_write(1, 2, &two);
        batch.wr(3, SendFlags::empty()).rdma_write(1, 2, null_sge());
        assert_eq!(batch.len(), 1, "extended: {extended}");
        match batch.post() {
            Err(PostError::Invalid {
                index: 1,
                wr_id: 2,
                reason:
                    InvalidWorkRequest::TooManySge {
                        given: 2, max: 1, ..
                    },
                ..
            }) => {}
            other => panic!("extended: {extended}: expected TooManySge, got {other:?}"),
        }
        let c = np.counters();
        assert_eq!(c.post_send_calls, 0);
        // An extended QP had the first request: the batch was started, then aborted.
        let expected = if extended { (1, 1, 1, 0) } else { (0, 0, 0, 0) };
        assert_eq!(
            (c.wr_starts, c.wr_ops, c.wr_aborts, c.wr_completes),
            expected,
            "extended: {extended}"
        );

        // A refused first request leaves nothing to abort, and the next batch is whole.
        let mut batch = qp.start_post_send();
        batch.wr(4, SendFlags::empty()).rdma_write(1, 2, &two);
        assert!(batch.is_empty());
        assert!(batch.post().is_err());
        let mut batch = qp.start_post_send();
        batch
            .wr(5, SendFlags::SIGNALED)
            .rdma_write(1, 2, null_sge());
        batch.post().unwrap();
        let c = np.counters();
        let (posted, ops) = if extended {
            (c.wr_completes, c.wr_ops)
        } else {
            (c.post_send_calls, c.send_wrs)
        };
        assert_eq!((posted, ops), if extended { (1, 2) } else { (1, 1) });
        assert_eq!(c.wr_aborts, u64::from(extended));
        assert_eq!(c.signaled, 1);
    }
}

#[test]
fn receives_past_the_storage_are_refused_and_chains_end_at_their_batch() {
    let np = NullProvider::new();
    let (mut qp, _cq) = np.sideway(false);
    let capacity = qp.cap().max_recv_wr as usize;
    let mut batch = qp.start_post_recv();
    for k in 0..=capacity as u64 {
        batch.recv(k, &[null_sge()]);
    }
    assert!(matches!(
        batch.post(),
        Err(PostError::Invalid {
            reason: InvalidWorkRequest::BatchFull { .. },
            ..
        })
    ));
    assert_eq!(np.counters().post_recv_calls, 0);
    // A shorter batch over the same storage: its chain ends at its own last receive.
    let mut batch = qp.start_post_recv();
    batch.recv(1, &[null_sge()]).recv(2, &[]);
    batch.post().unwrap();
    let c = np.counters();
    assert_eq!((c.post_recv_calls, c.recv_wrs, c.wr_id_sum), (1, 2, 3));
}
