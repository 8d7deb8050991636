//! Helpers for the device tests of UD, UC, SRQ, events and memory windows: queue pairs on
//! one device connected to each other (loopback), and bounded waits for completions.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::address_handle::AddressVector;
use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::device::DeviceContext;
use sideway::gid::Gid;
use sideway::queue_pair::{ConnectOptions, Endpoint, QueuePair};

/// Every wait of these tests gives up after this.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Connect options for loopback on port 1 with the test GID.
pub(crate) fn options(ctx: &DeviceContext, psn: u32) -> ConnectOptions {
    let mut o = ConnectOptions::new();
    let mtu = ctx.query_port(1).unwrap().active_mtu();
    o.port_num(1)
        .gid_index(crate::common::gid_index(ctx))
        .path_mtu(mtu)
        .sq_psn(psn);
    o
}

/// This port's GID at the test index.
pub(crate) fn local_gid(ctx: &DeviceContext) -> Gid {
    ctx.query_gid(1, crate::common::gid_index(ctx)).unwrap().gid
}

/// The endpoint of `qp` for the peer.
pub(crate) fn endpoint(ctx: &DeviceContext, qp: &QueuePair, psn: u32) -> Endpoint {
    Endpoint {
        lid: ctx.query_port(1).unwrap().lid(),
        qp_num: qp.qp_num(),
        psn,
        gid: local_gid(ctx),
    }
}

/// Connects `a` and `b` (RC or UC) to each other.
pub(crate) fn connect(ctx: &DeviceContext, a: &QueuePair, b: &QueuePair) {
    let (pa, pb) = (0x100, 0x200);
    a.connect(&options(ctx, pa), &endpoint(ctx, b, pb)).unwrap();
    b.connect(&options(ctx, pb), &endpoint(ctx, a, pa)).unwrap();
}

/// An address vector that reaches this device's port 1 (global, as RoCE needs).
pub(crate) fn loopback_av(ctx: &DeviceContext) -> AddressVector {
    let mut av = AddressVector::new();
    av.set_port_num(1)
        .set_dlid(ctx.query_port(1).unwrap().lid())
        .set_is_global(true)
        .set_dgid(local_gid(ctx))
        .set_sgid_index(crate::common::gid_index(ctx))
        .set_hop_limit(1);
    av
}

/// Polls `cq` until `n` completions arrived, failing after [`WAIT`].
pub(crate) fn wait_for(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    while out.len() < n {
        let got = cq.poll_into(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..got]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions within {WAIT:?}: {out:?}",
            out.len()
        );
        if got == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

/// The context, kept alive by the caller.
pub(crate) type Ctx = Arc<DeviceContext>;
