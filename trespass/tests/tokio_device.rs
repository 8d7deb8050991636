//! Device tests of the tokio front end (`trespass::tokio`): streams driven by tokio's
//! reactor over a real RDMA device's IPv4 address (`RDMA_TEST_IP`). Without a device each
//! test prints `skipped: <reason>`; with `RDMA_TEST_DEVICE` set a missing device is a
//! failure. Every test runs under a time limit.

mod common;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use trespass::tokio::{Listener, Stream};
use trespass::Config;

/// Runs `f` on a multi-threaded runtime, failing the test after `limit`.
fn run<F: Future<Output = ()>>(limit: Duration, f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        tokio::time::timeout(limit, f)
            .await
            .unwrap_or_else(|_| panic!("the test did not finish within {limit:?}"))
    });
}

/// A listener on `port` and a client connected to it.
async fn pair(ip: IpAddr, port: u16, config: &Config) -> (Stream, Stream) {
    let addr = SocketAddr::new(ip, port);
    let listener = Listener::bind_with(config, addr).await.expect("bind");
    let connect = tokio::spawn(Stream::connect_with(config, addr));
    let (server, peer) = listener.accept().await.expect("accept");
    let client = connect.await.expect("connect task").expect("connect");
    assert_eq!(peer, client.local_addr().unwrap());
    assert_eq!(server.peer_addr().unwrap(), client.local_addr().unwrap());
    (server, client)
}

#[test]
fn tokio_copy_echoes_a_stream_larger_than_every_buffer() {
    let Some(ip) = common::test_ip("tokio_copy_echoes_a_stream_larger_than_every_buffer") else {
        return;
    };
    run(Duration::from_secs(120), async move {
        // The server's configuration sets the adaptive spin's limit; the client's does not.
        let mut limited = common::small_config();
        limited.busy_poll_max(Duration::from_micros(600));
        let addr = SocketAddr::new(ip, 7701);
        let listener = Listener::bind_with(&limited, addr).await.expect("bind");
        let connect = tokio::spawn(Stream::connect_with(&common::small_config(), addr));
        let (mut server, _) = listener.accept().await.expect("accept");
        let mut client = connect.await.expect("connect task").expect("connect");
        // The busy poll carries over from the configuration; the limit is the blocking
        // calls' 750 us (a third of it outside answers) unless the configuration set one.
        assert_eq!(client.busy_poll(), Duration::from_micros(20));
        assert_eq!(client.busy_poll_max(), trespass::tokio::BUSY_POLL_MAX);
        assert_eq!(client.busy_poll_max(), Duration::from_micros(750));
        assert_eq!(server.busy_poll_max(), Duration::from_micros(600));
        client.set_busy_poll_max(Duration::from_micros(100));
        assert_eq!(client.busy_poll_max(), Duration::from_micros(100));
        let echo = tokio::spawn(async move {
            let (mut rd, mut wr) = tokio::io::split(&mut server);
            let n = tokio::io::copy(&mut rd, &mut wr).await.expect("copy");
            wr.shutdown().await.expect("shutdown");
            n
        });
        // Sixteen rings' worth each way, through a send buffer half a ring long.
        const LEN: usize = 1 << 20;
        let data = Arc::new(common::pattern(0, LEN));
        let (mut rd, mut wr) = tokio::io::split(client);
        let sent = Arc::clone(&data);
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(50_000) {
                wr.write_all(piece).await.expect("write");
            }
            wr.shutdown().await.expect("shutdown");
            wr
        });
        let mut back = Vec::with_capacity(LEN);
        rd.read_to_end(&mut back).await.expect("read to end");
        assert_eq!(back.len(), LEN);
        assert!(back == *data, "the echo differs from what was sent");
        assert_eq!(echo.await.unwrap(), LEN as u64);
        drop(writer.await.unwrap());
    });
}

#[test]
fn dropping_read_and_write_futures_halfway_loses_and_duplicates_nothing() {
    let Some(ip) =
        common::test_ip("dropping_read_and_write_futures_halfway_loses_and_duplicates_nothing")
    else {
        return;
    };
    run(Duration::from_secs(120), async move {
        let (mut server, mut client) = pair(ip, 7702, &common::small_config()).await;
        // The reader parks instead of spinning, so its reads are pending (and dropped) often.
        server.set_busy_poll(Duration::ZERO);
        const LEN: usize = 2 << 20;
        const CHECKPOINT: usize = 512 * 1024;
        let data = Arc::new(common::pattern(0, LEN));
        let sent = Arc::clone(&data);
        // Whichever is polled first, a call that would block is dropped at the next turn
        // of the select; only the bytes a completed call reports count.
        let tick = tokio::task::yield_now;
        // Past each 512 KiB the writer stops, says where, and waits for the reader's go,
        // given once the reader has read that far and then dropped a read that found
        // nothing: 3 drops for sure, beside those the select makes.
        let (at, mut stopped_at) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let (go, mut gone) = tokio::sync::mpsc::unbounded_channel::<()>();
        let writer = tokio::spawn(async move {
            let (mut off, mut dropped) = (0usize, 0u32);
            let mut next_stop = CHECKPOINT;
            while off < LEN {
                if off >= next_stop {
                    at.send(off).expect("the reader listens");
                    gone.recv().await.expect("the reader's go");
                    next_stop += CHECKPOINT;
                }
                let n = (LEN - off).min(1 + (off * 7919) % 40_000);
                tokio::select! {
                    r = client.write(&sent[off..off + n]) => off += r.expect("write"),
                    () = tick() => dropped += 1,
                }
            }
            client.shutdown().await.expect("shutdown");
            (client, dropped)
        });
        let (mut off, mut dropped, mut checkpoints) = (0usize, 0u32, 0u32);
        let mut stop = None;
        let mut buf = vec![0u8; 24_000];
        loop {
            if let Ok(at) = stopped_at.try_recv() {
                stop = Some(at);
            }
            if stop == Some(off) {
                // Everything written is read and nothing more comes until the go.
                let r = tokio::time::timeout(Duration::from_millis(5), server.read(&mut buf)).await;
                assert!(r.is_err(), "bytes came before the go: {r:?}");
                checkpoints += 1;
                stop = None;
                go.send(()).expect("the writer waits");
            }
            tokio::select! {
                r = server.read(&mut buf) => {
                    let n = r.expect("read");
                    if n == 0 {
                        break;
                    }
                    assert!(
                        off + n <= LEN && buf[..n] == data[off..off + n],
                        "bytes {off}..{} differ from what was written",
                        off + n
                    );
                    off += n;
                }
                () = tick() => dropped += 1,
            }
        }
        assert_eq!(off, LEN, "every byte, once");
        let (_client, write_drops) = writer.await.unwrap();
        println!(
            "{} read futures ({dropped} by the select, {checkpoints} at the checkpoints) and {write_drops} write futures dropped halfway",
            dropped + checkpoints
        );
        assert_eq!(
            checkpoints as usize,
            (LEN - 1) / CHECKPOINT,
            "a read dropped halfway at every checkpoint"
        );
    });
}

#[test]
fn async_messages_keep_their_boundaries_across_dropped_receives() {
    let Some(ip) = common::test_ip("async_messages_keep_their_boundaries_across_dropped_receives")
    else {
        return;
    };
    run(Duration::from_secs(120), async move {
        let config = common::small_config();
        let (mut server, mut client) = pair(ip, 7703, &config).await;
        server.set_busy_poll(Duration::ZERO);
        let sizes: Vec<usize> = (0..60)
            .map(|i| [0, 1, 100, 4096, 20_000, 32 * 1024][i % 6])
            .collect();
        let expect = sizes.clone();
        // Every 10th message waits for the receiver's go: it has dropped a recv_msg that
        // found nothing (the sender may otherwise stay ahead and every call find a message).
        let (go, mut gone) = tokio::sync::mpsc::unbounded_channel::<()>();
        let sender = tokio::spawn(async move {
            for (i, &n) in sizes.iter().enumerate() {
                if i > 0 && i % 10 == 0 {
                    gone.recv().await.expect("the receiver's go");
                }
                client
                    .send_msg(&common::pattern(i as u64, n))
                    .await
                    .expect("send_msg");
            }
            let too_big = client
                .send_msg(&vec![0u8; 32 * 1024 + 1])
                .await
                .unwrap_err();
            assert_eq!(too_big.kind(), io::ErrorKind::InvalidInput, "{too_big}");
            client.shutdown().await.expect("shutdown");
            client
        });
        let mut msg = Vec::new();
        let (mut i, mut dropped, mut checkpoints) = (0usize, 0u32, 0u32);
        loop {
            tokio::select! {
                r = server.recv_msg(&mut msg) => match r.expect("recv_msg") {
                    Some(n) => {
                        assert_eq!(n, expect[i], "message {i}'s length");
                        assert!(msg == common::pattern(i as u64, n), "message {i}'s bytes");
                        i += 1;
                        if i % 10 == 0 && i < expect.len() {
                            // Nothing more is sent until the go: this call is dropped
                            // halfway for sure.
                            let r = tokio::time::timeout(
                                Duration::from_millis(5),
                                server.recv_msg(&mut msg),
                            )
                            .await;
                            assert!(r.is_err(), "a message came before the go: {r:?}");
                            checkpoints += 1;
                            go.send(()).expect("the sender waits");
                        }
                    }
                    None => break,
                },
                () = tokio::task::yield_now() => dropped += 1,
            }
        }
        assert_eq!(i, expect.len(), "every message, once");
        println!(
            "{} recv_msg futures dropped halfway ({dropped} by the select, {checkpoints} at the checkpoints)",
            dropped + checkpoints
        );
        assert_eq!(
            checkpoints, 5,
            "a recv_msg dropped halfway every 10 messages"
        );
        drop(sender.await.unwrap());
    });
}

/// Lifts the soft limit on open descriptors to the hard one: each connection takes five,
/// and both ends of every connection are in this process.
#[test]
fn lent_buffers_cross_the_tokio_front_end_both_ways() {
    let Some(ip) = common::test_ip("lent_buffers_cross_the_tokio_front_end_both_ways") else {
        return;
    };
    run(Duration::from_secs(120), async move {
        let mut config = common::small_config();
        config.max_message(4 << 20).keepalive(None);
        let (mut server, mut client) = pair(ip, 7706, &config).await;
        // The reader waits first: its fetch starts on the lend's arrival and completes on
        // the READs' completions, each a wake of the reactor.
        let reader = tokio::spawn(async move {
            let mut buf = Vec::with_capacity(4 << 20);
            let ptr = buf.as_ptr() as usize;
            assert_eq!(server.recv_msg(&mut buf).await.unwrap(), Some(3 << 20));
            assert!(buf == common::pattern(1, 3 << 20), "the lent message");
            assert_eq!(
                buf.as_ptr() as usize,
                ptr,
                "fetched into the reader's allocation"
            );
            // The second as stream bytes.
            let mut bytes = vec![0; 200_000];
            server.read_exact(&mut bytes).await.unwrap();
            assert!(bytes == common::pattern(2, 200_000));
            server
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.lend_msg(common::pattern(1, 3 << 20)).await.unwrap();
        client.lend_msg(common::pattern(2, 200_000)).await.unwrap();
        assert_eq!(client.lent(), 2);
        assert!(client.reclaim().await.unwrap() == common::pattern(1, 3 << 20));
        assert!(client.reclaim().await.unwrap() == common::pattern(2, 200_000));
        let e = client.reclaim().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = client.lend_msg(Vec::new()).await.unwrap_err();
        assert_eq!(
            e.into_parts().1,
            Some(Vec::new()),
            "a refused buffer comes back"
        );
        drop(reader.await.unwrap());
    });
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: one valid rlimit, written by the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        // Root (the rig's guest) may raise the hard limit too; anyone may raise the soft one.
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max.max(65_536),
            rlim_max: lim.rlim_max.max(65_536),
        };
        // SAFETY: one valid rlimit, read by the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
            lim.rlim_cur = lim.rlim_max;
            // SAFETY: as above.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        }
    }
}

/// This process's resident memory in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The two many-connection tests measure descriptors and memory: one at a time.
static MANY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn one_runtime_thread_serves_many_connections() {
    let Some(ip) = common::test_ip("one_runtime_thread_serves_many_connections") else {
        return;
    };
    many_connections(ip, 7704, None);
}

#[test]
fn one_runtime_thread_serves_many_connections_on_a_shared_receive_queue() {
    let Some(ip) =
        common::test_ip("one_runtime_thread_serves_many_connections_on_a_shared_receive_queue")
    else {
        return;
    };
    // 2000 streams promised 8 receives each (16,000) share 2048.
    many_connections(ip, 7709, Some(2048));
}

/// Opens `TRESPASS_TOKIO_CONNECTIONS` (default 1000) connections to one listener, both ends
/// on one current-thread runtime, moves 20 KB each way on each, and closes them; prints the
/// descriptors and memory they took while all were up.
fn many_connections(ip: IpAddr, port: u16, shared: Option<u32>) {
    let _one = MANY.lock().unwrap_or_else(|p| p.into_inner());
    let count: usize = std::env::var("TRESPASS_TOKIO_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut config = Config::new();
    config
        .ring_size(16 * 1024)
        .send_buffer(16 * 1024)
        .recv_depth(8)
        .send_depth(8)
        .max_write(8 * 1024)
        .busy_poll(Duration::ZERO)
        .connect_timeout(Duration::from_secs(30))
        .shared_receive_queue(shared);
    raise_fd_limit();
    let before = open_fds();
    let rss_before = rss_kib();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(300), async move {
            let addr = SocketAddr::new(ip, port);
            let listener = Listener::bind_with(&config, addr).await.expect("bind");
            let server = tokio::spawn(async move {
                let mut tasks = Vec::with_capacity(count);
                for _ in 0..count {
                    let (mut s, _) = listener.accept().await.expect("accept");
                    tasks.push(tokio::spawn(async move {
                        let (mut rd, mut wr) = tokio::io::split(&mut s);
                        tokio::io::copy(&mut rd, &mut wr).await.expect("echo")
                    }));
                }
                let mut total = 0;
                for t in tasks {
                    total += t.await.unwrap();
                }
                total
            });
            // Every connection is up at once before any moves data: the descriptors and the
            // memory they take are read then.
            let all_up = Arc::new(tokio::sync::Barrier::new(count + 1));
            let mut clients = Vec::with_capacity(count);
            for i in 0..count {
                let cfg = config.clone();
                let all_up = Arc::clone(&all_up);
                clients.push(tokio::spawn(async move {
                    let mut s = Stream::connect_with(&cfg, addr).await.expect("connect");
                    all_up.wait().await;
                    let data = common::pattern(i as u64 * 10_000, 20_000);
                    let (mut rd, mut wr) = tokio::io::split(&mut s);
                    let send = async {
                        wr.write_all(&data).await.expect("write");
                        wr.shutdown().await.expect("shutdown");
                    };
                    let mut back = Vec::new();
                    let recv = rd.read_to_end(&mut back);
                    let ((), r) = tokio::join!(send, recv);
                    r.expect("read");
                    assert!(back == data, "connection {i}'s echo");
                }));
            }
            all_up.wait().await;
            let (fds, rss) = (open_fds() - before, rss_kib() - rss_before);
            let mode = match shared {
                Some(d) => format!("a shared receive queue of {d}"),
                None => "a receive queue each".into(),
            };
            println!(
                "{count} connections up (both ends in this process, on one runtime thread, \
                 {mode}): {fds} descriptors, {rss} KiB of resident memory more than before"
            );
            for c in clients {
                c.await.unwrap();
            }
            assert_eq!(server.await.unwrap(), count as u64 * 20_000);
        })
        .await
        .expect("the connections did not finish within 300 s");
    });
    // Every stream was dropped with its runtime; lingering closes ran on the blocking pool,
    // which the runtime's drop waited for. The keep-alive thread may be in a pass over the
    // connections, holding them a moment longer: give it a few of its ticks.
    drop(rt);
    let mut after = open_fds();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while after > before + 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = open_fds();
    }
    assert!(
        after <= before + 4,
        "{} descriptors left open after {count} connections closed",
        after - before
    );
}

#[test]
fn connecting_where_nobody_listens_is_refused() {
    let Some(ip) = common::test_ip("connecting_where_nobody_listens_is_refused") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async move {
        let err = tokio::time::timeout(
            Duration::from_secs(30),
            Stream::connect(SocketAddr::new(ip, 7705)),
        )
        .await
        .expect("connect did not end within 30 s")
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    });
}

/// Runs with or without a device: a connect and a bind that cannot succeed (loopback has no
/// RDMA device, or nothing listens on its port 1; on a host without rdma-core the library
/// cannot even be loaded) end in an error, in bounded time, without a panic, and leave the
/// runtime usable.
#[test]
fn a_connect_that_cannot_succeed_fails_in_time_anywhere() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut config = Config::new();
        config.connect_timeout(Duration::from_secs(3));
        let err = tokio::time::timeout(
            Duration::from_secs(20),
            Stream::connect_with(&config, "127.0.0.1:1"),
        )
        .await
        .expect("connect did not end within 20 s")
        .unwrap_err();
        println!("connect to 127.0.0.1:1: {err}");
        let err = Stream::connect("no-such-host.invalid:7471")
            .await
            .unwrap_err();
        println!("connect to no-such-host.invalid: {err}");
        let after = tokio::spawn(async { 7 })
            .await
            .expect("the runtime still runs tasks");
        assert_eq!(after, 7);
    });
}

#[test]
fn a_stream_taken_back_from_tokio_keeps_its_bytes_and_closes_after_them() {
    let Some(ip) =
        common::test_ip("a_stream_taken_back_from_tokio_keeps_its_bytes_and_closes_after_them")
    else {
        return;
    };
    run(Duration::from_secs(60), async move {
        let (mut server, mut client) = pair(ip, 7710, &common::small_config()).await;
        let data = common::pattern(0, 300_000);
        client.write_all(&data[..1000]).await.expect("async write");
        // Taken back to the blocking API: the rest goes out from a blocking thread, and the
        // drop waits for it before the thread ends.
        let blocking = client.into_std();
        let rest = data[1000..].to_vec();
        let writer = tokio::task::spawn_blocking(move || {
            let mut blocking = blocking;
            blocking.set_nonblocking(false).expect("blocking mode");
            std::io::Write::write_all(&mut blocking, &rest).expect("blocking write");
            drop(blocking);
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("read to the end");
        writer.await.expect("the blocking writer");
        assert!(
            got == data,
            "{} bytes of {} arrived, or different ones",
            got.len(),
            data.len()
        );
    });
}

/// A reader task parked on a stream whose writer task keeps trying to write: the writer's
/// own polls take the completion events (and the completions) that announce the reader's
/// bytes, so the reactor may never see them; the writer must wake the reader itself. On one
/// runtime thread, with no busy poll, the client's writer polls a write over and over
/// (yielding between tries) on a connection whose server reads nothing, so every try finds
/// the window full and prepares to sleep, draining the events; meanwhile the server sends a
/// ping at a time and waits until the client's reader has it. A lost wake-up leaves a ping
/// unread for good (nothing else arrives to raise another event), and the time limit ends
/// the test.
#[test]
fn a_writer_that_takes_the_readers_completions_wakes_the_reader() {
    let Some(ip) = common::test_ip("a_writer_that_takes_the_readers_completions_wakes_the_reader")
    else {
        return;
    };
    const PINGS: usize = 200;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async move {
        let mut config = common::small_config();
        config.busy_poll(Duration::ZERO);
        let (mut server, mut client) = pair(ip, 7711, &config).await;
        for s in [&mut server, &mut client] {
            s.set_busy_poll(Duration::ZERO);
            s.set_busy_poll_max(Duration::ZERO);
        }
        let (mut rd, mut wr) = tokio::io::split(client);
        let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            for i in 0..PINGS {
                rd.read_exact(&mut byte).await.expect("read a ping");
                assert_eq!(byte[0], i as u8, "ping {i}");
                got_tx.send(i).expect("the server waits");
            }
            rd
        });
        let stopped = Arc::clone(&stop);
        let writer = tokio::spawn(async move {
            let chunk = common::pattern(1, 8 * 1024);
            let (mut sent, mut tries) = (0usize, 0u64);
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                // One try, whatever it says (the window is soon full: Pending), then let
                // the others run.
                std::future::poll_fn(|cx| {
                    if let std::task::Poll::Ready(r) =
                        std::pin::Pin::new(&mut wr).poll_write(cx, &chunk)
                    {
                        sent += r.expect("a write");
                    }
                    std::task::Poll::Ready(())
                })
                .await;
                tries += 1;
                tokio::task::yield_now().await;
            }
            (wr, sent, tries)
        });
        let limit = Duration::from_secs(60);
        let pings = async {
            for i in 0..PINGS {
                server.write_all(&[i as u8]).await.expect("write a ping");
                let got = got_rx.recv().await.expect("the reader goes on");
                assert_eq!(got, i);
            }
        };
        tokio::time::timeout(limit, pings)
            .await
            .unwrap_or_else(|_| {
                panic!("a ping was not read within {limit:?}: the reader was not woken")
            });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (wr, sent, tries) = writer.await.expect("the writer");
        let rd = reader.await.expect("the reader");
        drop(rd.unsplit(wr));
        println!("{PINGS} pings read while the writer tried {tries} writes ({sent} bytes taken)");
    });
}
