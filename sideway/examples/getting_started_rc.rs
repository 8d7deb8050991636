//! Getting started, part 1: a reliable connection with verbs only.
//!
//! Opens a device, registers a buffer, makes a CQ that wakes a completion channel, and an RC
//! queue pair; trades endpoints with the peer over TCP (the line rdma-core's
//! `ibv_rc_pingpong` sends), connects, and then the client SENDs a greeting that the server
//! answers. Every wait sleeps on the completion channel and gives up after 10 seconds.
//!
//!     server:  cargo run -p sideway-rdma --example getting_started_rc
//!     client:  cargo run -p sideway-rdma --example getting_started_rc -- SERVER_HOST
//!
//! Options (both sides): `--device NAME` (default: the first device), `--gid-index N`
//! (default: port 1's RoCE v2 IPv4 GID, else index 0), `--port TCP_PORT` (default 18515).

use std::io::Error;
use std::time::Duration;

use sideway::connection::{exchange, CompletionWaiter};
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::queue_pair::{ConnectOptions, QueuePair, SendFlags};
use sideway::Report;

const RECV: u64 = 1;
const SEND: u64 = 2;
const TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Report> {
    let args = Args::parse()?;

    // The device, and what every other object hangs off: a protection domain.
    let ctx = sideway::open_device(args.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    // One buffer: bytes 0..64 receive, bytes 64..128 send.
    let mut buf = pd.reg_buffer(128, AccessFlags::LOCAL_WRITE)?;

    // A CQ that signals a completion channel, so waits sleep instead of spinning.
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq_builder().cqe(16).channel(&channel).build()?;
    let mut qp = pd
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()?;
    let mut waiter = CompletionWaiter::new(&cq, TIMEOUT).with_channel(&channel);

    // Where this QP is: the port's LID, the QP number, a first PSN and the GID.
    let gid_index = match args.gid_index {
        Some(index) => index,
        None => ctx.roce_v2_ipv4_gid(1, None).map_or(0, |entry| entry.index),
    };
    let mut opts = ConnectOptions::new();
    opts.gid_index(gid_index).sq_psn(0x1234);
    let local = qp.local_endpoint(&opts)?;
    println!("local endpoint  {local}");

    // Connect: the client sends its endpoint and gets the server's; the server connects its
    // QP (Reset -> Init -> RTR -> RTS) and posts its receive before it answers, so the
    // client may SEND at once. A receive is posted only once the QP has left Reset.
    let remote = match &args.server {
        Some(host) => {
            let remote = exchange::client_exchange(host, args.port, &local, TIMEOUT)?;
            qp.connect(&opts, &remote)?;
            qp.start_post_recv()
                .recv(RECV, &[buf.sge(0..64).unwrap()])
                .post()?;
            remote
        }
        None => exchange::server_exchange(args.port, &local, TIMEOUT, |remote| {
            qp.connect(&opts, remote)?;
            qp.start_post_recv()
                .recv(RECV, &[buf.sge(0..64).unwrap()])
                .post()?;
            Ok(())
        })?,
    };
    println!("remote endpoint {remote}");

    if args.server.is_some() {
        say(&mut qp, &mut buf, b"hello from the client")?;
        waiter.wait(SEND)?;
        let wc = waiter.wait(RECV)?;
        println!("got: {}", text(&buf, wc.byte_len()));
    } else {
        let wc = waiter.wait(RECV)?;
        println!("got: {}", text(&buf, wc.byte_len()));
        say(&mut qp, &mut buf, b"hello from the server")?;
        waiter.wait(SEND)?;
    }
    println!("done");
    Ok(())
}

/// Copies `msg` into the send half of `buf` and SENDs it, signaled.
fn say(qp: &mut QueuePair, buf: &mut RegisteredBuffer, msg: &[u8]) -> Result<(), Report> {
    buf.write_at(64, msg)?;
    let sge = buf.sge(64..64 + msg.len()).unwrap();
    let mut batch = qp.start_post_send();
    batch.wr(SEND, SendFlags::SIGNALED).send(sge);
    batch.post()?;
    Ok(())
}

/// The first `len` received bytes, as text.
fn text(buf: &RegisteredBuffer, len: u32) -> String {
    let bytes = buf.to_vec(0..len as usize).unwrap_or_default();
    sideway::peer_text::printable(&String::from_utf8_lossy(&bytes), 200)
}

/// The command line: `[--device NAME] [--gid-index N] [--port P] [SERVER_HOST]`.
struct Args {
    device: Option<String>,
    gid_index: Option<u8>,
    port: u16,
    server: Option<String>,
}

impl Args {
    fn parse() -> Result<Args, Report> {
        let mut args = Args {
            device: None,
            gid_index: None,
            port: 18515,
            server: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .ok_or(Error::other(format!("{arg} needs a value")))
            };
            match arg.as_str() {
                "--device" => args.device = Some(value()?),
                "--gid-index" => args.gid_index = Some(value()?.parse()?),
                "--port" => args.port = value()?.parse()?,
                _ if arg.starts_with('-') => Err(Error::other(format!("unknown option {arg}")))?,
                _ => args.server = Some(arg),
            }
        }
        Ok(args)
    }
}
