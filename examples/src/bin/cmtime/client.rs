//! The client's side of a round, and the TCP connection that keeps it in step.

use super::*;

/// The TCP connection that keeps client and server in step.
pub(super) struct ClientSync {
    pub(super) stream: TcpStream,
    /// The server's address, for messages.
    pub(super) dst: SocketAddr,
    /// How long the server may take to agree to the next step.
    pub(super) limit: Duration,
}

/// A wait's length as a person reads it: "2 s", "1500 ms".
pub(super) fn show_wait(d: Duration) -> String {
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
    pub(super) fn connect(dst: SocketAddr, limit: Duration) -> Result<Self, CliError> {
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
    pub(super) fn step(&mut self, step: Step) -> Result<(), CliError> {
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

pub(super) fn client(args: &Args, host: &str) -> Result<(), CliError> {
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

pub(super) fn client_round(
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
pub(super) fn disconnect_all(r: &mut Connections, threads: u32) -> Result<(), CliError> {
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
pub(super) fn destroy_all(r: Connections) -> Vec<Times> {
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

pub(super) fn unexpected(e: Event, wanted: &str) -> CliError {
    match e.into_result() {
        Err(err) => CliError::run(err),
        Ok(e) => CliError::run(format!(
            "expected {wanted}, got {:?} (status {})",
            e.event_type(),
            e.status()
        )),
    }
}
