//! Device tests for trespass: streams and messages over a real RDMA device's IPv4 address
//! (`RDMA_TEST_IP`). Without a device each test prints `skipped: <reason>`; with
//! `RDMA_TEST_DEVICE` set a missing device or address is a failure.
//!
//! Each test listens on its own rdma_cm port (tests run in parallel); every wait is bounded.

mod common;

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use trespass::{Config, Stream};

/// A listener on `port` and a client connected to it, with `config` on both sides.
fn pair(ip: IpAddr, port: u16, config: &Config) -> (Stream, Stream) {
    let addr = SocketAddr::new(ip, port);
    let listener = config.bind(addr).expect("bind");
    let cfg = config.clone();
    let client = thread::spawn(move || cfg.connect(addr).expect("connect"));
    let (server, peer) = listener.accept().expect("accept");
    let client = client.join().expect("client thread");
    assert_eq!(peer, client.local_addr().unwrap());
    assert_eq!(server.local_addr().unwrap(), addr);
    (server, client)
}

#[test]
fn an_echo_round_trip_carries_every_byte() {
    let Some(ip) = common::test_ip("an_echo_round_trip_carries_every_byte") else {
        return;
    };
    let (mut server, mut client) = pair(ip, 7601, &Config::new());
    let echo = thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        let mut total = 0;
        loop {
            let n = server.read(&mut buf).unwrap();
            if n == 0 {
                return total;
            }
            server.write_all(&buf[..n]).unwrap();
            total += n;
        }
    });
    for (i, size) in [1usize, 8, 64, 65, 4096, 100_000].into_iter().enumerate() {
        let data = common::pattern(i as u64 * 1000, size);
        client.write_all(&data).unwrap();
        let mut back = vec![0u8; size];
        client.read_exact(&mut back).unwrap();
        assert_eq!(back, data, "size {size}");
    }
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(echo.join().unwrap(), 1 + 8 + 64 + 65 + 4096 + 100_000);
}

#[test]
fn a_slow_reader_gets_every_byte_of_a_stream_larger_than_its_ring() {
    let Some(ip) =
        common::test_ip("a_slow_reader_gets_every_byte_of_a_stream_larger_than_its_ring")
    else {
        return;
    };
    const TOTAL: u64 = 16 << 20;
    let (mut server, mut client) = pair(ip, 7602, &common::small_config());
    let writer = thread::spawn(move || {
        let mut sent = 0u64;
        let mut sizes = [1usize, 7, 4096, 65536, 333, 20000].iter().cycle();
        while sent < TOTAL {
            let n = (*sizes.next().unwrap() as u64).min(TOTAL - sent) as usize;
            client.write_all(&common::pattern(sent, n)).unwrap();
            sent += n as u64;
        }
        client.shutdown(Shutdown::Write).unwrap();
        client
    });
    let mut got = 0u64;
    let mut buf = vec![0u8; 50_000];
    let mut reads = 0u32;
    loop {
        let want = 1 + (reads as usize * 7919) % buf.len();
        let n = server.read(&mut buf[..want]).unwrap();
        if n == 0 {
            break;
        }
        assert_eq!(buf[..n], common::pattern(got, n)[..], "at byte {got}");
        got += n as u64;
        reads += 1;
        if reads % 64 == 0 {
            // The reader sleeps now and then: the writer must block, not overrun.
            thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(got, TOTAL);
    drop(writer.join().unwrap());
}

#[test]
fn messages_keep_their_boundaries_including_empty_and_larger_than_the_ring() {
    let Some(ip) =
        common::test_ip("messages_keep_their_boundaries_including_empty_and_larger_than_the_ring")
    else {
        return;
    };
    let sizes = [0usize, 1, 100, 0, 16 * 1024, 200_000, 3, 64 * 1024, 1 << 20];
    let (mut server, mut client) = pair(ip, 7603, &common::small_config());
    let sender = thread::spawn(move || {
        for (i, &size) in sizes.iter().enumerate() {
            client.send_msg(&common::pattern(i as u64, size)).unwrap();
        }
        client.shutdown(Shutdown::Write).unwrap();
        client
    });
    let mut buf = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let n = server.recv_msg(&mut buf).unwrap().expect("a message");
        assert_eq!(n, size, "message {i}");
        assert_eq!(buf, common::pattern(i as u64, size), "message {i}");
    }
    assert_eq!(server.recv_msg(&mut buf).unwrap(), None, "end of stream");
    drop(sender.join().unwrap());
}

#[test]
fn a_message_larger_than_the_peer_accepts_is_refused_before_sending() {
    let Some(ip) =
        common::test_ip("a_message_larger_than_the_peer_accepts_is_refused_before_sending")
    else {
        return;
    };
    let mut config = common::small_config();
    config.max_message(1000);
    let (_server, mut client) = pair(ip, 7604, &config);
    let err = client.send_msg(&[0u8; 1001]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("1000"), "{err}");
    client.send_msg(&[0u8; 1000]).unwrap();
}

#[test]
fn nonblocking_reads_would_block_and_the_fd_wakes_poll() {
    let Some(ip) = common::test_ip("nonblocking_reads_would_block_and_the_fd_wakes_poll") else {
        return;
    };
    let (mut server, mut client) = pair(ip, 7605, &Config::new());
    server.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    let err = server.read(&mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    let fd = server.as_raw_fd();
    let writer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        client.write_all(b"wake up").unwrap();
        client
    });
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let t0 = Instant::now();
    loop {
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert!(n > 0, "poll timed out or failed: {n}");
        match server.read(&mut buf) {
            Ok(n) => {
                assert_eq!(&buf[..n], &b"wake up"[..n]);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(t0.elapsed() < Duration::from_secs(10), "no data after 10 s");
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(writer.join().unwrap());
}

#[test]
fn a_read_timeout_ends_a_read_with_timed_out() {
    let Some(ip) = common::test_ip("a_read_timeout_ends_a_read_with_timed_out") else {
        return;
    };
    let (mut server, _client) = pair(ip, 7606, &Config::new());
    server
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t0 = Instant::now();
    let err = server.read(&mut [0u8; 4]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(
        server.set_read_timeout(Some(Duration::ZERO)).is_err(),
        "a zero timeout is refused, as TcpStream does"
    );
}

#[test]
fn connecting_where_nobody_listens_is_refused_in_time() {
    let Some(ip) = common::test_ip("connecting_where_nobody_listens_is_refused_in_time") else {
        return;
    };
    let t0 = Instant::now();
    let err =
        Stream::connect_timeout(&SocketAddr::new(ip, 7607), Duration::from_secs(5)).unwrap_err();
    println!("no listener: {err}");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(8));
}

#[test]
fn a_dropped_peer_reads_as_end_of_stream_after_its_last_bytes() {
    let Some(ip) = common::test_ip("a_dropped_peer_reads_as_end_of_stream_after_its_last_bytes")
    else {
        return;
    };
    let (mut server, mut client) = pair(ip, 7608, &common::small_config());
    let data = common::pattern(5, 200_000);
    let expect = data.clone();
    let writer = thread::spawn(move || {
        client.write_all(&data).unwrap();
        // Dropping closes gracefully: the bytes, then end of stream.
    });
    let mut got = Vec::new();
    server.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(got == expect);
    writer.join().unwrap();
    // Writing to a peer that left fails, and keeps failing.
    let mut failed = None;
    for _ in 0..100 {
        match server.write_all(b"anyone?") {
            Ok(_) => thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("a write to a departed peer fails");
    println!("write after the peer left: {e}");
    assert!(server.write(b"again").is_err(), "the error is sticky");
}

#[test]
fn requests_beyond_the_backlog_wait_and_connect_once_the_listener_accepts() {
    let Some(ip) =
        common::test_ip("requests_beyond_the_backlog_wait_and_connect_once_the_listener_accepts")
    else {
        return;
    };
    let addr = SocketAddr::new(ip, 7610);
    let mut config = common::small_config();
    config.backlog(2).connect_timeout(Duration::from_secs(30));
    // Six requests against a backlog of two, while the application is busy: rdma_cm queues
    // two and leaves the rest unanswered (no refusal), and the clients' connection manager
    // sends those again. Nothing is lost: once the listener accepts, every client connects.
    let listener = config.bind(addr).expect("bind");
    let t0 = Instant::now();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let cfg = config.clone();
            thread::spawn(move || cfg.connect(addr).map(|s| (s, t0.elapsed())))
        })
        .collect();
    thread::sleep(Duration::from_secs(2));
    let mut servers = Vec::new();
    for _ in 0..6 {
        servers.push(listener.accept().expect("accept").0);
    }
    for c in clients {
        let (mut s, took) = c
            .join()
            .expect("client thread")
            .expect("a request beyond the backlog still connects");
        println!("connected after {took:?}");
        s.write_all(b"x").expect("write");
    }
    for mut s in servers {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).expect("read");
        assert_eq!(&b, b"x");
    }
}

#[test]
fn a_try_handle_takes_what_is_there_and_leaves_the_owners_wake_up_alone() {
    let Some(ip) =
        common::test_ip("a_try_handle_takes_what_is_there_and_leaves_the_owners_wake_up_alone")
    else {
        return;
    };
    let (mut server, mut client) = pair(ip, 7621, &Config::new());
    let handle = client.try_handle();
    let mut buf = [0u8; 64];
    // Nothing there: WouldBlock at once, whatever the owner's mode.
    let t0 = Instant::now();
    let err = handle.try_read(&mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert!(t0.elapsed() < Duration::from_secs(1), "try_read waited");
    // A write through the handle reaches the peer, in order with the owner's.
    client.write_all(b"owner,").unwrap();
    assert_eq!(handle.try_write(b"handle,").unwrap(), 7);
    client.write_all(b"owner").unwrap();
    let mut got = [0u8; 18];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"owner,handle,owner");

    // The owner waits the way its tokio front end does: a non-blocking read says
    // WouldBlock, having armed its fd, and the fd turns readable when bytes arrive.
    client.set_nonblocking(true).unwrap();
    assert_eq!(
        client.read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    server.write_all(b"for whoever looks first").unwrap();
    let mut pfd = libc::pollfd {
        fd: client.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    assert_eq!(n, 1, "the owner's fd did not turn readable within 10 s");
    // The handle takes the bytes, then finds nothing more...
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut taken = Vec::new();
    while taken.len() < 23 {
        match handle.try_read(&mut buf) {
            Ok(n) => taken.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "took {taken:?} in 10 s");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(taken, b"for whoever looks first");
    assert_eq!(
        handle.try_read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    // ...and the event that announced them is still the owner's: a waiter on the fd (a
    // reactor) wakes, looks, and arms again. Had the handle's WouldBlock drained the fd, a
    // waiter that had not collected the event yet would never hear of what came.
    pfd.revents = 0;
    // SAFETY: as above; a zero timeout only looks.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert_eq!(n, 1, "the handle took the owner's wake-up");
    assert_eq!(
        client.read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock,
        "the owner finds the bytes gone and waits again"
    );
    // After the owner drops the stream the handle's calls fail rather than reach it.
    server.write_all(b"late").unwrap();
    drop(client);
    let mut failed = false;
    for _ in 0..100 {
        match handle.try_write(b"x") {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                failed = true;
                break;
            }
            _ => thread::sleep(Duration::from_millis(10)),
        }
    }
    assert!(
        failed,
        "a write through the handle of a dropped stream succeeded"
    );
}
