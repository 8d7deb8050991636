//! TLS over trespass (tokio-rustls, ring), beside the same over TCP.
//!
//! `trespass-tls IP [--bytes N] [--pings N] [--rounds R]`
//!
//! Makes a self-signed certificate for `trespass.test` at run time, starts a TLS echo server
//! on IP over trespass (port 7900) and over TCP (port 7901), and, for R rounds (default 3),
//! alternating the transports, connects a client that checks the server's certificate,
//! sends N bytes (default 16 MiB) and reads them back checked, then ping-pongs 64-byte
//! records N times (default 2000). Prints the handshake time, the throughput of the echo and
//! the round-trip percentiles per transport (medians over the rounds); exits 1 with a
//! message when a byte differs or a step fails.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use trespass_frameworks::{
    alternate, connect, main_with, median, pattern, positive, quantile_us, serve_each, Listener,
    Transport,
};

const NAME: &str = "trespass.test";
const USAGE: &str = "usage: trespass-tls IP [--bytes N] [--pings N] [--rounds R]";

/// The server's and the client's TLS configurations, around a certificate made now.
fn tls_configs() -> Result<(TlsAcceptor, TlsConnector), Box<dyn std::error::Error>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let made = rcgen::generate_simple_self_signed(vec![NAME.to_string()])?;
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((
        TlsAcceptor::from(Arc::new(server)),
        TlsConnector::from(Arc::new(client)),
    ))
}

/// Accepts TLS connections and echoes each until the client closes.
async fn serve(listener: Listener, acceptor: TlsAcceptor) {
    loop {
        let Ok(stream) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let (mut rd, mut wr) = tokio::io::split(tls);
            if tokio::io::copy(&mut rd, &mut wr).await.is_ok() {
                let _ = wr.shutdown().await;
            }
        });
    }
}

/// One client run's numbers.
struct Run {
    handshake: Duration,
    echo: Duration,
    rtts: Vec<Duration>,
}

async fn client(
    transport: Transport,
    addr: SocketAddr,
    connector: &TlsConnector,
    data: &Arc<Vec<u8>>,
    pings: usize,
) -> io::Result<Run> {
    let t0 = Instant::now();
    let stream = connect(transport, addr).await?;
    let name = ServerName::try_from(NAME).map_err(io::Error::other)?;
    let mut tls = connector.connect(name, stream).await?;
    let handshake = t0.elapsed();
    let (_, session) = tls.get_ref();
    if session.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
        return Err(io::Error::other(format!(
            "negotiated {:?}, not TLS 1.3",
            session.protocol_version()
        )));
    }

    // Ping-pong of small records first, then the bulk echo (which ends the connection).
    let mut rtts = Vec::with_capacity(pings);
    let mut back = [0u8; 64];
    for i in 0..pings {
        let msg = [i as u8; 64];
        let t = Instant::now();
        tls.write_all(&msg).await?;
        tls.read_exact(&mut back).await?;
        rtts.push(t.elapsed());
        if back != msg {
            return Err(io::Error::other(format!("ping {i} came back different")));
        }
    }

    let t1 = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(tls);
    let sent = Arc::clone(data);
    let writer = tokio::spawn(async move {
        for piece in sent.chunks(64 * 1024) {
            wr.write_all(piece).await?;
        }
        wr.shutdown().await?;
        Ok::<_, io::Error>(wr)
    });
    let mut got = Vec::with_capacity(data.len());
    rd.read_to_end(&mut got).await?;
    writer.await.map_err(io::Error::other)??;
    let echo = t1.elapsed();
    if got.len() != data.len() {
        return Err(io::Error::other(format!(
            "the echo was {} bytes, not {}",
            got.len(),
            data.len()
        )));
    }
    if let Some(at) = got.iter().zip(data.iter()).position(|(a, b)| a != b) {
        return Err(io::Error::other(format!("the echo differs at byte {at}")));
    }
    rtts.sort_unstable();
    Ok(Run {
        handshake,
        echo,
        rtts,
    })
}

async fn run(ip: IpAddr, bytes: usize, pings: usize, rounds: usize) -> Result<(), String> {
    let (acceptor, connector) = tls_configs().map_err(|e| format!("making TLS configs: {e}"))?;
    let addrs = [SocketAddr::new(ip, 7900), SocketAddr::new(ip, 7901)];
    serve_each(addrs, |l| serve(l, acceptor.clone())).await?;
    let data = Arc::new(pattern(bytes));
    let runs = alternate(
        rounds,
        addrs,
        |transport, addr| client(transport, addr, &connector, &data, pings),
        |r: &Run| {
            format!(
                "handshake {:.1} ms, echo {:.1} MB/s, p50 {:.0} µs",
                r.handshake.as_secs_f64() * 1e3,
                bytes as f64 / r.echo.as_secs_f64() / 1e6,
                quantile_us(&r.rtts, 0.5)
            )
        },
    )
    .await?;
    println!(
        "# TLS 1.3 (rustls, ring), {bytes} bytes echoed, {pings} pings of 64 B, {rounds} rounds \
         alternating; medians over the rounds"
    );
    println!("transport\thandshake_ms\techo_MB_per_s\tping_p50_us\tping_p99_us");
    for (transport, r) in Transport::ALL.into_iter().zip(&runs) {
        println!(
            "{}\t{:.2}\t{:.1}\t{:.0}\t{:.0}",
            transport.name(),
            median(r.iter().map(|r| r.handshake.as_secs_f64() * 1e3).collect()),
            median(
                r.iter()
                    .map(|r| bytes as f64 / r.echo.as_secs_f64() / 1e6)
                    .collect()
            ),
            median(r.iter().map(|r| quantile_us(&r.rtts, 0.5)).collect()),
            median(r.iter().map(|r| quantile_us(&r.rtts, 0.99)).collect()),
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    main_with("trespass-tls", USAGE, |ip, flags| {
        let (mut bytes, mut pings, mut rounds) = (16 << 20, 2000, 3);
        for &(f, v) in flags {
            match f {
                "--bytes" => bytes = positive(f, v)?,
                "--pings" => pings = positive(f, v)?,
                "--rounds" => rounds = positive(f, v)?,
                _ => return Err(format!("unknown option {f:?}")),
            }
        }
        Ok(run(ip, bytes, pings, rounds))
    })
    .await
}
