//! Instructions per iteration of a measured loop, from two callgrind profiles of the same
//! program: one run of `n1` iterations and one of `n2` (`scripts/loop-instructions`).
//!
//! A latency loop spins while it waits, and how long it spins depends on timing, so a
//! profile's totals are not deterministic. Its loop body is: an instruction on the path that
//! every iteration takes runs exactly `k` times per iteration (k = 1 for most, 2 for code the
//! loop reaches twice), so between the two runs its count grows by exactly `k × (n2 − n1)`.
//! Setup and teardown instructions do not grow at all, and a spin's instructions grow by
//! however much longer the second run waited, which is an exact small multiple of
//! `n2 − n1` only by coincidence (and a spinning wait runs them tens of times per iteration,
//! beyond [`MAX_PER_ITERATION`]). Summing `k` over the instructions that grew by an exact
//! multiple therefore counts the instructions one iteration executes outside its waits: the
//! same for the C program and for the Rust one, measured the same way, by object (the
//! program, the provider library, libc, ...). Kernel work (the doorbell's system call) is
//! not seen: callgrind counts user-space instructions only.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The most times per iteration an instruction may run and still count as loop body rather
/// than spin: the ping-pongs reach some code twice (both halves of a round trip).
pub const MAX_PER_ITERATION: u64 = 4;

/// One callgrind profile: instructions executed (`Ir`) per instruction address, by object
/// and function.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Profile {
    /// The profiled command line, from the file's `cmd:` line.
    pub command: String,
    counts: HashMap<(String, String, u64), u64>,
}

/// Why a profile could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line.
    pub line: usize,
    /// What was wrong with it.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

impl std::error::Error for ParseError {}

impl Profile {
    /// Reads a callgrind output file written with `--dump-instr=yes --compress-pos=no` (so
    /// every cost line names its instruction address) and event `Ir`; names may be
    /// compressed or not.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut profile = Profile::default();
        let mut positions: Option<usize> = None;
        let mut ir_column: Option<usize> = None;
        let mut object = String::new();
        let mut function = String::new();
        let mut skip_next_cost = false;
        // Compressed names: "(3) name" defines id 3, a later "(3)" refers to it; objects
        // (ob=, cob=) and functions (fn=, cfn=) number theirs separately.
        let mut objects: HashMap<String, String> = HashMap::new();
        let mut functions: HashMap<String, String> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let err = |what: String| ParseError { line: i + 1, what };
            if let Some(rest) = line.strip_prefix("positions:") {
                let cols: Vec<&str> = rest.split_whitespace().collect();
                if cols.first() != Some(&"instr") {
                    return Err(err(format!(
                        "positions are \"{}\", not by instruction: run callgrind with \
                         --dump-instr=yes",
                        rest.trim()
                    )));
                }
                positions = Some(cols.len());
            } else if let Some(rest) = line.strip_prefix("events:") {
                let at = rest.split_whitespace().position(|e| e == "Ir");
                ir_column = Some(at.ok_or_else(|| err("no Ir event in the profile".into()))?);
            } else if let Some(rest) = line.strip_prefix("cmd:") {
                profile.command = rest.trim().to_owned();
            } else if let Some(rest) = line.strip_prefix("ob=") {
                object = resolve(&mut objects, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("cob=") {
                resolve(&mut objects, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("fn=") {
                function = resolve(&mut functions, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("cfn=") {
                resolve(&mut functions, rest).map_err(err)?;
            } else if line.starts_with("calls=") {
                // The next cost line is the call's inclusive cost, not the caller's own.
                skip_next_cost = true;
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                if skip_next_cost {
                    skip_next_cost = false;
                    continue;
                }
                let (Some(npos), Some(ir)) = (positions, ir_column) else {
                    return Err(err(
                        "a cost line before the positions: and events: lines".into()
                    ));
                };
                let fields: Vec<&str> = line.split_whitespace().collect();
                let Some(addr) = fields.first().and_then(|a| a.strip_prefix("0x")) else {
                    return Err(err(format!(
                        "\"{line}\" has a relative position: run callgrind with \
                         --compress-pos=no"
                    )));
                };
                let addr = u64::from_str_radix(addr, 16)
                    .map_err(|e| err(format!("address \"{addr}\": {e}")))?;
                // A missing trailing event counts 0, as callgrind writes them.
                let count = match fields.get(npos + ir) {
                    Some(c) => c
                        .parse::<u64>()
                        .map_err(|e| err(format!("count \"{c}\": {e}")))?,
                    None => 0,
                };
                *profile
                    .counts
                    .entry((object.clone(), function.clone(), addr))
                    .or_default() += count;
            }
            // Every other line (fl=, fi=, fe=, cob=, cfn=, totals:, ...) changes nothing
            // counted here.
        }
        if positions.is_none() || ir_column.is_none() {
            return Err(ParseError {
                line: 0,
                what: "not a callgrind profile (no positions: or events: line)".into(),
            });
        }
        Ok(profile)
    }

    /// The instructions counted, over all addresses.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// A name as callgrind writes it: plain, `(12) name` (defining id 12), or `(12)` (a name
/// defined before).
fn resolve(table: &mut HashMap<String, String>, s: &str) -> Result<String, String> {
    let s = s.trim();
    let Some(rest) = s.strip_prefix('(') else {
        return Ok(s.to_owned());
    };
    match rest.split_once(')') {
        Some((id, "")) => table
            .get(id)
            .cloned()
            .ok_or_else(|| format!("name ({id}) used before it was defined")),
        Some((id, name)) => {
            let name = name.trim().to_owned();
            table.insert(id.to_owned(), name.clone());
            Ok(name)
        }
        None => Ok(s.to_owned()),
    }
}

/// Every instruction whose count grew from `short` to `long`, by object file name and
/// function, summed as `take` weighs each growth (`None`: left out). The walk both counts
/// share; they differ only in which growths they take and how.
fn growth_by_function(
    short: &Profile,
    long: &Profile,
    take: impl Fn(u64) -> Option<u64>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut by_object: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for ((object, function, addr), &n_long) in &long.counts {
        let key = (object.clone(), function.clone(), *addr);
        let n_short = short.counts.get(&key).copied().unwrap_or(0);
        let Some(weight) = n_long
            .checked_sub(n_short)
            .filter(|&grew| grew > 0)
            .and_then(&take)
        else {
            continue;
        };
        let file = object.rsplit('/').next().unwrap_or(object).to_owned();
        *by_object
            .entry(file)
            .or_default()
            .entry(function.clone())
            .or_default() += weight;
    }
    by_object
}

/// Instructions per iteration of one object (the program, a library).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectCost {
    /// The object's file name (`stride-perf`, `librxe-rdmav34.so`, ...).
    pub object: String,
    /// Instructions one iteration executes in it, outside waits.
    pub per_iteration: u64,
    /// The functions they are in, most first: `(function, instructions per iteration)`.
    pub functions: Vec<(String, u64)>,
}

/// The loop body of `short` → `long` (the same program and loop, `iterations` more
/// iterations in `long`), by object, most first; see the module documentation.
pub fn per_iteration(short: &Profile, long: &Profile, iterations: u64) -> Vec<ObjectCost> {
    if iterations == 0 {
        return Vec::new();
    }
    let by_object = growth_by_function(short, long, |grew| {
        (grew % iterations == 0 && grew / iterations <= MAX_PER_ITERATION)
            .then_some(grew / iterations)
    });
    let mut out: Vec<ObjectCost> = by_object
        .into_iter()
        .map(|(object, fns)| {
            let mut functions: Vec<(String, u64)> = fns.into_iter().collect();
            functions.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            ObjectCost {
                object,
                per_iteration: functions.iter().map(|f| f.1).sum(),
                functions,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.per_iteration
            .cmp(&a.per_iteration)
            .then_with(|| a.object.cmp(&b.object))
    });
    out
}

/// Instructions per iteration of one object by the looser count ([`loose_per_iteration`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LooseCost {
    /// The object's file name.
    pub object: String,
    /// Instructions per iteration, fractional.
    pub per_iteration: f64,
    /// The functions they are in, most first.
    pub functions: Vec<(String, f64)>,
}

/// The looser count of `short` → `long`: every instruction whose count grew by more than 0
/// and at most [`MAX_PER_ITERATION`] × `iterations`, each counted by its growth /
/// `iterations`, exact or not. It adds to [`per_iteration`]'s strict body what the loop does
/// only every few iterations (a credit update, a ring's wrap, receives reposted in batches,
/// the statistics' sort) and code shared by the body with such work, which the strict count
/// drops whole; but also the short waits: a poll that found its completion at once, or after
/// a few tries, counts too. So the strict count is a floor of the loop's own work, and this
/// one is nearer to all of it, with some of its waiting. Spins that polled more than
/// [`MAX_PER_ITERATION`] times per iteration, or fewer in the longer run, stay out of both.
pub fn loose_per_iteration(short: &Profile, long: &Profile, iterations: u64) -> Vec<LooseCost> {
    if iterations == 0 {
        return Vec::new();
    }
    let by_object = growth_by_function(short, long, |grew| {
        (grew <= MAX_PER_ITERATION * iterations).then_some(grew)
    });
    let per = |grew: u64| grew as f64 / iterations as f64;
    let mut out: Vec<LooseCost> = by_object
        .into_iter()
        .map(|(object, fns)| {
            let total: u64 = fns.values().sum();
            let mut functions: Vec<(String, u64)> = fns.into_iter().collect();
            functions.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            LooseCost {
                object,
                per_iteration: per(total),
                functions: functions.into_iter().map(|(f, g)| (f, per(g))).collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.per_iteration
            .total_cmp(&a.per_iteration)
            .then_with(|| a.object.cmp(&b.object))
    });
    out
}

/// [`LooseCost`]s by [`Group`], in [`Group::ALL`]'s order.
pub fn loose_by_group(cost: &[LooseCost], program: &str) -> [f64; 5] {
    let mut out = [0f64; 5];
    for c in cost {
        let g = group_of(&c.object, program);
        let at = Group::ALL.iter().position(|x| *x == g).unwrap_or(4);
        out[at] += c.per_iteration;
    }
    out
}

/// The tests `scripts/loop-instructions` runs, each a latency ping-pong whose one iteration
/// is one round trip: the client sends one message and receives one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE ping-pong: `ib_write_lat` against `stride-perf write lat`.
    WriteLat,
    /// SEND/RECV ping-pong: `ib_send_lat` against `stride-perf send lat`.
    SendLat,
    /// RDMA READ: `ib_read_lat` against `stride-perf read lat`.
    ReadLat,
    /// Atomics (8 bytes, no size flag): `ib_atomic_lat` against `stride-perf atomic lat`.
    AtomicLat,
    /// A byte-stream ping-pong: trespass (`stride-perf stream lat`, write_all + read_exact)
    /// against rsocket (`rstream -S SIZE -C 1 -I ITERS`), both spinning on their waits.
    StreamLat,
    /// trespass's messages (`stride-perf stream lat --messages`, send_msg + recv_msg),
    /// spinning on its waits; rsocket has no messages.
    MessagesLat,
    /// trespass's stream with its default, adaptive busy poll, which sleeps on the
    /// completion channel when a wait outlasts the spin: how the sleeps change the count.
    AdaptiveLat,
    /// trespass's tokio front end (`stride-perf stream lat --tokio`: each call a
    /// current-thread runtime's `block_on` of the async call under a timeout), spinning on
    /// its waits: what the async path adds to the blocking one.
    TokioLat,
}

impl Test {
    /// Every test, in the order `--help` lists them.
    pub const ALL: [Test; 8] = [
        Test::WriteLat,
        Test::SendLat,
        Test::ReadLat,
        Test::AtomicLat,
        Test::StreamLat,
        Test::MessagesLat,
        Test::AdaptiveLat,
        Test::TokioLat,
    ];

    /// The name a row uses (`write_lat`, `stream_lat`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::SendLat => "send_lat",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
            Test::StreamLat => "stream_lat",
            Test::MessagesLat => "messages_lat",
            Test::AdaptiveLat => "adaptive_lat",
            Test::TokioLat => "tokio_lat",
        }
    }

    /// The programs the row compares, each profiled twice.
    pub fn tools(self) -> &'static [Tool] {
        match self {
            Test::WriteLat | Test::SendLat | Test::ReadLat | Test::AtomicLat => {
                &[Tool::Perftest, Tool::Stride]
            }
            Test::StreamLat => &[Tool::Trespass, Tool::Rsocket],
            Test::MessagesLat | Test::AdaptiveLat | Test::TokioLat => &[Tool::Trespass],
        }
    }
}

/// The program one profile is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// perftest's `ib_*_lat`.
    Perftest,
    /// `stride-perf` on the verbs.
    Stride,
    /// `stride-perf stream lat`: trespass.
    Trespass,
    /// rdma-core's `rstream`: rsocket.
    Rsocket,
}

impl Tool {
    /// The name in profile file names and labels.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Perftest => "perftest",
            Tool::Stride => "stride",
            Tool::Trespass => "trespass",
            Tool::Rsocket => "rsocket",
        }
    }
}

/// The busy poll the spinning trespass rows set on both sides, in microseconds: trespass's
/// longest (one second), so that every wait ends in its spin and none sleeps, as rstream's
/// non-blocking calls and the verbs programs do; the adaptation is turned off with it.
pub const SPIN_BUSY_POLL_US: u64 = 1_000_000;

/// One row of `scripts/loop-instructions`: `TEST:SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// What runs.
    pub test: Test,
    /// Message size in bytes (ignored by `atomic_lat`, whose size is 8).
    pub size: u64,
}

/// The rows run when none are named.
pub const DEFAULT_ROWS: &str = "write_lat:64 send_lat:64 read_lat:64 atomic_lat:8";

impl std::str::FromStr for Row {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let names: Vec<&str> = Test::ALL.iter().map(|t| t.name()).collect();
        let not_a_row = || {
            format!(
                "\"{s}\" is not TEST:SIZE with TEST one of {}",
                names.join(", ")
            )
        };
        let (test, size) = s.split_once(':').ok_or_else(not_a_row)?;
        let test = *Test::ALL
            .iter()
            .find(|t| t.name() == test)
            .ok_or_else(not_a_row)?;
        let size = match size.parse::<u64>() {
            Ok(n) if n > 0 && size.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => {
                return Err(format!(
                    "\"{s}\": the size must be a number of bytes above 0"
                ))
            }
        };
        Ok(Row { test, size })
    }
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.test.name(), self.size)
    }
}

/// Reads rows (`TEST:SIZE`, separated by white space); none: [`DEFAULT_ROWS`].
pub fn parse_rows<S: AsRef<str>>(args: &[S]) -> Result<Vec<Row>, String> {
    let mut words: Vec<&str> = args
        .iter()
        .flat_map(|a| a.as_ref().split_whitespace())
        .collect();
    if words.is_empty() {
        words = DEFAULT_ROWS.split_whitespace().collect();
    }
    words.into_iter().map(str::parse).collect()
}

/// The name of one profile: `TOOL-TEST-SIZE-ITERS.out`.
pub fn profile_name(row: Row, tool: Tool, iterations: u64) -> String {
    format!(
        "{}-{}-{}-{iterations}.out",
        tool.name(),
        row.test.name(),
        row.size
    )
}

/// The label of one row's tool in the report: `trespass stream_lat 64 B`.
pub fn label(row: Row, tool: Tool) -> String {
    format!("{} {} {} B", tool.name(), row.test.name(), row.size)
}

/// The devices and addresses of the two guest hosts (`RDMA_TEST_*`, `RDMA_TEST_PEER_*`)
/// and the `stride-perf` to run: the client runs on this host, its server on the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    /// The `stride-perf` binary.
    pub stride_perf: String,
    /// This host's RDMA device.
    pub device: String,
    /// This host's GID index.
    pub gid_index: String,
    /// The peer host's RDMA device.
    pub peer_device: String,
    /// The peer host's GID index.
    pub peer_gid_index: String,
    /// The peer host's address, where the clients connect.
    pub peer_ip: String,
}

/// How to tell that a server is ready for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Something listens on the TCP port (perftest's and stride-perf's side channel).
    Tcp,
    /// An rdma_cm id listens on the port (trespass, rsocket).
    Cm,
}

/// One profiled run: a server on the peer host, and the client to profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The profile's file name ([`profile_name`]).
    pub profile: String,
    /// How to see that the server is ready.
    pub ready: Ready,
    /// The port both use.
    pub port: u16,
    /// The server's command line (run on the peer host).
    pub server: Vec<String>,
    /// The client's command line (run here, under callgrind).
    pub client: Vec<String>,
}

impl Run {
    /// The run as one line for the guest script: profile, `tcp` or `cm`, port, the
    /// server's words and the client's words, separated by tabs (words by spaces).
    pub fn line(&self) -> Result<String, String> {
        for w in self.server.iter().chain(&self.client) {
            if w.is_empty() || w.contains(char::is_whitespace) {
                return Err(format!(
                    "\"{w}\" in the command of {}: empty or with white space",
                    self.profile
                ));
            }
        }
        let ready = match self.ready {
            Ready::Tcp => "tcp",
            Ready::Cm => "cm",
        };
        Ok(format!(
            "{}\t{ready}\t{}\t{}\t{}",
            self.profile,
            self.port,
            self.server.join(" "),
            self.client.join(" ")
        ))
    }
}

/// Every run of `rows`: each row's tools, each with `short` and then `long` iterations, on
/// ports from `first_port` up, one each.
pub fn plan(rows: &[Row], short: u64, long: u64, first_port: u16, hosts: &Hosts) -> Vec<Run> {
    let mut port = first_port;
    let mut runs = Vec::new();
    for &row in rows {
        for &tool in row.test.tools() {
            for n in [short, long] {
                runs.push(command(row, tool, n, port, hosts));
                port = port.wrapping_add(1);
            }
        }
    }
    runs
}

/// One tool's server and client for one row.
fn command(row: Row, tool: Tool, n: u64, port: u16, h: &Hosts) -> Run {
    let words = |v: &[&str]| v.iter().map(|w| (*w).to_owned()).collect::<Vec<String>>();
    let (size, n_s, port_s) = (row.size.to_string(), n.to_string(), port.to_string());
    let (server, client, ready) = match tool {
        Tool::Perftest | Tool::Stride => {
            let name = row.test.name();
            let (verb, _) = name.split_once('_').unwrap_or((name, ""));
            let mut program = match tool {
                Tool::Perftest => vec![format!("ib_{name}")],
                _ => words(&[&h.stride_perf, verb, "lat"]),
            };
            let mut common = words(&["-p", &port_s]);
            if row.test != Test::AtomicLat {
                common.extend(words(&["-s", &size]));
            }
            common.extend(words(&["-n", &n_s]));
            let mut server = program.clone();
            server.extend(words(&["-d", &h.peer_device, "-x", &h.peer_gid_index]));
            server.extend(common.iter().cloned());
            program.extend(words(&["-d", &h.device, "-x", &h.gid_index]));
            program.extend(common);
            program.push(h.peer_ip.clone());
            (server, program, Ready::Tcp)
        }
        Tool::Trespass => {
            let mut common = words(&["-s", &size, "-n", &n_s, "-p", &port_s]);
            if row.test == Test::MessagesLat {
                common.push("--messages".into());
            }
            if row.test == Test::TokioLat {
                common.push("--tokio".into());
            }
            if row.test != Test::AdaptiveLat {
                let spin = SPIN_BUSY_POLL_US.to_string();
                common.extend(words(&["--busy-poll-us", &spin, "--busy-poll-max-us", "0"]));
            }
            let mut server = words(&[&h.stride_perf, "stream", "lat", "--bind", &h.peer_ip]);
            server.extend(common.iter().cloned());
            let mut client = words(&[&h.stride_perf, "stream", "lat"]);
            client.extend(common);
            client.push(h.peer_ip.clone());
            (server, client, Ready::Cm)
        }
        Tool::Rsocket => {
            let common = words(&["-p", &port_s, "-S", &size, "-C", "1", "-I", &n_s]);
            let mut server = words(&["rstream", "-b", &h.peer_ip]);
            server.extend(common.iter().cloned());
            let mut client = words(&["rstream", "-s", &h.peer_ip]);
            client.extend(common);
            (server, client, Ready::Cm)
        }
    };
    Run {
        profile: profile_name(row, tool, n),
        ready,
        port,
        server,
        client,
    }
}

/// Where an object's instructions go in the comparison's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// The profiled program itself (for `stride-perf`: stride, trespass and sideway, linked
    /// in).
    Program,
    /// libibverbs and its provider (`librxe-rdmav*.so`, any `lib*-rdmav*.so`).
    Verbs,
    /// librdmacm, where rsocket lives.
    Rdmacm,
    /// The C library.
    Libc,
    /// Everything else (the dynamic loader, libgcc, Valgrind's preloads, ...).
    Other,
}

impl Group {
    /// Every group, in the table's column order.
    pub const ALL: [Group; 5] = [
        Group::Program,
        Group::Verbs,
        Group::Rdmacm,
        Group::Libc,
        Group::Other,
    ];

    /// The table's column heading.
    pub fn heading(self) -> &'static str {
        match self {
            Group::Program => "program",
            Group::Verbs => "libibverbs + provider",
            Group::Rdmacm => "librdmacm",
            Group::Libc => "libc",
            Group::Other => "other",
        }
    }
}

/// The group of `object` (a file name, as [`ObjectCost::object`]) when `program` (a file
/// name too) is the profiled program.
pub fn group_of(object: &str, program: &str) -> Group {
    if object == program {
        Group::Program
    } else if object.starts_with("libibverbs.") || object.contains("-rdmav") {
        Group::Verbs
    } else if object.starts_with("librdmacm.") {
        Group::Rdmacm
    } else if object.starts_with("libc.so") || object.starts_with("libc-") {
        Group::Libc
    } else {
        Group::Other
    }
}

/// The program of a profiled command line: its first word's file name (`stride-perf` of
/// `target/release/stride-perf stream lat ...`).
pub fn program_of(command: &str) -> &str {
    let first = command.split_whitespace().next().unwrap_or("");
    first.rsplit('/').next().unwrap_or(first)
}

/// Instructions per iteration by [`Group`], in [`Group::ALL`]'s order.
pub fn by_group(cost: &[ObjectCost], program: &str) -> [u64; 5] {
    let mut out = [0u64; 5];
    for c in cost {
        let g = group_of(&c.object, program);
        let at = Group::ALL.iter().position(|x| *x == g).unwrap_or(4);
        out[at] += c.per_iteration;
    }
    out
}

/// The crate a Rust function's name belongs to (`trespass` of
/// `trespass::stream::Stream::read` or `<trespass::ring::Ring as core::fmt::Debug>::fmt`),
/// `None` for a name that is not a Rust path (C code, an address).
pub fn crate_of(function: &str) -> Option<&str> {
    let name = function.trim_start_matches(['<', '&', '*']);
    let name = name.strip_prefix("mut ").unwrap_or(name);
    let (first, _) = name.split_once("::")?;
    let is_ident =
        !first.is_empty() && first.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    is_ident.then_some(first)
}

/// A program's instructions per iteration by crate ([`crate_of`]; `(other)` for the rest),
/// most first.
pub fn by_crate(cost: &ObjectCost) -> Vec<(String, u64)> {
    let mut crates: BTreeMap<String, u64> = BTreeMap::new();
    for (f, n) in &cost.functions {
        let c = crate_of(f).unwrap_or("(other)");
        *crates.entry(c.to_owned()).or_default() += n;
    }
    let mut out: Vec<(String, u64)> = crates.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// [`by_crate`] of the looser count.
pub fn loose_by_crate(cost: &LooseCost) -> Vec<(String, f64)> {
    let mut crates: BTreeMap<String, f64> = BTreeMap::new();
    for (f, n) in &cost.functions {
        let c = crate_of(f).unwrap_or("(other)");
        *crates.entry(c.to_owned()).or_default() += n;
    }
    let mut out: Vec<(String, f64)> = crates.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile in callgrind's format: a loop body at 0x10..0x12 run `n` times (0x12 twice
    /// per iteration), a spin at 0x20 run `spins` times, setup at 0x30 once, and a provider
    /// call whose inclusive cost must not count as the caller's.
    fn profile(n: u64, spins: u64) -> String {
        format!(
            "version: 1\ncreator: callgrind-3.24.0\ncmd: ./prog -n {n}\npart: 1\n\n\
             positions: instr line\nevents: Ir\nsummary: 1\n\n\
             ob=(1) /usr/bin/prog\nfl=(1) ???\nfn=(1) main\n\
             0x10 0 {n}\n0x11 0 {n}\n0x12 0 {twice}\n0x20 0 {spins}\n0x30 0 1\n\
             cob=(2) /usr/lib/libprov.so\ncfn=(2) post\ncalls={n} 0x400\n0x13 0 {inclusive}\n\
             ob=(2)\nfn=(2)\n0x400 0 {n}\n0x401 0 {n}\n0x402 0 {n}\n",
            twice = 2 * n,
            inclusive = 3 * n,
        )
    }

    #[test]
    fn counts_the_body_not_the_spins_setup_or_inclusive_costs() {
        let short = Profile::parse(&profile(1000, 61_237)).unwrap();
        let long = Profile::parse(&profile(2000, 119_001)).unwrap();
        assert_eq!(long.command, "./prog -n 2000");
        let cost = per_iteration(&short, &long, 1000);
        assert_eq!(cost.len(), 2, "{cost:?}");
        // main: 0x10 once, 0x11 once, 0x12 twice; the call's line 0x13 is not the caller's.
        assert_eq!(cost[0].object, "prog");
        assert_eq!(cost[0].per_iteration, 4);
        assert_eq!(cost[0].functions, vec![("main".to_owned(), 4)]);
        assert_eq!(cost[1].object, "libprov.so");
        assert_eq!(cost[1].per_iteration, 3);
        assert_eq!(cost[1].functions, vec![("post".to_owned(), 3)]);
    }

    #[test]
    fn a_spin_that_grew_by_an_exact_multiple_still_does_not_count() {
        // 50 spins per iteration: an exact multiple, but far beyond any body instruction.
        let short = Profile::parse(&profile(1000, 50_000)).unwrap();
        let long = Profile::parse(&profile(2000, 100_000)).unwrap();
        let cost = per_iteration(&short, &long, 1000);
        assert_eq!(cost[0].per_iteration, 4);
    }

    #[test]
    fn compressed_positions_and_missing_headers_are_refused_with_the_fix() {
        let relative = "positions: instr line\nevents: Ir\nfn=(1) f\n+3 0 7\n";
        let e = Profile::parse(relative).unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.to_string().contains("--compress-pos=no"), "{e}");
        let by_line = "positions: line\nevents: Ir\n";
        assert!(Profile::parse(by_line)
            .unwrap_err()
            .to_string()
            .contains("--dump-instr=yes"));
        assert!(Profile::parse("hello\n").is_err());
        let undefined = "positions: instr\nevents: Ir\nfn=(7)\n0x1 5\n";
        assert!(Profile::parse(undefined)
            .unwrap_err()
            .to_string()
            .contains("(7) used before"));
        let no_ir = "positions: instr\nevents: Dr\n";
        assert!(Profile::parse(no_ir)
            .unwrap_err()
            .to_string()
            .contains("Ir"));
    }

    #[test]
    fn no_iterations_means_no_body() {
        let p = Profile::parse(&profile(1000, 5)).unwrap();
        assert!(per_iteration(&p, &p, 0).is_empty());
        assert!(per_iteration(&p, &p, 1000).is_empty());
        assert_eq!(p.total(), 1000 + 1000 + 2000 + 5 + 1 + 3000);
    }

    fn hosts() -> Hosts {
        Hosts {
            stride_perf: "target/release/stride-perf".into(),
            device: "rxe0".into(),
            gid_index: "1".into(),
            peer_device: "rxe1".into(),
            peer_gid_index: "3".into(),
            peer_ip: "10.0.0.2".into(),
        }
    }

    #[test]
    fn rows_are_read_and_bad_ones_refused_with_the_choices() {
        let rows = parse_rows(&["stream_lat:64 messages_lat:4096", "atomic_lat:8"]).unwrap();
        assert_eq!(
            rows,
            vec![
                Row {
                    test: Test::StreamLat,
                    size: 64
                },
                Row {
                    test: Test::MessagesLat,
                    size: 4096
                },
                Row {
                    test: Test::AtomicLat,
                    size: 8
                },
            ]
        );
        assert_eq!(rows[0].to_string(), "stream_lat:64");
        let defaults = parse_rows::<&str>(&[]).unwrap();
        assert_eq!(defaults.len(), 4);
        assert_eq!(
            defaults[0],
            Row {
                test: Test::WriteLat,
                size: 64
            }
        );
        let e = parse_rows(&["write_bw:64"]).unwrap_err();
        assert!(e.contains("\"write_bw:64\" is not TEST:SIZE"), "{e}");
        assert!(
            e.contains("stream_lat") && e.contains("adaptive_lat"),
            "{e}"
        );
        assert!(parse_rows(&["stream_lat"])
            .unwrap_err()
            .contains("is not TEST:SIZE"));
        for bad in [
            "stream_lat:",
            "stream_lat:0",
            "stream_lat:+4",
            "stream_lat:4k",
        ] {
            let e = parse_rows(&[bad]).unwrap_err();
            assert!(e.contains("number of bytes"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_plan_runs_each_tool_twice_with_its_server_on_the_peer() {
        let rows = parse_rows(&["send_lat:64 atomic_lat:8 stream_lat:4096"]).unwrap();
        let runs = plan(&rows, 1000, 2000, 19701, &hosts());
        let names: Vec<&str> = runs.iter().map(|r| r.profile.as_str()).collect();
        assert_eq!(
            names,
            [
                "perftest-send_lat-64-1000.out",
                "perftest-send_lat-64-2000.out",
                "stride-send_lat-64-1000.out",
                "stride-send_lat-64-2000.out",
                "perftest-atomic_lat-8-1000.out",
                "perftest-atomic_lat-8-2000.out",
                "stride-atomic_lat-8-1000.out",
                "stride-atomic_lat-8-2000.out",
                "trespass-stream_lat-4096-1000.out",
                "trespass-stream_lat-4096-2000.out",
                "rsocket-stream_lat-4096-1000.out",
                "rsocket-stream_lat-4096-2000.out",
            ]
        );
        let ports: Vec<u16> = runs.iter().map(|r| r.port).collect();
        assert_eq!(ports, (19701..19713).collect::<Vec<u16>>());
        assert_eq!(
            runs[1].line().unwrap(),
            "perftest-send_lat-64-2000.out\ttcp\t19702\t\
             ib_send_lat -d rxe1 -x 3 -p 19702 -s 64 -n 2000\t\
             ib_send_lat -d rxe0 -x 1 -p 19702 -s 64 -n 2000 10.0.0.2"
        );
        // Atomics take no size.
        assert_eq!(
            runs[6].client.join(" "),
            "target/release/stride-perf atomic lat -d rxe0 -x 1 -p 19707 -n 1000 10.0.0.2"
        );
        assert_eq!(
            runs[8].line().unwrap(),
            "trespass-stream_lat-4096-1000.out\tcm\t19709\t\
             target/release/stride-perf stream lat --bind 10.0.0.2 -s 4096 -n 1000 -p 19709 \
             --busy-poll-us 1000000 --busy-poll-max-us 0\t\
             target/release/stride-perf stream lat -s 4096 -n 1000 -p 19709 \
             --busy-poll-us 1000000 --busy-poll-max-us 0 10.0.0.2"
        );
        assert_eq!(
            runs[11].line().unwrap(),
            "rsocket-stream_lat-4096-2000.out\tcm\t19712\t\
             rstream -b 10.0.0.2 -p 19712 -S 4096 -C 1 -I 2000\t\
             rstream -s 10.0.0.2 -p 19712 -S 4096 -C 1 -I 2000"
        );
    }

    #[test]
    fn messages_spin_and_adaptive_keeps_the_defaults() {
        let rows = parse_rows(&["messages_lat:64 adaptive_lat:64"]).unwrap();
        let runs = plan(&rows, 10, 20, 1, &hosts());
        assert_eq!(runs.len(), 4);
        let messages = runs[0].client.join(" ");
        assert!(
            messages.contains(" --messages --busy-poll-us 1000000"),
            "{messages}"
        );
        let adaptive = runs[2].client.join(" ");
        assert_eq!(
            adaptive,
            "target/release/stride-perf stream lat -s 64 -n 10 -p 3 10.0.0.2"
        );
        assert_eq!(runs[3].profile, "trespass-adaptive_lat-64-20.out");
        assert_eq!(label(rows[1], Tool::Trespass), "trespass adaptive_lat 64 B");
    }

    #[test]
    fn the_tokio_row_runs_both_sides_on_tokio_spinning() {
        let rows = parse_rows(&["tokio_lat:64"]).unwrap();
        let runs = plan(&rows, 10, 20, 1, &hosts());
        assert_eq!(runs.len(), 2, "trespass only, twice");
        for run in &runs {
            for side in [&run.server, &run.client] {
                let line = side.join(" ");
                assert!(
                    line.contains(" --tokio --busy-poll-us 1000000 --busy-poll-max-us 0"),
                    "{line}"
                );
            }
        }
        assert_eq!(runs[1].profile, "trespass-tokio_lat-64-20.out");
    }

    #[test]
    fn a_word_with_white_space_is_refused() {
        let mut h = hosts();
        h.stride_perf = "/tmp/my dir/stride-perf".into();
        let runs = plan(&parse_rows(&["stream_lat:64"]).unwrap(), 1, 2, 1, &h);
        assert!(runs[0].line().unwrap_err().contains("white space"));
        // rstream's command does not name stride-perf.
        assert!(runs[2].line().is_ok());
    }

    #[test]
    fn objects_fall_into_groups_and_functions_into_crates() {
        for (object, group) in [
            ("stride-perf", Group::Program),
            ("rstream", Group::Program),
            ("libibverbs.so.1.14.50.0", Group::Verbs),
            ("librxe-rdmav34.so", Group::Verbs),
            ("librdmacm.so.1.3.50.0", Group::Rdmacm),
            ("libc.so.6", Group::Libc),
            ("ld-linux-x86-64.so.2", Group::Other),
            ("vgpreload_core-amd64-linux.so", Group::Other),
        ] {
            let program = if object == "rstream" {
                "rstream"
            } else {
                "stride-perf"
            };
            assert_eq!(group_of(object, program), group, "{object}");
        }
        assert_eq!(
            program_of("target/release/stride-perf stream lat -s 64"),
            "stride-perf"
        );
        assert_eq!(program_of("rstream -s 10.0.0.2"), "rstream");
        assert_eq!(program_of(""), "");
        let cost = ObjectCost {
            object: "stride-perf".into(),
            per_iteration: 0,
            functions: vec![
                ("trespass::stream::Stream::read_exact".into(), 300),
                ("<trespass::ring::Ring as core::ops::Drop>::drop".into(), 20),
                ("&mut sideway::ibverbs::cq::poll".into(), 100),
                ("std::time::Instant::now".into(), 40),
                ("memcpy".into(), 7),
                ("0x0000000000012345".into(), 3),
            ],
        };
        assert_eq!(
            by_crate(&cost),
            vec![
                ("trespass".to_owned(), 320),
                ("sideway".to_owned(), 100),
                ("std".to_owned(), 40),
                ("(other)".to_owned(), 10),
            ]
        );
        let objects = vec![
            ObjectCost {
                object: "stride-perf".into(),
                per_iteration: 500,
                functions: vec![],
            },
            ObjectCost {
                object: "librxe-rdmav34.so".into(),
                per_iteration: 200,
                functions: vec![],
            },
            ObjectCost {
                object: "libibverbs.so.1".into(),
                per_iteration: 30,
                functions: vec![],
            },
            ObjectCost {
                object: "libc.so.6".into(),
                per_iteration: 90,
                functions: vec![],
            },
            ObjectCost {
                object: "ld-linux-x86-64.so.2".into(),
                per_iteration: 4,
                functions: vec![],
            },
        ];
        assert_eq!(by_group(&objects, "stride-perf"), [500, 230, 0, 90, 4]);
    }

    #[test]
    fn the_loose_count_adds_amortised_work_and_short_waits_but_not_spins() {
        // Exactly as the strict test, plus one instruction run every 32 iterations (1000 →
        // 2000: 31 → 62 runs), one that polled 1.5 times per iteration, and a spin that ran
        // less in the longer run.
        let with = |n: u64, every32: u64, polls: u64, spin: u64| {
            let mut p = profile(n, spin);
            p.push_str(&format!("0x403 0 {every32}\n0x404 0 {polls}\n"));
            Profile::parse(&p).unwrap()
        };
        let short = with(1000, 31, 1500, 90_000);
        let long = with(2000, 62, 3000, 60_000);
        let strict = per_iteration(&short, &long, 1000);
        assert_eq!(strict[1].per_iteration, 3);
        let loose = loose_per_iteration(&short, &long, 1000);
        // The provider's 4.531 now come before the program's 4.
        assert_eq!(loose[0].object, "libprov.so");
        assert!((loose[0].per_iteration - (3.0 + 0.031 + 1.5)).abs() < 1e-9);
        assert_eq!(loose[0].functions[0].0, "post");
        assert_eq!(loose[1].object, "prog");
        assert_eq!(loose[1].per_iteration, 4.0);
        assert_eq!(
            loose_by_group(&loose, "prog"),
            [4.0, 0.0, 0.0, 0.0, loose[0].per_iteration]
        );
        assert!(loose_per_iteration(&short, &long, 0).is_empty());
        let rust = LooseCost {
            object: "stride-perf".into(),
            per_iteration: 0.0,
            functions: vec![
                ("trespass::driver::Driver::pump".into(), 2.5),
                ("core::slice::sort::quicksort".into(), 1.0),
                ("trespass::core::Connection::on_data".into(), 1.0),
                ("0x1234".into(), 0.5),
            ],
        };
        assert_eq!(
            loose_by_crate(&rust),
            vec![
                ("trespass".to_owned(), 3.5),
                ("core".to_owned(), 1.0),
                ("(other)".to_owned(), 0.5),
            ]
        );
    }
}
