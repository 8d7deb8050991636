//! Getting started, part 2: a client and a server connected with rdma_cm, talking with
//! one-sided and two-sided operations.
//!
//! The server advertises two buffers in the private data of its accept: a 64-byte area the
//! client may WRITE and an 8-byte counter (37) it may add to atomically. The client WRITEs
//! a greeting, adds 5 to the counter (fetch-and-add, which brings back the old value), and
//! SENDs a message with immediate data; the server prints all three, then both disconnect.
//!
//!     server:  cargo run -p sideway-rdma --example getting_started_cm -- --listen 198.18.0.1
//!     client:  cargo run -p sideway-rdma --example getting_started_cm -- 198.18.0.1
//!
//! The address is an IPv4 address of the RDMA device's network interface; `--port P` sets
//! the rdma_cm port (default 7471).

use std::io::Error;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sideway::connection::{CompletionWaiter, RemoteBuffer, REMOTE_BUFFER_LEN};
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{QueuePair, SendFlags};
use sideway::rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use sideway::Report;

const RECV: u64 = 1;
const WRITE: u64 = 2;
const FETCH_ADD: u64 = 3;
const SEND: u64 = 4;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const IMM: u32 = 0x5eed;

fn main() -> Result<(), Report> {
    let (listen, addr) = parse_args()?;
    let channel = EventChannel::new()?;
    if listen {
        server(&channel, addr)
    } else {
        client(&channel, addr)
    }
}

/// A QP made on `id` (so librdmacm moves it through its states), on a PD and CQ of the
/// device the id is bound to.
fn qp_on(id: &Arc<CmId>) -> Result<(QueuePair, CompletionWaiter), Report> {
    let ctx = id.device_context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq_builder().cqe(16).build()?;
    let qp = id.create_qp(
        pd.create_qp_builder()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(4)
            .max_recv_wr(4),
    )?;
    let waiter = CompletionWaiter::new(&cq, Duration::from_secs(10));
    Ok((qp, waiter))
}

fn server(channel: &Arc<EventChannel>, addr: SocketAddr) -> Result<(), Report> {
    let listener = channel.create_id(PortSpace::Tcp)?;
    listener.bind_addr(addr)?;
    listener.listen(1)?;
    println!("listening on {addr}");
    let request = channel.wait_for(EventType::ConnectRequest, None)?;
    let id = Arc::clone(request.id()); // the new connection's id
    drop(request);

    let (mut qp, mut waiter) = qp_on(&id)?;
    let pd = Arc::clone(qp.pd());
    let target = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let mut counter = pd.reg_buffer(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
    counter.write_at(0, &37u64.to_ne_bytes())?;
    let inbox = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE)?;
    qp.start_post_recv()
        .recv(RECV, &[inbox.sge(0..64).unwrap()])
        .post()?;

    // Tell the client where the two buffers are, in the accept's private data.
    let mut private = Vec::new();
    for buf in [&target, &counter] {
        let len = buf.len() as u32;
        let remote = RemoteBuffer {
            addr: buf.addr(),
            rkey: buf.rkey(),
            len,
        };
        private.extend_from_slice(&remote.to_bytes());
    }
    id.accept_qp(&qp, ConnParam::new().private_data(&private), WAIT)?;
    println!("connected to {:?}", id.peer_addr());

    // The client WRITEs, adds, then SENDs: once the SEND is here, the rest is too.
    let wc = waiter.wait(RECV)?;
    let message = inbox.to_vec(0..wc.byte_len() as usize)?;
    println!(
        "SEND with immediate {:#x}: {}",
        wc.imm_data().unwrap_or_default(),
        String::from_utf8_lossy(&message)
    );
    let written = target.to_vec(0..64)?;
    let end = written
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(written.len());
    println!("RDMA WRITE: {}", String::from_utf8_lossy(&written[..end]));
    let mut value = [0u8; 8];
    counter.read_at(0, &mut value)?;
    println!("counter after fetch-and-add: {}", u64::from_ne_bytes(value));

    id.wait_for(EventType::Disconnected, WAIT)?;
    println!("the client disconnected");
    Ok(())
}

fn client(channel: &Arc<EventChannel>, addr: SocketAddr) -> Result<(), Report> {
    let id = channel.create_id(PortSpace::Tcp)?;
    id.resolve_addr(None, addr, Duration::from_secs(2))?;
    id.wait_for(EventType::AddrResolved, WAIT)?;
    id.resolve_route(Duration::from_secs(2))?;
    id.wait_for(EventType::RouteResolved, WAIT)?;

    let (mut qp, mut waiter) = qp_on(&id)?;
    let pd = Arc::clone(qp.pd());
    let mut buf = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE)?;
    let old = pd.reg_buffer(8, AccessFlags::LOCAL_WRITE)?;

    let answer = id.connect_qp(&qp, &ConnParam::new(), WAIT)?;
    let data = answer.private_data();
    let target = RemoteBuffer::from_private_data(data)?;
    let counter = RemoteBuffer::from_private_data(data.get(REMOTE_BUFFER_LEN..).unwrap_or(&[]))?;
    println!("connected to {addr}");

    let greeting = b"hello through RDMA WRITE";
    let message = b"hello through SEND";
    buf.write_at(0, greeting)?;
    buf.write_at(32, message)?;
    // One batch, one doorbell: WRITE, fetch-and-add, SEND with immediate, in this order.
    let mut batch = qp.start_post_send();
    batch
        .wr(WRITE, SendFlags::SIGNALED)
        .rdma_write(
            target.rkey,
            target.addr,
            buf.sge(0..greeting.len()).unwrap(),
        )
        .wr(FETCH_ADD, SendFlags::SIGNALED)
        .atomic_fetch_add(counter.rkey, counter.addr, 5, old.sge(0..8).unwrap())
        .wr(SEND, SendFlags::SIGNALED)
        .send_with_imm(IMM, buf.sge(32..32 + message.len()).unwrap());
    batch.post()?;
    waiter.wait_all(&[WRITE, FETCH_ADD, SEND])?;
    let mut value = [0u8; 8];
    old.read_at(0, &mut value)?;
    println!(
        "fetch-and-add: the counter was {}",
        u64::from_ne_bytes(value)
    );

    id.disconnect()?;
    id.wait_for(EventType::Disconnected, WAIT)?;
    println!("disconnected");
    Ok(())
}

/// `[--listen] [--port P] ADDRESS`
fn parse_args() -> Result<(bool, SocketAddr), Report> {
    let (mut listen, mut port, mut ip) = (false, 7471, None::<IpAddr>);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--listen" => listen = true,
            "--port" => {
                port = it
                    .next()
                    .ok_or(Error::other("--port needs a value"))?
                    .parse()?
            }
            _ if arg.starts_with('-') => Err(Error::other(format!("unknown option {arg}")))?,
            _ => ip = Some(arg.parse()?),
        }
    }
    let ip = ip.ok_or(Error::other(
        "usage: getting_started_cm [--listen] [--port P] ADDRESS",
    ))?;
    Ok((listen, SocketAddr::new(ip, port)))
}
