//! System calls per round trip when every wait sleeps (device test; both sides in this
//! process). A wait that sleeps looks at the connection's readiness fd once and reads only
//! the fds that have something: no read of an empty completion channel or eventfd, no
//! rdma_cm event fetch that fails with EAGAIN. The kernel counts every read- and write-like
//! system call a process makes, failed ones included (`syscr` and `syscw` in
//! `/proc/self/io`), so the count is a deterministic gate, unlike any timing.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::Duration;

use trespass::Config;

const WARM_UP: usize = 50;
const MEASURED: usize = 500;

/// The process's read- and write-like system calls so far (`syscr` + `syscw`).
fn read_write_calls() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io")
        .expect("reading /proc/self/io (the kernel's per-process I/O accounting)");
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/self/io: {io}"))
    };
    field("syscr:") + field("syscw:")
}

/// Read and write system calls per round trip of a `size`-byte ping-pong in which every
/// wait sleeps (no busy poll), both sides together.
fn calls_per_round_trip(ip: IpAddr, port: u16, size: usize) -> f64 {
    let addr = SocketAddr::new(ip, port);
    let mut config = Config::new();
    config
        .busy_poll(Duration::ZERO)
        .busy_poll_max(Duration::ZERO);
    let listener = config.bind(addr).unwrap();
    let cfg = config.clone();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; size];
        for _ in 0..WARM_UP + MEASURED {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        s
    });
    let mut c = cfg.connect(addr).unwrap();
    let out = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut start = 0;
    for i in 0..WARM_UP + MEASURED {
        if i == WARM_UP {
            start = read_write_calls();
        }
        c.write_all(&out).unwrap();
        c.read_exact(&mut back).unwrap();
    }
    let used = read_write_calls() - start;
    let s = server.join().unwrap();
    drop((c, s));
    used as f64 / MEASURED as f64
}

#[test]
fn a_sleeping_wait_reads_only_the_fds_that_have_something() {
    let Some(ip) = common::test_ip("a_sleeping_wait_reads_only_the_fds_that_have_something") else {
        return;
    };
    // Per round trip and side: the doorbell of the one WRITE (a write(2) on rxe; other
    // providers ring it without a system call) and the completion event's read: 4 for
    // both sides. Reading every fd on every sleep made it about 12 (an empty channel's
    // read and an empty eventfd's after the event, and rdma_cm's fetch before and after
    // each sleep). The bound leaves room for the keep-alive thread's passes and a credit
    // update now and then.
    for (port, size) in [(7650, 8), (7651, 4096)] {
        let n = calls_per_round_trip(ip, port, size);
        println!("{size} bytes: {n:.2} read/write system calls per round trip");
        assert!(
            n <= 6.0,
            "{size}-byte round trips made {n:.2} read/write system calls each (at most 6 expected)"
        );
    }
}
