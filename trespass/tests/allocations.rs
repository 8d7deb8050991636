//! Zero heap allocations per message in steady state: a counting global allocator around
//! ping-pongs over a byte stream and over messages (device test; both sides in this
//! process). A deterministic gate, unlike any timing.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use trespass::Config;

/// Counts every allocation and reallocation in the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for dealloc; the caller's contract for realloc is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARM_UP: usize = 100;

/// Runs `WARM_UP` then `measured` ping-pongs of `size` bytes, streams or messages, with
/// receives of their own or from a shared receive queue, and returns the allocations the
/// measured ones made (both sides together).
fn allocations_per_run(
    ip: IpAddr,
    port: u16,
    size: usize,
    messages: bool,
    shared: bool,
    measured: usize,
) -> u64 {
    let addr = SocketAddr::new(ip, port);
    let mut config = Config::new();
    config.shared_receive_queue(shared.then_some(512));
    // The keep-alive thread looks after these connections too: its passes count.
    config.keepalive(Some(std::time::Duration::from_secs(30)));
    let listener = config.bind(addr).unwrap();
    let cfg = config.clone();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; size];
        let mut msg = Vec::with_capacity(size);
        for _ in 0..WARM_UP + measured {
            if messages {
                s.recv_msg(&mut msg).unwrap().unwrap();
                s.send_msg(&msg).unwrap();
            } else {
                s.read_exact(&mut buf).unwrap();
                s.write_all(&buf).unwrap();
            }
        }
        s
    });
    let mut c = cfg.connect(addr).unwrap();
    let out = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut msg = Vec::with_capacity(size);
    let mut start = 0;
    for i in 0..WARM_UP + measured {
        if i == WARM_UP {
            start = ALLOCATIONS.load(Ordering::SeqCst);
        }
        if messages {
            c.send_msg(&out).unwrap();
            c.recv_msg(&mut msg).unwrap().unwrap();
        } else {
            c.write_all(&out).unwrap();
            c.read_exact(&mut back).unwrap();
        }
    }
    let used = ALLOCATIONS.load(Ordering::SeqCst) - start;
    let s = server.join().unwrap();
    drop((c, s));
    used
}

#[test]
fn steady_state_ping_pong_allocates_nothing() {
    let Some(ip) = common::test_ip("steady_state_ping_pong_allocates_nothing") else {
        return;
    };
    // Sizes below and above the inline limit, and above the ring's quarter (a message in
    // several writes, credits returned on the way).
    // The shared mode's router hands receives over through each connection's mailbox.
    for (port, size, messages, shared, measured) in [
        (7640, 8, false, false, 1000),
        (7641, 4096, false, false, 500),
        (7642, 100_000, false, false, 100),
        (7643, 8, true, false, 1000),
        (7644, 100_000, true, false, 100),
        (7645, 8, false, true, 1000),
        (7646, 100_000, true, true, 100),
    ] {
        let n = allocations_per_run(ip, port, size, messages, shared, measured);
        let kind = match (messages, shared) {
            (false, false) => "stream",
            (true, false) => "messages",
            (false, true) => "stream (shared receive queue)",
            (true, true) => "messages (shared receive queue)",
        };
        println!("{kind} of {size} bytes: {n} allocations in {measured} round trips");
        assert_eq!(n, 0, "{kind} of {size} bytes allocated {n} times");
    }
}
