//! Async ping-pong over trespass and over TCP, on tokio's multi-threaded runtime or on one
//! current-thread runtime per core (each pinned to its core and owning its connections):
//! round trips per second, per core of the client, and round-trip percentiles.
//!
//! ```text
//! async_bench compare IP [--rounds R] [--workers N] [--conns C] [--size BYTES] [--secs S]
//! async_bench serve IP PORT --transport trespass|tcp|blocking --runtime multi|per-core [--workers N]
//! async_bench run IP PORT --transport trespass|tcp|blocking --runtime multi|per-core [--workers N]
//!                 [--conns C] [--size BYTES] [--secs S]
//! ```
//!
//! `compare` runs trespass's blocking API (a thread per connection, the reference) and every
//! async transport × runtime pair, alternating, R rounds (default 3), each
//! against a fresh server process (this program's `serve`), and prints one row per pair
//! with the median and the spread over the rounds. A server listens on N ports from PORT
//! (one per worker); connection i goes to port PORT + i % N, so on the per-core runtime
//! each worker serves the connections of its own port. Defaults: 2 workers, 8 connections,
//! 64 bytes, 3 seconds.

#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    Trespass,
    Tcp,
    /// trespass's blocking API, a thread per connection on both sides (the runtime does
    /// not apply): the reference the async front end is measured against.
    Blocking,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Runtime {
    Multi,
    PerCore,
}

#[derive(Clone, Copy, Debug)]
struct Opts {
    transport: Transport,
    runtime: Runtime,
    workers: usize,
    conns: usize,
    size: usize,
    secs: f64,
    rounds: usize,
}

/// One client run's result.
#[derive(Clone, Debug)]
struct Row {
    rts: u64,
    wall: f64,
    cpu: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

const USAGE: &str = "usage: async_bench compare IP [--rounds R] [--workers N] [--conns C] [--size BYTES] [--secs S]
       async_bench serve IP PORT --transport trespass|tcp|blocking --runtime multi|per-core [--workers N]
       async_bench run IP PORT --transport trespass|tcp|blocking --runtime multi|per-core [--workers N] [--conns C] [--size BYTES] [--secs S]";

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        transport: Transport::Trespass,
        runtime: Runtime::Multi,
        workers: 2,
        conns: 8,
        size: 64,
        secs: 3.0,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag} takes a positive whole number, not {v:?}"))
        };
        match flag.as_str() {
            "--transport" => {
                o.transport = match value.as_str() {
                    "trespass" => Transport::Trespass,
                    "tcp" => Transport::Tcp,
                    "blocking" => Transport::Blocking,
                    v => {
                        return Err(format!(
                            "--transport is trespass, tcp or blocking, not {v:?}"
                        ))
                    }
                }
            }
            "--runtime" => {
                o.runtime = match value.as_str() {
                    "multi" => Runtime::Multi,
                    "per-core" => Runtime::PerCore,
                    v => return Err(format!("--runtime is multi or per-core, not {v:?}")),
                }
            }
            "--workers" => o.workers = num(value)?,
            "--conns" => o.conns = num(value)?,
            "--size" => o.size = num(value)?.min(1 << 20),
            "--rounds" => o.rounds = num(value)?,
            "--secs" => {
                o.secs = value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| format!("--secs takes seconds (0 to 3600), not {value:?}"))?
            }
            f => return Err(format!("unknown option {f:?}")),
        }
    }
    Ok(o)
}

/// Pins the calling thread to `cpu` (modulo the CPUs there are).
fn pin(cpu: usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes a bit inside it (the
    // index is below the CPU count); sched_setaffinity reads the set for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// This process's CPU time (user and system) in seconds.
fn cpu_time() -> f64 {
    // SAFETY: a zeroed rusage is valid; getrusage writes it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Builds the runtime(s) of `runtime` and runs `job(worker)` for each worker: all on one
/// multi-threaded runtime, or each on its own current-thread runtime on its own pinned
/// thread. Returns the jobs' results in worker order.
fn on_runtimes<T, F, Fut>(runtime: Runtime, workers: usize, job: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    match runtime {
        Runtime::Multi => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()
                .expect("a tokio runtime");
            rt.block_on(async move {
                let tasks: Vec<_> = (0..workers).map(|w| tokio::spawn(job(w))).collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.expect("a worker's task"));
                }
                out
            })
        }
        Runtime::PerCore => {
            let threads: Vec<_> = (0..workers)
                .map(|w| {
                    let job = job.clone();
                    std::thread::spawn(move || {
                        pin(w);
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("a tokio runtime")
                            .block_on(job(w))
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a worker thread"))
                .collect()
        }
    }
}

/// Echoes fixed-size messages (the size comes first, as 4 bytes) until end of stream.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let Ok(size) = s.read_u32().await else { return };
    let mut buf = vec![0u8; size.clamp(1, 1 << 20) as usize];
    while s.read_exact(&mut buf).await.is_ok() {
        if s.write_all(&buf).await.is_err() {
            return;
        }
    }
}

/// The blocking server: a thread per port accepting, a thread per connection echoing.
fn serve_blocking(ip: IpAddr, port: u16, o: Opts) -> io::Result<()> {
    use std::io::{Read, Write};
    let mut config = trespass::Config::new();
    config.busy_poll(Duration::ZERO);
    let listeners = (0..o.workers)
        .map(|w| config.bind(SocketAddr::new(ip, port + w as u16)))
        .collect::<io::Result<Vec<_>>>()?;
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            std::thread::spawn(move || loop {
                let Ok((mut s, _)) = l.accept() else { return };
                std::thread::spawn(move || {
                    let mut len = [0u8; 4];
                    if s.read_exact(&mut len).is_err() {
                        return;
                    }
                    let size = u32::from_be_bytes(len).clamp(1, 1 << 20) as usize;
                    let mut buf = vec![0u8; size];
                    while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
                });
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// The blocking client: a thread per connection.
fn run_blocking(
    ip: IpAddr,
    port: u16,
    o: Opts,
    warm: Instant,
    end: Instant,
) -> io::Result<Vec<u32>> {
    use std::io::{Read, Write};
    let threads: Vec<_> = (0..o.conns)
        .map(|i| {
            let addr = SocketAddr::new(ip, port + (i % o.workers) as u16);
            std::thread::spawn(move || -> io::Result<Vec<u32>> {
                let mut s = trespass::Stream::connect(addr)?;
                s.write_all(&(o.size as u32).to_be_bytes())?;
                let msg = vec![0x5au8; o.size];
                let mut back = vec![0u8; o.size];
                let mut rtts = Vec::with_capacity(1 << 16);
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        return Ok(rtts);
                    }
                    s.write_all(&msg)?;
                    s.read_exact(&mut back)?;
                    if t0 >= warm {
                        rtts.push(t0.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(
            t.join()
                .map_err(|_| io::Error::other("a client thread panicked"))??,
        );
    }
    Ok(all)
}

fn serve(ip: IpAddr, port: u16, o: Opts) -> io::Result<()> {
    if o.transport == Transport::Blocking {
        return serve_blocking(ip, port, o);
    }
    on_runtimes(o.runtime, o.workers, move |w| async move {
        let addr = SocketAddr::new(ip, port + w as u16);
        match o.transport {
            Transport::Trespass => {
                let mut config = trespass::Config::new();
                // Many connections on one worker: spinning on one is time the others wait.
                config.busy_poll(Duration::ZERO);
                let l = trespass::tokio::Listener::bind_with(&config, addr).await?;
                loop {
                    let (s, _) = l.accept().await?;
                    tokio::spawn(echo(s));
                }
            }
            Transport::Tcp | Transport::Blocking => {
                let l = tokio::net::TcpListener::bind(addr).await?;
                loop {
                    let (s, _) = l.accept().await?;
                    s.set_nodelay(true)?;
                    tokio::spawn(echo(s));
                }
            }
        }
    })
    .into_iter()
    .collect::<io::Result<Vec<()>>>()
    .map(|_| ())
}

/// One connection's ping-pong until `end`; its round-trip times in nanoseconds (those
/// after `warm`).
async fn pingpong<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    size: usize,
    warm: Instant,
    end: Instant,
) -> io::Result<Vec<u32>> {
    s.write_u32(size as u32).await?;
    let msg = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(1 << 16);
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            return Ok(rtts);
        }
        s.write_all(&msg).await?;
        s.read_exact(&mut back).await?;
        if t0 >= warm {
            rtts.push(t0.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        }
    }
}

async fn connect_and_run(
    addr: SocketAddr,
    o: Opts,
    warm: Instant,
    end: Instant,
) -> io::Result<Vec<u32>> {
    match o.transport {
        Transport::Trespass => {
            let s = trespass::tokio::Stream::connect(addr).await?;
            pingpong(s, o.size, warm, end).await
        }
        Transport::Tcp | Transport::Blocking => {
            let s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            pingpong(s, o.size, warm, end).await
        }
    }
}

fn run(ip: IpAddr, port: u16, o: Opts) -> io::Result<Row> {
    let start = Instant::now() + Duration::from_millis(500);
    let warm = start + Duration::from_secs_f64(o.secs * 0.1);
    let end = start + Duration::from_secs_f64(o.secs * 1.1);
    let cpu0 = cpu_time();
    let per_worker = if o.transport == Transport::Blocking {
        vec![run_blocking(ip, port, o, warm, end)]
    } else {
        on_runtimes(o.runtime, o.workers, move |w| async move {
            // Worker w runs connections w, w + N, ...; connection i goes to port PORT + i % N.
            let mine: Vec<_> = (w..o.conns)
                .step_by(o.workers)
                .map(|i| {
                    let addr = SocketAddr::new(ip, port + (i % o.workers) as u16);
                    tokio::spawn(connect_and_run(addr, o, warm, end))
                })
                .collect();
            let mut all = Vec::new();
            for t in mine {
                all.extend(t.await.map_err(io::Error::other)??);
            }
            Ok::<_, io::Error>(all)
        })
    };
    let cpu = cpu_time() - cpu0;
    let mut rtts = Vec::new();
    for r in per_worker {
        rtts.extend(r?);
    }
    if rtts.is_empty() {
        return Err(io::Error::other("no round trip completed"));
    }
    rtts.sort_unstable();
    let q = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    Ok(Row {
        rts: rtts.len() as u64,
        wall: o.secs,
        cpu,
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
    })
}

/// Starts `serve` in a child process and waits until every port of it accepts.
fn spawn_server(ip: IpAddr, port: u16, o: Opts) -> io::Result<Child> {
    let t = match o.transport {
        Transport::Trespass => "trespass",
        Transport::Tcp => "tcp",
        Transport::Blocking => "blocking",
    };
    let r = match o.runtime {
        Runtime::Multi => "multi",
        Runtime::PerCore => "per-core",
    };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", &ip.to_string(), &port.to_string()])
        .args([
            "--transport",
            t,
            "--runtime",
            r,
            "--workers",
            &o.workers.to_string(),
        ])
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for w in 0..o.workers {
        let addr = SocketAddr::new(ip, port + w as u16);
        loop {
            let ok = rt.block_on(async {
                match o.transport {
                    Transport::Trespass | Transport::Blocking => {
                        trespass::tokio::Stream::connect(addr).await.is_ok()
                    }
                    Transport::Tcp => tokio::net::TcpStream::connect(addr).await.is_ok(),
                }
            });
            if ok {
                break;
            }
            if Instant::now() > deadline || child.try_wait()?.is_some() {
                let _ = child.kill();
                return Err(io::Error::other(format!(
                    "the server on {addr} never listened"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(child)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn compare(ip: IpAddr, o: Opts) -> io::Result<()> {
    let pairs = [
        (Transport::Blocking, Runtime::Multi),
        (Transport::Trespass, Runtime::Multi),
        (Transport::Trespass, Runtime::PerCore),
        (Transport::Tcp, Runtime::Multi),
        (Transport::Tcp, Runtime::PerCore),
    ];
    let mut rows: Vec<Vec<Row>> = vec![Vec::new(); pairs.len()];
    let mut port = 7800u16;
    for round in 1..=o.rounds {
        for (k, &(transport, runtime)) in pairs.iter().enumerate() {
            let o = Opts {
                transport,
                runtime,
                ..o
            };
            let mut server = spawn_server(ip, port, o)?;
            let r = run(ip, port, o);
            let _ = server.kill();
            let _ = server.wait();
            let r = r?;
            let runtime_name = if transport == Transport::Blocking {
                "Threads".to_string()
            } else {
                format!("{runtime:?}")
            };
            eprintln!(
                "round {round}/{}: {transport:?} {runtime_name}: {:.0} round trips/s, p50 {:.1} µs",
                o.rounds,
                r.rts as f64 / r.wall,
                r.p50
            );
            rows[k].push(r);
            port += o.workers as u16;
        }
    }
    println!(
        "# {} workers, {} connections, {} B messages, {} s per run, {} rounds alternating; \
         median [min-max] over the rounds; per core: round trips per second of client CPU",
        o.workers, o.conns, o.size, o.secs, o.rounds
    );
    println!("transport\truntime\tround_trips_per_s\tper_client_core\tp50_us\tp99_us\tp999_us");
    for (k, &(transport, runtime)) in pairs.iter().enumerate() {
        let col = |f: &dyn Fn(&Row) -> f64| {
            let v: Vec<f64> = rows[k].iter().map(f).collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            format!("{:.1} [{lo:.1}-{hi:.1}]", median(v))
        };
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            match transport {
                Transport::Blocking | Transport::Trespass => "trespass",
                Transport::Tcp => "tcp",
            },
            match (transport, runtime) {
                (Transport::Blocking, _) => "blocking (thread per connection)",
                (_, Runtime::Multi) => "tokio multi-thread",
                (_, Runtime::PerCore) => "tokio per-core",
            },
            col(&|r| r.rts as f64 / r.wall),
            col(&|r| r.rts as f64 / r.cpu.max(1e-9)),
            col(&|r| r.p50),
            col(&|r| r.p99),
            col(&|r| r.p999),
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return if args.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    let fail = |e: String| {
        eprintln!("async_bench: {e}\n{USAGE}");
        ExitCode::FAILURE
    };
    let Some(ip) = args.get(1).and_then(|a| a.parse::<IpAddr>().ok()) else {
        return fail("the second argument must be an IP address".into());
    };
    let (rest, port) = match args[0].as_str() {
        "compare" => (&args[2..], 0),
        "serve" | "run" => match args.get(2).and_then(|p| p.parse::<u16>().ok()) {
            Some(p) => (&args[3..], p),
            None => return fail("serve and run take a port after the IP address".into()),
        },
        c => return fail(format!("unknown command {c:?}")),
    };
    let o = match parse(rest) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let result = match args[0].as_str() {
        "compare" => compare(ip, o),
        "serve" => serve(ip, port, o),
        _ => run(ip, port, o).map(|r| {
            println!(
                "{:.0} round trips/s, {:.0} per client core, p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
                r.rts as f64 / r.wall,
                r.rts as f64 / r.cpu.max(1e-9),
                r.p50,
                r.p99,
                r.p999
            )
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
