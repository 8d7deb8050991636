//! Rank 0's coordinator: takes every rank's registration, sends the table and the steps,
//! gathers the results, watches every rank (heartbeats, closed connections), and ends the
//! run on every rank, naming the culprit, when one dies, hangs, fails or never comes.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::launcher::Launch;
use super::report::ClusterReport;
use super::wire::{self, Control, Member, PairResult, RecvError};
use crate::cli::{Pattern, RunArgs, Verb};
use crate::engine::RunError;
use crate::params::TestParams;

/// How often ranks and rank 0 tell each other they are alive.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// After a pair fails, how long rank 0 waits for more news (the death of the pair's partner
/// usually), so that the message names the cause and not only its symptoms.
const GRACE: Duration = Duration::from_secs(2);

enum Event {
    /// A rank registered over this connection.
    Arrived(TcpStream, Member),
    /// A connection that did not register; said on standard error, then ignored.
    Stranger(String),
    /// A registered rank's next message, or why none can come.
    From(usize, Result<Control, RecvError>),
}

/// Listens at the rendezvous port and starts the coordinator's thread.
pub(super) fn start(
    verb: Verb,
    args: &RunArgs,
    launch: &Launch,
    rendezvous: &str,
) -> Result<JoinHandle<Result<(), RunError>>, RunError> {
    let port = rendezvous
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| RunError::usage(format!("rendezvous {rendezvous}: no port")))?;
    // Every address of this host: the others reach it by its name or address.
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| {
            RunError::setup(format!(
                "rank 0: cannot listen for the other ranks on TCP port {port}: {e} (another \
                 run on this host? pick another with -p or --rendezvous)"
            ))
        })?;
    // Rank 0 must be where the others look for it.
    if let Ok(addrs) = rendezvous.to_socket_addrs() {
        let addrs: Vec<_> = addrs.collect();
        if !addrs.is_empty()
            && addrs
                .iter()
                .all(|a| std::net::TcpListener::bind((a.ip(), 0)).is_err())
        {
            return Err(RunError::usage(format!(
                "rank 0 runs on {}, but the rendezvous {rendezvous} is another host's: the \
                 other ranks would wait there in vain; pass --rendezvous with this host's \
                 name",
                super::launcher::host_name()
            )));
        }
    }
    start_on(listener, verb, args, launch)
}

/// Starts the coordinator on a listener made elsewhere.
fn start_on(
    listener: TcpListener,
    verb: Verb,
    args: &RunArgs,
    launch: &Launch,
) -> Result<JoinHandle<Result<(), RunError>>, RunError> {
    let params = TestParams::resolve(verb, args)?;
    let coordinator = Coordinator {
        size: launch.size,
        limit: args.cluster.timeout(),
        kind: launch.kind,
        pattern: args.cluster.pattern,
        params,
        args: args.clone(),
        ranks: Vec::new(),
    };
    let (events, inbox) = mpsc::channel();
    thread::spawn(move || accept_ranks(&listener, &events));
    Ok(thread::spawn(move || coordinator.run(&inbox)))
}

/// Takes connections and reads each one's registration in a thread of its own, which then
/// reads the rank's messages for as long as the connection lasts.
fn accept_ranks(listener: &TcpListener, events: &Sender<Event>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let events = events.clone();
        thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "an unknown address".to_owned(), |a| a.to_string());
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let member = match wire::recv(&mut stream) {
                Ok(Control::Register { member }) => member.printable(),
                Ok(other) => {
                    let _ = events.send(Event::Stranger(format!(
                        "{peer} sent {other:?} before registering"
                    )));
                    return;
                }
                Err(e) => {
                    let _ = events.send(Event::Stranger(format!("{peer} {e}")));
                    return;
                }
            };
            let rank = member.rank;
            let (Ok(mut reader), Ok(())) = (stream.try_clone(), stream.set_read_timeout(None))
            else {
                return;
            };
            if events.send(Event::Arrived(stream, member)).is_err() {
                return;
            }
            loop {
                let msg = wire::recv(&mut reader);
                let stop = msg.is_err();
                if events.send(Event::From(rank, msg)).is_err() || stop {
                    break;
                }
            }
        });
    }
}

/// A registered rank.
struct Rank {
    member: Member,
    stream: TcpStream,
    heard: Instant,
}

impl Rank {
    fn name(&self) -> String {
        name_of(&self.member)
    }
}

/// "rank 2 (host n03, pid 4711)".
pub(crate) fn name_of(m: &Member) -> String {
    format!("rank {} (host {}, pid {})", m.rank, m.host, m.pid)
}

struct Coordinator {
    size: usize,
    limit: Duration,
    kind: super::launcher::LauncherKind,
    pattern: Pattern,
    params: TestParams,
    args: RunArgs,
    /// Indexed by rank once everyone came.
    ranks: Vec<Rank>,
}

impl Coordinator {
    fn run(mut self, inbox: &Receiver<Event>) -> Result<(), RunError> {
        let result = self.run_inner(inbox);
        if let Err(e) = &result {
            let reason = e.to_string();
            for r in &mut self.ranks {
                let _ = wire::send(
                    &mut r.stream,
                    &Control::Abort {
                        reason: reason.clone(),
                    },
                );
            }
        }
        result
    }

    fn run_inner(&mut self, inbox: &Receiver<Event>) -> Result<(), RunError> {
        self.gather(inbox)?;
        let members: Vec<Member> = self.ranks.iter().map(|r| r.member.clone()).collect();
        self.broadcast(&Control::Table {
            members: members.clone(),
        })?;
        let steps = self.pattern.steps(self.size);
        let total = steps.len();
        let mut results: Vec<PairResult> = Vec::new();
        for (index, jobs) in steps.into_iter().enumerate() {
            if total > 1 {
                let what: Vec<String> = jobs
                    .iter()
                    .map(|j| format!("{} -> {}", j.client, j.server))
                    .collect();
                println!(" step {}/{total}: pair {}", index + 1, what.join(", "));
            }
            self.broadcast(&Control::Step {
                index,
                jobs: jobs.clone(),
            })?;
            let mut got = self.step(inbox, index)?;
            // Keep only what the step asked for, once each.
            got.retain(|r| jobs.contains(&r.pair));
            got.sort_by_key(|r| (r.pair.client, r.pair.server));
            got.dedup_by_key(|r| r.pair);
            if got.len() != jobs.len() {
                return Err(RunError::peer_invalid(format!(
                    "step {}: {} of its {} pairs reported results",
                    index + 1,
                    got.len(),
                    jobs.len()
                )));
            }
            results.extend(got);
        }
        let report = ClusterReport::new(
            self.kind,
            self.pattern,
            self.params.clone(),
            self.args.report_gbits,
            members,
            results,
        );
        report.print();
        let written = write_files(
            &report,
            self.args.json.as_deref(),
            self.args.cluster.heatmap.as_deref(),
        );
        self.broadcast(&Control::Finish)?;
        written
    }

    /// Waits until every rank registered, at most the timeout.
    fn gather(&mut self, inbox: &Receiver<Event>) -> Result<(), RunError> {
        let deadline = Instant::now() + self.limit;
        // Ranks as they arrive: nothing is allocated for a rank before it comes.
        let mut came: BTreeMap<usize, Rank> = BTreeMap::new();
        let mut beat = Instant::now();
        while came.len() < self.size {
            // Those who came wait for the others: tell them rank 0 is alive.
            if beat.elapsed() >= HEARTBEAT {
                for r in came.values_mut() {
                    let _ = wire::send(&mut r.stream, &Control::Heartbeat);
                }
                beat = Instant::now();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match inbox.recv_timeout(left.min(HEARTBEAT / 4)) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) if !left.is_zero() => continue,
                Err(RecvTimeoutError::Timeout) => {
                    let missing = self.size - came.len();
                    let list = missing_ranks(&came, self.size);
                    self.ranks = came.into_values().collect();
                    return Err(RunError::timeout(format!(
                        "rank{} {list} never arrived at rank 0 within {} s (--cluster-timeout): \
                         did they start, with the same -p/--rendezvous? {} of {} ranks came",
                        if missing == 1 { "" } else { "s" },
                        self.limit.as_secs(),
                        self.size - missing,
                        self.size
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RunError::new("rank 0 stopped listening"))
                }
            };
            match event {
                Event::Stranger(what) => {
                    eprintln!("stride-perf: rank 0: ignored a connection: {what}");
                }
                Event::Arrived(stream, member) => {
                    let problem = if member.size != self.size {
                        Some(format!(
                            "{} says the run has {} ranks; rank 0 says {}: the launcher's \
                             variables disagree",
                            name_of(&member),
                            member.size,
                            self.size
                        ))
                    } else if member.rank >= self.size {
                        Some(format!(
                            "{} says it is rank {} of a run of {} ranks",
                            name_of(&member),
                            member.rank,
                            self.size
                        ))
                    } else if let Some(first) = came.get(&member.rank) {
                        Some(format!(
                            "two processes say they are rank {}: {} and {}",
                            member.rank,
                            first.name(),
                            name_of(&member)
                        ))
                    } else {
                        None
                    };
                    let rank = Rank {
                        member,
                        stream,
                        heard: Instant::now(),
                    };
                    if let Some(problem) = problem {
                        self.ranks = came.into_values().collect();
                        self.ranks.push(rank);
                        return Err(RunError::usage(problem));
                    }
                    came.insert(rank.member.rank, rank);
                }
                Event::From(rank, Err(e)) => {
                    let who = came
                        .get(&rank)
                        .map_or_else(|| format!("rank {rank}"), Rank::name);
                    self.ranks = came.into_values().collect();
                    return Err(RunError::peer_gone(format!(
                        "{who} {e} before every rank arrived: it died or was killed; see its \
                         output"
                    )));
                }
                Event::From(rank, Ok(_)) => {
                    // Those who came early keep up their heartbeats while the others come.
                    if let Some(r) = came.get_mut(&rank) {
                        r.heard = Instant::now();
                    }
                }
            }
        }
        self.ranks = came.into_values().collect();
        println!(
            " cluster: {} ranks registered with rank 0 ({}, pattern {})",
            self.size,
            self.kind,
            self.pattern.as_str()
        );
        Ok(())
    }

    fn broadcast(&mut self, msg: &Control) -> Result<(), RunError> {
        for r in &mut self.ranks {
            wire::send(&mut r.stream, msg).map_err(|e| {
                RunError::peer_gone(format!(
                    "{} is gone ({e}): it died or was killed; see its output",
                    name_of(&r.member)
                ))
            })?;
        }
        Ok(())
    }

    /// Waits for every rank's end of step `index`; the results of the pairs.
    fn step(&mut self, inbox: &Receiver<Event>, index: usize) -> Result<Vec<PairResult>, RunError> {
        let mut done = vec![false; self.size];
        let mut results = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let mut deaths: Vec<String> = Vec::new();
        let mut failed_at: Option<Instant> = None;
        let mut beat = Instant::now();
        loop {
            if let Some(at) = failed_at {
                if at.elapsed() >= GRACE || !deaths.is_empty() {
                    // A rank that died is the news; else the ranks' own reasons came.
                    let died = !deaths.is_empty();
                    let mut all = deaths;
                    all.extend(failures);
                    let text = all.join("; ");
                    return Err(if died {
                        RunError::peer_gone(text)
                    } else {
                        RunError::peer_aborted(text)
                    });
                }
            }
            if done.iter().all(|&d| d) {
                return Ok(results);
            }
            if beat.elapsed() >= HEARTBEAT {
                self.broadcast(&Control::Heartbeat)?;
                beat = Instant::now();
            }
            for r in &self.ranks {
                if r.heard.elapsed() >= self.limit {
                    return Err(RunError::timeout(format!(
                        "{} sent nothing for {} s during step {}: it hangs or its host is \
                         gone (--cluster-timeout)",
                        r.name(),
                        self.limit.as_secs(),
                        index + 1
                    )));
                }
            }
            let event = match inbox.recv_timeout(HEARTBEAT / 4) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RunError::new("rank 0 stopped listening"))
                }
            };
            let (rank, msg) = match event {
                Event::Stranger(what) => {
                    eprintln!("stride-perf: rank 0: ignored a connection: {what}");
                    continue;
                }
                Event::Arrived(_, member) => {
                    eprintln!(
                        "stride-perf: rank 0: ignored a late registration of {}",
                        name_of(&member)
                    );
                    continue;
                }
                Event::From(rank, msg) => (rank, msg),
            };
            let Some(r) = self.ranks.get_mut(rank) else {
                continue;
            };
            r.heard = Instant::now();
            let who = r.name();
            match msg {
                Err(e) => {
                    let death = format!(
                        "{who} {e} during step {}: it died or was killed; see its output",
                        index + 1
                    );
                    if failed_at.is_none() {
                        return Err(RunError::peer_gone(death));
                    }
                    deaths.push(death);
                }
                Ok(Control::Heartbeat) => {}
                Ok(Control::StepDone {
                    index: i,
                    results: mut got,
                }) if i == index => {
                    if let Some(d) = done.get_mut(rank) {
                        *d = true;
                    }
                    // A rank reports only the pairs it initiated.
                    got.retain(|p| p.pair.client == rank);
                    results.extend(got.into_iter().map(|mut p| {
                        p.client = p.client.printable();
                        p.server = p.server.printable();
                        p
                    }));
                }
                Ok(Control::Failed { index: i, reason }) if i == index => {
                    failures.push(sideway::peer_text::printable(
                        &reason,
                        sideway::peer_text::PEER_TEXT_MAX,
                    ));
                    failed_at.get_or_insert_with(Instant::now);
                }
                Ok(other) => {
                    return Err(RunError::peer_invalid(format!(
                        "{who} sent a message out of step {}: {}",
                        index + 1,
                        sideway::peer_text::printable(&format!("{other:?}"), 200)
                    )))
                }
            }
        }
    }
}

/// Writes the report's JSON file and heatmap, when asked for.
fn write_files(
    report: &ClusterReport,
    json: Option<&Path>,
    heatmap: Option<&Path>,
) -> Result<(), RunError> {
    let fail = |path: &Path, e: &dyn std::fmt::Display| {
        RunError::new(format!(
            "the run succeeded but {} could not be written: {e}",
            path.display()
        ))
    };
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(report).map_err(|e| fail(path, &e))?;
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text + "\n")
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| fail(path, &e))?;
        println!(" cluster results written to {}", path.display());
    }
    if let Some(path) = heatmap {
        std::fs::write(path, super::heatmap::render(report)).map_err(|e| fail(path, &e))?;
        println!(" pair matrix heatmap written to {}", path.display());
    }
    Ok(())
}

/// Ranks a missing-rank message names at most; the rest are counted.
const MISSING_LISTED: usize = 20;

/// The ranks below `size` that are not in `came`, as a message lists them: the first
/// [`MISSING_LISTED`], then how many more.
fn missing_ranks<T>(came: &BTreeMap<usize, T>, size: usize) -> String {
    let missing = size - came.len();
    let mut listed: Vec<String> = (0..size)
        .filter(|r| !came.contains_key(r))
        .take(MISSING_LISTED)
        .map(|r| r.to_string())
        .collect();
    if missing > listed.len() {
        listed.push(format!("and {} more", missing - listed.len()));
    }
    listed.join(", ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_rank_list_names_twenty_and_counts_the_rest() {
        let mut came = BTreeMap::new();
        assert_eq!(missing_ranks(&came, 3), "0, 1, 2");
        came.insert(1, ());
        assert_eq!(missing_ranks(&came, 3), "0, 2");
        let most: BTreeMap<usize, ()> = (0..99_990).map(|r| (r, ())).collect();
        assert_eq!(
            missing_ranks(&most, 100_000),
            "99990, 99991, 99992, 99993, 99994, 99995, 99996, 99997, 99998, 99999"
        );
        let none = BTreeMap::<usize, ()>::new();
        let text = missing_ranks(&none, 100_000);
        assert!(text.ends_with(", 19, and 99980 more"), "{text}");
        assert!(text.len() < 200, "{text}");
    }

    use super::*;
    use crate::cluster::launcher::{LauncherKind, RankZeroHost};
    use crate::cluster::report::tests::member;
    use clap::Parser;

    /// A coordinator for `size` ranks on a loopback port, with these extra arguments.
    fn coordinator(size: usize, extra: &[&str]) -> (JoinHandle<Result<(), RunError>>, u16) {
        let mut argv = vec!["stride-perf", "write", "bw", "--cluster", "-n", "10"];
        argv.extend_from_slice(extra);
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let args = cli.command.run_args().unwrap().1.clone();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let launch = Launch {
            kind: LauncherKind::Slurm,
            rank: 0,
            size,
            rank_zero: RankZeroHost::ThisHost,
        };
        (
            start_on(listener, Verb::Write, &args, &launch).unwrap(),
            port,
        )
    }

    /// A fake rank: registered, its table read.
    fn rank(port: u16, r: usize, size: usize) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut m = member(r);
        m.size = size;
        wire::send(&mut s, &Control::Register { member: m }).unwrap();
        s
    }

    /// The next message that is not a heartbeat.
    fn next(s: &mut TcpStream) -> Control {
        loop {
            match wire::recv(s).unwrap() {
                Control::Heartbeat => {}
                other => return other,
            }
        }
    }

    fn side(role: &str, results: Vec<crate::report::SizeResult>) -> crate::report::SideReport {
        crate::report::SideReport {
            role: role.into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            intervals: Vec::new(),
            results,
        }
    }

    #[test]
    fn fake_ranks_run_every_step_and_get_finish() {
        let (handle, port) = coordinator(3, &["--pattern", "ring"]);
        let mut ranks: Vec<TcpStream> = (0..3).map(|r| rank(port, r, 3)).collect();
        for s in &mut ranks {
            assert!(matches!(next(s), Control::Table { members } if members.len() == 3));
        }
        for (r, s) in ranks.iter_mut().enumerate() {
            let Control::Step { index, jobs } = next(s) else {
                panic!("no step")
            };
            assert_eq!(jobs.len(), 3);
            let results = jobs
                .iter()
                .filter(|j| j.client == r)
                .map(|&pair| PairResult {
                    pair,
                    client: side(
                        "client",
                        vec![crate::report::SizeResult::Bandwidth(
                            crate::bandwidth::BandwidthResult {
                                bytes: 65536,
                                iterations: 10,
                                peak_bytes_per_sec: None,
                                avg_bytes_per_sec: 1e8,
                                msg_rate_mpps: 0.001,
                                intervals: None,
                                cpu_util_percent: None,
                            },
                        )],
                    ),
                    server: side("server", Vec::new()),
                })
                .collect();
            wire::send(s, &Control::StepDone { index, results }).unwrap();
        }
        for s in &mut ranks {
            assert_eq!(next(s), Control::Finish);
        }
        handle.join().unwrap().unwrap();
    }

    /// A fake rank in a thread: answers every heartbeat, reports a result for each pair it
    /// initiates a second after the step begins, returns the message that ended it (finish
    /// or abort).
    fn live_rank(port: u16, r: usize, size: usize) -> thread::JoinHandle<Control> {
        let mut s = rank(port, r, size);
        thread::spawn(move || loop {
            match wire::recv(&mut s).unwrap() {
                Control::Heartbeat => wire::send(&mut s, &Control::Heartbeat).unwrap(),
                Control::Table { .. } => {}
                Control::Step { index, jobs } => {
                    thread::sleep(Duration::from_secs(1));
                    let results = jobs
                        .iter()
                        .filter(|j| j.client == r)
                        .map(|&pair| PairResult {
                            pair,
                            client: side("client", Vec::new()),
                            server: side("server", Vec::new()),
                        })
                        .collect();
                    wire::send(&mut s, &Control::StepDone { index, results }).unwrap();
                }
                end => return end,
            }
        })
    }

    #[test]
    fn ranks_that_came_early_and_kept_beating_are_not_called_silent() {
        // Rank 0 waits 2.5 s for rank 1, and the step ends a second later: past the 3 s
        // silence bound counted from rank 0's registration. Its heartbeats while it waited
        // keep it alive.
        let (handle, port) = coordinator(2, &["--cluster-timeout", "3", "--pattern", "ring"]);
        let early = live_rank(port, 0, 2);
        thread::sleep(Duration::from_millis(2500));
        let late = live_rank(port, 1, 2);
        assert_eq!(early.join().unwrap(), Control::Finish);
        assert_eq!(late.join().unwrap(), Control::Finish);
        handle.join().unwrap().unwrap();
    }

    #[test]
    fn a_rank_whose_pair_failed_ends_the_run_with_its_reason() {
        let (handle, port) = coordinator(2, &[]);
        let mut ranks: Vec<TcpStream> = (0..2).map(|r| rank(port, r, 2)).collect();
        for s in &mut ranks {
            assert!(matches!(next(s), Control::Table { .. }));
            assert!(matches!(next(s), Control::Step { index: 0, .. }));
        }
        let reason = "pair 0 -> 1 on rank 0 (n00): RDMA WRITE on QP 0 failed";
        wire::send(
            &mut ranks[0],
            &Control::Failed {
                index: 0,
                reason: reason.to_owned(),
            },
        )
        .unwrap();
        for s in &mut ranks {
            assert_eq!(
                next(s),
                Control::Abort {
                    reason: reason.to_owned()
                }
            );
        }
        let e = handle.join().unwrap().unwrap_err();
        assert_eq!(e, RunError::PeerAborted(reason.to_owned()));
    }

    #[test]
    fn a_rank_that_dies_is_named_to_every_other_rank() {
        let (handle, port) = coordinator(3, &[]);
        let mut ranks: Vec<TcpStream> = (0..3).map(|r| rank(port, r, 3)).collect();
        for s in &mut ranks {
            assert!(matches!(next(s), Control::Table { .. }));
            assert!(matches!(next(s), Control::Step { index: 0, .. }));
        }
        drop(ranks.remove(1));
        for s in &mut ranks {
            let Control::Abort { reason } = next(s) else {
                panic!("no abort")
            };
            assert_eq!(
                reason,
                "rank 1 (host n01, pid 101) closed the connection during step 1: it died or \
                 was killed; see its output"
            );
        }
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::PeerGone(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("rank 1 (host n01, pid 101) closed"),
            "{e}"
        );
    }

    #[test]
    fn silent_missing_and_confused_ranks_end_the_run_in_bounded_time() {
        // Rank 2 never comes.
        let (handle, port) = coordinator(3, &["--cluster-timeout", "2"]);
        let mut ranks: Vec<TcpStream> = (0..2).map(|r| rank(port, r, 3)).collect();
        let started = Instant::now();
        for s in &mut ranks {
            let Control::Abort { reason } = next(s) else {
                panic!("no abort")
            };
            assert!(
                reason.starts_with("rank 2 never arrived at rank 0 within 2 s"),
                "{reason}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(10));
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::Timeout(_)), "{e:?}");

        // Rank 1 registers, then says nothing more: not even heartbeats.
        let (handle, port) = coordinator(2, &["--cluster-timeout", "2"]);
        let mut r0 = rank(port, 0, 2);
        let _r1 = rank(port, 1, 2);
        let beats = thread::spawn(move || loop {
            let msg = wire::recv(&mut r0).unwrap();
            if let Control::Abort { reason } = msg {
                return reason;
            }
            if wire::send(&mut r0, &Control::Heartbeat).is_err() {
                return String::new();
            }
        });
        let reason = beats.join().unwrap();
        assert!(
            reason.starts_with("rank 1 (host n01, pid 101) sent nothing for 2 s during step 1"),
            "{reason}"
        );
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::Timeout(_)), "{e:?}");

        // Two processes claim rank 0; a rank with another world size.
        let (handle, port) = coordinator(3, &[]);
        let mut a = rank(port, 0, 3);
        let _b = rank(port, 0, 3);
        let Control::Abort { reason } = next(&mut a) else {
            panic!("no abort")
        };
        assert!(
            reason.starts_with("two processes say they are rank 0"),
            "{reason}"
        );
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::Usage(_)), "{e:?}");
        let (handle, port) = coordinator(3, &[]);
        let mut a = rank(port, 1, 4);
        let Control::Abort { reason } = next(&mut a) else {
            panic!("no abort")
        };
        assert!(
            reason.contains("says the run has 4 ranks; rank 0 says 3"),
            "{reason}"
        );
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::Usage(_)), "{e:?}");
        // A rank number outside the run (it was dropped silently, and the run waited for
        // the timeout).
        let (handle, port) = coordinator(3, &[]);
        let mut a = rank(port, 7, 3);
        let Control::Abort { reason } = next(&mut a) else {
            panic!("no abort")
        };
        assert!(
            reason.contains("says it is rank 7 of a run of 3 ranks"),
            "{reason}"
        );
        let e = handle.join().unwrap().unwrap_err();
        assert!(matches!(e, RunError::Usage(_)), "{e:?}");
    }
}
