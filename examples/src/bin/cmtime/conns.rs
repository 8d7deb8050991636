//! The connections of a round: their ids, QPs and per-step times, and the worker threads
//! that run their steps.

use super::*;

/// The PD and CQ every QP of the run uses, made once on the device of the first id.
pub(super) struct Verbs {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) cq: Arc<CompletionQueue>,
}

impl Verbs {
    pub(super) fn get<'a>(
        slot: &'a mut Option<Verbs>,
        id: &CmId,
        n: u32,
    ) -> Result<&'a Verbs, CliError> {
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
    pub(super) fn check_device(&self, id: &CmId) -> Result<(), CliError> {
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
    pub(super) fn create_qp(&self) -> Result<QueuePair, CliError> {
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
pub(super) struct Conn {
    pub(super) id: Arc<CmId>,
    pub(super) qp: Option<QueuePair>,
    pub(super) times: Times,
    /// When the asynchronous step in progress started.
    pub(super) started: Instant,
    /// Resolution retries left.
    pub(super) retries: u32,
    /// The step in progress has finished.
    pub(super) done: bool,
}

impl Conn {
    /// Moves the QP to `state`, timing the attribute query and the modify; without a QP the
    /// modify is what `qps` makes it (a sleep, or nothing).
    pub(super) fn advance(
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
    pub(super) fn requested(id: Arc<CmId>) -> Self {
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
    pub(super) fn create_qp(&mut self, qps: Qps, verbs: Option<&Verbs>) -> Result<(), CliError> {
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
    pub(super) fn qp_num(&self, args: &Args, i: usize) -> u32 {
        match &self.qp {
            Some(qp) => qp.qp_num(),
            // In range: -q is below 2^24 and -c at most 100000.
            None => args.base_qpn + i as u32,
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The values guarded (a work list, the first failure) stay whole if a holder panicked.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `work` on every item on `threads` threads, each taking the next item as it gets
/// free, as rdma-core's cmtime's work queue does (one thread: the items in order, here).
/// The first failure stops the threads from taking more and is returned.
pub(super) fn on_workers<I>(
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
pub(super) struct Connections {
    pub(super) channel: Arc<EventChannel>,
    pub(super) conns: Vec<Conn>,
    pub(super) index: HashMap<usize, usize>,
    /// Threads that handle the events (-n).
    pub(super) threads: u32,
}

/// What a handler learns of an rdma_cm event: its type and, for an event that reports a
/// failure, the error. Unlike the event (acknowledged once this is taken) it may go to
/// another thread.
#[derive(Debug)]
pub(super) struct Got {
    pub(super) kind: EventType,
    pub(super) status: i32,
    pub(super) failure: Option<CmError>,
}

impl Got {
    pub(super) fn of(event: Event) -> Self {
        let (kind, status) = (event.event_type(), event.status());
        Got {
            kind,
            status,
            failure: event.into_result().err(),
        }
    }

    /// The error of an event that is not the one `wanted`.
    pub(super) fn unexpected(&self, wanted: &str) -> CliError {
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
    pub(super) fn of(&self, event: &Event) -> Option<usize> {
        self.index.get(&(event.id().as_raw() as usize)).copied()
    }

    /// Handles events with `handle` until it has marked every connection done, or
    /// `limit` passes. With more than one thread (-n), the events that are waiting are taken
    /// together and handled on the threads, each connection's in order on one of them.
    pub(super) fn until_done(
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
