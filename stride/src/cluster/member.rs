//! One rank of a cluster run: registers with rank 0, runs the pairs of each step it is part
//! of with the pair engine, and reports; stops when rank 0 says so, falls silent, or goes.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::coordinator::{self, HEARTBEAT};
use super::launcher::{host_name, Launch};
use super::wire::{self, Control, Member, PairJob, PairResult, RecvError};
use crate::cli::{RunArgs, Verb};
use crate::engine::{self, RunError};
use crate::oob::OobChannel;
use crate::report::SideReport;

/// How long each pair's out-of-band exchanges may wait for the partner (as a pair run's).
const PAIR_EXCHANGE: Duration = Duration::from_secs(15);

/// What the rank's main loop waits on.
enum Event {
    /// A message from rank 0, or why none can come.
    Control(Result<Control, RecvError>),
    /// A pair of the step ended.
    Pair(PairJob, Box<Result<(SideReport, SideReport), RunError>>),
}

/// Streams of pairs' clients, handed from the pair listener to the pairs that wait for them,
/// keyed by (step, client rank); a client may come before its server's pair starts.
#[derive(Default)]
struct Arrivals {
    streams: Mutex<HashMap<(usize, usize), TcpStream>>,
    came: Condvar,
}

impl Arrivals {
    fn put(&self, key: (usize, usize), stream: TcpStream) {
        if let Ok(mut map) = self.streams.lock() {
            map.insert(key, stream);
            self.came.notify_all();
        }
    }

    fn take(&self, key: (usize, usize), limit: Duration) -> Option<TcpStream> {
        let deadline = Instant::now() + limit;
        let mut map = self.streams.lock().ok()?;
        loop {
            if let Some(stream) = map.remove(&key) {
                return Some(stream);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            map = self.came.wait_timeout(map, left).ok()?.0;
        }
    }
}

/// Connects to rank 0, trying again while nothing listens yet (ranks start in any order),
/// for at most `limit`.
fn connect_rank_zero(
    rendezvous: &str,
    rank: usize,
    limit: Duration,
) -> Result<TcpStream, RunError> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("the name resolved to no address");
    loop {
        match rendezvous.to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last = format!("{addr}: {e}"),
                    }
                }
            }
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(RunError::peer_gone(format!(
                "rank {rank}: no rank 0 at {rendezvous} within {} s ({last}): did rank 0 \
                 start, and on that host? Pass --rendezvous HOST:PORT when rank 0 runs \
                 elsewhere",
                limit.as_secs()
            )));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Runs this rank: rank 0 also runs the coordinator, in a thread of its own.
pub(super) fn run(
    verb: Verb,
    args: &RunArgs,
    launch: &Launch,
    rendezvous: &str,
) -> Result<(), RunError> {
    let limit = args.cluster.timeout();
    let coordinator = if launch.rank == 0 {
        Some(coordinator::start(verb, args, launch, rendezvous)?)
    } else {
        None
    };
    let result = run_member(verb, args, launch, rendezvous, limit);
    match coordinator {
        // Rank 0's own report of the run (written, or why the run stopped) wins: the
        // member's error then only repeats it.
        Some(handle) => match handle.join() {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => result,
            Err(_) => Err(RunError::new("rank 0's coordinator panicked")),
        },
        None => result,
    }
}

fn run_member(
    verb: Verb,
    args: &RunArgs,
    launch: &Launch,
    rendezvous: &str,
    limit: Duration,
) -> Result<(), RunError> {
    let me = launch.rank;
    let pair_listener = TcpListener::bind(("0.0.0.0", 0))
        .map_err(|e| RunError::setup(format!("rank {me}: cannot open a pair listener: {e}")))?;
    let (device, port, gid) = engine::device_summary(verb, args)?;
    let mut control = connect_rank_zero(rendezvous, me, limit)?;
    let set = |r: std::io::Result<()>| {
        r.map_err(|e| RunError::setup(format!("rank {me}: control connection: {e}")))
    };
    set(control.set_nodelay(true))?;
    set(control.set_write_timeout(Some(limit)))?;
    // Others reach this rank's pairs at the address it reached rank 0 from.
    let local_ip = control
        .local_addr()
        .map_err(|e| RunError::setup(format!("rank {me}: control connection: {e}")))?
        .ip();
    let pair_port = pair_listener
        .local_addr()
        .map_err(|e| RunError::setup(format!("rank {me}: pair listener: {e}")))?
        .port();
    let member = Member {
        rank: me,
        size: launch.size,
        host: host_name(),
        pid: std::process::id(),
        device,
        port,
        gid,
        pair_addr: std::net::SocketAddr::new(local_ip, pair_port).to_string(),
    };
    let rank_zero = format!("rank 0 (at {rendezvous})");
    wire::send(&mut control, &Control::Register { member }).map_err(|e| {
        RunError::peer_gone(format!("rank {me}: registering with {rank_zero}: {e}"))
    })?;

    let (events, inbox) = mpsc::channel();
    let mut reader = control
        .try_clone()
        .map_err(|e| RunError::setup(format!("rank {me}: control connection: {e}")))?;
    let to_main = events.clone();
    thread::spawn(move || loop {
        let msg = wire::recv(&mut reader);
        let stop = msg.is_err();
        if to_main.send(Event::Control(msg)).is_err() || stop {
            break;
        }
    });
    let arrivals = Arc::new(Arrivals::default());
    let hand = Arc::clone(&arrivals);
    thread::spawn(move || accept_pairs(&pair_listener, &hand));

    let mut state = MemberState {
        me,
        verb,
        args,
        limit,
        members: Vec::new(),
        events,
        arrivals,
        control,
        rank_zero,
    };
    state.serve(&inbox)
}

/// Takes pair clients' connections and files each under the step and rank it names.
fn accept_pairs(listener: &TcpListener, arrivals: &Arrivals) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        // A client says who it is at once; a silent stranger is dropped.
        if stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .is_err()
        {
            continue;
        }
        if let Ok(Control::PairHello { client, step }) = wire::recv(&mut stream) {
            arrivals.put((step, client), stream);
        }
    }
}

struct MemberState<'a> {
    me: usize,
    verb: Verb,
    args: &'a RunArgs,
    limit: Duration,
    members: Vec<Member>,
    events: Sender<Event>,
    arrivals: Arc<Arrivals>,
    control: TcpStream,
    rank_zero: String,
}

impl MemberState<'_> {
    fn send(&mut self, msg: &Control) -> Result<(), RunError> {
        wire::send(&mut self.control, msg).map_err(|e| {
            RunError::peer_gone(format!(
                "rank {}: {} is gone ({e}): it ended or died; see its output",
                self.me, self.rank_zero
            ))
        })
    }

    fn serve(&mut self, inbox: &Receiver<Event>) -> Result<(), RunError> {
        let me = self.me;
        let mut heard = Instant::now();
        let mut beat = Instant::now();
        // The step running: its number, the pairs still running, the results so far, and
        // the first failure.
        let mut step: Option<(usize, usize, Vec<PairResult>, Option<RunError>)> = None;
        let mut failed_at: Option<Instant> = None;
        loop {
            if beat.elapsed() >= HEARTBEAT {
                self.send(&Control::Heartbeat)?;
                beat = Instant::now();
            }
            if heard.elapsed() >= self.limit {
                return Err(RunError::timeout(format!(
                    "rank {me}: {} sent nothing for {} s: it hangs or its host is gone \
                     (--cluster-timeout)",
                    self.rank_zero,
                    self.limit.as_secs()
                )));
            }
            if let Some(at) = failed_at {
                if at.elapsed() >= self.limit {
                    return Err(RunError::timeout(format!(
                        "rank {me}: a pair failed and {} did not stop the run within {} s",
                        self.rank_zero,
                        self.limit.as_secs()
                    )));
                }
            }
            let event = match inbox.recv_timeout(HEARTBEAT / 4) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RunError::new("the rank's threads are gone"))
                }
            };
            match event {
                Event::Control(Err(RecvError::Closed)) => {
                    return Err(RunError::peer_gone(format!(
                        "rank {me}: {} closed the control connection: it ended or died; see \
                         its output",
                        self.rank_zero
                    )))
                }
                Event::Control(Err(e)) => {
                    let text = format!("rank {me}: {}: {e}", self.rank_zero);
                    return Err(match e {
                        RecvError::Garbage(_) => RunError::peer_invalid(text),
                        RecvError::Closed | RecvError::Io(_) => RunError::peer_gone(text),
                    });
                }
                Event::Control(Ok(msg)) => {
                    heard = Instant::now();
                    match msg {
                        Control::Heartbeat => {}
                        Control::Table { members } => {
                            self.members = members.into_iter().map(Member::printable).collect();
                        }
                        Control::Step { index, jobs } => {
                            let mine: Vec<PairJob> = jobs
                                .into_iter()
                                .filter(|j| j.client == me || j.server == me)
                                .collect();
                            for job in &mine {
                                self.start_pair(index, *job)?;
                            }
                            step = Some((index, mine.len(), Vec::new(), None));
                        }
                        Control::Abort { reason } => {
                            return Err(RunError::peer_aborted(format!(
                                "the cluster run stopped: {}",
                                sideway::peer_text::printable(
                                    &reason,
                                    sideway::peer_text::PEER_TEXT_MAX
                                )
                            )))
                        }
                        Control::Finish => return Ok(()),
                        other => {
                            return Err(RunError::peer_invalid(format!(
                                "rank {me}: {} sent an unexpected message: {other:?}",
                                self.rank_zero
                            )))
                        }
                    }
                }
                Event::Pair(job, outcome) => {
                    let Some((_, left, results, failure)) = step.as_mut() else {
                        continue;
                    };
                    *left = left.saturating_sub(1);
                    match *outcome {
                        Ok((ours, theirs)) if job.client == me => results.push(PairResult {
                            pair: job,
                            client: ours,
                            server: theirs,
                        }),
                        Ok(_) => {}
                        Err(e) => {
                            failure.get_or_insert(e);
                        }
                    }
                }
            }
            if matches!(step, Some((_, 0, _, _))) {
                if let Some((index, _, results, failure)) = step.take() {
                    match failure {
                        None => self.send(&Control::StepDone { index, results })?,
                        Some(failure) => {
                            let reason = failure.to_string();
                            self.send(&Control::Failed { index, reason })?;
                            failed_at = Some(Instant::now());
                        }
                    }
                }
            }
        }
    }

    /// Starts one pair of step `index` in a thread of its own.
    fn start_pair(&self, index: usize, job: PairJob) -> Result<(), RunError> {
        let me = self.me;
        let peer_rank = if job.client == me {
            job.server
        } else {
            job.client
        };
        let peer = self.members.get(peer_rank).cloned().ok_or_else(|| {
            RunError::peer_invalid(format!(
                "rank {me}: step {index} names rank {peer_rank}, which the table lacks"
            ))
        })?;
        let mut args = self.args.clone();
        args.json = None;
        args.cluster.cluster = false;
        args.server = (job.client == me).then(|| peer.host.clone());
        let (verb, limit) = (self.verb, self.limit);
        let arrivals = Arc::clone(&self.arrivals);
        let events = self.events.clone();
        let who = format!("rank {} ({})", peer.rank, peer.host);
        thread::spawn(move || {
            // A pair that panicked must still end the step (as a failure), or the rank
            // would wait for it while its heartbeats kept the run alive.
            let run = std::panic::AssertUnwindSafe(|| {
                engine::run_side(verb, &args, true, |params| {
                    let oob = if job.client == me {
                        let mut stream = connect_pair(&peer.pair_addr, &who)?;
                        wire::send(
                            &mut stream,
                            &Control::PairHello {
                                client: me,
                                step: index,
                            },
                        )
                        .map_err(|e| RunError::peer_gone(format!("greeting {who}: {e}")))?;
                        let mut oob = OobChannel::from_stream(stream, PAIR_EXCHANGE)?;
                        oob.client_handshake(params)?;
                        oob
                    } else {
                        let stream =
                            arrivals.take((index, job.client), limit).ok_or_else(|| {
                                RunError::timeout(format!(
                                    "{who} did not connect for our pair within {} s",
                                    limit.as_secs()
                                ))
                            })?;
                        let mut oob = OobChannel::from_stream(stream, PAIR_EXCHANGE)?;
                        oob.server_handshake(params)?;
                        oob
                    };
                    Ok(oob)
                })
            });
            let outcome = std::panic::catch_unwind(run)
                .unwrap_or_else(|_| Err(RunError::new("the pair's thread panicked")))
                .map_err(|e| {
                    e.map_text(|text| {
                        format!(
                            "pair {} -> {} on rank {me} ({}): {text}",
                            job.client,
                            job.server,
                            super::launcher::host_name()
                        )
                    })
                });
            let _ = events.send(Event::Pair(job, Box::new(outcome)));
        });
        Ok(())
    }
}

fn connect_pair(addr: &str, who: &str) -> Result<TcpStream, RunError> {
    let sockaddr = addr.parse::<std::net::SocketAddr>().map_err(|e| {
        RunError::peer_invalid(format!("{who} registered a bad pair address {addr}: {e}"))
    })?;
    let stream = TcpStream::connect_timeout(&sockaddr, PAIR_EXCHANGE).map_err(|e| {
        RunError::peer_gone(format!("connecting to {who}'s pair listener {addr}: {e}"))
    })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
