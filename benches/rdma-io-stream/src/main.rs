//! rdma-io-stream: the rdma-io crate's `AsyncRdmaStream` (its `SendRecvConfig::stream()`
//! transport, the one it offers for byte streams and tonic) through the two tests of
//! `stride-perf stream`, so that scripts/trespass-compare can put it beside trespass.
//!
//! ```text
//! rdma-io-stream serve ADDR:PORT lat|bw SIZE ITERS
//! rdma-io-stream client ADDR:PORT lat|bw SIZE ITERS
//! ```
//!
//! - lat: a ping-pong. The client writes SIZE bytes, the server reads exactly SIZE and
//!   writes them back, ITERS times. Each sample is one round trip / 2; the client prints
//!   their mean and median in microseconds.
//! - bw: the client writes ITERS times SIZE bytes; the server reads them all and answers one
//!   byte. The client prints MiB/s over the time from the first write to that answer.
//!
//! The client's last line is `rdma-io-stream result: ...` (what trespass-compare reads).
//! Both sides run on a current-thread tokio runtime, as `stride-perf stream --tokio` does.
//! Exit status: 0 on success, 1 when the run failed (the message says how), 2 for a usage
//! error. Every call is bounded by a 60 s timeout: in the measured loops, as in
//! `stride-perf stream --tokio`, by one timer for the whole loop that fails it when 60 s
//! pass without an iteration ending (no timer and no label per call, which would be
//! measured too).

use std::cell::Cell;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_io::async_cm::AsyncCmListener;
use rdma_io::async_stream::AsyncRdmaStream;
use rdma_io::send_recv_transport::{SendRecvConfig, SendRecvTransport};

const USAGE: &str = "usage: rdma-io-stream serve|client ADDR:PORT lat|bw SIZE ITERS";
/// How long any one step may take.
const STEP: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq)]
enum Test {
    Lat,
    Bw,
}

struct Args {
    serve: bool,
    addr: SocketAddr,
    test: Test,
    size: usize,
    iters: u64,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let [role, addr, test, size, iters] = argv else {
        return Err(USAGE.into());
    };
    let serve = match role.as_str() {
        "serve" => true,
        "client" => false,
        other => return Err(format!("unknown role {other:?}\n{USAGE}")),
    };
    let addr = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not an IP address and port: {e}"))?;
    let test = match test.as_str() {
        "lat" => Test::Lat,
        "bw" => Test::Bw,
        other => return Err(format!("unknown test {other:?} (lat or bw)")),
    };
    let size = size
        .parse()
        .ok()
        .filter(|&s: &usize| (1..=4 << 20).contains(&s))
        .ok_or_else(|| format!("SIZE {size:?} is not a number of bytes from 1 to 4194304"))?;
    let iters = iters
        .parse()
        .ok()
        .filter(|&n: &u64| n >= 1)
        .ok_or_else(|| format!("ITERS {iters:?} is not a count of at least 1"))?;
    Ok(Args {
        serve,
        addr,
        test,
        size,
        iters,
    })
}

/// `f`, failing with `what` after [`STEP`].
async fn step<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(STEP, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: nothing happened for {} s", STEP.as_secs())),
    }
}

/// The measured loop `f`, run to its end; it fails when a whole [`STEP`] passes without
/// `progress` (the iterations it finished) moving.
async fn looped(
    progress: &Cell<u64>,
    f: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    let mut f = std::pin::pin!(f);
    let mut seen = progress.get();
    loop {
        match tokio::time::timeout(STEP, f.as_mut()).await {
            Ok(r) => return r,
            Err(_) if progress.get() == seen => {
                return Err(format!(
                    "iteration {seen}: nothing happened for {} s",
                    STEP.as_secs()
                ))
            }
            Err(_) => seen = progress.get(),
        }
    }
}

type Stream = AsyncRdmaStream<SendRecvTransport>;

/// Reads exactly `buf.len()` bytes (rdma-io's stream has inherent `read` and `write_all`,
/// and implements the `futures` traits, not tokio's).
async fn read_exact(s: &mut Stream, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match s.read(buf).await? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => buf = &mut buf[n..],
        }
    }
    Ok(())
}

async fn serve(a: &Args) -> Result<(), String> {
    let listener =
        AsyncCmListener::bind(&a.addr).map_err(|e| format!("listening on {}: {e}", a.addr))?;
    println!("rdma-io-stream: listening on {}", a.addr);
    let transport = step(
        "accepting",
        SendRecvTransport::accept(&listener, SendRecvConfig::stream()),
    )
    .await?;
    let mut s: Stream = AsyncRdmaStream::new(transport);
    let mut buf = vec![0u8; a.size.max(1 << 20)];
    match a.test {
        Test::Lat => {
            let progress = Cell::new(0);
            looped(&progress, async {
                for i in 0..a.iters {
                    read_exact(&mut s, &mut buf[..a.size])
                        .await
                        .map_err(|e| format!("round trip {i}: reading: {e}"))?;
                    s.write_all(&buf[..a.size])
                        .await
                        .map_err(|e| format!("round trip {i}: echoing: {e}"))?;
                    progress.set(i + 1);
                }
                Ok(())
            })
            .await?;
        }
        Test::Bw => {
            let progress = Cell::new(0);
            looped(&progress, async {
                let mut left = a.size as u64 * a.iters;
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let got = s
                        .read(&mut buf[..want])
                        .await
                        .map_err(|e| format!("reading with {left} bytes to go: {e}"))?;
                    if got == 0 {
                        return Err(format!("the client closed with {left} bytes to go"));
                    }
                    left -= got as u64;
                    progress.set(progress.get() + 1);
                }
                Ok(())
            })
            .await?;
            step("answering", s.write_all(&[1])).await?;
        }
    }
    // The client's last read sees the end of the stream.
    let mut end = [0u8; 1];
    let _ = tokio::time::timeout(STEP, s.read(&mut end)).await;
    println!("rdma-io-stream: served {} of {} B", a.iters, a.size);
    Ok(())
}

async fn client(a: &Args) -> Result<(), String> {
    let transport = step(
        &format!("connecting to {}", a.addr),
        SendRecvTransport::connect(&a.addr, SendRecvConfig::stream()),
    )
    .await?;
    let mut s: Stream = AsyncRdmaStream::new(transport);
    let data: Vec<u8> = (0..a.size).map(|i| (i as u8).wrapping_mul(31)).collect();
    let mut back = vec![0u8; a.size];
    let line = match a.test {
        Test::Lat => {
            let mut half_rtts = Vec::with_capacity(a.iters as usize);
            let progress = Cell::new(0);
            looped(&progress, async {
                for i in 0..a.iters {
                    let t0 = Instant::now();
                    s.write_all(&data)
                        .await
                        .map_err(|e| format!("round trip {i}: writing: {e}"))?;
                    read_exact(&mut s, &mut back)
                        .await
                        .map_err(|e| format!("round trip {i}: reading the echo: {e}"))?;
                    half_rtts.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                    progress.set(i + 1);
                }
                Ok(())
            })
            .await?;
            // The last echo, checked once (a check per round trip would be measured too).
            if back != data {
                return Err("the last echo differs from what was sent".into());
            }
            let mean = half_rtts.iter().sum::<f64>() / half_rtts.len() as f64;
            half_rtts.sort_by(f64::total_cmp);
            let median = half_rtts[half_rtts.len() / 2];
            format!(
                "lat {} B x {}: mean_us={mean:.3} median_us={median:.3}",
                a.size, a.iters
            )
        }
        Test::Bw => {
            let t0 = Instant::now();
            let progress = Cell::new(0);
            looped(&progress, async {
                for i in 0..a.iters {
                    s.write_all(&data)
                        .await
                        .map_err(|e| format!("message {i}: writing: {e}"))?;
                    progress.set(i + 1);
                }
                Ok(())
            })
            .await?;
            let mut answer = [0u8; 1];
            step(
                "reading the server's answer",
                read_exact(&mut s, &mut answer),
            )
            .await?;
            let secs = t0.elapsed().as_secs_f64();
            let mib = a.size as f64 * a.iters as f64 / secs / f64::from(1 << 20);
            format!("bw {} B x {}: mib_per_sec={mib:.3}", a.size, a.iters)
        }
    };
    let _ = step("closing", s.shutdown()).await;
    println!("rdma-io-stream result: {line}");
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rdma-io-stream: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdma-io-stream: starting tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async {
        if a.serve {
            serve(&a).await
        } else {
            client(&a).await
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-io-stream: {e}");
            ExitCode::FAILURE
        }
    }
}
