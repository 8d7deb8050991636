//! Criterion benchmarks of the data path: every operation of `benches::data_path`, its Rust
//! side (over sideway) and its C side (over verbs.h's inlines) in one group.
//!
//! `cargo bench -p benches --bench data_path` runs them over the null provider, on any
//! machine. With an RDMA device (or `RDMA_TEST_DEVICE=<name>`, which makes a missing device
//! an error) it also times a loopback RDMA WRITE + poll on the device; without one that
//! group is skipped with a message.
//!
//! For the one-table comparison, see the `compare` bench.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::data_path::{null_provider_pairs, run_c, run_rust, COp, Pair, RawObjects, Write};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sideway::completion_queue::CompletionQueue;
use sideway::device::DeviceContext;
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::queue_pair::{ConnectOptions, QueuePair};

fn bench_pair(c: &mut Criterion, mut pair: Pair) {
    let mut group = c.benchmark_group(&pair.name);
    group.throughput(Throughput::Elements(pair.per_iter));
    let timed = |f: &mut dyn FnMut(u64), iters: u64| {
        let start = Instant::now();
        f(iters);
        start.elapsed()
    };
    group.bench_function("rust", |b| {
        b.iter_custom(|iters| timed(&mut pair.rust, iters))
    });
    group.bench_function("c", |b| b.iter_custom(|iters| timed(&mut pair.c, iters)));
    group.finish();
}

fn null_provider(c: &mut Criterion) {
    for pair in null_provider_pairs() {
        bench_pair(c, pair);
    }
}

/// A loopback connection on a real device: `qp` writes into `dst` through `peer`.
struct Loopback {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    _peer: QueuePair,
    _src: RegisteredBuffer,
    _dst: RegisteredBuffer,
    write: Write,
}

/// The device, or `None` (after printing why) when there is none and none is required.
fn device_or_skip() -> Option<Arc<DeviceContext>> {
    let test = "device benchmarks (loopback WRITE + poll)";
    match sideway::testing::test_device(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestDevice::Ready(ctx) => Some(ctx),
        sideway::testing::TestDevice::Skip(skip) => {
            println!("{skip}");
            None
        }
    }
}

fn loopback(
    ctx: &Arc<DeviceContext>,
    extended: bool,
) -> Result<Loopback, Box<dyn std::error::Error>> {
    let pd = ctx.alloc_pd()?;
    let make_cq = || {
        let b = ctx.create_cq_builder();
        if extended {
            b.build_ex()
        } else {
            b.build()
        }
    };
    let (cq, peer_cq) = (make_cq()?, make_cq()?);
    let make_qp = |cq: &Arc<CompletionQueue>| {
        let mut b = pd.create_qp_builder();
        b.send_cq(cq).recv_cq(cq);
        if extended {
            b.build_ex()
        } else {
            b.build()
        }
    };
    let (qp, peer) = (make_qp(&cq)?, make_qp(&peer_cq)?);
    let mut opts = ConnectOptions::new();
    let port = ctx.query_port(1)?;
    let gid_index = sideway::testing::gid_index(ctx);
    opts.gid_index(gid_index).path_mtu(port.active_mtu());
    let (a, b) = (qp.local_endpoint(&opts)?, peer.local_endpoint(&opts)?);
    qp.connect(&opts, &b)?;
    peer.connect(&opts, &a)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let src = pd.reg_buffer(4096, access)?;
    let dst = pd.reg_buffer(4096, access)?;
    let sge = src.sge(0..64).ok_or("64 bytes fit in 4096")?;
    let write = Write::new(dst.rkey(), dst.addr(), sge);
    Ok(Loopback {
        qp,
        cq,
        _peer: peer,
        _src: src,
        _dst: dst,
        write,
    })
}

fn device_pair(ctx: &Arc<DeviceContext>, extended: bool) -> Option<Pair> {
    let kind = if extended { "extended" } else { "classic" };
    let lb = match loopback(ctx, extended) {
        Ok(lb) => lb,
        Err(e) if extended => {
            println!("skipped: device loopback WRITE + poll ({kind}): {e}");
            return None;
        }
        Err(e) => panic!("device loopback ({kind}) on {}: {e}", ctx.name()),
    };
    let objs = RawObjects {
        qp: lb.qp.as_raw(),
        qp_ex: lb.qp.as_raw_ex().unwrap_or(std::ptr::null_mut()),
        cq: lb.cq.as_raw(),
        cq_ex: lb.cq.as_raw_ex().unwrap_or(std::ptr::null_mut()),
    };
    let w = lb.write;
    // Both sides drive the same QP, one after the other; the Rc keeps it alive for both.
    let rust_lb = Rc::new(RefCell::new(lb));
    let c_lb = Rc::clone(&rust_lb);
    Some(Pair {
        name: format!("device {}: post WRITE + poll ({kind})", ctx.name()),
        per_iter: 1,
        rust: Box::new(move |iters| {
            let mut lb = rust_lb.borrow_mut();
            let Loopback { qp, cq, .. } = &mut *lb;
            run_rust(COp::Cycle, qp, cq, None, &w, iters).expect("device cycle (Rust)");
        }),
        c: Box::new(move |iters| {
            let _alive = c_lb.borrow_mut();
            // SAFETY: objs are the live objects of c_lb (borrowed for the call, so no Rust
            // side runs meanwhile); w's SGE names the registered src buffer.
            unsafe { run_c(COp::Cycle, &objs, extended, &w, iters) }.expect("device cycle (C)");
        }),
    })
}

fn device(c: &mut Criterion) {
    let Some(ctx) = device_or_skip() else {
        return;
    };
    for extended in [false, true] {
        if let Some(pair) = device_pair(&ctx, extended) {
            bench_pair(c, pair);
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = null_provider, device
}
criterion_main!(benches);
