//! Lending (zero-copy messages) on a real device: `Stream::lend_msg` hands a buffer to the
//! peer, whose `recv_msg` fetches it with RDMA READ straight into the caller's allocation
//! (or whose `read` takes it as stream bytes), and `Stream::reclaim` gives it back once the
//! peer returned it and its registration is gone. What a peer that lends a region it does
//! not own, or keeps reading one it returned, gets is in `hostile.rs`.
//!
//! Device tests: they skip without a device, and fail with `RDMA_TEST_DEVICE` set and none.

mod common;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::thread;
use std::time::Duration;

use trespass::{Config, Stream};

fn config() -> Config {
    let mut c = common::small_config();
    c.max_message(8 << 20).keepalive(None);
    c
}

/// A connected pair on `port`: (client, server).
fn pair(ip: std::net::IpAddr, port: u16, config: &Config) -> (Stream, Stream) {
    let addr = SocketAddr::new(ip, port);
    let listener = config.bind(addr).unwrap();
    let cfg = config.clone();
    let client = thread::spawn(move || cfg.connect(addr).unwrap());
    let (server, _) = listener.accept().unwrap();
    let mut client = client.join().unwrap();
    client
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    (client, server)
}

/// Lends messages of several sizes (one beyond a READ chunk, one of a single byte, one
/// read as stream bytes) between ordinary ones; every byte arrives in order, a lent
/// message lands in the allocation the reader handed to `recv_msg`, and every buffer
/// comes back unchanged, in the order lent.
fn lend_and_reclaim(port: u16, config: &Config) {
    let Some(ip) = common::test_ip(&format!("lend_and_reclaim on port {port}")) else {
        return;
    };
    let (mut client, mut server) = pair(ip, port, config);
    server
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let sizes = [(1 << 20) + 7, 1, 4 << 20, 100_000];
    let reader = thread::spawn(move || {
        let mut buf = Vec::with_capacity(8 << 20);
        for (i, &len) in sizes.iter().enumerate().take(3) {
            let ptr = buf.as_ptr();
            assert_eq!(server.recv_msg(&mut buf).unwrap(), Some(len), "message {i}");
            assert!(
                buf == common::pattern(i as u64 * 1000, len),
                "lent message {i} of {len} bytes arrived changed"
            );
            assert_eq!(
                buf.as_ptr(),
                ptr,
                "lent message {i} was fetched into the reader's own allocation"
            );
            let mut plain = Vec::new();
            assert_eq!(server.recv_msg(&mut plain).unwrap(), Some(5));
            assert_eq!(plain, b"plain");
        }
        // The last one as stream bytes, between stream bytes.
        let mut all = vec![0; 3 + sizes[3] + 3];
        server.read_exact(&mut all).unwrap();
        assert_eq!(&all[..3], b"abc");
        assert!(all[3..3 + sizes[3]] == common::pattern(3000, sizes[3]));
        assert_eq!(&all[3 + sizes[3]..], b"xyz");
        server
    });
    for (i, &len) in sizes.iter().enumerate() {
        if i == 3 {
            client.write_all(b"abc").unwrap();
        }
        client
            .lend_msg(common::pattern(i as u64 * 1000, len))
            .unwrap();
        if i < 3 {
            client.send_msg(b"plain").unwrap();
        } else {
            client.write_all(b"xyz").unwrap();
        }
    }
    assert_eq!(client.lent(), 4);
    for (i, &len) in sizes.iter().enumerate() {
        let back = client.reclaim().unwrap();
        assert!(
            back == common::pattern(i as u64 * 1000, len),
            "buffer {i} came back changed"
        );
    }
    assert_eq!(client.lent(), 0);
    let e = client.reclaim().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    let _server = reader.join().unwrap();
}

#[test]
fn lent_buffers_arrive_whole_and_come_back() {
    lend_and_reclaim(7663, &config());
}

#[test]
fn lent_buffers_arrive_whole_and_come_back_in_the_shared_receive_queue_mode() {
    let mut c = config();
    c.shared_receive_queue(Some(64));
    lend_and_reclaim(7664, &c);
}

/// Non-blocking: `reclaim` says `WouldBlock` until the peer fetched, and the stream's fd
/// turns readable when the buffer is back.
#[test]
fn reclaim_would_block_until_the_peer_fetched() {
    let Some(ip) = common::test_ip("reclaim_would_block_until_the_peer_fetched") else {
        return;
    };
    let (mut client, mut server) = pair(ip, 7665, &config());
    client.lend_msg(vec![7; 300_000]).unwrap();
    client.set_nonblocking(true).unwrap();
    let e = client.reclaim().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    let e = client.lend_msg(Vec::new()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert_eq!(
        e.into_parts().1,
        Some(Vec::new()),
        "a refused buffer comes back"
    );
    let mut buf = Vec::new();
    assert_eq!(server.recv_msg(&mut buf).unwrap(), Some(300_000));
    assert!(buf.iter().all(|&b| b == 7));
    let back = loop {
        match client.reclaim() {
            Ok(v) => break v,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(client.as_raw_fd(), 10_000);
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(back.len(), 300_000);
}

/// A stream dropped right after lending lingers until the peer fetched: the message is
/// not lost.
#[test]
fn a_lender_that_drops_its_stream_at_once_still_delivers() {
    let Some(ip) = common::test_ip("a_lender_that_drops_its_stream_at_once_still_delivers") else {
        return;
    };
    let (mut client, mut server) = pair(ip, 7666, &config());
    client.lend_msg(common::pattern(5, 2 << 20)).unwrap();
    let dropper = thread::spawn(move || drop(client));
    thread::sleep(Duration::from_millis(200));
    let mut buf = Vec::new();
    assert_eq!(server.recv_msg(&mut buf).unwrap(), Some(2 << 20));
    assert!(buf == common::pattern(5, 2 << 20));
    dropper.join().unwrap();
    assert_eq!(
        server.recv_msg(&mut buf).unwrap(),
        None,
        "then end of stream"
    );
}

/// A buffer larger than the peer takes is refused before anything is lent, and comes back.
#[test]
fn a_buffer_larger_than_the_peer_takes_is_refused_and_returned() {
    let Some(ip) = common::test_ip("a_buffer_larger_than_the_peer_takes_is_refused_and_returned")
    else {
        return;
    };
    let mut small = config();
    small.max_message(1000);
    let (mut client, _server) = pair(ip, 7667, &small);
    let e = client.lend_msg(vec![1; 1001]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string().contains("larger than the peer accepts"),
        "{e}"
    );
    assert_eq!(e.into_parts().1.map(|v| v.len()), Some(1001));
    assert_eq!(client.lent(), 0);
    client.write_all(b"still fine").unwrap();
}

/// Waits up to `timeout_ms` for `fd` to turn readable.
fn wait_readable(fd: i32, timeout_ms: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid, exclusively borrowed pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    assert!(n >= 0, "poll failed: {}", io::Error::last_os_error());
}
