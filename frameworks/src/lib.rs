//! What the programs of this package share: deterministic content, the transports they run
//! over, and percentiles.
//!
//! The programs (`trespass-tls`, `trespass-http`, `trespass-grpc`) run a server and a client
//! in one process, over trespass and over TCP on the same address, and print one row per
//! transport.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

/// Deterministic bytes, different at every offset.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

/// The transports a program runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A trespass stream (its tokio front end).
    Trespass,
    /// A TCP stream on the same address (context: TCP pays none of SoftRoCE's cost).
    Tcp,
}

impl Transport {
    /// Both, trespass first.
    pub const ALL: [Transport; 2] = [Transport::Trespass, Transport::Tcp];

    /// Its name in the printed rows.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Trespass => "trespass",
            Transport::Tcp => "tcp",
        }
    }
}

/// A listener of either transport.
pub enum Listener {
    /// trespass's.
    Trespass(Box<trespass::tokio::Listener>),
    /// TCP's.
    Tcp(tokio::net::TcpListener),
}

/// A connected stream of either transport, boxed behind tokio's I/O traits.
pub type Stream = Box<dyn IoStream>;

/// What a stream of either transport is.
pub trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> IoStream for T {}

impl Listener {
    /// Listens on `addr` over `transport`.
    ///
    /// # Errors
    ///
    /// The transport's bind error.
    pub async fn bind(transport: Transport, addr: SocketAddr) -> io::Result<Listener> {
        Ok(match transport {
            Transport::Trespass => {
                Listener::Trespass(Box::new(trespass::tokio::Listener::bind(addr).await?))
            }
            Transport::Tcp => Listener::Tcp(tokio::net::TcpListener::bind(addr).await?),
        })
    }

    /// The next connection.
    ///
    /// # Errors
    ///
    /// The transport's accept error.
    pub async fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Trespass(l) => Box::new(l.accept().await?.0),
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
        })
    }
}

/// Connects to `addr` over `transport`.
///
/// # Errors
///
/// The transport's connect error.
pub async fn connect(transport: Transport, addr: SocketAddr) -> io::Result<Stream> {
    Ok(match transport {
        Transport::Trespass => Box::new(trespass::tokio::Stream::connect(addr).await?),
        Transport::Tcp => {
            let s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Box::new(s)
        }
    })
}

/// The `p` quantile (0 to 1) of `sorted`, in microseconds.
pub fn quantile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Binds a listener of each transport on its address (in [`Transport::ALL`]'s order) and
/// spawns `serve` on each.
///
/// # Errors
///
/// A message naming the transport and address that could not be bound.
pub async fn serve_each<F, Fut>(addrs: [SocketAddr; 2], serve: F) -> Result<(), String>
where
    F: Fn(Listener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    for (transport, addr) in Transport::ALL.into_iter().zip(addrs) {
        let l = Listener::bind(transport, addr)
            .await
            .map_err(|e| format!("{} listener on {addr}: {e}", transport.name()))?;
        tokio::spawn(serve(l));
    }
    Ok(())
}

/// Runs `client` over each transport in turn (to its address, in [`Transport::ALL`]'s
/// order), `rounds` times, each run within 300 s, printing `progress` of each run to
/// stderr. The runs per transport, in the same order.
///
/// # Errors
///
/// The first run that failed or did not finish in time, named by transport and round.
pub async fn alternate<R, E, F, Fut>(
    rounds: usize,
    addrs: [SocketAddr; 2],
    mut client: F,
    progress: impl Fn(&R) -> String,
) -> Result<[Vec<R>; 2], String>
where
    E: Display,
    F: FnMut(Transport, SocketAddr) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    let mut runs = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (k, (transport, addr)) in Transport::ALL.into_iter().zip(addrs).enumerate() {
            let name = transport.name();
            let r = tokio::time::timeout(Duration::from_secs(300), client(transport, addr))
                .await
                .map_err(|_| format!("{name} round {round}: no result within 300 s"))?
                .map_err(|e| format!("{name} round {round}: {e}"))?;
            eprintln!("round {round}/{rounds}: {name}: {}", progress(&r));
            runs[k].push(r);
        }
    }
    Ok(runs)
}

/// A program's `main`: `--help` prints `usage`; otherwise the first argument is the IP
/// address and the rest `--flag value` pairs, which `parse` turns into the run. A bad
/// argument prints the message and `usage`, a failed run its message; both exit 1.
pub async fn main_with<Fut>(
    name: &str,
    usage: &str,
    parse: impl FnOnce(IpAddr, &[(&str, &str)]) -> Result<Fut, String>,
) -> ExitCode
where
    Fut: Future<Output = Result<(), String>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--help" || a == "-h") {
        println!("{usage}");
        return ExitCode::SUCCESS;
    }
    let run = args
        .first()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .ok_or_else(|| "the first argument must be an IP address with an RDMA device".to_string())
        .and_then(|ip| parse(ip, &flags(&args[1..])?));
    let run = match run {
        Ok(run) => run,
        Err(e) => {
            eprintln!("{name}: {e}\n{usage}");
            return ExitCode::FAILURE;
        }
    };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses `--flag value` pairs into `(flag, value)`, refusing a flag without its value.
///
/// # Errors
///
/// A message naming the flag.
pub fn flags(args: &[String]) -> Result<Vec<(&str, &str)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(f) = it.next() {
        let v = it.next().ok_or_else(|| format!("{f} needs a value"))?;
        out.push((f.as_str(), v.as_str()));
    }
    Ok(out)
}

/// A positive whole number, or a message naming `flag`.
///
/// # Errors
///
/// When `v` is not a positive whole number.
pub fn positive(flag: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{flag} takes a positive whole number, not {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_pair_up_and_refuse_a_missing_value() {
        let a: Vec<String> = ["--size", "10", "--rounds", "2"].map(String::from).to_vec();
        assert_eq!(flags(&a).unwrap(), [("--size", "10"), ("--rounds", "2")]);
        let b: Vec<String> = ["--size"].map(String::from).to_vec();
        assert_eq!(flags(&b).unwrap_err(), "--size needs a value");
        assert!(positive("--size", "0").is_err());
        assert_eq!(positive("--size", "7"), Ok(7));
    }

    #[test]
    fn quantiles_pick_from_the_sorted_samples() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile_us(&v, 0.0), 1.0);
        assert_eq!(quantile_us(&v, 0.5), 50.0);
        assert_eq!(quantile_us(&v, 1.0), 100.0);
        assert!(quantile_us(&[], 0.5).is_nan());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert!(median(Vec::new()).is_nan());
        assert_ne!(pattern(64)[..32], pattern(64)[32..]);
    }
}
