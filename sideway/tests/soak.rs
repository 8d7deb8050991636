//! Soak tests: many connect-and-tear-down cycles leave nothing behind.
//!
//! A program that serves connections for months creates and destroys queue pairs, regions
//! and rdma_cm ids millions of times; one file descriptor or kernel object left per cycle is
//! an outage. Each test runs `SOAK_CYCLES` (default 1000) cycles after one warm-up cycle and
//! compares, before and after: this process's open file descriptors (`/proc/self/fd`), the
//! device's kernel objects as `rdma resource show` counts them (pd, cq, qp, cm_id, mr, ctx),
//! and the memory sideway had to leak (`sideway::memory_region::leaked_memory`, which must stay 0).
//!
//! The kernel's counts are the device's, not this process's: the two tests take turns (one
//! lock), and the device test run starts one test binary at a time.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sideway::device::DeviceContext;
use sideway::memory_region::{leaked_memory, AccessFlags};
use sideway::queue_pair::SendFlags;
use sideway::rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace};

/// One test at a time: the kernel's counts are the whole device's.
static TURN: Mutex<()> = Mutex::new(());

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const RESOLVE: Duration = Duration::from_secs(2);

/// How many cycles: `SOAK_CYCLES`, default 1000.
fn cycles() -> u32 {
    match std::env::var("SOAK_CYCLES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("SOAK_CYCLES={v:?} is not a number")),
        Err(_) => 1000,
    }
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// The kernel's objects on `device` (`rdma resource show`: pd, cq, qp, cm_id, mr, ctx, ...),
/// by kind.
fn kernel_objects(device: &str) -> BTreeMap<String, u64> {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `rdma resource show` (iproute2) to count kernel objects: {e}")
        });
    assert!(
        out.status.success(),
        "`rdma resource show` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "0: rxe0: pd 2 cq 3 qp 2 cm_id 1 mr 1 ctx 1 srq 0"
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{device}:")))
        .unwrap_or_else(|| panic!("`rdma resource show` does not list {device}: {text}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    words
        .chunks_exact(2)
        .filter_map(|kv| Some((kv[0].to_owned(), kv[1].parse().ok()?)))
        .collect()
}

/// What a cycle may leave behind, counted.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    fds: usize,
    kernel: BTreeMap<String, u64>,
    leaked_regions: u64,
}

fn footprint(device: &str) -> Footprint {
    Footprint {
        fds: open_fds(),
        kernel: kernel_objects(device),
        leaked_regions: leaked_memory().regions,
    }
}

/// Runs `cycle` once to warm up, then `n` times, and fails unless nothing grew.
fn soak(name: &str, device: &str, mut cycle: impl FnMut(u32)) {
    cycle(0);
    let before = footprint(device);
    let n = cycles();
    let started = Instant::now();
    for i in 1..=n {
        cycle(i);
    }
    let after = footprint(device);
    println!(
        "{name}: {n} cycles in {:.1} s; before {before:?}, after {after:?}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        before, after,
        "{name}: {n} cycles left something behind (file descriptors, the device's kernel \
         objects, or leaked memory)"
    );
}

/// Verbs: a PD, a CQ per side, a registered buffer per side and an RC pair connected to
/// each other, one SEND across, then everything dropped; every cycle.
#[test]
fn verbs_qp_cycles_leave_nothing_behind() {
    let Some(ctx) = common::device_or_skip("verbs_qp_cycles_leave_nothing_behind") else {
        return;
    };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let device = ctx.name().to_owned();
    soak("verbs QP cycles", &device, |i| verbs_cycle(&ctx, i));
}

fn verbs_cycle(ctx: &Arc<DeviceContext>, i: u32) {
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq_builder().cqe(8).build().unwrap();
    let cq_b = ctx.create_cq_builder().cqe(8).build().unwrap();
    let new = |cq| {
        let mut b = pd.create_qp_builder();
        b.send_cq(cq).recv_cq(cq).max_send_wr(4).max_recv_wr(4);
        b.build().unwrap()
    };
    let (mut a, mut b) = (new(&cq_a), new(&cq_b));
    pairs::connect(ctx, &a, &b);
    let mut out = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    let into = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    out.write_at(0, &i.to_le_bytes()).unwrap();
    let mut r = b.start_post_recv();
    r.recv(7, &[into.sge(0..64).unwrap()]);
    r.post().unwrap();
    let mut s = a.start_post_send();
    s.wr(9, SendFlags::SIGNALED).send(out.sge(0..4).unwrap());
    s.post().unwrap();
    assert!(pairs::wait_for(&cq_a, 1)[0].ok().is_ok(), "cycle {i}: send");
    let wc = pairs::wait_for(&cq_b, 1)[0];
    assert!(wc.ok().is_ok(), "cycle {i}: receive {wc:?}");
    assert_eq!(into.to_vec(0..4).unwrap(), i.to_le_bytes(), "cycle {i}");
}

/// A QP on the id, with its own PD and CQ (which the QP holds).
fn qp_on(id: &Arc<CmId>) -> sideway::queue_pair::QueuePair {
    let ctx = id.device_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().cqe(8).build().unwrap();
    id.create_qp(
        pd.create_qp_builder()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(4)
            .max_recv_wr(4),
    )
    .unwrap()
}

/// rdma_cm: a client id on its own event channel resolves, connects with a QP, the
/// listener's side accepts with a QP, both see the connection established, both disconnect,
/// and every id, QP and channel is dropped; every cycle. The listener stays.
#[test]
fn rdmacm_connect_cycles_leave_nothing_behind() {
    let Some(ip) = common::ip_or_skip("rdmacm_connect_cycles_leave_nothing_behind") else {
        return;
    };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let addr = SocketAddr::new(ip, 7471);
    let sch = EventChannel::new().unwrap();
    let listener = sch.create_id(PortSpace::Tcp).unwrap();
    listener.bind_addr(addr).unwrap();
    listener.listen(4).unwrap();
    let device = listener
        .device_context()
        .expect("a listener bound to a device address has a device")
        .name()
        .to_owned();
    soak("rdmacm connect cycles", &device, |i| {
        let cch = EventChannel::new().unwrap();
        let cid = cch.create_id(PortSpace::Tcp).unwrap();
        cid.resolve_addr(None, addr, RESOLVE).unwrap();
        cch.wait_for(EventType::AddrResolved, WAIT).unwrap();
        cid.resolve_route(RESOLVE).unwrap();
        cch.wait_for(EventType::RouteResolved, WAIT).unwrap();
        let client_qp = qp_on(&cid);
        cid.connect(&ConnParam::new()).unwrap();
        let req = sch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
        let sid = Arc::clone(req.id());
        drop(req);
        let server_qp = qp_on(&sid);
        sid.accept(&ConnParam::new()).unwrap();
        cch.wait_for(EventType::Established, WAIT)
            .unwrap_or_else(|e| panic!("cycle {i}: client: {e}"));
        sch.wait_for(EventType::Established, WAIT)
            .unwrap_or_else(|e| panic!("cycle {i}: server: {e}"));
        cid.disconnect().unwrap();
        sch.wait_for(EventType::Disconnected, WAIT).unwrap();
        sid.disconnect().unwrap();
        cch.wait_for(EventType::Disconnected, WAIT).unwrap();
        drop((sid, server_qp, cid, client_qp, cch));
    });
}
