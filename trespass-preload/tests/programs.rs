//! The preload under a program that knows nothing about RDMA (`tests/c/pingpong.c`): both
//! sides carried over RDMA, each side alone (the fallback to TCP), readiness through poll,
//! select and epoll, a peer killed mid-transfer, many short connections, the sockets the
//! library must leave alone, and environment rules that do not parse.
//!
//! Device tests: without an RDMA device each prints `skipped: <reason>`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

const PINGPONG: &str = env!("PINGPONG_EXE");

/// The ping-pong program run as `run` says.
trait Pingpong {
    fn pp(&self, args: &[&str]) -> Child;
}

impl Pingpong for Run {
    fn pp(&self, args: &[&str]) -> Child {
        self.spawn(PINGPONG, args)
    }
}

/// Starts a TCP server on an ephemeral port; returns it and the port.
fn server(run: &Run, dir: &Path, args: &[&str]) -> (Child, u16) {
    let mut all = vec!["server", "--port", "0"];
    all.extend_from_slice(args);
    listening(run, dir, &all)
}

/// Starts a server (`args` from its mode on) and waits until it listens; returns it and the
/// port it wrote.
fn listening(run: &Run, dir: &Path, args: &[&str]) -> (Child, u16) {
    let port_file = dir.join(format!("port-{}", args.join("_").replace('/', "_")));
    let _ = std::fs::remove_file(&port_file);
    let pf = port_file.to_str().unwrap().to_owned();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--port-file", &pf]);
    let mut child = run.pp(&all);
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            if let Ok(port) = text.trim().parse() {
                return (child, port);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the server exited ({status}) before listening: {}",
                show(&out)
            );
        }
        assert!(
            start.elapsed() < BOUND,
            "the server did not listen within {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn both_sides_preloaded_go_over_rdma() {
    let Some(ip) = test_ip("both_sides_preloaded_go_over_rdma") else {
        return;
    };
    let dir = scratch("both");
    let (s_stats, c_stats) = (dir.join("server.stats"), dir.join("client.stats"));
    let host = ip.to_string();
    let (srv, port) = server(&Run::preloaded(s_stats.clone()), &dir, &["--bind", &host]);
    let port = port.to_string();
    let client = Run::preloaded(c_stats.clone()).pp(&[
        "client",
        "--host",
        &host,
        "--port",
        &port,
        "--iters",
        "300",
        "--size",
        "1000",
        "--rcvtimeo",
        "4000",
    ]);
    let out = ok(client, "the client");
    assert_eq!(field(&out, "round_trips"), "300", "{out}");
    // Options set on the TCP socket before connect hold on the connection it became (4 s:
    // whole jiffies at any HZ, as the kernel keeps timeouts).
    assert_eq!(field(&out, "rcvtimeo_ms"), "4000", "{out}");
    assert_eq!(field(&out, "nodelay"), "1", "{out}");
    let served = ok(srv, "the server");
    // The server's accept names the RDMA peer, the client's getsockname/getpeername the
    // RDMA addresses, not the loopback and socket pair they ride on.
    assert!(served.contains(&format!("accepted {host}:")), "{served}");
    assert!(
        out.contains(&format!("connected {host}:{port} local {host}:")),
        "{out}"
    );
    assert_counters(&c_stats, &[("connect_rdma", 1)]);
    assert_counters(&s_stats, &[("listen_rdma", 1), ("accept_rdma", 1)]);
    // The blocking reads of a ping-pong wait on the stream in the pump's place (the
    // default), so that an arrival wakes the reader alone.
    let (c, s) = (&counters(&c_stats)[0], &counters(&s_stats)[0]);
    assert!(
        c["read_stood_in"] > 0 && s["read_stood_in"] > 0,
        "no blocking read waited in the pump's place: {c:?} {s:?}"
    );
    println!("{}", out.lines().last().unwrap_or_default());
}

#[test]
fn poll_select_and_epoll_programs_run_unchanged() {
    let Some(ip) = test_ip("poll_select_and_epoll_programs_run_unchanged") else {
        return;
    };
    let dir = scratch("readiness");
    let host = ip.to_string();
    let s_stats = dir.join("server.stats");
    let (srv, port) = server(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["--epoll", "--count", "3"],
    );
    let port = port.to_string();
    let clients: Vec<(Child, PathBuf)> = [&["--poll"][..], &["--select"], &[]]
        .iter()
        .enumerate()
        .map(|(i, extra)| {
            let stats = dir.join(format!("client{i}.stats"));
            let mut args = vec!["client", "--host", &host, "--port", &port, "--iters", "200"];
            args.extend_from_slice(extra);
            (Run::preloaded(stats.clone()).pp(&args), stats)
        })
        .collect();
    let mut stood_in = Vec::new();
    for (i, (c, stats)) in clients.into_iter().enumerate() {
        let out = ok(c, &format!("client {i}"));
        assert_eq!(field(&out, "round_trips"), "200", "{out}");
        assert_counters(&stats, &[("connect_rdma", 1)]);
        stood_in.push(counters(&stats)[0]["wait_stood_in"]);
    }
    let served = ok(srv, "the epoll server");
    assert!(served.contains("served 3 connections"), "{served}");
    assert_counters(&s_stats, &[("listen_rdma", 1), ("accept_rdma", 3)]);
    // The poll and select clients' waits and the edge-triggered epoll server's stand in for
    // the pump (the blocking client makes no such wait): the bytes they report are read from
    // the stream, not copied into the socket first.
    let served_in = counters(&s_stats)[0]["wait_stood_in"];
    assert!(
        stood_in[0] > 0 && stood_in[1] > 0 && stood_in[2] == 0 && served_in > 0,
        "waits in the pump's place (poll, select, blocking clients; server): {stood_in:?} {served_in}"
    );
}

/// A level-triggered epoll client (one connection, its fd modified before every wait, as
/// `--epoll` does) whose waits stand in for the pump: every round trip's bytes arrive and
/// most waits report them from the stream; with the switch off, none do.
#[test]
fn epoll_waits_stand_in_for_the_pump() {
    let Some(ip) = test_ip("epoll_waits_stand_in_for_the_pump") else {
        return;
    };
    let dir = scratch("epoll-stand-in");
    let host = ip.to_string();
    for on in [true, false] {
        let s_stats = dir.join(format!("server-{on}.stats"));
        let c_stats = dir.join(format!("client-{on}.stats"));
        let switch = if on { "on" } else { "off" };
        let (srv, port) = server(
            &Run::preloaded(s_stats.clone()).env("TRESPASS_PRELOAD_STAND_IN", switch),
            &dir,
            &["--epoll"],
        );
        let port = port.to_string();
        let client = Run::preloaded(c_stats.clone())
            .env("TRESPASS_PRELOAD_STAND_IN", switch)
            .pp(&[
                "client", "--host", &host, "--port", &port, "--iters", "300", "--size", "3000",
                "--epoll",
            ]);
        let out = ok(client, "the epoll client");
        assert_eq!(field(&out, "round_trips"), "300", "{out}");
        ok(srv, "the epoll server");
        let (c, s) = (&counters(&c_stats)[0], &counters(&s_stats)[0]);
        if on {
            assert!(
                c["wait_stood_in"] >= 150 && s["wait_stood_in"] >= 150,
                "fewer than half the round trips' waits stood in: {c:?} {s:?}"
            );
        } else {
            assert_eq!(
                (c["wait_stood_in"], s["wait_stood_in"]),
                (0, 0),
                "{c:?} {s:?}"
            );
        }
        let line = out.lines().find(|l| l.starts_with("round_trips="));
        println!("stand-in {switch}: {}", line.unwrap_or_default());
    }
}

/// An epoll set of many carried connections keeps their streams from one wait to the next:
/// the edge-triggered server serves 10 clients at once from one set (10 connections and the
/// listener), every byte of every echo checked by its client, and its waits report the
/// streams' bytes themselves (none with the switch off).
#[test]
fn an_epoll_set_of_many_connections_holds_their_streams() {
    let Some(ip) = test_ip("an_epoll_set_of_many_connections_holds_their_streams") else {
        return;
    };
    const CLIENTS: usize = 10;
    let dir = scratch("epoll-many");
    let host = ip.to_string();
    for on in [true, false] {
        let switch = if on { "on" } else { "off" };
        let s_stats = dir.join(format!("server-{switch}.stats"));
        let c_stats = dir.join(format!("clients-{switch}.stats"));
        let _ = std::fs::remove_file(&c_stats);
        let count = CLIENTS.to_string();
        let (srv, port) = server(
            &Run::preloaded(s_stats.clone()).env("TRESPASS_PRELOAD_STAND_IN", switch),
            &dir,
            &["--epoll", "--count", &count],
        );
        let port = port.to_string();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let io = ["--epoll", "--poll", "--select"][i % 3];
                Run::preloaded(c_stats.clone())
                    .env("TRESPASS_PRELOAD_STAND_IN", switch)
                    .pp(&[
                        "client", "--host", &host, "--port", &port, "--iters", "100", "--size",
                        "3000", io,
                    ])
            })
            .collect();
        for (i, c) in clients.into_iter().enumerate() {
            let out = ok(c, &format!("client {i}"));
            assert_eq!(field(&out, "round_trips"), "100", "{out}");
        }
        let out = ok(srv, "the epoll server");
        assert!(
            out.contains(&format!("served {CLIENTS} connections")),
            "{out}"
        );
        let s = &counters(&s_stats)[0];
        assert_eq!(s["accept_rdma"], CLIENTS as u64, "{s:?}");
        if on {
            assert!(
                s["wait_stood_in"] >= 100,
                "the server's waits reported the streams' bytes {} times in {} round trips",
                s["wait_stood_in"],
                CLIENTS * 100
            );
        } else {
            assert_eq!(s["wait_stood_in"], 0, "{s:?}");
        }
        println!(
            "stand-in {switch}: the server's waits reported streams {} times, read {} times directly",
            s["wait_stood_in"], s["read_direct"]
        );
    }
}

/// Answers that come later than a wait stands in for the pump (20 ms) reach the program
/// through the kernel's wait that takes over: an epoll and a poll client against a server
/// that waits 50 ms before each echo make every round trip, every byte checked.
#[test]
fn answers_later_than_the_stand_in_lasts_reach_the_kernels_wait() {
    let Some(ip) = test_ip("answers_later_than_the_stand_in_lasts_reach_the_kernels_wait") else {
        return;
    };
    let dir = scratch("slow-answers");
    let host = ip.to_string();
    for mode in ["--epoll", "--poll", "--select"] {
        let (s_stats, c_stats) = (
            dir.join(format!("server{mode}.stats")),
            dir.join(format!("client{mode}.stats")),
        );
        let (srv, port) = server(&Run::preloaded(s_stats), &dir, &["--echo-delay", "50"]);
        let port = port.to_string();
        let client = Run::preloaded(c_stats.clone()).pp(&[
            "client", "--host", &host, "--port", &port, "--iters", "20", "--size", "500", mode,
        ]);
        let out = ok(client, &format!("the {mode} client"));
        assert_eq!(field(&out, "round_trips"), "20", "{out}");
        ok(srv, "the slow server");
        assert_counters(&c_stats, &[("connect_rdma", 1)]);
    }
}

/// Bytes a poll or epoll wait reported from the stream (not the socket) stay reachable by
/// whatever the program does next: after a read of one byte, a wait the library leaves to
/// the kernel (an `EPOLLONESHOT` registration) sees the rest; after no read at all, that wait
/// sees them all; a `MSG_PEEK` (which the kernel answers) after a `poll` sees them. Each wait is bounded at 5 s in the program, so bytes
/// left in the stream where only a reader that does not come would see them fail it.
#[test]
fn bytes_a_wait_reported_reach_every_later_wait_read_and_peek() {
    let Some(ip) = test_ip("bytes_a_wait_reported_reach_every_later_wait_read_and_peek") else {
        return;
    };
    let dir = scratch("handoffs");
    let host = ip.to_string();
    let (s_stats, c_stats) = (dir.join("server.stats"), dir.join("client.stats"));
    let (srv, port) = server(&Run::preloaded(s_stats.clone()), &dir, &[]);
    let port = port.to_string();
    let client = Run::preloaded(c_stats.clone()).pp(&[
        "client",
        "--host",
        &host,
        "--port",
        &port,
        "--handoffs",
        "--iters",
        "300",
    ]);
    let out = ok(client, "the handoffs client");
    assert!(out.contains("handoffs=300"), "{out}");
    ok(srv, "the server");
    assert_counters(&c_stats, &[("connect_rdma", 1)]);
    let c = &counters(&c_stats)[0];
    println!(
        "handoffs: waits reported from the stream {} times, blocking reads stood in {} times",
        c["wait_stood_in"], c["read_stood_in"]
    );
    assert!(
        c["wait_stood_in"] >= 100,
        "the waits did not report from the stream: {c:?}"
    );
}

/// A connect on a non-blocking socket that returns `EINPROGRESS` (the wait for the RDMA
/// answer set to 0) ends as a TCP socket's would: writable once connected, over RDMA to a
/// preloaded server (found by an epoll set that watched the fd from `EINPROGRESS` on: the fd
/// is never replaced), over TCP from the program's own socket to a plain one, and with
/// `SO_ERROR` saying `ECONNREFUSED` where nothing listens. With a wait longer than the
/// answer takes, connect returns 0 over RDMA, as before.
#[test]
fn a_connect_in_progress_ends_as_a_tcp_connect_would() {
    let Some(ip) = test_ip("a_connect_in_progress_ends_as_a_tcp_connect_would") else {
        return;
    };
    let dir = scratch("in-progress");
    let host = ip.to_string();
    let s_stats = dir.join("server.stats");
    let (srv, port) = server(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["--bind", &host, "--epoll", "--count", "3"],
    );
    let (plain, plain_port) = server(&Run::plain(), &dir, &["--bind", &host]);
    let (port, plain_port) = (port.to_string(), plain_port.to_string());
    let client = |name: &str, wait: &str, port: &str, io: &str| {
        let stats = dir.join(format!("{name}.stats"));
        let run = Run::preloaded(stats.clone()).env("TRESPASS_PRELOAD_CONNECT_WAIT_MS", wait);
        let mut args = vec![
            "client", "--host", &host, "--port", port, "--iters", "100", io,
        ];
        if io == "--poll" {
            args.push("--fcntl-dup");
        }
        if io == "--epoll" {
            args.extend_from_slice(&["--rcvtimeo", "4000"]);
        }
        (run.pp(&args), stats)
    };
    // (The --poll client goes on on an fcntl(F_DUPFD) copy: it names the RDMA addresses too.)
    for (io, wait) in [("--epoll", "0"), ("--poll", "0"), ("--select", "60000")] {
        let (c, stats) = client(&format!("rdma{io}"), wait, &port, io);
        let out = ok(c, &format!("the {io} client"));
        assert_eq!(field(&out, "round_trips"), "100", "{out}");
        assert!(
            out.contains(&format!("connected {host}:{port} local {host}:")),
            "the RDMA addresses once connected: {out}"
        );
        if io == "--epoll" {
            // Options set before connect hold after it completed in the background.
            assert_eq!(field(&out, "rcvtimeo_ms"), "4000", "{out}");
            assert_eq!(field(&out, "nodelay"), "1", "{out}");
        }
        if wait == "0" {
            assert_counters(&stats, &[("connect_in_progress", 1), ("connect_rdma", 1)]);
        } else {
            // Answered within the wait: connect returned 0, no EINPROGRESS.
            assert_counters(&stats, &[("connect_rdma", 1)]);
        }
    }
    let (c, stats) = client("tcp", "0", &plain_port, "--epoll");
    let out = ok(c, "the client of the plain server");
    assert_eq!(field(&out, "round_trips"), "100", "{out}");
    assert_eq!(field(&out, "rcvtimeo_ms"), "4000", "{out}");
    assert_counters(
        &stats,
        &[("connect_in_progress", 1), ("connect_tcp_refused", 1)],
    );
    ok(plain, "the plain server");
    let closed = free_port().to_string();
    let (c, stats) = client("refused", "0", &closed, "--poll");
    let out = wait_bounded(c, BOUND).unwrap_or_else(|o| panic!("hung: {}", show(&o)));
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("connect: Connection refused"),
        "{}",
        show(&out)
    );
    assert_counters(
        &stats,
        &[("connect_in_progress", 1), ("connect_tcp_refused", 1)],
    );
    let served = ok(srv, "the epoll server");
    assert!(served.contains("served 3 connections"), "{served}");
    assert_counters(&s_stats, &[("listen_rdma", 1), ("accept_rdma", 3)]);

    // A peer that answers nothing (an address on the device's network where no host is):
    // the connect returns EINPROGRESS at once (the default wait, not the RDMA timeout), and
    // the program's own bound ends it.
    let Some(quiet) = quiet_neighbour(ip) else {
        return;
    };
    let stats = dir.join("quiet.stats");
    let c = Run::preloaded(stats.clone()).pp(&[
        "client",
        "--host",
        &quiet,
        "--port",
        "7",
        "--poll",
        "--connect-timeout",
        "1000",
    ]);
    let out = wait_bounded(c, BOUND).unwrap_or_else(|o| panic!("hung: {}", show(&o)));
    // The program's bound (5), or the kernel giving up on the neighbour (3): either way,
    // the program decided, not a blocked connect.
    assert!(matches!(out.status.code(), Some(3 | 5)), "{}", show(&out));
    let c = total(&stats);
    assert_eq!(c["connect_in_progress"], 1, "{c:?}");
    assert_eq!(c["connect_rdma"], 0, "{c:?}");
}

/// The RDMA listener exists once the TCP listener does: a client that connects over RDMA
/// the moment the port shows as listening (this test watches `/proc/net/tcp` every
/// millisecond, then connects with trespass itself) is served over RDMA. When the library
/// made its RDMA listener after the TCP `listen`, such a client (or a program's first client
/// of a server whose readiness it watched) found none and was refused.
#[test]
fn a_client_that_connects_the_moment_the_port_opens_is_served_over_rdma() {
    let Some(ip) = test_ip("a_client_that_connects_the_moment_the_port_opens_is_served_over_rdma")
    else {
        return;
    };
    let dir = scratch("port-opens");
    let stats = dir.join("s.stats");
    let port = free_port();
    let srv = Server::new(Run::preloaded(stats.clone()).pp(&[
        "server",
        "--bind",
        &ip.to_string(),
        "--port",
        &port.to_string(),
    ]));
    let start = Instant::now();
    while !listening_now(port) {
        assert!(start.elapsed() < BOUND, "nothing listened on {port}");
        std::thread::sleep(Duration::from_millis(1));
    }
    let addr = std::net::SocketAddr::new(ip, port);
    let mut s = trespass::Stream::connect_timeout(&addr, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("connecting over RDMA the moment {addr} listened: {e}"));
    let msg = [7u8; 64];
    std::io::Write::write_all(&mut s, &msg).expect("write");
    let mut back = [0u8; 64];
    std::io::Read::read_exact(&mut s, &mut back).expect("the echo");
    assert_eq!(back, msg);
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut rest).expect("end of stream");
    assert!(rest.is_empty());
    drop(s);
    ok(srv.take(), "the server");
    assert_counters(&stats, &[("listen_rdma", 1), ("accept_rdma", 1)]);
}

#[test]
fn large_messages_arrive_whole() {
    let Some(ip) = test_ip("large_messages_arrive_whole") else {
        return;
    };
    let dir = scratch("large");
    let host = ip.to_string();
    let (srv, port) = server(&Run::preloaded(dir.join("s.stats")), &dir, &[]);
    let port = port.to_string();
    let c = Run::preloaded(dir.join("c.stats")).pp(&[
        "client", "--host", &host, "--port", &port, "--iters", "20", "--size", "4194304",
    ]);
    let out = ok(c, "the client");
    assert_eq!(field(&out, "round_trips"), "20", "{out}");
    ok(srv, "the server");
    assert_counters(&dir.join("c.stats"), &[("connect_rdma", 1)]);
}

#[test]
fn a_preloaded_client_falls_back_to_a_plain_server() {
    let Some(ip) = test_ip("a_preloaded_client_falls_back_to_a_plain_server") else {
        return;
    };
    let dir = scratch("fallback-client");
    let host = ip.to_string();
    let (srv, port) = server(&Run::plain(), &dir, &[]);
    let port = port.to_string();
    let stats = dir.join("c.stats");
    let start = Instant::now();
    let c = Run::preloaded(stats.clone())
        .pp(&["client", "--host", &host, "--port", &port, "--iters", "50"]);
    let out = ok(c, "the client");
    assert_eq!(field(&out, "round_trips"), "50", "{out}");
    ok(srv, "the server");
    // Nothing listens for trespass there: rdma_cm refuses at once, well within the timeout.
    assert_counters(&stats, &[("connect_tcp_refused", 1)]);
    println!("fell back within {:?}", start.elapsed());
}

#[test]
fn a_plain_client_reaches_a_preloaded_server_over_tcp() {
    let Some(ip) = test_ip("a_plain_client_reaches_a_preloaded_server_over_tcp") else {
        return;
    };
    let dir = scratch("fallback-server");
    let host = ip.to_string();
    let stats = dir.join("s.stats");
    let (srv, port) = server(&Run::preloaded(stats.clone()), &dir, &["--count", "2"]);
    let port = port.to_string();
    // A plain client, then a preloaded one, to the same listener.
    let out = ok(
        Run::plain().pp(&["client", "--host", &host, "--port", &port, "--iters", "50"]),
        "the plain client",
    );
    assert_eq!(field(&out, "round_trips"), "50", "{out}");
    let out = ok(
        Run::preloaded(dir.join("c.stats"))
            .pp(&["client", "--host", &host, "--port", &port, "--iters", "50"]),
        "the preloaded client",
    );
    assert_eq!(field(&out, "round_trips"), "50", "{out}");
    ok(srv, "the server");
    assert_counters(
        &stats,
        &[("listen_rdma", 1), ("accept_tcp", 1), ("accept_rdma", 1)],
    );
}

#[test]
fn a_peer_killed_mid_transfer_ends_the_survivors_connection() {
    let Some(ip) = test_ip("a_peer_killed_mid_transfer_ends_the_survivors_connection") else {
        return;
    };
    let dir = scratch("killed");
    let host = ip.to_string();
    let (mut srv, port) = server(&Run::preloaded(dir.join("s.stats")), &dir, &[]);
    let port = port.to_string();
    let mut client = Run::preloaded(dir.join("c.stats"))
        .pp(&["client", "--host", &host, "--port", &port, "--stream", "60"]);
    // The server dies once the client is connected and streaming (a loaded guest may take
    // seconds to connect: a fixed sleep once killed the server before the connect).
    let (lines, printed) = std::sync::mpsc::channel::<String>();
    let stdout = client.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = lines.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    loop {
        match printed.recv_timeout(BOUND) {
            Ok(line) if line.starts_with("connected") => break,
            Ok(_) => {}
            Err(_) => panic!("the client did not connect within {BOUND:?}"),
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    srv.kill().unwrap();
    let _ = srv.wait();
    let killed = Instant::now();
    let out = finish(client, "the client");
    let took = killed.elapsed();
    let stdout = reader.join().expect("the reader");
    assert_eq!(out.status.code(), Some(4), "{stdout}{}", show(&out));
    assert!(stdout.contains("peer gone"), "{stdout}{}", show(&out));
    println!("the survivor saw its peer go after {took:?}");
}

/// `key=value` as a number.
fn number(out: &str, key: &str) -> u64 {
    field(out, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {out}"))
}

/// Neither fds nor memory grow from the first connection to the last: at most 8 more fds
/// (the pump closes a stream after the program closed its socket, on its blocking pool: one
/// connection's few fds may still be open at either count; a leak of 1,000 connections'
/// would be thousands), and at most 16 MiB more resident memory (a per-connection leak of
/// the smallest trespass buffers would be gigabytes).
fn assert_no_leak(out: &str, who: &str) {
    let (first, last) = (number(out, "open_fds_after_first"), number(out, "open_fds"));
    assert!(
        last <= first + 8,
        "{who}'s open fds grew from {first} to {last}: {out}"
    );
    let (first, last) = (number(out, "rss_kib_after_first"), number(out, "rss_kib"));
    assert!(
        last <= first + 16 * 1024,
        "{who}'s memory grew from {first} to {last} KiB: {out}"
    );
}

#[test]
fn a_thousand_short_connections_in_a_row_leak_nothing() {
    let Some(ip) = test_ip("a_thousand_short_connections_in_a_row_leak_nothing") else {
        return;
    };
    const N: &str = "1000";
    let dir = scratch("short");
    let host = ip.to_string();
    let s_stats = dir.join("s.stats");
    let c_stats = dir.join("c.stats");
    let (srv, port) = server(&Run::preloaded(s_stats.clone()), &dir, &["--count", N]);
    let port = port.to_string();
    let out = ok(
        Run::preloaded(c_stats.clone())
            .pp(&["client", "--host", &host, "--port", &port, "--short", N]),
        "the client",
    );
    assert_eq!(field(&out, "short_connections"), N, "{out}");
    let served = ok(srv, "the server");
    assert_no_leak(&out, "the client");
    assert_no_leak(&served, "the server");
    assert_counters(&c_stats, &[("connect_rdma", 1000)]);
    assert_counters(&s_stats, &[("listen_rdma", 1), ("accept_rdma", 1000)]);
    println!("{}", out.trim());
}

#[test]
fn forked_children_use_inherited_connections() {
    let Some(ip) = test_ip("forked_children_use_inherited_connections") else {
        return;
    };
    let dir = scratch("fork");
    let host = ip.to_string();
    let s_stats = dir.join("s.stats");
    // A server that forks a child per connection; clients that fork, and fork and exec,
    // after connecting: the children do all the talking.
    let (srv, port) = server(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["--fork", "--count", "3"],
    );
    let port = port.to_string();
    for (i, how) in [&["--fork"][..], &["--exec"], &["--exec", "--poll"]]
        .iter()
        .enumerate()
    {
        let stats = dir.join(format!("c{i}.stats"));
        let mut args = vec![
            "client", "--host", &host, "--port", &port, "--iters", "200", "--size", "3000",
        ];
        args.extend_from_slice(how);
        let out = ok(
            Run::preloaded(stats.clone()).pp(&args),
            &format!("client {how:?}"),
        );
        assert_eq!(field(&out, "round_trips"), "200", "{out}");
        assert!(out.contains("child exited 0"), "{out}");
        // The parent connected over RDMA; its child (and an exec'd program) counted nothing
        // of its own.
        let c = counters(&stats);
        assert_eq!(
            c.iter().map(|p| p["connect_rdma"]).sum::<u64>(),
            1,
            "{how:?}: {c:?}"
        );
    }
    let served = ok(srv, "the forking server");
    assert!(served.contains("served 3 connections (forked)"), "{served}");
    let s = total(&s_stats);
    assert_eq!((s["accept_rdma"], s["accept_tcp"]), (3, 0), "{s:?}");
}

/// A preloaded client run with `mode` (one of its thread options) against a preloaded echo
/// server at `ip`, both carried over RDMA; returns what the client printed.
fn client_mode_over_rdma(ip: std::net::IpAddr, name: &str, mode: &str) -> String {
    let dir = scratch(name);
    let host = ip.to_string();
    let (srv, port) = server(&Run::preloaded(dir.join("s.stats")), &dir, &[]);
    let port = port.to_string();
    let out = ok(
        Run::preloaded(dir.join("c.stats")).pp(&["client", "--host", &host, "--port", &port, mode]),
        "the client",
    );
    ok(srv, "the server");
    assert_counters(&dir.join("c.stats"), &[("connect_rdma", 1)]);
    out
}

/// An address on `ip`'s network where no host is (IPv4 only): nothing answers there.
fn quiet_neighbour(ip: std::net::IpAddr) -> Option<String> {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            Some(std::net::Ipv4Addr::new(a, b, c, 254).to_string())
        }
        std::net::IpAddr::V6(_) => None,
    }
}

#[test]
fn closing_a_socket_another_thread_reads_wakes_the_reader() {
    let Some(ip) = test_ip("closing_a_socket_another_thread_reads_wakes_the_reader") else {
        return;
    };
    let out = client_mode_over_rdma(ip, "threads-close", "--threads-close");
    assert!(out.contains("reader returned"), "{out}");
}

#[test]
fn threads_cancelled_while_they_read_end_as_they_would_over_tcp() {
    let Some(ip) = test_ip("threads_cancelled_while_they_read_end_as_they_would_over_tcp") else {
        return;
    };
    // Each reader is cancelled while it waits in the library's direct read or in the
    // kernel's read after it: neither may stop the process (a cancellation unwinding through
    // the library's frames aborts it) or leave the thread running.
    let out = client_mode_over_rdma(ip, "threads-cancel", "--threads-cancel");
    assert!(out.contains("readers cancelled 20"), "{out}");
}

#[test]
fn timeouts_signals_and_writes_after_shutdown_end_reads_and_writes_as_over_tcp() {
    let Some(ip) =
        test_ip("timeouts_signals_and_writes_after_shutdown_end_reads_and_writes_as_over_tcp")
    else {
        return;
    };
    // The client's --edges walk: SO_RCVTIMEO's EAGAIN, EINTR from a process-directed
    // SIGALRM that only the reading thread accepts (the library's own threads must leave it
    // to the program: one that takes it leaves the read waiting), EPIPE from send and write
    // after shutdown(SHUT_WR), and the end. Over TCP first, to pin down what TCP does here;
    // then carried over RDMA, where every one of these reads waits on the direct path.
    const WALKED: &str = "edges rcvtimeo=EAGAIN eintr=5 epipe=EPIPE eof=0";
    let dir = scratch("edges-tcp");
    let host = ip.to_string();
    let (srv, port) = server(&Run::plain(), &dir, &[]);
    let port = port.to_string();
    let out = ok(
        Run::plain().pp(&["client", "--host", &host, "--port", &port, "--edges"]),
        "the client over TCP",
    );
    ok(srv, "the server over TCP");
    assert!(out.contains(WALKED), "over TCP: {out}");
    let out = client_mode_over_rdma(ip, "edges", "--edges");
    assert!(out.contains(WALKED), "over RDMA: {out}");
}

#[test]
fn a_thread_cancelled_in_connect_ends_as_it_would_over_tcp() {
    let Some(ip) = test_ip("a_thread_cancelled_in_connect_ends_as_it_would_over_tcp") else {
        return;
    };
    // An address on the device's network where no host is: the RDMA attempt waits for an
    // answer (at most 500 ms here), then the kernel's TCP connect waits for the neighbour.
    // The cancellation (after 100 ms) must neither stop the process (unwinding through the
    // library's RDMA attempt would) nor be lost: the thread ends cancelled within 5 s.
    let Some(quiet) = quiet_neighbour(ip) else {
        return;
    };
    let dir = scratch("connect-cancel");
    let c = Run::preloaded(dir.join("c.stats"))
        .env("TRESPASS_PRELOAD_TIMEOUT_MS", "500")
        .pp(&[
            "client",
            "--host",
            &quiet,
            "--port",
            "7",
            "--connect-cancel",
        ]);
    let out = ok(c, "the client");
    assert!(out.contains("connect cancelled"), "{out}");
}

#[test]
fn datagram_and_unix_sockets_are_left_alone() {
    let Some(_ip) = test_ip("datagram_and_unix_sockets_are_left_alone") else {
        return;
    };
    let dir = scratch("untouched");
    let s_stats = dir.join("s.stats");
    let c_stats = dir.join("c.stats");
    let path = dir.join("sock");
    let path = path.to_str().unwrap();
    let srv = listening(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["unix-server", "--path", path],
    )
    .0;
    let out = ok(
        Run::preloaded(c_stats.clone()).pp(&["unix-client", "--path", path, "--iters", "20"]),
        "the unix client",
    );
    assert_eq!(field(&out, "round_trips"), "20", "{out}");
    ok(srv, "the unix server");
    let (srv, port) = listening(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["udp-server", "--bind", "127.0.0.1", "--port", "0"],
    );
    let port = port.to_string();
    let out = ok(
        Run::preloaded(c_stats.clone()).pp(&["udp-client", "--host", "127.0.0.1", "--port", &port]),
        "the udp client",
    );
    assert!(out.contains("udp ok"), "{out}");
    ok(srv, "the udp server");
    for stats in [&s_stats, &c_stats] {
        for process in counters(stats) {
            assert!(
                process.values().all(|&n| n == 0),
                "{}: {process:?}",
                stats.display()
            );
        }
    }
}

#[test]
fn rules_that_do_not_parse_mean_tcp_and_one_message() {
    let Some(ip) = test_ip("rules_that_do_not_parse_mean_tcp_and_one_message") else {
        return;
    };
    let dir = scratch("bad-rules");
    let host = ip.to_string();
    let s_stats = dir.join("s.stats");
    let c_stats = dir.join("c.stats");
    let bad =
        |stats: &PathBuf| Run::preloaded(stats.clone()).env("TRESPASS_PRELOAD_PORTS", "redis");
    let (srv, port) = server(&bad(&s_stats), &dir, &[]);
    let port = port.to_string();
    let out = finish(
        bad(&c_stats).pp(&["client", "--host", &host, "--port", &port, "--iters", "20"]),
        "the client",
    );
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("TRESPASS_PRELOAD_PORTS=\"redis\"").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("over TCP"), "{stderr}");
    ok(srv, "the server");
    assert_counters(&c_stats, &[("connect_tcp_rule", 1)]);
    assert_counters(&s_stats, &[("listen_tcp_rule", 1), ("accept_tcp", 1)]);
}

#[test]
fn rules_narrow_what_is_carried() {
    let Some(ip) = test_ip("rules_narrow_what_is_carried") else {
        return;
    };
    let dir = scratch("rules");
    let host = ip.to_string();
    let s_stats = dir.join("s.stats");
    let (srv, port) = server(&Run::preloaded(s_stats.clone()), &dir, &["--count", "2"]);
    let port_s = port.to_string();
    // A client whose rules leave this port out goes over TCP; one whose rules name it, RDMA.
    let other = if port == 65535 { 1 } else { port + 1 };
    for (ports, stats, expect) in [
        (other.to_string(), dir.join("c1.stats"), "connect_tcp_rule"),
        (
            format!("{}-{}", port.saturating_sub(1).max(1), port),
            dir.join("c2.stats"),
            "connect_rdma",
        ),
    ] {
        let run = Run::preloaded(stats.clone()).env("TRESPASS_PRELOAD_PORTS", &ports);
        let out = ok(
            run.pp(&[
                "client", "--host", &host, "--port", &port_s, "--iters", "10",
            ]),
            "a client",
        );
        assert_eq!(field(&out, "round_trips"), "10", "{out}");
        assert_counters(&stats, &[(expect, 1)]);
    }
    ok(srv, "the server");
    assert_counters(
        &s_stats,
        &[("listen_rdma", 1), ("accept_tcp", 1), ("accept_rdma", 1)],
    );
}

#[test]
fn a_listener_whose_backlog_is_full_of_rdma_connects_serves_them_all() {
    let Some(ip) = test_ip("a_listener_whose_backlog_is_full_of_rdma_connects_serves_them_all")
    else {
        return;
    };
    const N: usize = 8;
    let dir = scratch("backlog");
    let host = ip.to_string();
    let s_stats = dir.join("s.stats");
    // A backlog of 1 and no accept for 3 s: the RDMA connections are accepted by the pump at
    // once, and their loopback hand-overs wait for the program, beyond its backlog.
    let n = N.to_string();
    let (srv, port) = server(
        &Run::preloaded(s_stats.clone()),
        &dir,
        &["--backlog", "1", "--accept-after", "3000", "--count", &n],
    );
    let port = port.to_string();
    let start = Instant::now();
    let clients: Vec<(Child, PathBuf)> = (0..N)
        .map(|i| {
            let stats = dir.join(format!("c{i}.stats"));
            let c = Run::preloaded(stats.clone())
                .pp(&["client", "--host", &host, "--port", &port, "--iters", "20"]);
            (c, stats)
        })
        .collect();
    for (i, (c, stats)) in clients.into_iter().enumerate() {
        let out = ok(c, &format!("client {i}"));
        assert_eq!(field(&out, "round_trips"), "20", "{out}");
        assert_counters(&stats, &[("connect_rdma", 1)]);
    }
    let served = ok(srv, "the server");
    assert!(
        served.contains(&format!("served {N} connections")),
        "{served}"
    );
    assert_counters(&s_stats, &[("listen_rdma", 1), ("accept_rdma", N as u64)]);
    println!(
        "{N} clients through a backlog of 1 in {:?}",
        start.elapsed()
    );
}

#[test]
fn bytes_written_just_before_exit_arrive_whole() {
    let Some(ip) = test_ip("bytes_written_just_before_exit_arrive_whole") else {
        return;
    };
    let dir = scratch("exit");
    let host = ip.to_string();
    let (srv, port) = server(&Run::preloaded(dir.join("s.stats")), &dir, &["--sink"]);
    let port = port.to_string();
    // 4 MB, then exit(0) at once: the tail is still in the socket pair, the pump and the
    // stream when the program's exit handlers run; the library's must send it all.
    let out = ok(
        Run::preloaded(dir.join("c.stats")).pp(&[
            "client",
            "--host",
            &host,
            "--port",
            &port,
            "--send-exit",
            "4000000",
        ]),
        "the client",
    );
    assert!(out.contains("sent 4000000 bytes"), "{out}");
    let served = ok(srv, "the server");
    assert!(
        served.contains("served 1 connections, 4000000 bytes"),
        "{served}"
    );
    assert_counters(&dir.join("c.stats"), &[("connect_rdma", 1)]);
}

#[test]
fn bytes_keep_their_order_when_the_direct_path_and_the_kernel_take_turns() {
    let Some(ip) = test_ip("bytes_keep_their_order_when_the_direct_path_and_the_kernel_take_turns")
    else {
        return;
    };
    let dir = scratch("mixed");
    let host = ip.to_string();
    let (srv, port) = server(
        &Run::preloaded(dir.join("s.stats")),
        &dir,
        &["--sink", "--mixed"],
    );
    let port = port.to_string();
    // Writes by write, writev and send (the direct path's), send with MSG_MORE and sendfile
    // (the kernel's: the pump carries them) and nonblocking sends, in pieces of 1 byte to
    // 64 KiB; reads by read, recv, readv (direct), MSG_PEEK and MSG_WAITALL (the kernel's).
    // The server checks every byte's place in the pattern.
    let out = ok(
        Run::preloaded(dir.join("c.stats")).pp(&[
            "client",
            "--host",
            &host,
            "--port",
            &port,
            "--send-exit",
            "3000000",
            "--mixed",
        ]),
        "the client",
    );
    assert!(out.contains("sent 3000000 bytes"), "{out}");
    let served = ok(srv, "the server");
    assert!(
        served.contains("served 1 connections, 3000000 bytes"),
        "{served}"
    );
    let c = &counters(&dir.join("c.stats"))[0];
    let s = &counters(&dir.join("s.stats"))[0];
    assert_eq!((c["connect_rdma"], s["accept_rdma"]), (1, 1), "{c:?} {s:?}");
    // Both paths were taken, or the order was not put to the test.
    assert!(
        c["write_direct"] > 0,
        "no write took the direct path: {c:?}"
    );
    assert!(s["read_direct"] > 0, "no read took the direct path: {s:?}");
}
