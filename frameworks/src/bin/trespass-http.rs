//! HTTP/1.1 over trespass (hyper), beside the same over TCP.
//!
//! `trespass-http IP [--size BYTES] [--requests N] [--rounds R]`
//!
//! Serves a file of SIZE bytes (default 32 MiB, made at start) at `/file`, a 64-byte body at
//! `/small` and 404 elsewhere, with hyper over trespass (port 7910) and over TCP (port 7911).
//! For R rounds (default 3), alternating the transports, a hyper client on one keep-alive
//! connection fetches `/file` whole and checks every byte, asks for `/missing` (404), then
//! makes N requests for `/small` one after another (default 2000). Prints the file's fetch
//! rate, requests per second and their latency percentiles per transport (medians over the
//! rounds); exits 1 with a message when a byte or a status is wrong or a step fails.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use trespass_frameworks::{
    alternate, connect, main_with, median, pattern, positive, quantile_us, serve_each, Listener,
    Transport,
};

const USAGE: &str = "usage: trespass-http IP [--size BYTES] [--requests N] [--rounds R]";

async fn handle(file: Bytes, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/file" => (StatusCode::OK, file),
        "/small" => (StatusCode::OK, Bytes::from_static(&[b's'; 64])),
        _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    Ok(resp)
}

async fn serve(listener: Listener, file: Bytes) {
    loop {
        let Ok(stream) = listener.accept().await else {
            return;
        };
        let file = file.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(file.clone(), req));
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("trespass-http: the server's connection failed: {e}");
            }
        });
    }
}

struct Run {
    fetch: Duration,
    latencies: Vec<Duration>,
    requests: Duration,
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> io::Result<(StatusCode, Bytes)> {
    let req = Request::get(path)
        .header("host", "trespass.test")
        .body(Empty::new())
        .map_err(io::Error::other)?;
    // The connection takes one request at a time: wait until the last one is done.
    sender.ready().await.map_err(io::Error::other)?;
    let resp = sender.send_request(req).await.map_err(io::Error::other)?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    Ok((status, body))
}

async fn client(
    transport: Transport,
    addr: SocketAddr,
    file: &Bytes,
    requests: usize,
) -> io::Result<Run> {
    let stream = connect(transport, addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    let conn = tokio::spawn(conn);
    let result = exchange(&mut sender, file, requests).await;
    drop(sender);
    let ended = conn.await.map_err(io::Error::other)?;
    match (result, ended) {
        (Ok(run), Ok(())) => Ok(run),
        // The connection's own error says more than the request's ("canceled").
        (_, Err(e)) => Err(io::Error::other(format!("the HTTP connection failed: {e}"))),
        (Err(e), Ok(())) => Err(e),
    }
}

async fn exchange(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    file: &Bytes,
    requests: usize,
) -> io::Result<Run> {
    let t0 = Instant::now();
    let (status, body) = get(sender, "/file").await?;
    let fetch = t0.elapsed();
    if status != StatusCode::OK || body.len() != file.len() {
        return Err(io::Error::other(format!(
            "/file: status {status}, {} bytes, not 200 and {}",
            body.len(),
            file.len()
        )));
    }
    if let Some(at) = body.iter().zip(file.iter()).position(|(a, b)| a != b) {
        return Err(io::Error::other(format!("/file differs at byte {at}")));
    }
    let (status, _) = get(sender, "/missing").await?;
    if status != StatusCode::NOT_FOUND {
        return Err(io::Error::other(format!(
            "/missing: status {status}, not 404"
        )));
    }
    let mut latencies = Vec::with_capacity(requests);
    let t1 = Instant::now();
    for i in 0..requests {
        let t = Instant::now();
        let (status, body) = get(sender, "/small").await?;
        latencies.push(t.elapsed());
        if status != StatusCode::OK || body.len() != 64 {
            return Err(io::Error::other(format!(
                "/small request {i}: status {status}, {} bytes",
                body.len()
            )));
        }
    }
    let requests_took = t1.elapsed();
    latencies.sort_unstable();
    Ok(Run {
        fetch,
        latencies,
        requests: requests_took,
    })
}

async fn run(ip: IpAddr, size: usize, requests: usize, rounds: usize) -> Result<(), String> {
    let file = Bytes::from(pattern(size));
    let addrs = [SocketAddr::new(ip, 7910), SocketAddr::new(ip, 7911)];
    serve_each(addrs, |l| serve(l, file.clone())).await?;
    let runs = alternate(
        rounds,
        addrs,
        |transport, addr| client(transport, addr, &file, requests),
        |r: &Run| {
            format!(
                "/file at {:.1} MB/s, {:.0} requests/s",
                size as f64 / r.fetch.as_secs_f64() / 1e6,
                requests as f64 / r.requests.as_secs_f64()
            )
        },
    )
    .await?;
    println!(
        "# HTTP/1.1 (hyper), /file of {size} bytes, {requests} requests for 64 B one after \
         another on one connection, {rounds} rounds alternating; medians over the rounds"
    );
    println!("transport\tfile_MB_per_s\trequests_per_s\trequest_p50_us\trequest_p99_us");
    for (transport, r) in Transport::ALL.into_iter().zip(&runs) {
        println!(
            "{}\t{:.1}\t{:.0}\t{:.0}\t{:.0}",
            transport.name(),
            median(
                r.iter()
                    .map(|r| size as f64 / r.fetch.as_secs_f64() / 1e6)
                    .collect()
            ),
            median(
                r.iter()
                    .map(|r| requests as f64 / r.requests.as_secs_f64())
                    .collect()
            ),
            median(r.iter().map(|r| quantile_us(&r.latencies, 0.5)).collect()),
            median(r.iter().map(|r| quantile_us(&r.latencies, 0.99)).collect()),
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    main_with("trespass-http", USAGE, |ip, flags| {
        let (mut size, mut requests, mut rounds) = (32 << 20, 2000, 3);
        for &(f, v) in flags {
            match f {
                "--size" => size = positive(f, v)?,
                "--requests" => requests = positive(f, v)?,
                "--rounds" => rounds = positive(f, v)?,
                _ => return Err(format!("unknown option {f:?}")),
            }
        }
        Ok(run(ip, size, requests, rounds))
    })
    .await
}
