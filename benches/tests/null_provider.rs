//! The benchmarks over the null provider measure what they claim: every Rust operation
//! reaches the provider with exactly what its C twin does (same calls, same requests, same
//! completions), and none allocates in steady state. Needs no device and no rdma-core
//! library.

use benches::alloc_counter::{count_allocations, CountingAllocator};
use benches::data_path::{run_c, run_rust, COp, RawObjects, Write, MAX_BATCH, MAX_POLL};
use benches::null_provider::{Counters, NullProvider};
use sideway::CompletionQueueError;

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

fn c_side(op: COp, extended: bool, iters: u64) -> (Counters, u64) {
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
    let sum = unsafe { run_c(op, &objs, extended, &w, iters) }
        .unwrap_or_else(|e| panic!("{op:?} (extended: {extended}), C: {e}"));
    (np.counters(), sum)
}

#[test]
fn rust_and_c_hand_the_provider_the_same_work() {
    for (op, extended) in operations() {
        let rust = rust_side(op, extended, ITERS);
        let c = c_side(op, extended, ITERS);
        assert_eq!(rust, c, "{op:?} (extended: {extended}): Rust vs C");
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
            let wrs: Vec<u64> = (0..4).collect();
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

#[test]
fn only_extended_cqs_refuse_a_second_poller() {
    // A classic CQ has no start..end poll sequence to protect: two pollers may coexist.
    let np = NullProvider::new();
    let (_qp, cq) = np.sideway(false);
    let first = cq.poll().unwrap();
    let second = cq.poll().unwrap();
    drop((first, second));

    let np = NullProvider::new();
    let (_qp, cq) = np.sideway(true);
    np.add_completions(1);
    let first = cq.poll().unwrap();
    assert!(matches!(cq.poll(), Err(CompletionQueueError::Busy)));
    let mut into = [sideway::WorkCompletion::default(); 1];
    assert!(matches!(
        cq.poll_into(&mut into),
        Err(CompletionQueueError::Busy)
    ));
    drop(first);
    assert!(cq.poll().is_ok(), "the flag is released with the poller");
}
