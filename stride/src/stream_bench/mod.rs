//! `stride-perf stream`: trespass's byte streams and messages, measured the way perftest
//! measures verbs, so that their numbers stand beside `stride-perf send lat` and `write bw`.
//!
//! - `stream lat`: a ping-pong. The client writes `size` bytes, the server reads exactly
//!   `size` bytes and writes them back, the client reads them. The client stamps the start of
//!   every round trip (the post clock of [`crate::post_clock`]); each sample is the interval
//!   between two starts, one round trip, halved as `ib_send_lat` halves it, and the
//!   statistics are perftest's ([`LatencySummary`](crate::latency::LatencySummary)). The
//!   row adds the round trips per second (every round trip of every connection over the
//!   run's wall time).
//! - `stream bw`: one-way streaming. The client writes `iters` messages of `size` bytes, the
//!   server reads all of them and answers one byte; the bandwidth is the bytes over the time
//!   from the first write to that answer (so it includes one small message's way back).
//!
//! `--messages` moves each `size` bytes as one trespass message ([`Stream::send_msg`],
//! [`Stream::recv_msg`]) instead of stream bytes. `--connections N` opens N connections, one
//! thread each, started together: latency samples are pooled, bandwidth is all bytes over
//! the time from the common start to the last connection's end. `--tokio` runs the same
//! test (written once, over the calls of `conn::Conn`) through trespass's tokio front end:
//! each connection's thread drives its stream through a current-thread runtime of its own,
//! and each measured loop runs there as one future, as an application's task would.
//!
//! The client sets each size up over the connection itself: a request ([`Request`]) naming
//! the test, the transfer mode, the size and the iterations, which the server checks against
//! what it was given (anything it was not given it takes from the client) and answers with
//! an empty reply or the reason it refuses.

use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use trespass::{Config, Stream};

use crate::cli::Test;
pub use crate::cli::{
    StreamArgs, STREAM_DEFAULT_PORT as DEFAULT_PORT, STREAM_MAX_BUSY_POLL_US as MAX_BUSY_POLL_US,
    STREAM_MAX_CONNECTIONS as MAX_CONNECTIONS, STREAM_MAX_SIZE as MAX_SIZE,
};
use crate::engine::RunError;
use crate::post_clock::{tsc_usable, PostClock};
use crate::report::RULE;

mod conn;
mod plan;
mod results;
use conn::{Conn, Lender, TokioConn};
use plan::differs_from_run;
pub use plan::{
    all_sizes, check_server, default_size, mismatches, Plan, Request, Transfer, DEFAULT_ITERS,
    REQUEST_LEN,
};
use results::row;
pub use results::{
    bandwidth_header, bandwidth_row, latency_header, latency_row, pool_latency, sum_bandwidth,
    ConnectionRun, StreamLatency, StreamReport, StreamResult,
};

/// How long a read or write may wait for the peer before the run fails.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server waits for the second and later connections of a run.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);

/// A barrier that a failing thread can break, so that the others stop waiting.
struct Gate {
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    parties: usize,
}

impl Gate {
    fn new(parties: usize) -> Self {
        Gate {
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            parties,
        }
    }

    /// Waits for every party; `false` when another party gave up.
    fn wait(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.2 {
            return false;
        }
        let generation = s.1;
        s.0 += 1;
        if s.0 == self.parties {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return true;
        }
        while s.1 == generation && !s.2 {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.1 != generation
    }

    fn give_up(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.2 = true;
        self.cv.notify_all();
    }
}

fn config(a: &StreamArgs) -> Config {
    let mut c = Config::new();
    if let Some(us) = a.busy_poll_us {
        c.busy_poll(Duration::from_micros(us));
    }
    if let Some(us) = a.busy_poll_max_us {
        c.busy_poll_max(Duration::from_micros(us));
    }
    c.shared_receive_queue(a.shared_receive_queue);
    c
}

fn prepare(s: &mut Stream, a: &StreamArgs) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(!a.coalesce)?;
    if let Some(us) = a.busy_poll_us {
        s.set_busy_poll(Duration::from_micros(us));
    }
    Ok(())
}

fn send(s: &mut impl Conn, buf: &[u8], transfer: Transfer, lender: &mut Lender) -> io::Result<()> {
    match transfer {
        Transfer::Stream => s.write_all(buf),
        Transfer::Messages => s.send_msg(buf),
        Transfer::Lent => lender.lend_copy(s, buf),
    }
}

/// Receives `buf.len()` bytes: exactly that many stream bytes, or one message of exactly
/// that length (into `msg`).
fn recv(
    s: &mut impl Conn,
    buf: &mut [u8],
    msg: &mut Vec<u8>,
    transfer: Transfer,
) -> io::Result<()> {
    match transfer {
        Transfer::Stream => s.read_exact(buf),
        Transfer::Messages | Transfer::Lent => conn::message_of(s.recv_msg(msg)?, buf.len()),
    }
}

fn write_reply(s: &mut impl Conn, refusal: &str) -> io::Result<()> {
    let mut b = (refusal.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(refusal.as_bytes());
    s.write_all(&b)
}

fn read_reply(s: &mut impl Conn) -> io::Result<Option<String>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 {
        return Ok(None);
    }
    let mut text = vec![0u8; len.min(4096)];
    s.read_exact(&mut text)?;
    Ok(Some(sideway::peer_text::printable(
        &String::from_utf8_lossy(&text),
        sideway::peer_text::PEER_TEXT_MAX,
    )))
}

fn read_request(s: &mut impl Conn) -> Result<Request, String> {
    let mut b = [0u8; REQUEST_LEN];
    s.read_exact(&mut b)
        .map_err(|e| format!("reading the client's request: {e}"))?;
    Request::decode(&b)
}

fn io_error(what: impl fmt::Display) -> impl FnOnce(io::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// The server's address from `HOST` and the port.
fn server_addr(host: &str, port: u16) -> Result<SocketAddr, RunError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| RunError::setup(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| RunError::setup(format!("{host} resolves to no address")))
}

/// Runs `stride-perf stream`: the client when an address is given, else the server.
pub fn run(a: &StreamArgs) -> Result<(), RunError> {
    match &a.server {
        Some(host) => client(a, host),
        None => server(a),
    }
}

fn clock_text(tsc: bool) -> &'static str {
    if tsc {
        "tsc (round trips stamped by RDTSC)"
    } else {
        "the monotonic clock"
    }
}

fn banner(a: &StreamArgs, role: &str, peer: &str, plan: Option<&Plan>, tsc: bool) {
    let what = match a.test {
        Test::Lat => "latency",
        Test::Bw => "bandwidth",
    };
    println!("{RULE}");
    println!(
        "                    trespass stream {what} test (stride-perf stream {}, {role})",
        a.test.as_str()
    );
    if let Some(p) = plan {
        println!(" Transfer        : {}", p.transfer.describe());
        println!(" Connections     : {} (one thread each)", p.connections);
        println!(
            " Iterations      : {} per size and connection",
            p.iterations
        );
    }
    let usec = |v: Option<u64>| {
        v.map_or_else(
            || "trespass's default".to_owned(),
            |us| format!("{us} usec"),
        )
    };
    if a.busy_poll_us.is_none() && a.busy_poll_max_us.is_none() {
        println!(" Busy poll       : trespass's defaults (this side)");
    } else {
        println!(
            " Busy poll       : at least {}, adaptive up to {} (this side)",
            usec(a.busy_poll_us),
            usec(a.busy_poll_max_us)
        );
    }
    println!(
        " Receives        : {} (this side)",
        match a.shared_receive_queue {
            Some(d) => format!("one shared receive queue of {d} for every connection"),
            None => "a receive queue per connection".to_owned(),
        }
    );
    println!(
        " Front end       : {} (this side)",
        if a.tokio {
            "tokio (--tokio): a current-thread runtime per connection thread"
        } else {
            "blocking calls"
        }
    );
    println!(
        " Nodelay         : {} (this side)",
        if a.coalesce { "off (--coalesce)" } else { "on" }
    );
    println!(
        " {:<16}: {peer}",
        if role == "client" {
            "Server"
        } else {
            "Listening on"
        }
    );
    if role == "client" {
        match a.test {
            Test::Lat => {
                println!(
                    " Sample          : one round trip / 2, as ib_send_lat: the client writes \
                     #bytes, the server reads all of them and writes them back"
                );
                println!(" Clock           : {}", clock_text(tsc));
            }
            Test::Bw => println!(
                " Measure         : #iterations writes of #bytes, one way; the time runs from \
                 the first write to the server's one-byte answer after it read them all"
            ),
        }
    } else {
        // The client's table header opens with the rule.
        println!("{RULE}");
    }
}

fn client(a: &StreamArgs, host: &str) -> Result<(), RunError> {
    let plan = Plan::client(a).map_err(RunError::usage)?;
    let addr = server_addr(host, a.port)?;
    let tsc = tsc_usable(crate::clock::current_source().as_deref());
    let cfg = config(a);
    let mut streams = Vec::with_capacity(plan.connections as usize);
    for i in 0..plan.connections {
        let mut s = cfg.connect(addr).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut => format!(
                    "; is `stride-perf stream {}` running there on port {}?",
                    a.test.as_str(),
                    a.port
                ),
                _ => String::new(),
            };
            RunError::peer_gone(format!(
                "connecting to {addr} (connection {} of {}): {e}{hint}",
                i + 1,
                plan.connections
            ))
        })?;
        prepare(&mut s, a).map_err(|e| RunError::setup(format!("setting up the stream: {e}")))?;
        // The first size's request goes at once: the server reads it before it accepts the
        // next connection (it learns the connection count from it).
        Conn::write_all(&mut s, &plan.request(i, plan.sizes[0]).encode())
            .map_err(|e| RunError::peer_gone(format!("sending the first request: {e}")))?;
        streams.push(s);
    }
    banner(a, "client", &addr.to_string(), Some(&plan), tsc);
    println!(
        "{}",
        match plan.test {
            Test::Lat => latency_header(),
            Test::Bw => bandwidth_header(),
        }
    );
    let gate = Arc::new(Gate::new(streams.len()));
    let origin = Instant::now();
    let plan = Arc::new(plan);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, u64, Result<ConnectionRun, String>)>();
    let tokio = a.tokio;
    let busy_poll_max = a.busy_poll_max_us.map(Duration::from_micros);
    let handles: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let (gate, plan, tx) = (Arc::clone(&gate), Arc::clone(&plan), tx.clone());
            thread::spawn(move || {
                if !tokio {
                    return connection_client(s, i, &plan, &gate, origin, tsc, &tx);
                }
                match TokioConn::new(s, busy_poll_max, IO_TIMEOUT) {
                    Ok(s) => connection_client(s, i, &plan, &gate, origin, tsc, &tx),
                    Err(e) => {
                        gate.give_up();
                        let _ = tx.send((i, 0, Err(format!("moving onto tokio: {e}"))));
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut results = Vec::new();
    let mut failure = None;
    for &size in &plan.sizes {
        let mut runs = Vec::new();
        while runs.len() < plan.connections as usize {
            match rx.recv() {
                Ok((_, s, Ok(run))) if s == size => runs.push(run),
                Ok((conn, _, Err(e))) => {
                    failure = Some(format!("connection {}: {e}", conn + 1));
                    break;
                }
                Ok(_) => {
                    failure = Some("a connection reported another size".into());
                    break;
                }
                Err(_) => {
                    failure = Some("a connection's thread ended early".into());
                    break;
                }
            }
        }
        if failure.is_some() {
            break;
        }
        let r = match plan.test {
            Test::Lat => pool_latency(size, &runs).map(StreamResult::Latency),
            Test::Bw => sum_bandwidth(size, &runs).map(StreamResult::Bandwidth),
        };
        match r {
            Ok(r) => {
                println!("{}", row(&r));
                results.push(r);
            }
            Err(e) => {
                failure = Some(format!("size {size}: {e}"));
                gate.give_up();
                break;
            }
        }
    }
    if failure.is_some() {
        gate.give_up();
    }
    for h in handles {
        if h.join().is_err() && failure.is_none() {
            failure = Some("a connection's thread panicked".into());
        }
    }
    println!("{RULE}");
    if let Some(e) = failure {
        return Err(RunError::new(e));
    }
    if let Some(path) = &a.json {
        let report = StreamReport {
            tool: "stride-perf".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            test: format!("stream {}", plan.test.as_str()),
            transfer: plan.transfer,
            connections: plan.connections,
            busy_poll_us: a.busy_poll_us,
            busy_poll_max_us: a.busy_poll_max_us,
            nodelay: !a.coalesce,
            tokio: a.tokio,
            shared_receive_queue: a.shared_receive_queue,
            server: addr.to_string(),
            clock: if plan.test == Test::Lat && tsc {
                "tsc"
            } else {
                "monotonic"
            }
            .into(),
            results,
        };
        report
            .write_json(path)
            .map_err(|e| RunError::new(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

type ResultSender = std::sync::mpsc::Sender<(usize, u64, Result<ConnectionRun, String>)>;

/// One connection's side of the client: every size, then the end of the run.
fn connection_client(
    mut s: impl Conn,
    index: usize,
    plan: &Plan,
    gate: &Gate,
    origin: Instant,
    tsc: bool,
    tx: &ResultSender,
) {
    let largest = plan.sizes.iter().copied().max().unwrap_or(1) as usize;
    let mut buf = vec![0u8; largest];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(index as u8);
    }
    let mut back = vec![0u8; largest];
    let mut msg = Vec::with_capacity(largest);
    for (k, &size) in plan.sizes.iter().enumerate() {
        let r = one_size(
            &mut s,
            index,
            plan,
            size,
            k > 0,
            gate,
            origin,
            tsc,
            &buf,
            &mut back,
            &mut msg,
        );
        let failed = r.is_err();
        if failed {
            gate.give_up();
        }
        if tx.send((index, size, r)).is_err() || failed {
            return;
        }
    }
    let done = Request::done(plan, index as u32).encode();
    if let Err(e) = s.write_all(&done) {
        let _ = tx.send((index, 0, Err(format!("ending the run: {e}"))));
        return;
    }
    // The server closes once it read the end; waiting for it keeps the last bytes' drop
    // (trespass lingers until the peer has them) off the next run.
    let mut end = [0u8; 1];
    let _ = s.read(&mut end);
}

#[allow(clippy::too_many_arguments)]
fn one_size(
    s: &mut impl Conn,
    index: usize,
    plan: &Plan,
    size: u64,
    send_request: bool,
    gate: &Gate,
    origin: Instant,
    tsc: bool,
    buf: &[u8],
    back: &mut [u8],
    msg: &mut Vec<u8>,
) -> Result<ConnectionRun, String> {
    let n = size as usize;
    if send_request {
        let req = plan.request(index as u32, size).encode();
        s.write_all(&req).map_err(io_error("sending the request"))?;
    }
    if let Some(refusal) = read_reply(s).map_err(io_error("reading the server's answer"))? {
        return Err(format!("the server refused: {refusal}"));
    }
    if !gate.wait() {
        return Err("another connection failed".into());
    }
    let iters = plan.iterations;
    let mut lender = Lender::default();
    match plan.test {
        Test::Lat => {
            let clock = PostClock::start(tsc);
            let mut stamps = Vec::with_capacity(iters as usize + 1);
            let start = origin.elapsed().as_secs_f64();
            if plan.transfer == Transfer::Lent {
                for i in 0..iters {
                    stamps.push(clock.now());
                    send(s, &buf[..n], plan.transfer, &mut lender)
                        .map_err(io_error(format_args!("round trip {i}: writing")))?;
                    recv(s, &mut back[..n], msg, plan.transfer)
                        .map_err(io_error(format_args!("round trip {i}: reading the echo")))?;
                }
                stamps.push(clock.now());
            } else {
                let messages = plan.transfer == Transfer::Messages;
                let mut stamp = || stamps.push(clock.now());
                s.ping(iters, &buf[..n], &mut back[..n], msg, messages, &mut stamp)?;
            }
            let end = origin.elapsed().as_secs_f64();
            lender
                .drain(s)
                .map_err(io_error("taking the lent buffers back"))?;
            let samples = clock.intervals_us(&stamps).map_err(|e| e.to_string())?;
            Ok(ConnectionRun {
                samples,
                start_s: start,
                end_s: end,
                messages: iters,
            })
        }
        Test::Bw => {
            let start = origin.elapsed().as_secs_f64();
            if plan.transfer == Transfer::Lent {
                for i in 0..iters {
                    send(s, &buf[..n], plan.transfer, &mut lender)
                        .map_err(io_error(format_args!("message {i}: writing")))?;
                }
                let mut answer = [0u8; 1];
                s.read_exact(&mut answer).map_err(io_error(
                    "reading the server's answer after the last message",
                ))?;
            } else {
                s.pour(iters, &buf[..n], plan.transfer == Transfer::Messages)?;
            }
            let end = origin.elapsed().as_secs_f64();
            lender
                .drain(s)
                .map_err(io_error("taking the lent buffers back"))?;
            Ok(ConnectionRun {
                samples: Vec::new(),
                start_s: start,
                end_s: end,
                messages: iters,
            })
        }
    }
}

fn server(a: &StreamArgs) -> Result<(), RunError> {
    check_server(a).map_err(RunError::usage)?;
    let addr = SocketAddr::new(a.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), a.port);
    let mut listener = config(a).bind(addr).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::AddrInUse {
            format!("; is another server on port {}?", a.port)
        } else {
            String::new()
        };
        RunError::setup(format!("listening on {addr} (rdma_cm): {e}{hint}"))
    })?;
    banner(a, "server", &addr.to_string(), None, false);
    println!(
        "stride-perf stream server: waiting for a client on rdma_cm port {}",
        a.port
    );
    let _ = io::stdout().flush();
    let (mut s, peer) = listener
        .accept()
        .map_err(|e| RunError::setup(format!("accepting a connection: {e}")))?;
    prepare(&mut s, a).map_err(|e| RunError::setup(format!("setting up the stream: {e}")))?;
    let first = read_request(&mut s).map_err(RunError::new)?;
    let refuse = |s: &mut Stream, why: String| -> RunError {
        let _ = write_reply(s, &why);
        RunError::usage(format!("refused the client {peer}: {why}"))
    };
    let wrong = mismatches(a, &first);
    if !wrong.is_empty() {
        return Err(refuse(&mut s, wrong.join("; ")));
    }
    println!(
        " Client          : {peer}, {} connection(s), {}",
        first.connections,
        first.transfer.describe()
    );
    let mut pending = vec![(s, first)];
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    listener
        .set_nonblocking(true)
        .map_err(|e| RunError::setup(e.to_string()))?;
    while pending.len() < first.connections as usize {
        match listener.accept() {
            Ok((mut s, _)) => {
                prepare(&mut s, a).map_err(|e| RunError::setup(format!("setting up: {e}")))?;
                let r = read_request(&mut s).map_err(RunError::new)?;
                if let Some(why) = differs_from_run(&first, &r) {
                    return Err(refuse(&mut s, why));
                }
                pending.push((s, r));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(RunError::timeout(format!(
                        "only {} of the client's {} connections arrived within {} s",
                        pending.len(),
                        first.connections,
                        ACCEPT_TIMEOUT.as_secs()
                    )));
                }
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(RunError::setup(format!("accepting a connection: {e}"))),
        }
    }
    let args = Arc::new(a.clone());
    let handles: Vec<_> = pending
        .into_iter()
        .map(|(s, r)| {
            let args = Arc::clone(&args);
            thread::spawn(move || {
                if !args.tokio {
                    return serve_connection(s, r, &args);
                }
                let max = args.busy_poll_max_us.map(Duration::from_micros);
                let s =
                    TokioConn::new(s, max, IO_TIMEOUT).map_err(io_error("moving onto tokio"))?;
                serve_connection(s, r, &args)
            })
        })
        .collect();
    let mut failure = None;
    let mut served = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(sizes)) => served = sizes,
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("a connection's thread panicked".to_owned())),
        }
    }
    if let Some(e) = failure {
        return Err(RunError::new(e));
    }
    let what = match first.test {
        Test::Lat => "round trips",
        Test::Bw => "messages",
    };
    for (size, iters) in served {
        println!(
            " served {size} B: {iters} {what} on each of {} connection(s)",
            first.connections
        );
    }
    println!("{RULE}");
    Ok(())
}

/// Serves one connection's sizes until the client ends the run; returns the sizes and
/// their iterations.
fn serve_connection(
    mut s: impl Conn,
    mut req: Request,
    a: &StreamArgs,
) -> Result<Vec<(u64, u64)>, String> {
    let first = req;
    let mut served = Vec::new();
    let mut buf = Vec::new();
    let mut msg = Vec::new();
    let mut lender = Lender::default();
    loop {
        if req.is_done() {
            // Answers the client's last read with the end of the stream.
            let _ = s.shutdown_write();
            return Ok(served);
        }
        let mut wrong = mismatches(a, &req);
        wrong.extend(differs_from_run(&first, &req));
        if !wrong.is_empty() {
            let why = wrong.join("; ");
            let _ = write_reply(&mut s, &why);
            return Err(format!("refused the client: {why}"));
        }
        write_reply(&mut s, "").map_err(io_error("answering the request"))?;
        let n = req.size as usize;
        if buf.len() < n.max(1 << 20) {
            buf.resize(n.max(1 << 20), 0);
        }
        match req.test {
            Test::Lat => {
                if req.transfer == Transfer::Lent {
                    for i in 0..req.iterations {
                        // The message fetched into a buffer back from the client is lent
                        // back as it is: no copy on this side either.
                        let mut got = lender.target();
                        recv(&mut s, &mut buf[..n], &mut got, Transfer::Lent)
                            .map_err(io_error(format_args!("round trip {i}: reading")))?;
                        lender
                            .lend(&mut s, got)
                            .map_err(io_error(format_args!("round trip {i}: echoing")))?;
                    }
                } else {
                    let messages = req.transfer == Transfer::Messages;
                    s.echo(req.iterations, &mut buf[..n], &mut msg, messages)?;
                }
                lender
                    .drain(&mut s)
                    .map_err(io_error("taking the lent echoes back"))?;
            }
            Test::Bw => {
                if req.transfer == Transfer::Lent {
                    for i in 0..req.iterations {
                        recv(&mut s, &mut buf[..n], &mut msg, req.transfer)
                            .map_err(io_error(format_args!("message {i}")))?;
                    }
                    s.write_all(&[1])
                        .map_err(io_error("answering the last message"))?;
                } else {
                    let messages = req.transfer == Transfer::Messages;
                    s.drink(req.iterations, n, &mut buf, &mut msg, messages)?;
                }
            }
        }
        served.push((req.size, req.iterations));
        req = read_request(&mut s)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::latency::LatencySummary;
    use clap::Parser;

    fn args(extra: &[&str]) -> Result<StreamArgs, clap::Error> {
        let mut argv = vec!["stride-perf", "stream"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Stream(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_test() {
        let p = Plan::client(&args(&["lat", "198.18.0.1"]).unwrap()).unwrap();
        assert_eq!(p.sizes, [64]);
        assert_eq!(p.iterations, DEFAULT_ITERS);
        assert_eq!((p.transfer, p.connections), (Transfer::Stream, 1));
        let a = args(&["bw", "198.18.0.1"]).unwrap();
        assert_eq!(a.port, DEFAULT_PORT);
        assert!(!a.tokio, "the blocking calls unless --tokio");
        assert!(args(&["bw", "198.18.0.1", "--tokio"]).unwrap().tokio);
        let p = Plan::client(&a).unwrap();
        assert_eq!(p.sizes, [65536]);
        let a = args(&[
            "bw",
            "-s",
            "4096",
            "-n",
            "7",
            "--messages",
            "--connections",
            "4",
            "--busy-poll-us",
            "0",
            "--busy-poll-max-us",
            "500",
            "-p",
            "19000",
            "h",
        ])
        .unwrap();
        let p = Plan::client(&a).unwrap();
        assert_eq!(
            (p.sizes.as_slice(), p.iterations, p.transfer, p.connections),
            (&[4096u64][..], 7, Transfer::Messages, 4)
        );
        assert_eq!(
            (a.busy_poll_us, a.busy_poll_max_us, a.port),
            (Some(0), Some(500), 19000)
        );
    }

    #[test]
    fn all_sizes_run_from_one_byte_to_four_mib() {
        let p = Plan::client(&args(&["lat", "-a", "h"]).unwrap()).unwrap();
        assert_eq!(p.sizes.len(), 23);
        assert_eq!((p.sizes[0], *p.sizes.last().unwrap()), (1, 4 << 20));
        assert!(p.sizes.windows(2).all(|w| w[1] == 2 * w[0]));
        assert!(p.all_sizes);
    }

    #[test]
    fn argument_rules() {
        // Clap's: sizes, iterations, connections and busy poll within range; -a or -s.
        for bad in [
            &["lat", "-s", "0"][..],
            &["lat", "-s", "4194305"],
            &["lat", "-a", "-s", "8"],
            &["lat", "-n", "0"],
            &["bw", "--connections", "0"],
            &["bw", "--connections", "65"],
            &["bw", "--busy-poll-us", "1000001"],
            &["bw", "--busy-poll-max-us", "-1"],
            &["fast"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
        assert!(args(&["lat", "-s", "4194304"]).is_ok());
        // The plan's: latency needs 3 samples; --bind is the server's, --json the client's.
        let e = Plan::client(&args(&["lat", "-n", "2", "h"]).unwrap()).unwrap_err();
        assert!(e.contains("at least 3"), "{e}");
        assert!(Plan::client(&args(&["bw", "-n", "1", "h"]).unwrap()).is_ok());
        // -n whose timestamps cannot fit: refused, not a 'capacity overflow' panic.
        let e =
            Plan::client(&args(&["lat", "-n", "9223372036854775808", "h"]).unwrap()).unwrap_err();
        assert!(
            e.starts_with("-n 9223372036854775808 ") && e.contains("at most -n"),
            "{e}"
        );
        let most = (crate::params::MAX_STAMP_BYTES / 16).to_string();
        assert!(Plan::client(&args(&["lat", "-n", &most, "h"]).unwrap()).is_ok());
        let more = (crate::params::MAX_STAMP_BYTES / 32 + 1).to_string();
        let e = Plan::client(&args(&["lat", "-n", &more, "--connections", "2", "h"]).unwrap())
            .unwrap_err();
        assert!(e.contains("at most -n"), "{e}");
        assert!(Plan::client(&args(&["bw", "-n", "9223372036854775808", "h"]).unwrap()).is_ok());
        let e = Plan::client(&args(&["lat", "--bind", "1.2.3.4", "h"]).unwrap()).unwrap_err();
        assert!(e.contains("--bind"), "{e}");
        assert!(check_server(&args(&["lat", "--bind", "1.2.3.4"]).unwrap()).is_ok());
        let e = check_server(&args(&["lat", "--json", "x.json"]).unwrap()).unwrap_err();
        assert!(e.contains("--json"), "{e}");
        assert!(check_server(&args(&["lat", "-n", "2"]).unwrap()).is_err());
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let p =
            Plan::client(&args(&["lat", "--messages", "--connections", "3", "-a", "h"]).unwrap())
                .unwrap();
        let r = p.request(2, 4096);
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let done = Request::done(&p, 1);
        assert!(Request::decode(&done.encode()).unwrap().is_done());
        let mut b = r.encode();
        b[0] = b'X';
        assert!(Request::decode(&b)
            .unwrap_err()
            .contains("not a stride-perf"));
        let mut b = r.encode();
        b[8] = 9;
        assert!(Request::decode(&b).unwrap_err().contains("version 9"));
        let mut b = r.encode();
        b[16] = 3; // index 3 of 3
        assert!(Request::decode(&b).is_err());
        let bad = Request {
            size: MAX_SIZE + 1,
            ..r
        };
        assert!(Request::decode(&bad.encode()).is_err());
        let bad = Request { iterations: 2, ..r };
        assert!(Request::decode(&bad.encode()).is_err());
        // Lent messages travel as their own flag; messages and lent at once are refused.
        let lent = Plan::client(&args(&["bw", "--lend", "-s", "1048576", "h"]).unwrap()).unwrap();
        assert_eq!(lent.transfer, Transfer::Lent);
        let r = lent.request(0, 1 << 20);
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[11] |= 1;
        assert!(Request::decode(&b).unwrap_err().contains("unknown flags"));
        assert!(args(&["bw", "--lend", "--messages", "h"]).is_err());
        let server = args(&["bw", "--lend"]).unwrap();
        let plain = Plan::client(&args(&["bw", "--messages", "h"]).unwrap()).unwrap();
        assert_eq!(
            mismatches(&server, &plain.request(0, 65536)),
            ["the server was given --lend, the client was not"]
        );
        assert!(mismatches(&server, &r).is_empty());
    }

    #[test]
    fn the_server_checks_only_what_it_was_given() {
        let client = Plan::client(&args(&["lat", "-s", "8", "-n", "50", "h"]).unwrap())
            .unwrap()
            .request(0, 8);
        assert!(mismatches(&args(&["lat"]).unwrap(), &client).is_empty());
        assert!(mismatches(&args(&["lat", "-s", "8", "-n", "50"]).unwrap(), &client).is_empty());
        let m = mismatches(
            &args(&[
                "bw",
                "-s",
                "64",
                "-n",
                "9",
                "--messages",
                "--connections",
                "2",
            ])
            .unwrap(),
            &client,
        );
        assert_eq!(m.len(), 5, "{m:?}");
        assert!(m[0].contains("stream bw") && m[0].contains("stream lat"));
        let all = Plan::client(&args(&["lat", "-a", "h"]).unwrap())
            .unwrap()
            .request(0, 1);
        assert!(mismatches(&args(&["lat", "-a"]).unwrap(), &all).is_empty());
        assert_eq!(
            mismatches(&args(&["lat", "-s", "1"]).unwrap(), &all).len(),
            1
        );
        assert_eq!(mismatches(&args(&["lat", "-a"]).unwrap(), &client).len(), 1);
        // A client with --messages may use a server without it.
        let msgs = Plan::client(&args(&["lat", "--messages", "h"]).unwrap())
            .unwrap()
            .request(0, 64);
        assert!(mismatches(&args(&["lat"]).unwrap(), &msgs).is_empty());
        assert!(differs_from_run(&client, &msgs).is_some());
        assert!(differs_from_run(
            &client,
            &Request {
                index: 0,
                size: 64,
                ..client
            }
        )
        .is_none());
    }

    fn conn(samples: &[f64], start_s: f64, end_s: f64) -> ConnectionRun {
        ConnectionRun {
            samples: samples.to_vec(),
            start_s,
            end_s,
            messages: samples.len() as u64,
        }
    }

    #[test]
    fn latency_pools_connections_with_perftests_statistics() {
        // Two connections of 5 round trips each; samples are whole round trips (usec).
        let a = conn(&[10.0, 12.0, 14.0, 16.0, 100.0], 0.0, 0.5);
        let b = conn(&[11.0, 13.0, 15.0, 17.0, 200.0], 0.1, 1.0);
        let r = pool_latency(64, &[a.clone(), b.clone()]).unwrap();
        assert_eq!((r.bytes, r.iterations), (64, 10));
        // The same numbers LatencySummary gives for the pooled samples, halved.
        let mut all: Vec<f64> = a.samples.iter().chain(&b.samples).copied().collect();
        assert_eq!(
            r.summary,
            LatencySummary::from_samples(&mut all, 2.0).unwrap()
        );
        assert_eq!(r.summary.t_min, 5.0);
        assert_eq!(r.summary.t_typical, 6.75);
        // 10 round trips over 1 s of wall time.
        assert!((r.round_trips_per_sec - 10.0).abs() < 1e-9);
        assert!(pool_latency(64, &[conn(&[1.0, 2.0], 0.0, 1.0)]).is_err());
        assert!(pool_latency(64, &[conn(&[1.0, 2.0, 3.0], 1.0, 1.0)]).is_err());
    }

    #[test]
    fn bandwidth_sums_connections_over_the_wall_time() {
        let run = |messages, start_s, end_s| ConnectionRun {
            samples: Vec::new(),
            start_s,
            end_s,
            messages,
        };
        let r = sum_bandwidth(1 << 20, &[run(100, 0.0, 1.0), run(100, 0.0, 2.0)]).unwrap();
        assert_eq!(r.iterations, 200);
        // 200 MiB over 2 s: 100 MiB/s, 0.0001 million messages per second.
        assert!((r.avg(false) - 100.0).abs() < 1e-9);
        assert!((r.msg_rate_mpps - 1e-4).abs() < 1e-12);
        assert_eq!(r.peak_bytes_per_sec, None);
        assert!(sum_bandwidth(8, &[run(0, 0.0, 1.0)]).is_err());
        assert!(sum_bandwidth(8, &[run(5, 1.0, 1.0)]).is_err());
    }

    #[test]
    fn rows_line_up_with_their_headers() {
        let l = StreamLatency {
            bytes: 64,
            iterations: 1000,
            summary: LatencySummary {
                t_min: 1.0,
                t_max: 9.0,
                t_typical: 2.5,
                t_avg: 2.75,
                t_stdev: 0.5,
                p99: 8.0,
                p99_9: 9.0,
            },
            round_trips_per_sec: 181818.2,
        };
        let cols: Vec<String> = latency_row(&l)
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(
            cols,
            ["64", "1000", "1.00", "9.00", "2.50", "2.75", "0.50", "8.00", "9.00", "181818"]
        );
        assert!(latency_header().ends_with("round trips/sec"));
        assert!(latency_header().contains("t_typical[usec]"));
        let b = sum_bandwidth(
            65536,
            &[ConnectionRun {
                messages: 16000,
                start_s: 0.0,
                end_s: 1.0,
                samples: Vec::new(),
            }],
        )
        .unwrap();
        let cols: Vec<String> = bandwidth_row(&b)
            .split_whitespace()
            .map(String::from)
            .collect();
        // 1000 MiB/s = 8.388608 Gb/s.
        assert_eq!(cols, ["65536", "16000", "1000.00", "8.389", "0.016000"]);
        assert_eq!(
            bandwidth_header()
                .lines()
                .last()
                .unwrap()
                .split("BW")
                .count(),
            3
        );
    }

    #[test]
    fn the_report_reads_back() {
        let report = StreamReport {
            tool: "stride-perf".into(),
            version: "0.1.0".into(),
            test: "stream lat".into(),
            transfer: Transfer::Messages,
            connections: 2,
            busy_poll_us: Some(5),
            busy_poll_max_us: None,
            nodelay: true,
            tokio: false,
            shared_receive_queue: Some(1024),
            server: "198.18.0.1:18600".into(),
            clock: "tsc".into(),
            results: vec![
                StreamResult::Latency(StreamLatency {
                    bytes: 8,
                    iterations: 10,
                    summary: LatencySummary {
                        t_min: 1.0,
                        t_max: 2.0,
                        t_typical: 1.5,
                        t_avg: 1.5,
                        t_stdev: 0.1,
                        p99: 2.0,
                        p99_9: 2.0,
                    },
                    round_trips_per_sec: 1000.0,
                }),
                StreamResult::Bandwidth(
                    sum_bandwidth(8, &[conn(&[1.0, 1.0, 1.0], 0.0, 1.0)]).unwrap(),
                ),
            ],
        };
        let dir = std::env::temp_dir().join(format!("stride-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.json");
        report.write_json(&path).unwrap();
        let back = StreamReport::read_json(&path).unwrap();
        assert_eq!(back, report);
        assert_eq!(back.results[1].bytes(), 8);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"kind\": \"latency\"") && text.contains("\"messages\""));
        std::fs::write(&path, "[]").unwrap();
        assert!(StreamReport::read_json(&path)
            .unwrap_err()
            .contains("not a stride-perf stream"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_gate_releases_every_waiter() {
        let gate = Arc::new(Gate::new(3));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let g = Arc::clone(&gate);
                thread::spawn(move || g.wait())
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        gate.give_up();
        for w in waiters {
            assert!(!w.join().unwrap());
        }
        assert!(!gate.wait());
        let gate = Arc::new(Gate::new(2));
        let g = Arc::clone(&gate);
        let other = thread::spawn(move || (g.wait(), g.wait()));
        assert!(gate.wait() && gate.wait());
        assert_eq!(other.join().unwrap(), (true, true));
    }
}
