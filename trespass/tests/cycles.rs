//! 1000 connect/transfer/close cycles leak no fd and no RDMA object (`rdma resource show`,
//! which counts the whole machine's objects: this binary holds this one test, so nothing else
//! of the process runs beside it; the SoftRoCE run runs test binaries one at a time); then a
//! third as many in the shared-receive-queue mode, after which its pool is gone too.
//!
//! Device test: it skips without a device, and fails with `RDMA_TEST_DEVICE` set and none.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use trespass::Config;

/// `rdma resource show`'s counts of this machine's RDMA objects (pd, cq, qp, cm_id, mr, ctx,
/// summed over devices), or `None` when the `rdma` tool is not there.
fn rdma_resources() -> Option<std::collections::BTreeMap<String, u64>> {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mut counts = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if let (name, Ok(n)) = (pair[0], pair[1].parse::<u64>()) {
                if ["pd", "cq", "qp", "cm_id", "mr", "ctx", "srq"].contains(&name) {
                    *counts.entry(name.to_string()).or_insert(0) += n;
                }
            }
        }
    }
    Some(counts)
}

#[test]
fn many_connect_transfer_close_cycles_leak_no_fd_and_no_rdma_object() {
    let Some(ip) =
        common::test_ip("many_connect_transfer_close_cycles_leak_no_fd_and_no_rdma_object")
    else {
        return;
    };
    // 1000 on a device the rig names (about half a minute under emulation), TRESPASS_CYCLES
    // to choose; the shared mode runs a third as many.
    let cycles: usize = std::env::var("TRESPASS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut config = Config::new();
    config.ring_size(64 * 1024).send_buffer(32 * 1024);
    config.keepalive(None);
    cycle(SocketAddr::new(ip, 7609), &config, cycles);
    // Counted once the first listener is gone: librdmacm keeps the device context it
    // opened for the life of the process.
    let between = settled(rdma_resources, |_| true);
    config.shared_receive_queue(Some(64));
    let shared_cycles = cycles.div_ceil(3).max(6);
    cycle(SocketAddr::new(ip, 7647), &config, shared_cycles);
    // Every listener and connection is closed, so the pool (its PD, SRQ and CQ) is too.
    if let Some(b) = between {
        let a = settled(rdma_resources, |a| a.as_ref() == Some(&b));
        assert_eq!(
            a,
            Some(b),
            "RDMA objects left once the shared mode's connections closed"
        );
    }
}

/// What `count` says once `done` holds for it, or once it stopped changing (the same for
/// 300 ms), or after 10 s: a closed connection's last objects go on the keep-alive thread's
/// next pass (every 100 ms), later on a loaded machine; a leak stays and fails the caller's
/// comparison.
fn settled<T: PartialEq>(count: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    thread::sleep(Duration::from_millis(300));
    let mut last = count();
    loop {
        if Instant::now() >= deadline {
            return last;
        }
        thread::sleep(Duration::from_millis(300));
        let now = count();
        // Settled: `done` holds, and the count is the one read 300 ms before.
        let steady = now == last;
        last = now;
        if done(&last) && steady {
            return last;
        }
    }
}

/// `cycles` connections to a listener on `addr`, each echoing 64 bytes (written, or lent
/// every other cycle): the fds and RDMA
/// objects after the last may not exceed those after the fifth (the listener, and in the
/// shared mode the pool it holds, exist at both points).
fn cycle(addr: SocketAddr, config: &Config, cycles: usize) {
    let listener = config.bind(addr).unwrap();
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let mut before = (0, None);
    let cfg = config.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = thread::spawn(move || {
        for _ in 0..cycles {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            s.write_all(&buf[..n]).unwrap();
            // The client reads to end of stream: this side's drop ends it.
        }
        done_rx.recv().ok();
    });
    let t0 = Instant::now();
    for i in 0..cycles {
        if i == 5 {
            // The keep-alive thread may hold a closed connection for one of its passes.
            before = settled(|| (fds(), rdma_resources()), |_| true);
        }
        let mut c = cfg.connect(addr).unwrap();
        // Every other cycle lends its bytes (zero-copy): the server's read fetches them,
        // and the buffer comes back; a registration either side kept would show below.
        if i % 2 == 1 {
            c.lend_msg(common::pattern(i as u64, 64)).unwrap();
        } else {
            c.write_all(&common::pattern(i as u64, 64)).unwrap();
        }
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap_or_else(|e| {
            panic!(
                "cycle {i} ({}): {e}",
                if i % 2 == 1 { "lent" } else { "written" }
            )
        });
        assert_eq!(back[..], common::pattern(i as u64, 64)[..]);
        if i % 2 == 1 {
            assert_eq!(c.reclaim().unwrap(), common::pattern(i as u64, 64));
        }
    }
    let (after_fds, after_rdma) = settled(
        || (fds(), rdma_resources()),
        |(f, r)| *f <= before.0 && *r == before.1,
    );
    done_tx.send(()).unwrap();
    server.join().unwrap();
    println!(
        "{cycles} cycles on port {} in {:.1} s: {} fds after 5 cycles, {after_fds} at the end; rdma objects {:?} then {:?}",
        addr.port(),
        t0.elapsed().as_secs_f64(),
        before.0,
        before.1,
        after_rdma
    );
    assert!(
        after_fds <= before.0,
        "fds grew from {} to {after_fds}",
        before.0
    );
    match (before.1, after_rdma) {
        (Some(b), Some(a)) => assert_eq!(a, b, "RDMA objects leaked"),
        _ => println!("skipped: the rdma tool is not installed: RDMA object counts not compared"),
    }
}
