//! `cmtime`: times every step of setting up and tearing down many rdma_cm connections,
//! with the flags of rdma-core's `cmtime` and its way of keeping client and server in step,
//! so either side may be theirs.
//!
//! The run has three rounds: a warm-up and a timed round with a QP per connection (created
//! by the program and moved through its states with `rdma_init_qp_attr`), then a timed
//! round without QPs (the connections name QP numbers from `-q` on). A TCP connection to
//! the server's port keeps the sides in step: at the start of a round, once all its
//! connections are established and once all are disconnected, the client sends the number
//! of that step (0, 12 or 14; one byte), and the server sends it back when its own side of
//! the step is done. After each timed round both sides print a table: per step, the time
//! from the first connection's start to the last one's end (total) and its share per
//! connection (avg/iter), the sum of the connections' own times and its mean (us/conn), and
//! the longest and shortest, all in microseconds.
//!
//! `-m US` simulates the QPs of the timed round with them (no QP is made; creating it and
//! each modify is a sleep of US microseconds, and the connections name QP numbers from `-q`
//! on), `-n THREADS` runs the per-connection steps that rdma-core's cmtime hands to its
//! worker threads on that many threads (address and route resolution requests, QP creation,
//! the move to Init, disconnecting, and what follows an rdma_cm event: the client's RTR, RTS
//! and establish after the server's reply, the server's accept of a request and its answer
//! to a disconnect; the socket test's socket creation and connect), and `-S` times plain TCP
//! connections instead of rdma_cm ones, as a baseline: the server accepts `-c` connections
//! on the port, the client creates and connects them, both close them, and each prints one
//! table; no step bytes are exchanged then. Where rdma-core's cmtime queues each event's work
//! as it comes, this one reads the events that are waiting, hands their work to the threads
//! (each connection's in order, on one thread) and reads on once that is done.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use sideway::rdmacm::{
    CmError, CmId, ConnParam, Event, EventChannel, EventType, PortSpace, QpTargetState,
};
use sideway::{CompletionQueue, ProtectionDomain, QueuePair};
use sideway_examples::cli::{exit_status, log_to_stderr, select_devices, CliError};
use sideway_examples::cm_connection::socket_addr;
use sideway_examples::cmtime_wire::{check_announced, check_answer, Step, STEPS};

/// Times the steps of rdma_cm connection setup and teardown over many connections.
#[derive(Debug, Parser)]
#[command(name = "cmtime")]
struct Args {
    /// Run as the client, connecting to this server (a name or an address); without it,
    /// run as the server
    #[arg(short = 's', long = "server", value_name = "ADDRESS")]
    server: Option<String>,

    /// The local address to bind to (the server listens on it; default: every address)
    #[arg(short = 'b', long = "bind", value_name = "ADDRESS")]
    bind: Option<String>,

    /// Connections per round
    #[arg(short = 'c', long = "connections", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    connections: u32,

    /// The server's port (rdma_cm, and TCP for keeping the sides in step)
    #[arg(short = 'p', long = "port", default_value_t = 7471)]
    port: u16,

    /// The first QP number the round without QPs names (it uses this and the next
    /// connections - 1); give client and server on one host different ones
    #[arg(short = 'q', long = "base-qpn", value_name = "QPN", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..0xff_ffff))]
    base_qpn: u32,

    /// Retries of an address or route resolution that failed
    #[arg(short = 'r', long = "retries", default_value_t = 2)]
    retries: u32,

    /// Milliseconds an address or route resolution may take; the client's TCP connection to
    /// the server and the server's first answer on it may take as long
    #[arg(short = 't', long = "timeout", value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..))]
    timeout_ms: u32,

    /// Simulate the QPs of the timed round: no QP is made, creating one and each modify is a
    /// sleep of this many microseconds, and the connections name QP numbers from -q on
    #[arg(short = 'm', long = "mimic-qp-delay", value_name = "US")]
    mimic_qp_delay: Option<u32>,

    /// Threads that run the per-connection steps (resolution requests, QP creation and
    /// modifies, connect, accept and disconnect handling; the socket test's creates and
    /// connects)
    #[arg(short = 'n', long = "threads", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,

    /// Time TCP socket connections instead of rdma_cm ones, as a baseline (both sides give
    /// it, with the same -c and -p)
    #[arg(short = 'S', long = "sockets")]
    sockets: bool,
}

/// How long the connections of a round may take for one asynchronous step (connecting,
/// disconnecting), and the server to answer in the TCP exchange once it has answered once.
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// The three rounds of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Warmup,
    WithQps,
    WithoutQps,
}

const ROUNDS: [Round; 3] = [Round::Warmup, Round::WithQps, Round::WithoutQps];

/// What stands for a connection's QP in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qps {
    /// A QP made and modified for real.
    Real,
    /// None; creating it and each modify is a sleep this long (zero in the round without
    /// QPs), and the connection names a QP number from -q on.
    Simulated(Duration),
}

impl Qps {
    fn real(self) -> bool {
        self == Qps::Real
    }

    /// What the QP's creation or modify costs when simulated.
    fn stand_in(self) {
        if let Qps::Simulated(d) = self {
            if !d.is_zero() {
                std::thread::sleep(d);
            }
        }
    }
}

impl Round {
    fn qps(self, args: &Args) -> Qps {
        match (self, args.mimic_qp_delay) {
            (Round::Warmup, _) | (Round::WithQps, None) => Qps::Real,
            (Round::WithQps, Some(us)) => Qps::Simulated(Duration::from_micros(u64::from(us))),
            (Round::WithoutQps, _) => Qps::Simulated(Duration::ZERO),
        }
    }

    fn title(self, client: bool, args: &Args) -> String {
        let n = args.connections;
        let (side, verb) = if client {
            ("Client", "Connect")
        } else {
            ("Server", "Accept")
        };
        match (self, args.mimic_qp_delay) {
            (Round::Warmup, _) => format!("{side} warmup"),
            (Round::WithQps, None) => format!("{verb} ({n}) QPs test"),
            (Round::WithQps, Some(us)) => {
                format!("{verb} ({n}) simulated QPs test (delay {us} us)")
            }
            (Round::WithoutQps, _) => format!("{verb} ({n}) test - no QPs"),
        }
    }
}

/// When one connection started and ended each step.
#[derive(Debug, Clone, Default)]
struct Times([Option<(Instant, Instant)>; STEPS.len()]);

impl Times {
    fn set(&mut self, step: Step, start: Instant, end: Instant) {
        self.0[step as usize] = Some((start, end));
    }

    /// Runs `f`, recording how long it took as `step`.
    fn time<T>(&mut self, step: Step, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.set(step, start, Instant::now());
        out
    }
}

/// One row of the table, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Row {
    total: u128,
    sum: u128,
    max: u128,
    min: u128,
}

/// The rows of the table: per step, from the connections' own spans, and the step's whole
/// span from `whole` where the program timed it as one (the socket test), else from the
/// first connection's start to the last one's end.
fn rows(conns: &[Times], whole: &Times) -> Vec<Row> {
    (0..STEPS.len())
        .map(|s| {
            let spans: Vec<(Instant, Instant)> = conns.iter().filter_map(|t| t.0[s]).collect();
            let each: Vec<u128> = spans.iter().map(|(a, b)| (*b - *a).as_micros()).collect();
            let total = match whole.0[s] {
                Some((first, last)) => (last - first).as_micros(),
                None => match (
                    spans.iter().map(|s| s.0).min(),
                    spans.iter().map(|s| s.1).max(),
                ) {
                    (Some(first), Some(last)) => (last - first).as_micros(),
                    _ => 0,
                },
            };
            Row {
                total,
                sum: each.iter().sum(),
                max: each.iter().copied().max().unwrap_or(0),
                min: each.iter().copied().min().unwrap_or(0),
            }
        })
        .collect()
}

/// The table, as rdma-core's cmtime lays it out: headed `qp_conn` when the connections had
/// real QPs, `cm_conn` otherwise (simulated or none, and the socket test).
fn table(real_qps: bool, threads: u32, conns: &[Times], whole: &Times) -> String {
    let n = conns.len().max(1) as u128;
    let label = if real_qps { "qp_conn" } else { "cm_conn" };
    let mut out = format!(
        "{label:<16}{:>9}\n{:<16}{:>9}\n",
        conns.len(),
        "threads",
        threads
    );
    out += &format!(
        "{:<16}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}\n",
        "step", "avg/iter", "total(us)", "us/conn", "sum(us)", "max(us)", "min(us)"
    );
    for ((_, name), row) in STEPS.iter().zip(rows(conns, whole)) {
        out += &format!(
            "{name:<16}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}\n",
            row.total / n,
            row.total,
            row.sum / n,
            row.sum,
            row.max,
            row.min
        );
    }
    out
}

fn say(line: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The PD and CQ every QP of the run uses, made once on the device of the first id.
struct Verbs {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
}

impl Verbs {
    fn get<'a>(slot: &'a mut Option<Verbs>, id: &CmId, n: u32) -> Result<&'a Verbs, CliError> {
        if let Some(v) = slot {
            v.check_device(id)?;
        } else {
            let ctx = id.device_context().map_err(CliError::run)?;
            say("\tAllocating verbs resources")?;
            let pd = ctx.alloc_pd().map_err(CliError::run)?;
            let cq = ctx
                .create_cq_builder()
                .cqe(n.saturating_mul(2).max(16))
                .build()
                .map_err(CliError::run)?;
            *slot = Some(Verbs { pd, cq });
        }
        // Filled above when it was empty.
        slot.as_ref()
            .ok_or_else(|| CliError::run("internal error: no verbs resources"))
    }

    /// Fails unless `id` is on the device the PD and CQ are.
    fn check_device(&self, id: &CmId) -> Result<(), CliError> {
        let ctx = id.device_context().map_err(CliError::run)?;
        if Arc::ptr_eq(self.pd.context(), &ctx) {
            return Ok(());
        }
        Err(CliError::run(format!(
            "the connections use two RDMA devices, {} and {}; bind with -b",
            self.pd.context().name(),
            ctx.name()
        )))
    }

    /// A QP that never posts anything: the smallest the device makes.
    fn create_qp(&self) -> Result<QueuePair, CliError> {
        self.pd
            .create_qp_builder()
            .send_cq(&self.cq)
            .recv_cq(&self.cq)
            .max_send_wr(1)
            .max_recv_wr(1)
            .build()
            .map_err(CliError::run)
    }
}

/// One connection of a round.
struct Conn {
    id: Arc<CmId>,
    qp: Option<QueuePair>,
    times: Times,
    /// When the asynchronous step in progress started.
    started: Instant,
    /// Resolution retries left.
    retries: u32,
    /// The step in progress has finished.
    done: bool,
}

impl Conn {
    /// Moves the QP to `state`, timing the attribute query and the modify; without a QP the
    /// modify is what `qps` makes it (a sleep, or nothing).
    fn advance(
        &mut self,
        state: QpTargetState,
        attr_step: Step,
        modify_step: Step,
        qps: Qps,
    ) -> Result<(), CliError> {
        let id = &self.id;
        let attr = self
            .times
            .time(attr_step, || id.init_qp_attr(state))
            .map_err(CliError::run)?;
        match &self.qp {
            Some(qp) => self
                .times
                .time(modify_step, || qp.modify(&attr))
                .map_err(CliError::run)?,
            None => self.times.time(modify_step, || qps.stand_in()),
        }
        Ok(())
    }

    /// The connection of a request on the server, its full connect starting now.
    fn requested(id: Arc<CmId>) -> Self {
        let start = Instant::now();
        let mut times = Times::default();
        times.set(Step::FullConnect, start, start);
        Conn {
            id,
            qp: None,
            times,
            started: start,
            retries: 0,
            done: false,
        }
    }

    /// Creates the connection's QP on `verbs` (a real one), or stands in for it, timed.
    fn create_qp(&mut self, qps: Qps, verbs: Option<&Verbs>) -> Result<(), CliError> {
        match (qps, verbs) {
            (Qps::Real, Some(v)) => {
                v.check_device(&self.id)?;
                self.qp = Some(self.times.time(Step::CreateQp, || v.create_qp())?);
            }
            (Qps::Real, None) => {
                return Err(CliError::run("internal error: no verbs resources"));
            }
            (Qps::Simulated(_), _) => self.times.time(Step::CreateQp, || qps.stand_in()),
        }
        Ok(())
    }

    /// The QP number the connection names: its QP's, or number `i` from -q on.
    fn qp_num(&self, args: &Args, i: usize) -> u32 {
        match &self.qp {
            Some(qp) => qp.qp_num(),
            // In range: -q is below 2^24 and -c at most 100000.
            None => args.base_qpn + i as u32,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The values guarded (a work list, the first failure) stay whole if a holder panicked.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `work` on every item on `threads` threads, each taking the next item as it gets
/// free, as rdma-core's cmtime's work queue does (one thread: the items in order, here).
/// The first failure stops the threads from taking more and is returned.
fn on_workers<I>(
    threads: u32,
    items: I,
    work: impl Fn(I::Item) -> Result<(), CliError> + Sync,
) -> Result<(), CliError>
where
    I: IntoIterator,
    I::IntoIter: Send,
{
    if threads <= 1 {
        return items.into_iter().try_for_each(work);
    }
    let queue = Mutex::new(items.into_iter());
    let failed: Mutex<Option<CliError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                if lock(&failed).is_some() {
                    break;
                }
                let Some(item) = lock(&queue).next() else {
                    break;
                };
                if let Err(e) = work(item) {
                    lock(&failed).get_or_insert(e);
                    break;
                }
            });
        }
    });
    match failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// The connections of a round, found from their events.
struct Connections {
    channel: Arc<EventChannel>,
    conns: Vec<Conn>,
    index: HashMap<usize, usize>,
    /// Threads that handle the events (-n).
    threads: u32,
}

/// What a handler learns of an rdma_cm event: its type and, for an event that reports a
/// failure, the error. Unlike the event (acknowledged once this is taken) it may go to
/// another thread.
#[derive(Debug)]
struct Got {
    kind: EventType,
    status: i32,
    failure: Option<CmError>,
}

impl Got {
    fn of(event: Event) -> Self {
        let (kind, status) = (event.event_type(), event.status());
        Got {
            kind,
            status,
            failure: event.into_result().err(),
        }
    }

    /// The error of an event that is not the one `wanted`.
    fn unexpected(&self, wanted: &str) -> CliError {
        match &self.failure {
            Some(err) => CliError::run(err.to_string()),
            None => CliError::run(format!(
                "expected {wanted}, got {:?} (status {})",
                self.kind, self.status
            )),
        }
    }
}

impl Connections {
    fn of(&self, event: &Event) -> Option<usize> {
        self.index.get(&(event.id().as_raw() as usize)).copied()
    }

    /// Handles events with `handle` until it has marked every connection done, or
    /// `limit` passes. With more than one thread (-n), the events that are waiting are taken
    /// together and handled on the threads, each connection's in order on one of them.
    fn until_done(
        &mut self,
        what: &str,
        limit: Duration,
        handle: impl Fn(&mut Conn, &Got) -> Result<(), CliError> + Sync,
    ) -> Result<(), CliError> {
        for c in &mut self.conns {
            c.done = false;
        }
        let deadline = Instant::now() + limit;
        while self.conns.iter().any(|c| !c.done) {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match self.channel.get_event(Some(left)) {
                Ok(e) => e,
                Err(CmError::Timeout { .. }) => {
                    let missing = self.conns.iter().filter(|c| !c.done).count();
                    return Err(CliError::run(format!(
                        "{what}: {missing} of {} connections did not finish within {}",
                        self.conns.len(),
                        show_wait(limit)
                    )));
                }
                Err(e) => return Err(CliError::run(e)),
            };
            let mut batch: HashMap<usize, Vec<Got>> = HashMap::new();
            if let Some(i) = self.of(&event) {
                batch.entry(i).or_default().push(Got::of(event));
            }
            if self.threads > 1 {
                while let Some(event) = self.channel.try_get_event().map_err(CliError::run)? {
                    if let Some(i) = self.of(&event) {
                        batch.entry(i).or_default().push(Got::of(event));
                    }
                }
            }
            let work: Vec<(&mut Conn, Vec<Got>)> = self
                .conns
                .iter_mut()
                .enumerate()
                .filter_map(|(i, c)| batch.remove(&i).map(|got| (c, got)))
                .collect();
            on_workers(self.threads, work, |(c, got)| {
                got.iter().try_for_each(|g| handle(c, g))
            })?;
        }
        Ok(())
    }
}

/// The TCP connection that keeps client and server in step.
struct ClientSync {
    stream: TcpStream,
    /// The server's address, for messages.
    dst: SocketAddr,
    /// How long the server may take to agree to the next step.
    limit: Duration,
}

/// A wait's length as a person reads it: "2 s", "1500 ms".
fn show_wait(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl ClientSync {
    /// Connects to the server's TCP port at `dst`. The connection and the server's answer to
    /// the first step may each take at most `limit` (the -t timeout): a server that is there
    /// answers both at once. Later steps wait for the server's connections, up to
    /// [`STEP_LIMIT`].
    fn connect(dst: SocketAddr, limit: Duration) -> Result<Self, CliError> {
        let step = format!("TCP connect to the cmtime server at {dst}");
        let stream = TcpStream::connect_timeout(&dst, limit).map_err(|e| {
            CliError::run(match e.kind() {
                ErrorKind::ConnectionRefused => format!(
                    "{step}: connection refused: is cmtime running there as the server, with \
                     -p {}?",
                    dst.port()
                ),
                ErrorKind::TimedOut | ErrorKind::WouldBlock => format!(
                    "{step}: no answer within {} (-t): the address routes nowhere or a \
                     firewall drops it; check -s and -p, or raise -t",
                    show_wait(limit)
                ),
                _ => format!("{step}: {e}"),
            })
        })?;
        stream
            .set_read_timeout(Some(limit))
            .map_err(|e| CliError::run(format!("{step}: setting the read timeout: {e}")))?;
        Ok(ClientSync { stream, dst, limit })
    }

    /// Client: tells the server this side is done with `step` and waits for it to agree.
    fn step(&mut self, step: Step) -> Result<(), CliError> {
        let byte = step as u8;
        let dst = self.dst;
        self.stream.write_all(&[byte]).map_err(|e| {
            CliError::run(format!(
                "telling the cmtime server at {dst} of step {byte}: {e}"
            ))
        })?;
        let mut echo = [0u8];
        self.stream.read_exact(&mut echo).map_err(|e| {
            let waiting = format!("waiting for the cmtime server at {dst} to agree to step {byte}");
            CliError::run(match e.kind() {
                ErrorKind::TimedOut | ErrorKind::WouldBlock => format!(
                    "{waiting}: no answer within {}: is it a cmtime server, and still running?",
                    show_wait(self.limit)
                ),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => {
                    format!("{waiting}: the server closed the connection (see its output)")
                }
                _ => format!("{waiting}: {e}"),
            })
        })?;
        check_answer(step, echo[0]).map_err(CliError::run)?;
        if self.limit != STEP_LIMIT {
            // It answered: from now on it may be busy with many connections.
            self.stream
                .set_read_timeout(Some(STEP_LIMIT))
                .map_err(|e| CliError::run(format!("setting the read timeout: {e}")))?;
            self.limit = STEP_LIMIT;
        }
        Ok(())
    }
}

fn client(args: &Args, host: &str) -> Result<(), CliError> {
    let dst = socket_addr(host, args.port)?;
    let src = args
        .bind
        .as_deref()
        .map(|h| socket_addr(h, 0))
        .transpose()?;
    let mut sync = ClientSync::connect(dst, Duration::from_millis(u64::from(args.timeout_ms)))?;
    let mut verbs = None;
    for round in ROUNDS {
        say(&round.title(true, args))?;
        let times = client_round(args, round, src, dst, &mut sync, &mut verbs)?;
        if round != Round::Warmup {
            let real = round.qps(args).real();
            say(table(real, args.threads, &times, &Times::default()).trim_end())?;
        }
    }
    Ok(())
}

fn client_round(
    args: &Args,
    round: Round,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    sync: &mut ClientSync,
    verbs: &mut Option<Verbs>,
) -> Result<Vec<Times>, CliError> {
    sync.step(Step::FullConnect)?;
    let resolve = Duration::from_millis(u64::from(args.timeout_ms));
    let resolve_limit = resolve
        .saturating_mul(args.retries.saturating_add(1))
        .saturating_add(Duration::from_secs(5));
    let channel = EventChannel::new().map_err(CliError::run)?;
    let mut r = Connections {
        channel: Arc::clone(&channel),
        conns: Vec::new(),
        index: HashMap::new(),
        threads: args.threads,
    };

    say("\tCreating IDs")?;
    for i in 0..args.connections as usize {
        let mut times = Times::default();
        let start = Instant::now();
        let id = times
            .time(Step::CreateId, || channel.create_id(PortSpace::Tcp))
            .map_err(CliError::run)?;
        times.set(Step::FullConnect, start, start);
        r.index.insert(id.as_raw() as usize, i);
        r.conns.push(Conn {
            id,
            qp: None,
            times,
            started: start,
            retries: args.retries,
            done: false,
        });
    }
    if let Some(src) = src {
        say("\tBinding addresses")?;
        for c in &mut r.conns {
            let id = &c.id;
            c.times
                .time(Step::BindAddr, || id.bind_addr(src))
                .map_err(CliError::run)?;
        }
    }

    let threads = args.threads;
    say("\tResolving addresses")?;
    on_workers(threads, &mut r.conns, |c| {
        c.started = Instant::now();
        c.id.resolve_addr(src, dst, resolve).map_err(CliError::run)
    })?;
    r.until_done(
        &format!("resolving the address {dst}"),
        resolve_limit,
        |c, g| {
            match g.kind {
                EventType::AddrResolved => {
                    c.times.set(Step::ResolveAddr, c.started, Instant::now());
                    c.done = true;
                }
                EventType::AddrError if c.retries > 0 => {
                    c.retries -= 1;
                    c.id.resolve_addr(src, dst, resolve)
                        .map_err(CliError::run)?;
                }
                _ => return Err(g.unexpected("ADDR_RESOLVED")),
            }
            Ok(())
        },
    )?;

    say("\tResolving routes")?;
    on_workers(threads, &mut r.conns, |c| {
        c.started = Instant::now();
        c.retries = args.retries;
        c.id.resolve_route(resolve).map_err(CliError::run)
    })?;
    r.until_done(
        &format!("resolving the route to {dst}"),
        resolve_limit,
        |c, g| {
            match g.kind {
                EventType::RouteResolved => {
                    c.times.set(Step::ResolveRoute, c.started, Instant::now());
                    c.done = true;
                }
                EventType::RouteError if c.retries > 0 => {
                    c.retries -= 1;
                    c.id.resolve_route(resolve).map_err(CliError::run)?;
                }
                _ => return Err(g.unexpected("ROUTE_RESOLVED")),
            }
            Ok(())
        },
    )?;

    say("\tCreating QPs")?;
    let qps = round.qps(args);
    if let (Qps::Real, Some(first)) = (qps, r.conns.first()) {
        // The PD and CQ, made once, before the threads share them.
        Verbs::get(verbs, &first.id, args.connections)?;
    }
    let shared = verbs.as_ref();
    on_workers(threads, &mut r.conns, |c| c.create_qp(qps, shared))?;
    say("\tModify QPs to INIT")?;
    on_workers(threads, &mut r.conns, |c| {
        c.advance(QpTargetState::Init, Step::InitQpAttr, Step::InitQp, qps)
    })?;

    say("\tConnecting")?;
    for (i, c) in r.conns.iter_mut().enumerate() {
        let qp_num = c.qp_num(args, i);
        c.started = Instant::now();
        c.id.connect(ConnParam::new().qp_num(qp_num))
            .map_err(CliError::run)?;
    }
    r.until_done(&format!("rdma_cm connect to {dst}"), STEP_LIMIT, |c, g| {
        if g.kind != EventType::ConnectResponse {
            return Err(g.unexpected("CONNECT_RESPONSE"));
        }
        c.times.set(Step::CmConnect, c.started, Instant::now());
        // Init again: the access flags follow the responder resources agreed only now.
        if let Some(qp) = &c.qp {
            c.id.modify_qp(qp, &[QpTargetState::Init])
                .map_err(CliError::run)?;
        }
        c.advance(QpTargetState::Rtr, Step::RtrQpAttr, Step::RtrQp, qps)?;
        c.advance(QpTargetState::Rts, Step::RtsQpAttr, Step::RtsQp, qps)?;
        let id = &c.id;
        c.times
            .time(Step::Establish, || id.establish())
            .map_err(CliError::run)?;
        let start = c.times.0[Step::FullConnect as usize].map_or(c.started, |s| s.0);
        c.times.set(Step::FullConnect, start, Instant::now());
        c.done = true;
        Ok(())
    })?;

    sync.step(Step::CmConnect)?;
    say("\tDisconnecting")?;
    disconnect_all(&mut r, threads)?;
    sync.step(Step::Disconnect)?;
    say("\tDestroying QPs and IDs")?;
    Ok(destroy_all(r))
}

/// Disconnects every connection and waits for each one's `DISCONNECTED` (which comes
/// whether this side's request or the peer's got there first).
fn disconnect_all(r: &mut Connections, threads: u32) -> Result<(), CliError> {
    on_workers(threads, &mut r.conns, |c| {
        c.started = Instant::now();
        c.done = false;
        // The peer may have disconnected first; then this only answers it.
        let _ = c.id.disconnect();
        Ok(())
    })?;
    r.until_done("disconnecting", STEP_LIMIT, |c, g| {
        match g.kind {
            EventType::Disconnected => {
                c.times.set(Step::Disconnect, c.started, Instant::now());
                c.done = true;
            }
            // Late news; nothing to do.
            EventType::Established | EventType::TimewaitExit => {}
            _ => return Err(g.unexpected("DISCONNECTED")),
        }
        Ok(())
    })
}

/// Destroys the QPs, then the ids, timing each; what is left is the connections' times.
fn destroy_all(r: Connections) -> Vec<Times> {
    let mut conns = r.conns;
    for c in &mut conns {
        if let Some(qp) = c.qp.take() {
            c.times.time(Step::DestroyQp, || drop(qp));
        }
    }
    conns
        .into_iter()
        .map(|c| {
            let Conn { id, mut times, .. } = c;
            // The last Arc of the id: dropping it is rdma_destroy_id.
            times.time(Step::DestroyId, || drop(id));
            times
        })
        .collect()
}

fn unexpected(e: Event, wanted: &str) -> CliError {
    match e.into_result() {
        Err(err) => CliError::run(err),
        Ok(e) => CliError::run(format!(
            "expected {wanted}, got {:?} (status {})",
            e.event_type(),
            e.status()
        )),
    }
}

/// The server's end of the TCP connection that keeps the sides in step; non-blocking, so
/// rdma_cm events are handled while waiting for the client's next step.
struct ServerSync {
    stream: TcpStream,
}

impl ServerSync {
    /// The client's next step, if it has sent one.
    fn poll(&mut self) -> Result<Option<u8>, CliError> {
        let mut byte = [0u8];
        match self.stream.read(&mut byte) {
            Ok(0) => Err(CliError::run(
                "the client closed the TCP connection before the run was over",
            )),
            Ok(_) => Ok(Some(byte[0])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(None)
            }
            Err(e) => Err(CliError::run(format!(
                "reading the client's next step: {e}"
            ))),
        }
    }

    /// Waits, at most [`STEP_LIMIT`], for the client to announce `step`.
    fn expect(&mut self, step: Step) -> Result<(), CliError> {
        let deadline = Instant::now() + STEP_LIMIT;
        loop {
            if let Some(byte) = self.poll()? {
                return check_announced(byte, step).map_err(CliError::run);
            }
            if Instant::now() >= deadline {
                return Err(CliError::run(format!(
                    "the client did not announce step {} within {STEP_LIMIT:?}",
                    step as u8
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Agrees to `step`: sends it back.
    fn agree(&mut self, step: Step) -> Result<(), CliError> {
        let byte = step as u8;
        // One byte into an idle socket's buffer: a non-blocking write takes it whole.
        self.stream
            .write_all(&[byte])
            .map_err(|e| CliError::run(format!("agreeing to step {byte}: {e}")))
    }
}

fn server(args: &Args) -> Result<(), CliError> {
    let bind = match args.bind.as_deref() {
        Some(host) => socket_addr(host, args.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port),
    };
    let tcp = TcpListener::bind(bind)
        .map_err(|e| CliError::run(format!("cannot listen on TCP {bind}: {e}")))?;
    let channel = EventChannel::new().map_err(CliError::run)?;
    let listener = channel.create_id(PortSpace::Tcp).map_err(CliError::run)?;
    listener.bind_addr(bind).map_err(CliError::run)?;
    let backlog = i32::try_from(args.connections).unwrap_or(i32::MAX);
    listener.listen(backlog).map_err(CliError::run)?;
    // Waiting for a client has no limit: that is what a server does.
    let (stream, _) = tcp
        .accept()
        .map_err(|e| CliError::run(format!("accepting the client's TCP connection: {e}")))?;
    stream.set_nonblocking(true).map_err(CliError::run)?;
    let mut sync = ServerSync { stream };
    let mut verbs = None;
    for round in ROUNDS {
        say(&round.title(false, args))?;
        let times = server_round(args, round, &channel, &mut sync, &mut verbs)?;
        if round != Round::Warmup {
            let real = round.qps(args).real();
            say(table(real, args.threads, &times, &Times::default()).trim_end())?;
        }
    }
    Ok(())
}

fn server_round(
    args: &Args,
    round: Round,
    channel: &Arc<EventChannel>,
    sync: &mut ServerSync,
    verbs: &mut Option<Verbs>,
) -> Result<Vec<Times>, CliError> {
    let n = args.connections as usize;
    sync.expect(Step::FullConnect)?;
    sync.agree(Step::FullConnect)?;
    say("\tAccepting")?;
    let mut r = Connections {
        channel: Arc::clone(channel),
        conns: Vec::new(),
        index: HashMap::new(),
        threads: args.threads,
    };
    // The client says when it has connected all it meant to (its warm-up may make fewer
    // than -c connections); every accepted connection must be established by then.
    let mut established = 0;
    let mut client_done = false;
    let mut deadline = Instant::now() + STEP_LIMIT;
    while !(client_done && established == r.conns.len()) {
        if !client_done {
            if let Some(byte) = sync.poll()? {
                check_announced(byte, Step::CmConnect).map_err(CliError::run)?;
                client_done = true;
            }
        }
        if Instant::now() >= deadline {
            return Err(CliError::run(format!(
                "{established} of {} accepted connections were established, no progress \
                 within {STEP_LIMIT:?}",
                r.conns.len()
            )));
        }
        let first = match channel.get_event(Some(Duration::from_millis(1))) {
            Ok(e) => e,
            Err(CmError::Timeout { .. }) => continue,
            Err(e) => return Err(CliError::run(e)),
        };
        deadline = Instant::now() + STEP_LIMIT;
        // With more than one thread (-n), the events waiting are taken together, and the
        // requests among them accepted on the threads.
        let mut next = Some(first);
        let accepted = r.conns.len();
        while let Some(event) = next.take() {
            match event.event_type() {
                EventType::ConnectRequest if r.conns.len() < n => {
                    let id = Arc::clone(event.id());
                    drop(event);
                    r.index.insert(id.as_raw() as usize, r.conns.len());
                    r.conns.push(Conn::requested(id));
                }
                // More requests than -c: refused by dropping the request's id.
                EventType::ConnectRequest => {}
                EventType::Established => {
                    if let Some(i) = r.of(&event) {
                        let c = &mut r.conns[i];
                        let now = Instant::now();
                        c.times.set(Step::CmConnect, c.started, now);
                        let start = c.times.0[Step::FullConnect as usize].map_or(now, |s| s.0);
                        c.times.set(Step::FullConnect, start, now);
                        established += 1;
                    }
                }
                // A late event of the last round's connections, which are gone.
                EventType::TimewaitExit => {}
                _ => return Err(unexpected(event, "CONNECT_REQUEST or ESTABLISHED")),
            }
            if args.threads > 1 {
                next = channel.try_get_event().map_err(CliError::run)?;
            }
        }
        let new = &mut r.conns[accepted..];
        let qps = round.qps(args);
        if let (Qps::Real, Some(c)) = (qps, new.first()) {
            // The PD and CQ, made once, before the threads share them.
            Verbs::get(verbs, &c.id, args.connections)?;
        }
        let shared = verbs.as_ref();
        on_workers(args.threads, new.iter_mut().zip(accepted..), |(c, i)| {
            accept(args, qps, c, i, shared)
        })?;
    }
    sync.agree(Step::CmConnect)?;

    // The client disconnects; each DISCONNECTED is answered with rdma_disconnect.
    say("\tDisconnecting")?;
    r.until_done(
        "waiting for the client to disconnect",
        STEP_LIMIT,
        |c, g| {
            match g.kind {
                EventType::Disconnected => {
                    let id = &c.id;
                    c.times
                        .time(Step::Disconnect, || id.disconnect())
                        .map_err(CliError::run)?;
                    c.done = true;
                }
                EventType::TimewaitExit => {}
                _ => return Err(g.unexpected("DISCONNECTED")),
            }
            Ok(())
        },
    )?;
    sync.expect(Step::Disconnect)?;
    sync.agree(Step::Disconnect)?;
    Ok(destroy_all(r))
}

/// Takes connection request number `i` of a round: a QP through Init, RTR and RTS (or,
/// without real QPs, only the attributes and what stands in for the QP), then `rdma_accept`.
fn accept(
    args: &Args,
    qps: Qps,
    conn: &mut Conn,
    i: usize,
    verbs: Option<&Verbs>,
) -> Result<(), CliError> {
    conn.create_qp(qps, verbs)?;
    conn.advance(QpTargetState::Init, Step::InitQpAttr, Step::InitQp, qps)?;
    conn.advance(QpTargetState::Rtr, Step::RtrQpAttr, Step::RtrQp, qps)?;
    conn.advance(QpTargetState::Rts, Step::RtsQpAttr, Step::RtsQp, qps)?;
    let qp_num = conn.qp_num(args, i);
    conn.started = Instant::now();
    conn.id
        .accept(ConnParam::new().qp_num(qp_num))
        .map_err(CliError::run)
}

/// A TCP socket of `addr`'s family, not connected yet (`socket(2)`): the socket test times
/// creating it apart from connecting it, as rdma-core's cmtime does.
fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2); nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects `sock` to `addr` (`connect(2)`, blocking), retrying when a signal interrupts it.
fn tcp_connect(sock: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let call = |sa: *const libc::sockaddr, len: usize| loop {
        // SAFETY: sock is an open socket; sa points to a sockaddr of `len` bytes that lives
        // across the call, which only reads it. len is a sockaddr_in or _in6 size.
        let ret = unsafe { libc::connect(sock.as_raw_fd(), sa, len as libc::socklen_t) };
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            call(
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of_val(&sin),
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            call(
                (&sin6 as *const libc::sockaddr_in6).cast(),
                std::mem::size_of_val(&sin6),
            )
        }
    }
}

/// `-S` on the client: creates `-c` TCP sockets, connects them to the server's port and
/// closes them, timing each step, and prints the table.
fn socket_client(args: &Args, host: &str) -> Result<(), CliError> {
    say("Client baseline socket setup")?;
    let dst = socket_addr(host, args.port)?;
    let n = args.connections as usize;
    let mut whole = Times::default();
    let mut conns: Vec<(Times, Option<OwnedFd>)> =
        (0..n).map(|_| (Times::default(), None)).collect();
    let full = Instant::now();
    say("Creating sockets")?;
    let start = Instant::now();
    on_workers(args.threads, &mut conns, |(times, sock)| {
        let made = times
            .time(Step::CreateId, || tcp_socket(&dst))
            .map_err(|e| CliError::run(format!("creating a TCP socket: {e}")))?;
        *sock = Some(made);
        Ok(())
    })?;
    whole.set(Step::CreateId, start, Instant::now());
    say("Connecting sockets")?;
    let start = Instant::now();
    on_workers(args.threads, &mut conns, |(times, sock)| {
        let Some(sock) = sock else {
            return Err(CliError::run("internal error: a socket was not created"));
        };
        times
            .time(Step::CmConnect, || tcp_connect(sock, &dst))
            .map_err(|e| {
                CliError::run(match e.kind() {
                    ErrorKind::ConnectionRefused => format!(
                        "TCP connect to the cmtime server at {dst}: connection refused: is \
                         cmtime -S running there as the server, with -p {}?",
                        dst.port()
                    ),
                    _ => format!("TCP connect to the cmtime server at {dst}: {e}"),
                })
            })
    })?;
    let end = Instant::now();
    whole.set(Step::CmConnect, start, end);
    whole.set(Step::FullConnect, full, end);
    say("Closing sockets")?;
    let start = Instant::now();
    let times: Vec<Times> = conns.into_iter().map(|(times, _)| times).collect();
    whole.set(Step::DestroyId, start, Instant::now());
    say("Client baseline socket results:")?;
    say(table(false, args.threads, &times, &whole).trim_end())
}

/// `-S` on the server: accepts `-c` TCP connections on the port, then closes them, timing
/// both, and prints the table.
fn socket_server(args: &Args) -> Result<(), CliError> {
    say("Server baseline socket setup")?;
    let bind = match args.bind.as_deref() {
        Some(host) => socket_addr(host, args.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port),
    };
    let tcp = TcpListener::bind(bind)
        .map_err(|e| CliError::run(format!("cannot listen on TCP {bind}: {e}")))?;
    say("Accept sockets")?;
    let n = args.connections as usize;
    let mut socks = Vec::with_capacity(n);
    let mut first = None;
    // Waiting for the client has no limit: that is what a server does.
    for _ in 0..n {
        let (sock, _) = tcp
            .accept()
            .map_err(|e| CliError::run(format!("accepting a TCP connection: {e}")))?;
        first.get_or_insert_with(Instant::now);
        socks.push(sock);
    }
    let mut whole = Times::default();
    let end = Instant::now();
    whole.set(Step::FullConnect, first.unwrap_or(end), end);
    say("Closing sockets")?;
    let start = Instant::now();
    drop(socks);
    whole.set(Step::DestroyId, start, Instant::now());
    drop(tcp);
    say("Server baseline socket results:")?;
    let times = vec![Times::default(); n];
    say(table(false, args.threads, &times, &whole).trim_end())
}

fn run(args: &Args) -> Result<(), CliError> {
    // Without a device, say so (and how to get one) before rdma_cm says something vaguer.
    select_devices(None)?;
    match (args.server.as_deref(), args.sockets) {
        (Some(host), false) => client(args, host),
        (None, false) => server(args),
        (Some(host), true) => socket_client(args, host),
        (None, true) => socket_server(args),
    }
}

fn main() -> ExitCode {
    log_to_stderr("cmtime");
    let args = Args::parse();
    exit_status("cmtime", run(&args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback port nothing listens on (bound, then closed).
    fn closed_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn no_server_is_refused_at_once_with_the_address() {
        let dst = closed_port();
        let started = Instant::now();
        let err = ClientSync::connect(dst, Duration::from_secs(2))
            .err()
            .expect("nothing listens there")
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            err,
            format!(
                "TCP connect to the cmtime server at {dst}: connection refused: is cmtime \
                 running there as the server, with -p {}?",
                dst.port()
            )
        );
    }

    #[test]
    fn a_silent_server_is_given_up_on_after_the_timeout_flag() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = listener.local_addr().unwrap();
        let silent = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            drop(s);
        });
        let started = Instant::now();
        let mut sync = ClientSync::connect(dst, Duration::from_millis(300)).unwrap();
        let err = sync.step(Step::FullConnect).unwrap_err().to_string();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(1500),
            "{waited:?}"
        );
        assert_eq!(
            err,
            format!(
                "waiting for the cmtime server at {dst} to agree to step 0: no answer within \
                 300 ms: is it a cmtime server, and still running?"
            )
        );
        silent.join().unwrap();
    }

    #[test]
    fn sync_bytes_are_rdma_core_step_numbers() {
        assert_eq!(Step::FullConnect as u8, 0);
        assert_eq!(Step::CmConnect as u8, 12);
        assert_eq!(Step::Disconnect as u8, 14);
        for (i, (step, _)) in STEPS.iter().enumerate() {
            assert_eq!(*step as usize, i, "{step:?} is out of order");
        }
    }

    #[test]
    fn rows_sum_spans_and_measure_the_whole_step() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut a = Times::default();
        a.set(Step::CreateId, us(0), us(10));
        a.set(Step::CmConnect, us(100), us(400));
        let mut b = Times::default();
        b.set(Step::CreateId, us(10), us(40));
        b.set(Step::CmConnect, us(110), us(210));
        let rows = rows(&[a, b], &Times::default());
        let create = rows[Step::CreateId as usize];
        assert_eq!(
            create,
            Row {
                total: 40,
                sum: 40,
                max: 30,
                min: 10
            }
        );
        let connect = rows[Step::CmConnect as usize];
        assert_eq!((connect.total, connect.sum), (300, 400));
        assert_eq!((connect.max, connect.min), (300, 100));
        assert_eq!(rows[Step::RtrQp as usize], Row::default(), "never timed");
    }

    #[test]
    fn the_table_is_laid_out_like_rdma_cores() {
        let t0 = Instant::now();
        let mut a = Times::default();
        a.set(Step::ResolveAddr, t0, t0 + Duration::from_micros(1742));
        let text = table(true, 1, &[a], &Times::default());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3 + STEPS.len());
        assert_eq!(lines[0], "qp_conn                 1");
        assert_eq!(lines[1], "threads                 1");
        assert_eq!(
            lines[2],
            "step             avg/iter  total(us)    us/conn    sum(us)    max(us)    min(us)"
        );
        assert_eq!(
            lines[3 + Step::ResolveAddr as usize],
            "resolve addr         1742       1742       1742       1742       1742       1742"
        );
        assert!(table(false, 1, &[], &Times::default()).starts_with("cm_conn                 0\n"));
    }

    #[test]
    fn a_whole_span_sets_the_total_and_threads_their_row() {
        let t0 = Instant::now();
        let mut whole = Times::default();
        whole.set(Step::FullConnect, t0, t0 + Duration::from_micros(500));
        let text = table(false, 4, &[Times::default(), Times::default()], &whole);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cm_conn                 2");
        assert_eq!(lines[1], "threads                 4");
        assert_eq!(
            lines[3],
            "full connect          250        500          0          0          0          0"
        );
    }

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(["cmtime"].iter().chain(extra)).unwrap()
    }

    #[test]
    fn mimic_simulates_the_timed_round_only() {
        let plain = args(&[]);
        assert_eq!(plain.threads, 1);
        assert!(!plain.sockets);
        assert_eq!(Round::WithQps.qps(&plain), Qps::Real);
        assert_eq!(Round::WithQps.title(true, &plain), "Connect (100) QPs test");
        let m = args(&["-m", "250", "-c", "7"]);
        assert_eq!(Round::Warmup.qps(&m), Qps::Real);
        assert_eq!(
            Round::WithQps.qps(&m),
            Qps::Simulated(Duration::from_micros(250))
        );
        assert_eq!(Round::WithoutQps.qps(&m), Qps::Simulated(Duration::ZERO));
        assert_eq!(
            Round::WithQps.title(true, &m),
            "Connect (7) simulated QPs test (delay 250 us)"
        );
        assert_eq!(
            Round::WithQps.title(false, &m),
            "Accept (7) simulated QPs test (delay 250 us)"
        );
        assert_eq!(
            Round::WithoutQps.title(false, &m),
            "Accept (7) test - no QPs"
        );
        let started = Instant::now();
        Round::WithQps.qps(&m).stand_in();
        assert!(started.elapsed() >= Duration::from_micros(250));
        assert!(Args::try_parse_from(["cmtime", "-n", "0"]).is_err());
    }

    #[test]
    fn workers_take_every_item_once_and_stop_at_a_failure() {
        for threads in [1, 3] {
            let mut items = vec![0u32; 50];
            on_workers(threads, &mut items, |x| {
                *x += 1;
                Ok(())
            })
            .unwrap();
            assert!(
                items.iter().all(|&x| x == 1),
                "{threads} threads: {items:?}"
            );
            let err = on_workers(threads, 0..50u32, |x| {
                if x == 7 {
                    Err(CliError::run("seven"))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
            assert_eq!(err.to_string(), "seven");
        }
    }

    #[test]
    fn socket_connect_to_nothing_is_refused() {
        let dst = closed_port();
        let sock = tcp_socket(&dst).unwrap();
        let err = tcp_connect(&sock, &dst).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let there = listener.local_addr().unwrap();
        let sock = tcp_socket(&there).unwrap();
        tcp_connect(&sock, &there).unwrap();
        let (_, peer) = listener.accept().unwrap();
        assert!(peer.ip().is_loopback());
    }
}
