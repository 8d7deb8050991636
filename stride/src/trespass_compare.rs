//! The numbers of `scripts/trespass-compare`: trespass beside the raw verbs floor, rsocket
//! and kernel TCP, in one SoftRoCE guest.
//!
//! The `trespass-compare` binary (`src/bin/`) runs every case at every size, round after
//! round, and writes one line per run into a TSV file ([`Run`], [`write_tsv_line`]); this
//! module holds what is pure: which program each case runs with which iteration count, how
//! rstream's output is read, and the table ([`summarize`], [`markdown_table`]): per row the
//! median of each program over the rounds, and the ratios trespass / verbs floor and
//! trespass / rsocket, each with the spread (min..max) of its per-round ratios.
//!
//! What each case measures:
//!
//! | case | lat (mean of one round trip / 2, usec) | bw (MiB/s, one way) |
//! | --- | --- | --- |
//! | `trespass-stream` | `stride-perf stream lat`: write_all + read_exact ping-pong, t_avg | `stride-perf stream bw` |
//! | `trespass-messages` | the same with `--messages` (send_msg / recv_msg) | `stride-perf stream bw --messages` |
//! | `trespass-lent` | the same with `--lend` (lend_msg / reclaim, zero-copy both ways) | `stride-perf stream bw --lend` |
//! | `trespass-spin` | `stream lat` with `--busy-poll-us 1000000` on both sides | `stream bw` likewise |
//! | `trespass-tokio` | `stream lat` with `--tokio` on both sides (the tokio front end) | `stream bw` likewise |
//! | `trespass-tokio-adaptive` | the same with `--busy-poll-max-us 750` on both sides | likewise |
//! | `rdma-io` | `rdma-io-stream client ADDR lat` (the rdma-io crate's tokio stream, the same ping-pong), mean | `rdma-io-stream client ADDR bw` |
//! | `verbs` | `stride-perf send lat` (SEND/RECV ping-pong), t_avg | `stride-perf write bw` |
//! | `rsocket` | `rstream -S size -C 1 -I iters`: usec/xfer | `rstream -S size -C iters -I 1`: size / usec/xfer |
//! | `tcp` | the same with `-T s` (kernel TCP over the guest's dummy0) | the same with `-T s` |
//!
//! Latency is the mean, not the median, because rstream prints only its total time: the
//! stride-perf programs' t_avg (perftest's mean, which leaves out the two largest samples)
//! stands beside rstream's usec/xfer (total time / 2 / round trips). The TSV keeps the
//! stride-perf programs' t_typical too.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cli::Test;
use crate::compare::median;

/// A program and transfer under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Case {
    /// trespass, stream bytes.
    TrespassStream,
    /// trespass, messages.
    TrespassMessages,
    /// trespass, lent messages (zero-copy: `--lend`).
    TrespassLent,
    /// trespass, stream bytes, both sides spinning instead of sleeping
    /// ([`SPIN_BUSY_POLL_US`]), as the verbs programs and rstream do.
    TrespassSpin,
    /// trespass, stream bytes, both sides on its tokio front end (`stream --tokio`: a
    /// current-thread runtime per connection).
    TrespassTokio,
    /// The same with the adaptive spin fixed on, both sides (`--busy-poll-max-us`
    /// [`TOKIO_ADAPTIVE_MAX_US`]). The front end's default adapts only while its runtime is
    /// not crowded, which one stream alone on its runtime never is, so the two rows differ
    /// by noise unless that default changes.
    TrespassTokioAdaptive,
    /// The rdma-io crate's tokio stream (`AsyncRdmaStream` over its `SendRecvConfig::stream()`
    /// transport), through `benches/rdma-io-stream`: another layer in trespass's place.
    RdmaIo,
    /// The raw verbs: `stride-perf send lat` and `write bw`.
    Verbs,
    /// rsocket through `rstream`.
    Rsocket,
    /// Kernel TCP through `rstream -T s`.
    Tcp,
}

impl Case {
    /// Every case, in table order.
    pub const ALL: [Case; 10] = [
        Case::TrespassStream,
        Case::TrespassMessages,
        Case::TrespassLent,
        Case::TrespassSpin,
        Case::TrespassTokio,
        Case::TrespassTokioAdaptive,
        Case::RdmaIo,
        Case::Verbs,
        Case::Rsocket,
        Case::Tcp,
    ];

    /// The name in the TSV file and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Case::TrespassStream => "trespass-stream",
            Case::TrespassMessages => "trespass-messages",
            Case::TrespassLent => "trespass-lent",
            Case::TrespassSpin => "trespass-spin",
            Case::TrespassTokio => "trespass-tokio",
            Case::TrespassTokioAdaptive => "trespass-tokio-adaptive",
            Case::RdmaIo => "rdma-io",
            Case::Verbs => "verbs",
            Case::Rsocket => "rsocket",
            Case::Tcp => "tcp",
        }
    }

    /// The case of `name`.
    pub fn parse(name: &str) -> Option<Case> {
        Case::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether it is one of trespass's.
    pub fn is_trespass(self) -> bool {
        matches!(
            self,
            Case::TrespassStream
                | Case::TrespassMessages
                | Case::TrespassLent
                | Case::TrespassSpin
                | Case::TrespassTokio
                | Case::TrespassTokioAdaptive
        )
    }
}

/// One measurement to make: a case and a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// lat or bw.
    pub test: Test,
    /// The program.
    pub case: Case,
}

impl Job {
    /// `stream-lat`, `messages-bw`, `verbs-lat`, `rsocket-bw`, `tcp-lat`...
    pub fn name(self) -> String {
        let case = match self.case {
            Case::TrespassStream => "stream",
            Case::TrespassMessages => "messages",
            Case::TrespassLent => "lent",
            Case::TrespassSpin => "spin",
            Case::TrespassTokio => "tokio",
            Case::TrespassTokioAdaptive => "tokio-adaptive",
            c => c.name(),
        };
        format!("{case}-{}", self.test.as_str())
    }

    /// The job named `name` ([`Job::name`]).
    pub fn parse(name: &str) -> Option<Job> {
        let (case, test) = name.rsplit_once('-')?;
        let test = match test {
            "lat" => Test::Lat,
            "bw" => Test::Bw,
            _ => return None,
        };
        let case = match case {
            "stream" => Case::TrespassStream,
            "messages" => Case::TrespassMessages,
            "lent" => Case::TrespassLent,
            "spin" => Case::TrespassSpin,
            "tokio" => Case::TrespassTokio,
            "tokio-adaptive" => Case::TrespassTokioAdaptive,
            other => Case::parse(other).filter(|c| !c.is_trespass())?,
        };
        Some(Job { test, case })
    }
}

/// The jobs of a default run: trespass stream lat and bw, trespass messages lat, trespass
/// spinning lat and bw, trespass on tokio lat and bw (its defaults, and with the adaptive
/// spin), rdma-io lat and bw, and the verbs floor, rsocket and TCP of both tests.
pub const DEFAULT_JOBS: &str = "stream-lat,messages-lat,spin-lat,tokio-lat,tokio-adaptive-lat,\
                                rdma-io-lat,verbs-lat,rsocket-lat,tcp-lat,stream-bw,spin-bw,\
                                tokio-bw,tokio-adaptive-bw,rdma-io-bw,verbs-bw,rsocket-bw,tcp-bw";
/// The adaptive spin's limit of the `tokio-adaptive` jobs, in microseconds: the tokio front
/// end's default (`trespass::tokio::BUSY_POLL_MAX`).
pub const TOKIO_ADAPTIVE_MAX_US: u64 = 750;
/// The busy poll of the `spin` jobs, in microseconds (trespass's longest, one second): a
/// blocking call spins through every round trip of this guest instead of sleeping on the
/// completion channel, as `stride-perf` and `rstream` always do.
pub const SPIN_BUSY_POLL_US: u64 = 1_000_000;
/// The sizes of a default run.
pub const DEFAULT_SIZES: [u64; 5] = [8, 64, 4096, 65536, 1 << 20];

/// The result of `rdma-io-stream`'s client output: (mean, median) half round trip in usec
/// for lat, (MiB/s, None) for bw; `None` without a result line.
pub fn rdma_io_result(text: &str) -> Option<(f64, Option<f64>)> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("rdma-io-stream result: "))?;
    let field = |key: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.parse().ok())
    };
    match (
        field("mean_us="),
        field("median_us="),
        field("mib_per_sec="),
    ) {
        (Some(mean), median, _) => Some((mean, median)),
        (None, _, Some(mib)) => Some((mib, None)),
        _ => None,
    }
}

/// Reads a comma-separated list of jobs.
pub fn parse_jobs(text: &str) -> Result<Vec<Job>, String> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            Job::parse(s.trim()).ok_or_else(|| {
                format!(
                    "unknown job '{s}': use CASE-TEST with CASE one of stream, messages, spin, \
                     tokio, tokio-adaptive, rdma-io, verbs, rsocket, tcp and TEST lat or bw"
                )
            })
        })
        .collect()
}

/// Bytes a latency run moves each way: its round trips are this over the size, within
/// [`LAT_MIN_ITERS`]..=[`LAT_MAX_ITERS`].
pub const LAT_BYTES: u64 = 16 << 20;
/// The fewest round trips of a latency run.
pub const LAT_MIN_ITERS: u64 = 50;
/// The most round trips of a latency run.
pub const LAT_MAX_ITERS: u64 = 1000;
/// Bytes a bandwidth run moves: its messages are this over the size, within
/// [`BW_MIN_ITERS`]..=[`BW_MAX_ITERS`].
pub const BW_BYTES: u64 = 32 << 20;
/// The fewest messages of a bandwidth run.
pub const BW_MIN_ITERS: u64 = 32;
/// The most messages of a bandwidth run.
pub const BW_MAX_ITERS: u64 = 5000;

/// The iterations of `test` at `size`, the same for every case.
pub fn iterations(test: Test, size: u64) -> u64 {
    let size = size.max(1);
    match test {
        Test::Lat => (LAT_BYTES / size).clamp(LAT_MIN_ITERS, LAT_MAX_ITERS),
        Test::Bw => (BW_BYTES / size).clamp(BW_MIN_ITERS, BW_MAX_ITERS),
    }
}

/// rstream's result row (`custom 64 1 200 25k 0.03s 0.80 63.92`): its usec/xfer, the last
/// column. `None` when the output has no such row.
pub fn rstream_usec_per_xfer(output: &str) -> Option<f64> {
    output
        .lines()
        .filter(|l| l.starts_with("custom"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .find(|v| v.is_finite() && *v > 0.0)
}

/// Bandwidth in MiB/s of `size`-byte transfers taking `usec_per_xfer` each.
pub fn mib_per_sec(size: u64, usec_per_xfer: f64) -> f64 {
    size as f64 / usec_per_xfer * 1e6 / f64::from(1u32 << 20)
}

/// One run, one line of the TSV file.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The round, from 1.
    pub round: u32,
    /// lat or bw.
    pub test: Test,
    /// The program.
    pub case: Case,
    /// Message size in bytes.
    pub size: u64,
    /// Round trips (lat) or messages (bw).
    pub iterations: u64,
    /// Mean half round trip in usec (lat) or MiB/s (bw); `None` when the run failed.
    pub value: Option<f64>,
    /// The median half round trip (the stride-perf programs' t_typical), usec.
    pub typical: Option<f64>,
    /// User + system CPU seconds of the run's two processes (setup included).
    pub cpu_seconds: Option<f64>,
    /// `ok`, or `failed: ` and why.
    pub status: String,
}

/// The TSV file's column names.
pub const TSV_HEADER: &str = "round\ttest\tcase\tsize\titerations\tvalue\ttypical\tcpu_s\tstatus";

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "nan".to_owned(), |v| format!("{v:.decimals$}"))
}

/// One line of the TSV file (no newline); tabs and newlines in the status become spaces.
pub fn write_tsv_line(r: &Run) -> String {
    let status: String = r
        .status
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        r.round,
        r.test.as_str(),
        r.case.name(),
        r.size,
        r.iterations,
        opt(r.value, 3),
        opt(r.typical, 3),
        opt(r.cpu_seconds, 3),
        status.trim()
    )
}

/// The TSV file: its `#` notes and its runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tsv {
    /// The text of each `#` line.
    pub notes: Vec<String>,
    /// Every run, in file order.
    pub runs: Vec<Run>,
}

fn number(f: &str) -> Option<f64> {
    f.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// Reads a TSV file written with [`TSV_HEADER`] and [`write_tsv_line`].
pub fn parse_tsv(text: &str) -> Result<Tsv, String> {
    let mut out = Tsv::default();
    for (i, line) in text.lines().enumerate() {
        if let Some(note) = line.strip_prefix('#') {
            out.notes.push(note.trim().to_owned());
            continue;
        }
        if line.trim().is_empty() || line.starts_with("round\t") {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if f.len() != 9 {
            return Err(bad("expected 9 tab-separated fields"));
        }
        let test = match f[1] {
            "lat" => Test::Lat,
            "bw" => Test::Bw,
            _ => return Err(bad("the test is neither lat nor bw")),
        };
        out.runs.push(Run {
            round: f[0].parse().map_err(|_| bad("the round is not a number"))?,
            test,
            case: Case::parse(f[2]).ok_or_else(|| bad("unknown case"))?,
            size: f[3].parse().map_err(|_| bad("the size is not a number"))?,
            iterations: f[4]
                .parse()
                .map_err(|_| bad("the iterations are not a number"))?,
            value: number(f[5]),
            typical: number(f[6]),
            cpu_seconds: number(f[7]),
            status: f[8].to_owned(),
        });
    }
    Ok(out)
}

/// One program's runs of one row: the medians over the rounds and how many failed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cell {
    /// The median value of the runs that gave one.
    pub median: Option<f64>,
    /// The median of their typical latencies (stride-perf latency runs).
    pub typical: Option<f64>,
    /// The smallest and largest value.
    pub range: Option<(f64, f64)>,
    /// Runs in all.
    pub runs: usize,
    /// Runs without a value.
    pub failed: usize,
    /// The first failed run's status.
    pub why: Option<String>,
}

/// A ratio of medians and the spread of the per-round ratios.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// Median of trespass / median of the other.
    pub ratio: f64,
    /// The smallest per-round ratio (rounds where both gave a value).
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// The rounds paired.
    pub rounds: usize,
}

/// One row of the table: a test, a size and a trespass transfer, beside the others.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// lat or bw.
    pub test: Test,
    /// Message size.
    pub size: u64,
    /// Which trespass transfer.
    pub trespass: Case,
    /// The cells: trespass, verbs, rsocket, tcp.
    pub cells: [Cell; 4],
    /// trespass / verbs: of the typical (median) latencies for lat, of the bandwidths
    /// for bw.
    pub vs_verbs: Option<Ratio>,
    /// trespass / rsocket: of the mean latencies for lat (rstream has no other), of the
    /// bandwidths for bw.
    pub vs_rsocket: Option<Ratio>,
}

fn median_of(runs: &[&Run], metric: fn(&Run) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().filter_map(|r| metric(r)).collect();
    median(&mut v)
}

fn value(r: &Run) -> Option<f64> {
    r.value
}

fn typical(r: &Run) -> Option<f64> {
    r.typical.filter(|_| r.value.is_some())
}

fn cell(runs: &[&Run]) -> Cell {
    let range = runs
        .iter()
        .filter_map(|r| r.value)
        .fold(None, |acc: Option<(f64, f64)>, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        });
    Cell {
        median: median_of(runs, value),
        typical: median_of(runs, typical),
        range,
        runs: runs.len(),
        failed: runs.iter().filter(|r| r.value.is_none()).count(),
        why: runs
            .iter()
            .find(|r| r.value.is_none())
            .map(|r| r.status.clone()),
    }
}

/// The ratio of the medians of `metric`, ours over theirs, and the spread of the
/// per-round ratios; `None` without a round in which both have it.
fn ratio(ours: &[&Run], theirs: &[&Run], metric: fn(&Run) -> Option<f64>) -> Option<Ratio> {
    let by_round: BTreeMap<u32, f64> = theirs
        .iter()
        .filter_map(|r| Some((r.round, metric(r)?)))
        .collect();
    let per_round: Vec<f64> = ours
        .iter()
        .filter_map(|r| {
            let other = *by_round.get(&r.round)?;
            (other > 0.0).then(|| metric(r).map(|v| v / other))?
        })
        .collect();
    let (num, den) = (median_of(ours, metric)?, median_of(theirs, metric)?);
    if den <= 0.0 || per_round.is_empty() {
        return None;
    }
    Some(Ratio {
        ratio: num / den,
        min: per_round.iter().copied().fold(f64::INFINITY, f64::min),
        max: per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        rounds: per_round.len(),
    })
}

/// The table's rows: for each test (lat, then bw), size and trespass transfer measured, the
/// four programs' cells and the two ratios.
pub fn summarize(runs: &[Run]) -> Vec<Row> {
    let mut sizes: Vec<u64> = runs.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut rows = Vec::new();
    for test in [Test::Lat, Test::Bw] {
        for &size in &sizes {
            let of = |case: Case| -> Vec<&Run> {
                runs.iter()
                    .filter(|r| r.test == test && r.size == size && r.case == case)
                    .collect()
            };
            let (verbs, rsocket, tcp) = (of(Case::Verbs), of(Case::Rsocket), of(Case::Tcp));
            for trespass in [
                Case::TrespassStream,
                Case::TrespassMessages,
                Case::TrespassLent,
                Case::TrespassSpin,
                Case::TrespassTokio,
                Case::TrespassTokioAdaptive,
                Case::RdmaIo,
            ] {
                let ours = of(trespass);
                if ours.is_empty() {
                    continue;
                }
                let vs_verbs = match test {
                    Test::Lat => ratio(&ours, &verbs, typical),
                    Test::Bw => ratio(&ours, &verbs, value),
                };
                rows.push(Row {
                    test,
                    size,
                    trespass,
                    cells: [cell(&ours), cell(&verbs), cell(&rsocket), cell(&tcp)],
                    vs_verbs,
                    vs_rsocket: ratio(&ours, &rsocket, value),
                });
            }
        }
    }
    rows
}

/// A size as people write it: 8 B, 64 B, 4 KiB, 64 KiB, 1 MiB.
pub fn size_label(size: u64) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size % (1 << 10) == 0 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn value_text(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A cell's median `pick`, or why there is none.
fn cell_text(c: &Cell, pick: Option<f64>) -> String {
    match pick {
        None if c.failed > 0 => format!("failed ({} of {})", c.failed, c.runs),
        None => "-".to_owned(),
        Some(m) if c.failed > 0 => {
            format!("{} ({} of {} failed)", value_text(m), c.failed, c.runs)
        }
        Some(m) => value_text(m),
    }
}

fn ratio_text(r: Option<&Ratio>) -> String {
    r.map_or_else(
        || "-".to_owned(),
        |r| format!("{:.2} ({:.2}..{:.2})", r.ratio, r.min, r.max),
    )
}

fn transfer(r: &Row) -> &'static str {
    match r.trespass {
        Case::TrespassMessages => "trespass messages",
        Case::TrespassLent => "trespass lent messages (zero-copy)",
        Case::TrespassSpin => "trespass stream, spinning",
        Case::TrespassTokio => "trespass stream, tokio",
        Case::TrespassTokioAdaptive => "trespass stream, tokio, adaptive spin",
        Case::RdmaIo => "rdma-io stream, tokio",
        _ => "trespass stream",
    }
}

/// The Markdown tables of `rows`, latency then bandwidth, with a list of the failed runs
/// under them.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut md = String::new();
    let lat: Vec<&Row> = rows.iter().filter(|r| r.test == Test::Lat).collect();
    let bw: Vec<&Row> = rows.iter().filter(|r| r.test == Test::Bw).collect();
    if !lat.is_empty() {
        md.push_str(
            "Latency: one round trip / 2, usec (lower is better); median = t_typical, mean = \
             t_avg (stride-perf) or usec/xfer (rstream).\n\n\
             | size | layer | median | verbs median | layer / verbs (medians; min..max) | mean \
             | verbs mean | rsocket mean | TCP mean | layer / rsocket (means; min..max) |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for r in &lat {
            let [t, v, rs, tcp] = &r.cells;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                size_label(r.size),
                transfer(r),
                cell_text(t, t.typical),
                cell_text(v, v.typical),
                ratio_text(r.vs_verbs.as_ref()),
                cell_text(t, t.median),
                cell_text(v, v.median),
                cell_text(rs, rs.median),
                cell_text(tcp, tcp.median),
                ratio_text(r.vs_rsocket.as_ref()),
            );
        }
    }
    if !bw.is_empty() {
        if !md.is_empty() {
            md.push('\n');
        }
        md.push_str(
            "Bandwidth: MiB/s (2^20 bytes) one way (higher is better).\n\n\
             | size | layer | MiB/s | verbs floor | rsocket | TCP | layer / verbs (min..max) | \
             layer / rsocket (min..max) |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for r in &bw {
            let [t, v, rs, tcp] = &r.cells;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                size_label(r.size),
                transfer(r),
                cell_text(t, t.median),
                cell_text(v, v.median),
                cell_text(rs, rs.median),
                cell_text(tcp, tcp.median),
                ratio_text(r.vs_verbs.as_ref()),
                ratio_text(r.vs_rsocket.as_ref()),
            );
        }
    }
    let mut failures = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in rows {
        let names = [r.trespass, Case::Verbs, Case::Rsocket, Case::Tcp];
        for (c, case) in r.cells.iter().zip(names) {
            if c.failed > 0 && seen.insert((r.test.as_str(), r.size, case)) {
                failures.push(format!(
                    "- {} {} {}: {} of {} runs failed: {}",
                    case.name(),
                    r.test.as_str(),
                    r.size,
                    c.failed,
                    c.runs,
                    c.why.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    if !failures.is_empty() {
        md.push_str("\nRuns without a result:\n\n");
        md.push_str(&failures.join("\n"));
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_parse_and_name_themselves() {
        let jobs = parse_jobs(DEFAULT_JOBS).unwrap();
        assert_eq!(jobs.len(), 17);
        for j in &jobs {
            assert_eq!(Job::parse(&j.name()), Some(*j));
        }
        assert_eq!(
            Job::parse("tokio-lat"),
            Some(Job {
                test: Test::Lat,
                case: Case::TrespassTokio
            })
        );
        assert_eq!(
            Job::parse("messages-bw"),
            Some(Job {
                test: Test::Bw,
                case: Case::TrespassMessages
            })
        );
        for bad in ["trespass-stream-lat", "verbs", "verbs-fast", "udp-lat", ""] {
            assert_eq!(Job::parse(bad), None, "{bad}");
        }
        assert!(parse_jobs("stream-lat,nope").unwrap_err().contains("nope"));
    }

    #[test]
    fn rdma_io_stream_results_are_read() {
        let lat = "rdma-io-stream: x\nrdma-io-stream result: lat 64 B x 1000: mean_us=51.250 \
                   median_us=49.000\n";
        assert_eq!(rdma_io_result(lat), Some((51.25, Some(49.0))));
        let bw = "rdma-io-stream result: bw 65536 B x 500: mib_per_sec=120.500";
        assert_eq!(rdma_io_result(bw), Some((120.5, None)));
        assert_eq!(rdma_io_result("rdma-io-stream: connecting: refused"), None);
        assert_eq!(rdma_io_result("rdma-io-stream result: lat mean_us=x"), None);
        assert_eq!(Job::parse("rdma-io-bw").map(|j| j.case), Some(Case::RdmaIo));
    }

    #[test]
    fn iterations_follow_the_size() {
        assert_eq!(iterations(Test::Lat, 8), 1000);
        assert_eq!(iterations(Test::Lat, 65536), 256);
        assert_eq!(iterations(Test::Lat, 1 << 20), 50);
        assert_eq!(iterations(Test::Bw, 8), 5000);
        assert_eq!(iterations(Test::Bw, 65536), 512);
        assert_eq!(iterations(Test::Bw, 1 << 20), 32);
        assert_eq!(iterations(Test::Bw, 0), 5000);
    }

    #[test]
    fn rstream_rows_are_read() {
        let out = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n\
                   custom    64      1       200     25k        0.03s      0.80      63.92\n";
        assert_eq!(rstream_usec_per_xfer(out), Some(63.92));
        let bw = "custom    1m      32      1       64m        1.90s      0.28   29687.50\n";
        assert_eq!(rstream_usec_per_xfer(bw), Some(29687.5));
        assert_eq!(
            rstream_usec_per_xfer("rconnect: Connection refused\n"),
            None
        );
        assert_eq!(
            rstream_usec_per_xfer("custom 64 1 1 128 0.00s inf 0.00\n"),
            None
        );
        // 1 MiB every 29687.5 usec: 33.68 MiB/s.
        assert!((mib_per_sec(1 << 20, 29687.5) - 33.684).abs() < 1e-3);
    }

    fn run(round: u32, test: Test, case: Case, size: u64, value: Option<f64>) -> Run {
        Run {
            round,
            test,
            case,
            size,
            iterations: 10,
            value,
            typical: value.map(|v| v - 1.5),
            cpu_seconds: Some(0.5),
            status: if value.is_some() {
                "ok".into()
            } else {
                "failed: rconnect: Connection refused".into()
            },
        }
    }

    #[test]
    fn tsv_lines_round_trip() {
        let runs = vec![
            run(1, Test::Lat, Case::TrespassStream, 64, Some(81.5)),
            Run {
                status: "failed: two\tlines\nhere".into(),
                ..run(2, Test::Bw, Case::Rsocket, 1 << 20, None)
            },
        ];
        let mut text = String::from("# method: test\n");
        text += TSV_HEADER;
        text.push('\n');
        for r in &runs {
            text += &write_tsv_line(r);
            text.push('\n');
        }
        let back = parse_tsv(&text).unwrap();
        assert_eq!(back.notes, ["method: test"]);
        assert_eq!(back.runs[0], runs[0]);
        assert_eq!(back.runs[1].value, None);
        assert_eq!(back.runs[1].status, "failed: two lines here");
        assert!(parse_tsv("1\tlat\n").unwrap_err().starts_with("line 1"));
        assert!(parse_tsv("1\tlat\tudp\t8\t1\t1\t1\t1\tok\n").is_err());
    }

    #[test]
    fn rows_take_medians_and_paired_ratio_spreads() {
        let mut runs = Vec::new();
        for (round, (t, v, r)) in [(100.0, 50.0, 80.0), (120.0, 50.0, 60.0), (90.0, 45.0, 90.0)]
            .into_iter()
            .enumerate()
        {
            let round = round as u32 + 1;
            runs.push(run(round, Test::Lat, Case::TrespassStream, 64, Some(t)));
            runs.push(run(round, Test::Lat, Case::Verbs, 64, Some(v)));
            runs.push(run(round, Test::Lat, Case::Rsocket, 64, Some(r)));
            runs.push(run(round, Test::Lat, Case::Tcp, 64, None));
        }
        runs.push(run(1, Test::Bw, Case::TrespassStream, 8, Some(2.0)));
        let rows = summarize(&runs);
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(
            (r.test, r.size, r.trespass),
            (Test::Lat, 64, Case::TrespassStream)
        );
        assert_eq!(r.cells[0].median, Some(100.0));
        assert_eq!(r.cells[0].range, Some((90.0, 120.0)));
        assert_eq!(r.cells[1].median, Some(50.0));
        assert_eq!((r.cells[3].median, r.cells[3].failed), (None, 3));
        let v = r.vs_verbs.unwrap();
        assert_eq!(v.rounds, 3);
        // Per round (typical = value - 1.5): 98.5 / 48.5 = 2.03, 118.5 / 48.5 = 2.44, 88.5 / 43.5.
        assert!((v.min - 98.5 / 48.5).abs() < 1e-12 && (v.max - 118.5 / 48.5).abs() < 1e-12);
        let s = r.vs_rsocket.unwrap();
        assert!((s.ratio - 100.0 / 80.0).abs() < 1e-12);
        assert!((s.min - 1.0).abs() < 1e-12 && (s.max - 2.0).abs() < 1e-12);
        // A row with nothing to compare with.
        assert_eq!(rows[1].vs_verbs, None);
        // trespass / verbs on the typical latencies (value - 1.5): 98.5 / 48.5.
        assert!((v.ratio - 98.5 / 48.5).abs() < 1e-12);
        let md = markdown_table(&rows);
        assert!(
            md.contains("| 64 B | trespass stream | 98.5 | 48.5 | 2.03 (2.03..2.44) | 100 | 50.0 | 80.0 | failed (3 of 3) | 1.25 (1.00..2.00) |"),
            "{md}"
        );
        assert!(
            md.contains("| 8 B | trespass stream | 2.00 | - | - | - | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("- tcp lat 64: 3 of 3 runs failed: failed: rconnect: Connection refused"),
            "{md}"
        );
    }

    #[test]
    fn partly_failed_cells_say_so() {
        let runs = vec![
            run(1, Test::Bw, Case::TrespassStream, 4096, Some(30.0)),
            run(1, Test::Bw, Case::Rsocket, 4096, Some(20.0)),
            run(2, Test::Bw, Case::TrespassStream, 4096, Some(32.0)),
            run(2, Test::Bw, Case::Rsocket, 4096, None),
        ];
        let rows = summarize(&runs);
        let r = &rows[0];
        assert_eq!(
            cell_text(&r.cells[2], r.cells[2].median),
            "20.0 (1 of 2 failed)"
        );
        let s = r.vs_rsocket.unwrap();
        assert_eq!((s.ratio, s.rounds), (31.0 / 20.0, 1));
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(100), "100 B");
    }
}
