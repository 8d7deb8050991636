//! Device tests of the tokio front end through the `futures` crate's traits (feature
//! `futures-io`): `futures_util::io`'s copy, `write_all`, `close` and `read_to_end` on a
//! `trespass::tokio::Stream` itself, no compat wrapper, over a real RDMA device's IPv4 address
//! (`RDMA_TEST_IP`). Without a device each test prints `skipped: <reason>`; with
//! `RDMA_TEST_DEVICE` set a missing device is a failure. Every test runs under a time limit.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::io::{AsyncReadExt, AsyncWriteExt};
use trespass::tokio::{Listener, Stream};

/// The stream is what code generic over the `futures` traits asks for.
fn futures_io_stream<T: futures_io::AsyncRead + futures_io::AsyncWrite + Unpin + Send>() {}

#[test]
fn the_stream_implements_the_futures_traits() {
    futures_io_stream::<Stream>();
}

/// Runs `f` on a current-thread runtime (the per-core mode), failing the test after `limit`.
fn run<F: std::future::Future<Output = ()>>(limit: Duration, f: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        tokio::time::timeout(limit, f)
            .await
            .unwrap_or_else(|_| panic!("the test did not finish within {limit:?}"))
    });
}

#[test]
fn futures_copy_echoes_a_stream_and_close_is_a_half_close() {
    let Some(ip) = common::test_ip("futures_copy_echoes_a_stream_and_close_is_a_half_close") else {
        return;
    };
    run(Duration::from_secs(120), async move {
        let config = common::small_config();
        let addr = SocketAddr::new(ip, 7712);
        let listener = Listener::bind_with(&config, addr).await.expect("bind");
        let connect = tokio::spawn(Stream::connect_with(&config, addr));
        let (server, _) = listener.accept().await.expect("accept");
        let client = connect.await.expect("connect task").expect("connect");

        // The server echoes through futures' copy until the client's close, then closes.
        let echo = tokio::spawn(async move {
            let (rd, mut wr) = server.split();
            let n = futures_util::io::copy(rd, &mut wr).await.expect("copy");
            wr.close().await.expect("close");
            n
        });
        // Many rings' worth, through a send buffer half a ring long, in odd pieces.
        const LEN: usize = 1 << 20;
        let data = Arc::new(common::pattern(7, LEN));
        let (mut rd, mut wr) = client.split();
        let sent = Arc::clone(&data);
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(40_009) {
                wr.write_all(piece).await.expect("write_all");
            }
            wr.flush().await.expect("flush");
            // A half-close: the echo still comes back after it.
            wr.close().await.expect("close");
            wr
        });
        let mut back = Vec::with_capacity(LEN);
        rd.read_to_end(&mut back).await.expect("read to end");
        assert_eq!(back.len(), LEN, "the echo's length");
        assert!(back == *data, "the echo differs from what was sent");
        assert_eq!(echo.await.expect("echo task"), LEN as u64);
        let wr = writer.await.expect("writer task");
        // Both halves back together: the stream reads end of stream again, as TCP's would.
        let mut stream = rd.reunite(wr).expect("the two halves of one stream");
        let mut more = [0u8; 16];
        assert_eq!(
            futures_util::io::AsyncReadExt::read(&mut stream, &mut more)
                .await
                .expect("read after end of stream"),
            0
        );
    });
}
