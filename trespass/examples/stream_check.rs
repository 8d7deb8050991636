//! stream_check: moves a stream of checked bytes over trespass, or holds a connection idle,
//! for the end-to-end checks (scripts/e2e/trespass-streams.sh).
//!
//! ```text
//! stream_check serve ADDR [--sleepy] [--keepalive SECS] [--tokio]
//!                                                         accept one connection, read to end
//!                                                         (sleeping at random with --sleepy),
//!                                                         answer "BYTES CHECKSUM"; --tokio:
//!                                                         the same through trespass::tokio
//! stream_check send ADDR BYTES [--keepalive SECS]         send BYTES of a pattern, shut down,
//!                                                         compare the answer with what was sent
//! stream_check idle ADDR [--keepalive SECS]               connect, then wait until killed
//! ```
//! Exit status: 0 when the check held, 1 when it did not (the message says how), 2 for a
//! usage error, 3 when the server's read failed (the message says after how long and why).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trespass::Config;

const USAGE: &str = "usage: stream_check serve ADDR [--sleepy] [--keepalive SECS] [--tokio]\n       stream_check send ADDR BYTES [--keepalive SECS]\n       stream_check idle ADDR [--keepalive SECS]";

/// A running checksum over 8-byte words (the tail zero-padded): cheap enough for a GiB in a
/// debug build, and sensitive to order, loss and duplication.
#[derive(Default)]
struct Sum {
    hash: u64,
    carry: Vec<u8>,
    bytes: u64,
}

impl Sum {
    fn update(&mut self, mut data: &[u8]) {
        self.bytes += data.len() as u64;
        if !self.carry.is_empty() {
            let take = (8 - self.carry.len()).min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() == 8 {
                let w = u64::from_le_bytes(self.carry[..].try_into().expect("8 bytes"));
                self.word(w);
                self.carry.clear();
            }
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        self.carry.extend_from_slice(chunks.remainder());
    }

    fn word(&mut self, w: u64) {
        self.hash = (self.hash ^ w)
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(5);
    }

    fn finish(mut self) -> (u64, u64) {
        if !self.carry.is_empty() {
            self.carry.resize(8, 0);
            let w = u64::from_le_bytes(self.carry[..].try_into().expect("8 bytes"));
            self.word(w);
        }
        (self.bytes, self.hash)
    }
}

/// The pattern at stream offset `offset`: a different byte at every offset of a GiB.
fn fill(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (offset + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        *b = (x >> 57) as u8 ^ (offset + i as u64) as u8;
    }
}

fn config(args: &[String]) -> Result<Config, String> {
    let mut c = Config::new();
    if let Some(i) = args.iter().position(|a| a == "--keepalive") {
        let secs: f64 = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|&s: &f64| s > 0.0)
            .ok_or("--keepalive takes a number of seconds above 0")?;
        c.keepalive(Some(Duration::from_secs_f64(secs)));
    }
    Ok(c)
}

/// The server's side of the check, whichever API reads: how much to ask for next, when to
/// sleep, and the running checksum.
struct Reader {
    sum: Sum,
    rng: u64,
    sleepy: bool,
    t0: Instant,
}

impl Reader {
    fn new(args: &[String]) -> Reader {
        Reader {
            sum: Sum::default(),
            rng: 0x2545_f491_4f6c_dd1d,
            sleepy: args.iter().any(|a| a == "--sleepy"),
            t0: Instant::now(),
        }
    }

    /// How many bytes the next read asks for (1 to `max`).
    fn want(&mut self, max: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        1 + (self.rng % max as u64) as usize
    }

    /// Takes what a read returned; says how long to sleep before the next one, if at all.
    fn got(&mut self, data: &[u8]) -> Option<Duration> {
        self.sum.update(data);
        (self.sleepy && self.rng % 512 == 0).then(|| Duration::from_millis(self.rng % 20))
    }

    /// Prints why the read failed; the exit status that says so.
    fn failed(&self, e: std::io::Error) -> ExitCode {
        println!(
            "read failed after {:.1} s: {e}",
            self.t0.elapsed().as_secs_f64()
        );
        ExitCode::from(3)
    }

    /// Prints what arrived; the answer to send back.
    fn finish(self) -> String {
        let (bytes, hash) = self.sum.finish();
        let secs = self.t0.elapsed().as_secs_f64();
        println!(
            "received {bytes} bytes in {secs:.1} s ({:.1} MB/s), checksum {hash:016x}",
            bytes as f64 / secs / 1e6
        );
        format!("{bytes} {hash:016x}\n")
    }
}

fn serve(addr: &str, args: &[String]) -> Result<ExitCode, String> {
    if args.iter().any(|a| a == "--tokio") {
        return serve_tokio(addr, args);
    }
    let listener = config(args)?
        .bind(addr)
        .map_err(|e| format!("bind {addr}: {e}"))?;
    println!("listening on {addr}");
    let (mut s, peer) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    println!("connection from {peer}");
    let mut r = Reader::new(args);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let want = r.want(buf.len());
        let n = match s.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return Ok(r.failed(e)),
        };
        if let Some(d) = r.got(&buf[..n]) {
            std::thread::sleep(d);
        }
    }
    s.write_all(r.finish().as_bytes())
        .map_err(|e| format!("answer: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// `serve` on a current-thread tokio runtime: the reads park in the reactor, so a dead peer
/// must wake them there.
fn serve_tokio(addr: &str, args: &[String]) -> Result<ExitCode, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = config(args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))?;
    rt.block_on(async {
        let listener = trespass::tokio::Listener::bind_with(&config, addr)
            .await
            .map_err(|e| format!("bind {addr}: {e}"))?;
        println!("listening on {addr} (tokio)");
        let (mut s, peer) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        println!("connection from {peer}");
        let mut r = Reader::new(args);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let want = r.want(buf.len());
            let n = match s.read(&mut buf[..want]).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Ok(r.failed(e)),
            };
            if let Some(d) = r.got(&buf[..n]) {
                tokio::time::sleep(d).await;
            }
        }
        s.write_all(r.finish().as_bytes())
            .await
            .map_err(|e| format!("answer: {e}"))?;
        s.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
        Ok(ExitCode::SUCCESS)
    })
}

fn send(addr: &str, total: u64, args: &[String]) -> Result<ExitCode, String> {
    let mut s = config(args)?
        .connect(addr)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut sum = Sum::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut sent = 0u64;
    let mut last_report = Instant::now();
    while sent < total {
        let n = (buf.len() as u64).min(total - sent) as usize;
        fill(&mut buf[..n], sent);
        sum.update(&buf[..n]);
        s.write_all(&buf[..n])
            .map_err(|e| format!("write at byte {sent}: {e}"))?;
        sent += n as u64;
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("sent {} MiB of {}", sent >> 20, total >> 20);
            last_report = Instant::now();
        }
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("reading the answer: {e}"))?;
    let (bytes, hash) = sum.finish();
    let expected = format!("{bytes} {hash:016x}");
    if answer.trim() != expected {
        println!(
            "MISMATCH: sent {expected}, the server received {}",
            answer.trim()
        );
        return Ok(ExitCode::from(1));
    }
    println!("sent {bytes} bytes, checksum {hash:016x}: the server received the same");
    Ok(ExitCode::SUCCESS)
}

fn idle(addr: &str, args: &[String]) -> Result<ExitCode, String> {
    let _s = config(args)?
        .connect(addr)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    println!("connected to {addr}; idle until killed");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Prints trespass's diagnostics (the `log` facade) on stderr when TRESPASS_LOG is set.
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        eprintln!("{} {}: {}", record.level(), record.target(), record.args());
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

fn main() -> ExitCode {
    if std::env::var_os("TRESPASS_LOG").is_some() {
        let _ = log::set_logger(&LOGGER);
        log::set_max_level(log::LevelFilter::Debug);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match (args.first().map(String::as_str), args.get(1)) {
        (Some("serve"), Some(addr)) => serve(addr, &args[2..]),
        (Some("send"), Some(addr)) => match args.get(2).and_then(|b| b.parse().ok()) {
            Some(bytes) => send(addr, bytes, &args[3..]),
            None => Err(format!("send needs a byte count\n{USAGE}")),
        },
        (Some("idle"), Some(addr)) => idle(addr, &args[2..]),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("stream_check: {e}");
        ExitCode::from(1)
    })
}
