//! What the programs of this package share: deterministic content, the transports they run
//! over, and percentiles.
//!
//! The programs (`trespass-tls`, `trespass-http`, `trespass-grpc`) run a server and a client
//! in one process, over trespass and over TCP on the same address, and print one row per
//! transport.

use std::io;
use std::net::SocketAddr;
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
        assert_ne!(pattern(64)[..32], pattern(64)[32..]);
    }
}
