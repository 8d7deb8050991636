//! gRPC over trespass (tonic), beside the same over TCP.
//!
//! `trespass-grpc IP [--requests N] [--stream N] [--rounds R]`
//!
//! Serves the `Echo` service of `proto/echo.proto` with tonic over trespass (port 7920,
//! through `serve_with_incoming`) and over TCP (port 7921). For R rounds (default 3),
//! alternating the transports, a tonic client (over trespass through
//! `connect_with_connector`) makes N unary calls of 64 bytes one after another (default
//! 2000), checking each answer, then receives a server stream of N messages of 4 KiB
//! (default 2000), checking each. Prints calls per second, their latency percentiles and the
//! stream's rate per transport (medians over the rounds); exits 1 with a message when an
//! answer is wrong or a step fails.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use trespass_frameworks::{
    alternate, connect, main_with, median, positive, quantile_us, serve_each, Listener, Transport,
};

/// The code tonic generates from proto/echo.proto.
pub mod echo {
    tonic::include_proto!("trespass.echo");
}

use echo::echo_client::EchoClient;
use echo::echo_server::{Echo, EchoServer};
use echo::{Payload, StreamRequest};

const USAGE: &str = "usage: trespass-grpc IP [--requests N] [--stream N] [--rounds R]";

/// A stream of either transport as tonic's server takes it: it must say what it knows of
/// its peer (`Connected`); here, nothing.
struct Incoming(trespass_frameworks::Stream);

impl Connected for Incoming {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Incoming {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Incoming {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[derive(Debug, Default)]
struct Service;

type PayloadStream = Pin<Box<dyn futures_util::Stream<Item = Result<Payload, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for Service {
    async fn unary(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        Ok(Response::new(req.into_inner()))
    }

    type ServerStreamStream = PayloadStream;

    async fn server_stream(
        &self,
        req: Request<StreamRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        let StreamRequest { count, size } = req.into_inner();
        if size > 1 << 20 {
            return Err(Status::invalid_argument("size is at most 1 MiB"));
        }
        let items = (0..count).map(move |i| {
            Ok(Payload {
                data: vec![i as u8; size as usize],
            })
        });
        Ok(Response::new(Box::pin(futures_util::stream::iter(items))))
    }
}

/// Serves the service on `listener` until the process ends.
async fn serve(listener: Listener) {
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(Incoming);
        Some((next, l))
    });
    if let Err(e) = Server::builder()
        .add_service(EchoServer::new(Service))
        .serve_with_incoming(incoming)
        .await
    {
        eprintln!("trespass-grpc: the server stopped: {e}");
    }
}

struct Run {
    calls: Duration,
    latencies: Vec<Duration>,
    stream: Duration,
}

async fn client(
    transport: Transport,
    addr: SocketAddr,
    requests: usize,
    stream_len: usize,
) -> Result<Run, Box<dyn std::error::Error + Send + Sync>> {
    // The URI is only a name here: the connector makes the connection.
    let channel = Endpoint::from_static("http://trespass.test")
        .connect_with_connector(tower::service_fn(move |_| async move {
            let s = connect(transport, addr).await?;
            Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(s))
        }))
        .await?;
    let mut client = EchoClient::new(channel);
    let mut latencies = Vec::with_capacity(requests);
    let t0 = Instant::now();
    for i in 0..requests {
        let data = vec![(i % 251) as u8; 64];
        let t = Instant::now();
        let back = client
            .unary(Payload { data: data.clone() })
            .await?
            .into_inner();
        latencies.push(t.elapsed());
        if back.data != data {
            return Err(format!("unary call {i}: the answer differs").into());
        }
    }
    let calls = t0.elapsed();
    let t1 = Instant::now();
    let mut stream = client
        .server_stream(StreamRequest {
            count: stream_len as u32,
            size: 4096,
        })
        .await?
        .into_inner();
    let mut n = 0usize;
    while let Some(p) = stream.message().await? {
        if p.data.len() != 4096 || p.data.iter().any(|&b| b != n as u8) {
            return Err(format!("stream message {n} differs").into());
        }
        n += 1;
    }
    if n != stream_len {
        return Err(format!("the stream ended after {n} of {stream_len} messages").into());
    }
    latencies.sort_unstable();
    Ok(Run {
        calls,
        latencies,
        stream: t1.elapsed(),
    })
}

async fn run(ip: IpAddr, requests: usize, stream_len: usize, rounds: usize) -> Result<(), String> {
    let addrs = [SocketAddr::new(ip, 7920), SocketAddr::new(ip, 7921)];
    serve_each(addrs, serve).await?;
    let runs = alternate(
        rounds,
        addrs,
        |transport, addr| client(transport, addr, requests, stream_len),
        |r: &Run| {
            format!(
                "{:.0} unary calls/s, p50 {:.0} µs; stream {:.0} messages/s",
                requests as f64 / r.calls.as_secs_f64(),
                quantile_us(&r.latencies, 0.5),
                stream_len as f64 / r.stream.as_secs_f64()
            )
        },
    )
    .await?;
    println!(
        "# gRPC (tonic), {requests} unary calls of 64 B one after another, a server stream of \
         {stream_len} messages of 4 KiB, {rounds} rounds alternating; medians over the rounds"
    );
    println!(
        "transport\tunary_per_s\tunary_p50_us\tunary_p99_us\tstream_msgs_per_s\tstream_MB_per_s"
    );
    for (transport, r) in Transport::ALL.into_iter().zip(&runs) {
        let stream_rate = median(
            r.iter()
                .map(|r| stream_len as f64 / r.stream.as_secs_f64())
                .collect(),
        );
        println!(
            "{}\t{:.0}\t{:.0}\t{:.0}\t{:.0}\t{:.1}",
            transport.name(),
            median(
                r.iter()
                    .map(|r| requests as f64 / r.calls.as_secs_f64())
                    .collect()
            ),
            median(r.iter().map(|r| quantile_us(&r.latencies, 0.5)).collect()),
            median(r.iter().map(|r| quantile_us(&r.latencies, 0.99)).collect()),
            stream_rate,
            stream_rate * 4096.0 / 1e6,
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    main_with("trespass-grpc", USAGE, |ip, flags| {
        let (mut requests, mut stream_len, mut rounds) = (2000, 2000, 3);
        for &(f, v) in flags {
            match f {
                "--requests" => requests = positive(f, v)?,
                "--stream" => stream_len = positive(f, v)?.min(u32::MAX as usize),
                "--rounds" => rounds = positive(f, v)?,
                _ => return Err(format!("unknown option {f:?}")),
            }
        }
        Ok(run(ip, requests, stream_len, rounds))
    })
    .await
}
