//! Device tests of the shared-receive-queue mode (`Config::shared_receive_queue`): both
//! ends of every connection live in this process, on one device, so all of them draw their
//! receives from one pool.
//!
//! The pool is one per device per process and keeps the depth it was made with while any
//! connection uses it, so the tests here run one at a time (`SERIAL`), each closing every
//! connection, and with it the pool, before the next makes its own. Without a device each
//! test prints `skipped: <reason>`; with `RDMA_TEST_DEVICE` set a missing one is a failure.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::Mutex;
use std::thread;
use std::time::Instant;

use trespass::{Config, Stream};

static SERIAL: Mutex<()> = Mutex::new(());

/// `n` connections to one listener on `port`, as (server side, client side).
fn pairs(ip: IpAddr, port: u16, config: &Config, n: usize) -> Vec<(Stream, Stream)> {
    let addr = SocketAddr::new(ip, port);
    let listener = config.bind(addr).expect("bind");
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let cfg = config.clone();
            thread::spawn(move || cfg.connect(addr).expect("connect"))
        })
        .collect();
    let mut servers: Vec<_> = (0..n)
        .map(|_| listener.accept().expect("accept").0)
        .collect();
    let clients: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .collect();
    // Pair each server side with its client by address.
    clients
        .into_iter()
        .map(|c| {
            let me = c.local_addr().unwrap();
            let at = servers
                .iter()
                .position(|s| s.peer_addr().unwrap() == me)
                .expect("the client's server side");
            (servers.swap_remove(at), c)
        })
        .collect()
}

/// The device's counter `name` (rxe's port counters), when the device has one.
fn hw_counter(name: &str) -> Option<u64> {
    let dev = std::env::var("RDMA_TEST_DEVICE").ok()?;
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

#[test]
fn shared_mode_connections_echo_every_byte_both_ways() {
    let Some(ip) = common::test_ip("shared_mode_connections_echo_every_byte_both_ways") else {
        return;
    };
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // 8 connections, both ends here: 16 streams promised 16 receives each, 256 in all, which
    // is the pool's depth: no write can find it empty.
    let mut config = common::small_config();
    config.shared_receive_queue(Some(256));
    let started = Instant::now();
    let workers: Vec<_> = pairs(ip, 7661, &config, 8)
        .into_iter()
        .enumerate()
        .map(|(i, (mut server, mut client))| {
            let echo = thread::spawn(move || {
                let mut buf = vec![0u8; 32 * 1024];
                let mut total = 0u64;
                loop {
                    let n = server.read(&mut buf).expect("echo read");
                    if n == 0 {
                        return total;
                    }
                    server.write_all(&buf[..n]).expect("echo write");
                    total += n as u64;
                }
            });
            thread::spawn(move || {
                let mut sent = 0u64;
                for (round, size) in [1usize, 100, 4096, 20_000, 7, 16_384]
                    .iter()
                    .cycle()
                    .take(120)
                    .enumerate()
                {
                    let data = common::pattern(i as u64 * 1_000_000 + sent, *size);
                    client.write_all(&data).expect("write");
                    let mut back = vec![0u8; *size];
                    client.read_exact(&mut back).expect("read");
                    assert!(
                        back == data,
                        "connection {i}, round {round}: the echo differs"
                    );
                    sent += *size as u64;
                }
                client.shutdown(Shutdown::Write).expect("shutdown");
                let mut rest = Vec::new();
                client.read_to_end(&mut rest).expect("end of stream");
                assert!(rest.is_empty());
                (sent, echo.join().expect("echo thread"))
            })
        })
        .collect();
    for w in workers {
        let (sent, echoed) = w.join().expect("connection thread");
        assert_eq!(sent, echoed);
    }
    println!(
        "8 shared-mode connections echoed their streams in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn an_overcommitted_shared_queue_makes_writers_wait_and_loses_nothing() {
    let Some(ip) =
        common::test_ip("an_overcommitted_shared_queue_makes_writers_wait_and_loses_nothing")
    else {
        return;
    };
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // 4 connections, 8 streams promised 16 receives each (128), from a pool of 8: writers
    // that post at once find it empty, are refused (RNR) and retried by their NIC.
    let mut config = common::small_config();
    config.shared_receive_queue(Some(8));
    let rnr_before = hw_counter("send_rnr_err");
    let started = Instant::now();
    const PIECES: usize = 64;
    const PIECE: usize = 2048;
    let workers: Vec<_> = pairs(ip, 7662, &config, 4)
        .into_iter()
        .enumerate()
        .map(|(i, (mut server, mut client))| {
            let reader = thread::spawn(move || {
                let mut got = Vec::new();
                server.read_to_end(&mut got).expect("read");
                got
            });
            thread::spawn(move || {
                let data = common::pattern(i as u64 * 1_000_000, PIECES * PIECE);
                // One write each: with nodelay (the default) every piece is its own RDMA
                // WRITE with immediate data, as many in flight as credit allows.
                for piece in data.chunks(PIECE) {
                    client.write_all(piece).expect("write");
                }
                client.shutdown(Shutdown::Write).expect("shutdown");
                let got = reader.join().expect("reader thread");
                assert!(got == data, "connection {i}: the stream differs");
                drop(client);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("connection thread");
    }
    let took = started.elapsed();
    let rnr = match (rnr_before, hw_counter("send_rnr_err")) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    println!(
        "4 connections through a pool of 8 receives: {} KiB each in {:.2} s, {} RNR NAKs",
        PIECES * PIECE / 1024,
        took.as_secs_f64(),
        rnr.map_or("an unknown number of".into(), |n| n.to_string())
    );
    if let Some(n) = rnr {
        assert!(
            n > 0,
            "no write found the pool empty: this test no longer overcommits it"
        );
    }
}

/// Set in the child process of the stopped-peer test: it serves on this port.
const STOPPED_PEER_PORT: &str = "TRESPASS_TEST_STOPPED_PEER_PORT";

#[test]
fn a_writer_to_a_stopped_shared_mode_peer_ends_by_keepalive() {
    let name = "a_writer_to_a_stopped_shared_mode_peer_ends_by_keepalive";
    let Some(ip) = common::test_ip(name) else {
        return;
    };
    if let Ok(port) = std::env::var(STOPPED_PEER_PORT) {
        // The child: a shared-mode server with a pool of 8 (the least) that accepts one
        // connection and waits, to be stopped (SIGSTOP) by the parent with its pool soon
        // empty.
        let mut config = common::small_config();
        config.shared_receive_queue(Some(8)).keepalive(None);
        let listener = config
            .bind(SocketAddr::new(ip, port.parse().unwrap()))
            .expect("bind");
        println!("listening");
        let (_stream, _) = listener.accept().expect("accept");
        println!("accepted");
        thread::sleep(std::time::Duration::from_secs(120));
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = 7663u16;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(STOPPED_PEER_PORT, port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the server process");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut wait_for = |what: &str| {
        for line in lines.by_ref() {
            if line.expect("the server's output").contains(what) {
                return;
            }
        }
        panic!("the server process ended before printing {what:?}");
    };
    wait_for("listening");
    let period = std::time::Duration::from_secs(1);
    let mut config = common::small_config();
    config.keepalive(Some(period));
    let mut client = config.connect(SocketAddr::new(ip, port)).expect("connect");
    wait_for("accepted");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    // Small writes, each its own write with immediate: the first 8 take the pool's
    // receives, the next is refused (RNR) and retried for ever; the peer's credit lets
    // the writer queue up to its 16 receives behind it, and then it waits for credit.
    let (done, result) = std::sync::mpsc::channel();
    let started = Instant::now();
    thread::spawn(move || {
        let piece = [7u8; 512];
        let r = loop {
            if let Err(e) = client.write_all(&piece).and_then(|()| client.flush()) {
                break e;
            }
        };
        let _ = done.send(r);
    });
    let outcome = result.recv_timeout(std::time::Duration::from_secs(60));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let err = outcome.expect("the writer still waits a minute after its peer stopped");
    let took = started.elapsed();
    println!("the writer ended after {:.2} s: {err}", took.as_secs_f64());
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err:?}");
    let inner = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<trespass::Error>());
    assert!(
        matches!(
            inner,
            Some(trespass::Error::Connection(trespass::core::ConnError::KeepAlive(p))) if *p == period
        ),
        "{err:?}"
    );
}
