//! The server's side of a round, and its end of the TCP connection that keeps it in step.

use super::*;

/// The server's end of the TCP connection that keeps the sides in step; non-blocking, so
/// rdma_cm events are handled while waiting for the client's next step.
pub(super) struct ServerSync {
    pub(super) stream: TcpStream,
}

impl ServerSync {
    /// The client's next step, if it has sent one.
    pub(super) fn poll(&mut self) -> Result<Option<u8>, CliError> {
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
    pub(super) fn expect(&mut self, step: Step) -> Result<(), CliError> {
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
    pub(super) fn agree(&mut self, step: Step) -> Result<(), CliError> {
        let byte = step as u8;
        // One byte into an idle socket's buffer: a non-blocking write takes it whole.
        self.stream
            .write_all(&[byte])
            .map_err(|e| CliError::run(format!("agreeing to step {byte}: {e}")))
    }
}

pub(super) fn server(args: &Args) -> Result<(), CliError> {
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

pub(super) fn server_round(
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
pub(super) fn accept(
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
