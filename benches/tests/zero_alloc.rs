//! The data path allocates nothing in steady state: after a warm-up, 10,000 cycles of "post
//! one signaled RDMA WRITE, poll until its completion" (and 2,000 SEND/receive round trips)
//! make no heap allocation, on classic and on extended QPs and CQs.
//!
//! A device test: without an RDMA device it prints `skipped: <reason>` and passes; with
//! `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets it) it must run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::alloc_counter::{count_allocations, CountingAllocator};
use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::device::DeviceContext;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{ConnectOptions, QueuePair, SendFlags};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const WRITES: u64 = 10_000;
const SENDS: u64 = 2_000;
const WARM_UP: u64 = 100;

/// The device, or `None` (after printing why) when there is none and none is required.
fn device_or_skip(test: &str) -> Option<Arc<DeviceContext>> {
    match sideway::testing::test_device(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestDevice::Ready(ctx) => Some(ctx),
        sideway::testing::TestDevice::Skip(skip) => {
            println!("{skip}");
            None
        }
    }
}

fn qp(ctx: &Arc<DeviceContext>, extended: bool) -> (QueuePair, Arc<CompletionQueue>) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = if extended {
        ctx.create_cq_builder().build_ex().unwrap()
    } else {
        ctx.create_cq_builder().build().unwrap()
    };
    let mut b = pd.create_qp_builder();
    b.send_cq(&cq).recv_cq(&cq).max_inline_data(16);
    let qp = if extended { b.build_ex() } else { b.build() }.unwrap();
    (qp, cq)
}

/// Polls `cq` until one completion arrives (failing after 10 s) and checks it succeeded.
fn wait_one(cq: &CompletionQueue, slots: &mut [WorkCompletion; 4]) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cq.poll_into(&mut slots[..1]).unwrap() {
            0 if Instant::now() > deadline => panic!("no completion within 10 s"),
            0 => continue,
            _ => {
                let wc = slots[0];
                wc.ok().unwrap();
                return wc;
            }
        }
    }
}

fn run(test: &str, extended: bool) {
    let Some(ctx) = device_or_skip(test) else {
        return;
    };
    let (mut a, cq_a) = qp(&ctx, extended);
    let (mut b, cq_b) = qp(&ctx, extended);
    let mut opts = ConnectOptions::new();
    opts.gid_index(sideway::testing::gid_index(&ctx))
        .path_mtu(ctx.query_port(1).unwrap().active_mtu());
    let (ea, eb) = (
        a.local_endpoint(&opts).unwrap(),
        b.local_endpoint(&opts).unwrap(),
    );
    a.connect(&opts, &eb).unwrap();
    b.connect(&opts, &ea).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let src = a.pd().reg_buffer(4096, access).unwrap();
    let dst = b.pd().reg_buffer(4096, access).unwrap();
    let (rkey, raddr) = (dst.rkey(), dst.addr());
    let mut slots = [WorkCompletion::default(); 4];

    let mut write = |i: u64| {
        let sge = src.sge(0..64).unwrap();
        let mut batch = a.start_post_send();
        batch
            .wr(i, SendFlags::SIGNALED)
            .rdma_write(rkey, raddr, sge);
        batch.post().unwrap();
        assert_eq!(wait_one(&cq_a, &mut slots).wr_id(), i);
    };
    for i in 0..WARM_UP {
        write(i);
    }
    let ((), n) = count_allocations(|| (0..WRITES).for_each(&mut write));
    assert_eq!(n, 0, "{WRITES} write+poll cycles allocated {n} times");

    let recv_sge = dst.sge(0..64).unwrap();
    let mut round_trip = |i: u64, b: &mut QueuePair, a: &mut QueuePair| {
        let mut recv = b.start_post_recv();
        recv.recv(i, &[recv_sge]);
        recv.post().unwrap();
        let bytes = i.to_le_bytes();
        let mut batch = a.start_post_send();
        batch.wr(i, SendFlags::SIGNALED).send(&bytes);
        batch.post().unwrap();
        assert_eq!(wait_one(&cq_a, &mut slots).wr_id(), i);
        let wc = wait_one(&cq_b, &mut slots);
        assert_eq!((wc.wr_id(), wc.byte_len()), (i, 8));
    };
    for i in 0..WARM_UP {
        round_trip(i, &mut b, &mut a);
    }
    let ((), n) = count_allocations(|| {
        for i in 0..SENDS {
            round_trip(i, &mut b, &mut a);
        }
    });
    assert_eq!(n, 0, "{SENDS} send/recv round trips allocated {n} times");
    let mut last = [0u8; 8];
    dst.read_at(0, &mut last).unwrap();
    assert_eq!(last, (SENDS - 1).to_le_bytes());
}

#[test]
fn classic_post_and_poll_allocate_nothing() {
    run("classic_post_and_poll_allocate_nothing", false);
}

#[test]
fn extended_post_and_poll_allocate_nothing() {
    run("extended_post_and_poll_allocate_nothing", true);
}
