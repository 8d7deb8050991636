//! Device tests of a reader that waits in the owner's place (`TryHandle::wait_readable`, and
//! `TryHandle::stand_in` driven by the test's own poll):
//! the owner is the tokio front end on its own thread (as trespass-preload's pump is), the
//! reader a plain thread with a `TryHandle`. Without a device each test prints `skipped:
//! <reason>`; with `RDMA_TEST_DEVICE` set a missing device is a failure.

mod common;

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trespass::{Config, ReadWaited, TryHandle};

/// What the owner's thread reports.
struct Owner {
    /// Times the owner's read future was polled (each wake-up of its task is one).
    polls: Arc<AtomicUsize>,
    /// The bytes the owner's reads got.
    got: mpsc::Receiver<Vec<u8>>,
    handle: TryHandle,
    thread: thread::JoinHandle<()>,
}

fn config() -> Config {
    let mut c = common::small_config();
    c.busy_poll(Duration::ZERO).busy_poll_max(Duration::ZERO);
    c
}

/// Accepts one connection on `addr` and owns it on a current-thread tokio runtime that reads
/// it until the end (every read reported), after writing `send` bytes to it (0: none).
fn owner(addr: SocketAddr, send: usize) -> (Owner, trespass::Stream) {
    let listener = config().bind(addr).expect("bind");
    let client = thread::spawn(move || config().connect(addr).expect("connect"));
    let (stream, _) = listener.accept().expect("accept");
    let client = client.join().expect("the connect thread");
    let polls = Arc::new(AtomicUsize::new(0));
    let (tx, got) = mpsc::channel();
    let (handle_tx, handle_rx) = mpsc::channel();
    let counted = Arc::clone(&polls);
    let thread = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async move {
            let mut s = trespass::tokio::Stream::from_std(stream).expect("from_std");
            s.set_busy_poll(Duration::ZERO);
            s.set_busy_poll_max(Duration::ZERO);
            handle_tx.send(s.try_handle()).expect("the test waits");
            let (mut rd, mut wr) = tokio::io::split(s);
            let writer = async move {
                if send > 0 {
                    wr.write_all(&common::pattern(0, send))
                        .await
                        .expect("the owner's write");
                }
                wr
            };
            let reader = async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let read = rd.read(&mut buf);
                    tokio::pin!(read);
                    let n = std::future::poll_fn(|cx| {
                        counted.fetch_add(1, Ordering::Relaxed);
                        read.as_mut().poll(cx)
                    })
                    .await
                    .expect("the owner's read");
                    if n == 0 {
                        return rd;
                    }
                    let _ = tx.send(buf[..n].to_vec());
                }
            };
            let (wr, rd) = tokio::join!(writer, reader);
            drop(rd.unsplit(wr));
        });
    });
    let handle = handle_rx.recv().expect("the owner's handle");
    (
        Owner {
            polls,
            got,
            handle,
            thread,
        },
        client,
    )
}

/// A socket that never turns readable, for the wait's other fd.
fn quiet() -> (UnixStream, UnixStream) {
    UnixStream::pair().expect("a socket pair")
}

fn test_ip(name: &str) -> Option<IpAddr> {
    common::test_ip(name)
}

#[test]
fn a_reader_standing_in_for_the_owner_takes_the_wake_ups_the_owner_would_have_had() {
    let Some(ip) =
        test_ip("a_reader_standing_in_for_the_owner_takes_the_wake_ups_the_owner_would_have_had")
    else {
        return;
    };
    const PINGS: usize = 300;
    const LEN: usize = 64;
    let (owner, mut client) = owner(SocketAddr::new(ip, 7720), 0);
    let peer = thread::spawn(move || {
        for i in 0..PINGS {
            client.write_all(&[i as u8; LEN]).expect("a ping");
            let mut back = [0u8; LEN];
            client.read_exact(&mut back).expect("a pong");
            assert_eq!(back, [i as u8; LEN], "pong {i}");
        }
        client
    });
    let (also, _other) = quiet();
    let mut ready = 0;
    let mut other = 0;
    let mut stolen = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..PINGS {
        let mut got = 0;
        let mut buf = [0u8; LEN];
        // A wait kept until the read after it is done.
        let mut _wait = None;
        while got < LEN {
            assert!(
                Instant::now() < deadline,
                "round {i} did not finish in time"
            );
            // What the owner took (the keep-alive thread may wake it now and then).
            while let Ok(b) = owner.got.try_recv() {
                assert!(
                    b.iter().all(|&x| x == i as u8),
                    "round {i}: the owner read {b:?}"
                );
                got += b.len();
                stolen += 1;
            }
            if got == LEN {
                break;
            }
            match owner.handle.try_read(&mut buf[..LEN - got]) {
                Ok(0) => panic!("round {i}: end of stream"),
                Ok(n) => {
                    assert!(buf[..n].iter().all(|&x| x == i as u8), "round {i}");
                    got += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    _wait = None;
                    let w = owner
                        .handle
                        .wait_readable(also.as_fd(), Duration::from_millis(50))
                        .expect("the wait");
                    match w.outcome() {
                        ReadWaited::Ready => ready += 1,
                        _ => other += 1,
                    }
                    _wait = Some(w);
                }
                Err(e) => panic!("round {i}: {e}"),
            }
        }
        assert_eq!(got, LEN, "round {i}: more bytes than were sent");
        let mut sent = 0;
        while sent < LEN {
            match owner.handle.try_write(&[i as u8; LEN][sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("round {i}: the pong: {e}"),
            }
        }
    }
    let client = peer.join().expect("the peer");
    let polls = owner.polls.load(Ordering::Relaxed);
    println!(
        "{PINGS} round trips: {ready} waits woken by bytes, {other} otherwise; the owner's read polled {polls} times and got bytes {stolen} times"
    );
    drop(client);
    owner.thread.join().expect("the owner");
    // Each arrival wakes the reader alone: the owner's task runs only when the keep-alive
    // thread pokes it (at most every 100 ms) and at the end. Waiting on the readiness fd
    // instead, the owner is woken by every arrival (a poll per round at least).
    assert!(
        polls <= PINGS / 2,
        "the owner was polled {polls} times in {PINGS} round trips: arrivals woke it"
    );
    assert!(
        ready >= PINGS / 2,
        "only {ready} of {PINGS} rounds were woken in the owner's place ({other} otherwise)"
    );
}

#[test]
fn bytes_a_standing_reader_leaves_unread_go_back_to_the_owner() {
    let Some(ip) = test_ip("bytes_a_standing_reader_leaves_unread_go_back_to_the_owner") else {
        return;
    };
    const LEN: usize = 1000;
    let (owner, mut client) = owner(SocketAddr::new(ip, 7721), 0);
    let (also, _other) = quiet();
    // Whatever the owner had before the bytes come is not these bytes.
    thread::sleep(Duration::from_millis(200));
    let before = owner.polls.load(Ordering::Relaxed);
    let waiter = {
        let handle = owner.handle.clone();
        thread::spawn(move || {
            let w = handle
                .wait_readable(also.as_fd(), Duration::from_secs(30))
                .expect("the wait");
            let outcome = w.outcome();
            let mut buf = [0u8; 10];
            let n = match handle.try_read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => panic!("{e}"),
            };
            // The rest is left: dropping the wait hands it to the owner.
            drop(w);
            (outcome, n)
        })
    };
    thread::sleep(Duration::from_millis(100));
    client.write_all(&[0x5a; LEN]).expect("the bytes");
    let (outcome, mine) = waiter.join().expect("the reader");
    let mut theirs = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while mine + theirs < LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        match owner.got.recv_timeout(left) {
            Ok(b) => {
                assert!(b.iter().all(|&x| x == 0x5a));
                theirs += b.len();
            }
            Err(_) => panic!(
                "the owner got {theirs} of the {} bytes the reader left ({outcome:?}, it read {mine}) within 10 s: they were stranded",
                LEN - mine
            ),
        }
    }
    assert_eq!(mine + theirs, LEN);
    println!(
        "the reader's wait: {outcome:?}, it read {mine}; the owner read {theirs} (polled {} times since)",
        owner.polls.load(Ordering::Relaxed) - before
    );
    drop(client);
    owner.thread.join().expect("the owner");
}

#[test]
fn an_owner_waiting_for_room_gets_its_credits_while_a_reader_stands_in() {
    let Some(ip) = test_ip("an_owner_waiting_for_room_gets_its_credits_while_a_reader_stands_in")
    else {
        return;
    };
    const LEN: usize = 2 * 1024 * 1024;
    let (owner, mut client) = owner(SocketAddr::new(ip, 7722), LEN);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let handle = owner.handle.clone();
    let stand_in = thread::spawn(move || {
        let (also, _other) = quiet();
        let (mut ready, mut declined, mut other) = (0, 0, 0);
        while !stopped.load(Ordering::Relaxed) {
            let w = handle
                .wait_readable(also.as_fd(), Duration::from_millis(5))
                .expect("the wait");
            match w.outcome() {
                ReadWaited::Ready => ready += 1,
                ReadWaited::Declined => declined += 1,
                _ => other += 1,
            }
            if w.outcome() == ReadWaited::Ready {
                // Nothing is sent this way: only the end of the stream makes it ready.
                break;
            }
        }
        (ready, declined, other)
    });
    // A slow reader: the owner's writes wait for room (credits) again and again.
    let mut got = vec![0u8; LEN];
    let mut off = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while off < LEN {
        assert!(
            Instant::now() < deadline,
            "the owner's writes stalled at {off} of {LEN} bytes: its credits were taken"
        );
        let n = client
            .read(&mut got[off..(off + 16 * 1024).min(LEN)])
            .expect("the owner's bytes");
        assert!(n > 0, "end of stream at {off}");
        off += n;
        thread::sleep(Duration::from_micros(500));
    }
    assert!(
        got == common::pattern(0, LEN),
        "the bytes came out of order"
    );
    stop.store(true, Ordering::Relaxed);
    let (ready, declined, other) = stand_in.join().expect("the stand-in");
    println!(
        "{LEN} bytes written by the owner while a reader waited in its place: {declined} waits declined, {other} timed out, {ready} ready"
    );
    drop(client);
    owner.thread.join().expect("the owner");
}

#[test]
fn vectored_writes_through_a_handle_keep_every_byte_in_order_across_the_buffer_end() {
    let Some(ip) =
        test_ip("vectored_writes_through_a_handle_keep_every_byte_in_order_across_the_buffer_end")
    else {
        return;
    };
    const LEN: usize = 3 * 1024 * 1024;
    let (owner, mut client) = owner(SocketAddr::new(ip, 7723), 0);
    let reader = thread::spawn(move || {
        let mut got = vec![0u8; LEN];
        client.read_exact(&mut got).expect("the bytes");
        assert!(
            got == common::pattern(0, LEN),
            "the bytes came out of order"
        );
        client
    });
    let data = common::pattern(0, LEN);
    let (mut off, mut calls, mut i) = (0usize, 0u64, 0usize);
    let deadline = Instant::now() + Duration::from_secs(120);
    while off < LEN {
        assert!(Instant::now() < deadline, "stalled at {off} of {LEN}");
        // Three pieces of changing sizes (one of them empty now and then), so that the
        // pieces straddle the end of the send buffer in every way.
        let a = (i * 7919) % 5000;
        let b = (i * 104_729) % 300;
        let end = |n: usize| (off + n).min(LEN);
        let (p1, p2) = (end(a), end(a + b));
        let p3 = end(a + b + 20_000);
        let bufs = [
            io::IoSlice::new(&data[off..p1]),
            io::IoSlice::new(&data[p1..p2]),
            io::IoSlice::new(&data[p2..p3]),
        ];
        match owner.handle.try_write_vectored(&bufs) {
            Ok(n) => {
                assert!(n <= p3 - off, "wrote {n} of {}", p3 - off);
                off += n;
                calls += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_micros(200))
            }
            Err(e) => panic!("at {off}: {e}"),
        }
        i += 1;
    }
    let client = reader.join().expect("the reader");
    println!("{LEN} bytes in {calls} vectored writes");
    drop(client);
    owner.thread.join().expect("the owner");
}

/// Polls `fd` for `POLLIN` for at most `ms`; whether it turned readable.
fn readable_within(fd: std::os::fd::BorrowedFd<'_>, ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0 && p.revents != 0
}

/// A caller's own poll driving a `StandIn` (the preload's poll and epoll waits): one at a
/// time per stream, the completion wakes the holder's poll, the bytes stay in the stream
/// when it ends (for the reader it reports them to), and `hand_back` gives what is left to
/// the owner.
#[test]
fn a_stand_in_driven_by_the_callers_poll_excludes_others_and_hands_back_on_request() {
    let Some(ip) =
        test_ip("a_stand_in_driven_by_the_callers_poll_excludes_others_and_hands_back_on_request")
    else {
        return;
    };
    let (owner, mut client) = owner(SocketAddr::new(ip, 7724), 0);
    let handle = owner.handle.clone();
    thread::sleep(Duration::from_millis(200));
    let mut first = handle.stand_in().expect("the first stand-in begins");
    assert!(
        handle.stand_in().is_none(),
        "a second stand-in began while the first holds the stream"
    );
    assert_eq!(first.arm(), trespass::Standing::Waiting);
    assert_eq!(first.standing(), trespass::Standing::Waiting);
    assert!(!handle.has_bytes());
    client.write_all(&[0xa5; 100]).expect("the first bytes");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = readable_within(first.as_fd(), 100);
        match first.woke(event) {
            trespass::Standing::Ready => break,
            trespass::Standing::Waiting => {}
            other => panic!("the stand-in ended as {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the completion never woke the stand-in's poll"
        );
        if first.arm() == trespass::Standing::Ready {
            break;
        }
    }
    assert!(handle.has_bytes());
    assert_eq!(first.standing(), trespass::Standing::Ready);
    let mut buf = [0u8; 100];
    let n = handle
        .try_read(&mut buf)
        .expect("the bytes the stand-in saw");
    assert_eq!(&buf[..n], &[0xa5; 100][..n]);
    assert_eq!(
        first.standing(),
        if n == 100 {
            trespass::Standing::Waiting
        } else {
            trespass::Standing::Ready
        },
        "after a read of {n} of the 100 bytes"
    );
    drop(first);

    // Free again; this time the bytes are left unread when the stand-in ends, and handed
    // back on request: the owner reads them.
    let mut second = handle.stand_in().expect("a stand-in after the first ended");
    let rest = 100 - n;
    client.write_all(&[0x3c; 50]).expect("the second bytes");
    let deadline = Instant::now() + Duration::from_secs(10);
    while second.arm() != trespass::Standing::Ready {
        let event = readable_within(second.as_fd(), 100);
        if second.woke(event) == trespass::Standing::Ready {
            break;
        }
        assert!(Instant::now() < deadline, "the second bytes never came");
    }
    drop(second);
    handle.hand_back();
    let mut theirs = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while theirs < rest + 50 {
        let left = deadline.saturating_duration_since(Instant::now());
        let b = owner.got.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "the owner got {theirs} of {} bytes handed back within 10 s",
                rest + 50
            )
        });
        theirs += b.len();
    }
    assert_eq!(theirs, rest + 50);
    drop(client);
    owner.thread.join().expect("the owner");
}
