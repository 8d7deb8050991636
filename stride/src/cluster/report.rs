//! The report of a whole cluster run: one table of every pair, the pair matrix, the pairs
//! that stand out as slow (which link is bad?), and one JSON file; rank 0 writes it.
//!
//! Each pair is summed up by one figure, that of its largest message size: the average
//! bandwidth of a bandwidth test, the typical (median) latency of a latency test. A pair is
//! flagged slow when its figure is more than [`OUTLIER_MADS`] scaled median absolute
//! deviations worse than the median of all pairs (below it for bandwidth, above for
//! latency); the deviation counts as at least [`MAD_FLOOR`] of the median, so that a set of
//! equally good links, whose deviation is near zero, flags nobody for noise.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::launcher::LauncherKind;
use super::wire::{Member, PairResult};
use crate::cli::{Pattern, Test, Verb};
use crate::params::TestParams;
use crate::report::{SideReport, SizeResult, RULE};

/// How many scaled MADs from the median flag a pair.
pub const OUTLIER_MADS: f64 = 3.0;
/// The least deviation counted, as a fraction of the median.
pub const MAD_FLOOR: f64 = 0.05;
/// How many of the worst pairs the report names, flagged or not.
pub const SLOWEST_SHOWN: usize = 3;
/// The factor that makes a MAD estimate a normal distribution's standard deviation.
const MAD_SCALE: f64 = 1.4826;

/// One pair's figure and how it compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairFigure {
    /// The initiating rank.
    pub client: usize,
    /// The target rank.
    pub server: usize,
    /// Their hosts.
    pub client_host: String,
    /// The target's host.
    pub server_host: String,
    /// The figure (see [`Matrix::quantity`]).
    pub value: f64,
    /// How far from the median, in percent (negative: lower).
    pub from_median_percent: f64,
    /// Whether it is flagged slow.
    pub flagged: bool,
}

/// The pair matrix: one figure per measured pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Matrix {
    /// What the figures are, with the unit.
    pub quantity: String,
    /// Whether higher is better (bandwidth) or lower (latency).
    pub higher_is_better: bool,
    /// The message size the figures are of.
    pub bytes: u64,
    /// `cells[client][server]`; `None` where the pattern ran no such pair.
    pub cells: Vec<Vec<Option<f64>>>,
    /// The median over the measured pairs.
    pub median: f64,
    /// The median absolute deviation (unscaled).
    pub mad: f64,
    /// The value beyond which a pair is flagged (below it for bandwidth, above for latency).
    pub threshold: f64,
}

/// One pair's results, both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairEntry {
    /// The initiating rank.
    pub client: usize,
    /// The target rank.
    pub server: usize,
    /// The initiator's report.
    pub client_side: SideReport,
    /// The target's report.
    pub server_side: SideReport,
}

impl PairEntry {
    /// The results of the side that measured: the initiator's, or the target's when the
    /// initiator measured nothing.
    pub fn measured(&self) -> &[SizeResult] {
        if self.client_side.results.is_empty() {
            &self.server_side.results
        } else {
            &self.client_side.results
        }
    }
}

/// The JSON file of a cluster run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// Always "stride-perf".
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// The launcher the ranks came from.
    pub launcher: LauncherKind,
    /// The pattern.
    pub pattern: Pattern,
    /// The parameters every pair ran with.
    pub params: TestParams,
    /// Whether bandwidth is in Gb/s (else MiB/s).
    pub report_gbits: bool,
    /// Every rank, by rank.
    pub members: Vec<Member>,
    /// Every pair's results, in run order.
    pub pairs: Vec<PairEntry>,
    /// The pair matrix.
    pub matrix: Matrix,
    /// The worst pairs, worst first, at most [`SLOWEST_SHOWN`] plus every flagged one.
    pub slowest: Vec<PairFigure>,
}

/// The median of `values` (not empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The figure of one pair: of its largest size.
fn figure(results: &[SizeResult], gbits: bool) -> Option<(u64, f64)> {
    results.iter().max_by_key(|r| r.bytes()).map(|r| match r {
        SizeResult::Bandwidth(b) => (b.bytes, b.avg(gbits)),
        SizeResult::Latency(l) => (l.bytes, l.summary.t_typical),
    })
}

impl ClusterReport {
    /// The report of these results.
    pub fn new(
        launcher: LauncherKind,
        pattern: Pattern,
        params: TestParams,
        report_gbits: bool,
        members: Vec<Member>,
        results: Vec<PairResult>,
    ) -> Self {
        let n = members.len();
        let pairs: Vec<PairEntry> = results
            .into_iter()
            .map(|r| PairEntry {
                client: r.pair.client,
                server: r.pair.server,
                client_side: r.client,
                server_side: r.server,
            })
            .collect();
        let higher_is_better = params.test == Test::Bw;
        let quantity = match (params.test, report_gbits) {
            (Test::Bw, true) => "average bandwidth [Gb/s]",
            (Test::Bw, false) => "average bandwidth [MiB/s]",
            (Test::Lat, _) => "typical latency [usec]",
        };
        let mut cells = vec![vec![None; n]; n];
        let mut bytes = 0;
        let mut figures = Vec::new();
        for p in &pairs {
            if let Some((b, v)) = figure(p.measured(), report_gbits) {
                if let Some(cell) = cells
                    .get_mut(p.client)
                    .and_then(|row| row.get_mut(p.server))
                {
                    *cell = Some(v);
                }
                bytes = bytes.max(b);
                figures.push((p.client, p.server, v));
            }
        }
        let mut values: Vec<f64> = figures.iter().map(|f| f.2).collect();
        let med = median(&mut values);
        let mut deviations: Vec<f64> = values.iter().map(|v| (v - med).abs()).collect();
        let mad = median(&mut deviations);
        let spread = OUTLIER_MADS * (MAD_SCALE * mad).max(MAD_FLOOR * med.abs());
        let threshold = if higher_is_better {
            med - spread
        } else {
            med + spread
        };
        // With fewer than three pairs there is no "usual" to stand out from.
        let can_flag = figures.len() >= 3;
        let host = |rank: usize| {
            members
                .get(rank)
                .map_or_else(|| "?".to_owned(), |m| m.host.clone())
        };
        let mut ranked: Vec<PairFigure> = figures
            .iter()
            .map(|&(client, server, value)| PairFigure {
                client,
                server,
                client_host: host(client),
                server_host: host(server),
                value,
                from_median_percent: if med == 0.0 {
                    0.0
                } else {
                    (value - med) / med * 100.0
                },
                flagged: can_flag
                    && if higher_is_better {
                        value < threshold
                    } else {
                        value > threshold
                    },
            })
            .collect();
        ranked.sort_by(|a, b| {
            if higher_is_better {
                a.value.total_cmp(&b.value)
            } else {
                b.value.total_cmp(&a.value)
            }
        });
        let slowest: Vec<PairFigure> = ranked
            .into_iter()
            .enumerate()
            .filter(|(i, f)| *i < SLOWEST_SHOWN || f.flagged)
            .map(|(_, f)| f)
            .collect();
        ClusterReport {
            tool: "stride-perf".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            launcher,
            pattern,
            params,
            report_gbits,
            members,
            pairs,
            matrix: Matrix {
                quantity: quantity.to_owned(),
                higher_is_better,
                bytes,
                cells,
                median: med,
                mad,
                threshold,
            },
            slowest,
        }
    }

    /// The title of the run: "RDMA WRITE bandwidth, 4 ranks (Open MPI), pattern pairs".
    pub fn title(&self) -> String {
        let verb = match self.params.verb {
            Verb::Send => "SEND",
            Verb::Write => "RDMA WRITE",
            Verb::Read => "RDMA READ",
            Verb::Atomic => "atomic",
        };
        let test = match self.params.test {
            Test::Bw => "bandwidth",
            Test::Lat => "latency",
        };
        format!(
            "{verb} {test}, {} ranks ({}), pattern {}",
            self.members.len(),
            self.launcher,
            self.pattern.as_str()
        )
    }

    /// The report as printed: ranks, every pair's rows, the matrix and the slowest pairs.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let gbits = self.report_gbits;
        let _ = writeln!(out, "{RULE}");
        let _ = writeln!(
            out,
            "                    {} (stride-perf cluster)",
            self.title()
        );
        let _ = writeln!(
            out,
            " rank  host              pid       pair address          device  port  GID"
        );
        for m in &self.members {
            let _ = writeln!(
                out,
                " {:<4}  {:<16}  {:<8}  {:<20}  {:<6}  {:<4}  {}",
                m.rank, m.host, m.pid, m.pair_addr, m.device, m.port, m.gid
            );
        }
        // perftest's columns, as a pair run prints them, after the pair.
        let header = match self.params.test {
            Test::Bw => crate::report::bandwidth_header(gbits),
            Test::Lat => crate::report::latency_header(),
        };
        for line in header.lines() {
            if line == RULE {
                let _ = writeln!(out, "{line}");
            } else {
                let _ = writeln!(out, " pair    {line}");
            }
        }
        for p in &self.pairs {
            for r in p.measured() {
                let pair = format!("{} -> {}", p.client, p.server);
                let _ = writeln!(out, " {pair:<8}{}", crate::report::row_for(r, gbits));
            }
        }
        let _ = writeln!(out, "{RULE}");
        out.push_str(&self.matrix_text());
        out.push_str(&self.slowest_text());
        let _ = writeln!(out, "{RULE}");
        out
    }

    /// The pair matrix as text: initiator rank by row, target by column.
    pub fn matrix_text(&self) -> String {
        let m = &self.matrix;
        let mut out = String::new();
        let _ = writeln!(
            out,
            " Pair matrix: {} at {} B, initiating rank (row) to target rank (column)",
            m.quantity, m.bytes
        );
        let _ = write!(out, "       ");
        for j in 0..m.cells.len() {
            let _ = write!(out, " {j:>10}");
        }
        let _ = writeln!(out);
        for (i, row) in m.cells.iter().enumerate() {
            let _ = write!(out, " {i:>5} ");
            for cell in row {
                match cell {
                    Some(v) => {
                        let _ = write!(out, " {v:>10.2}");
                    }
                    None => {
                        let _ = write!(out, " {:>10}", "-");
                    }
                }
            }
            let _ = writeln!(out);
        }
        out
    }

    /// The slowest pairs, and which are flagged.
    pub fn slowest_text(&self) -> String {
        let m = &self.matrix;
        let mut out = String::new();
        let (worse, side) = if m.higher_is_better {
            ("below", "slowest")
        } else {
            ("above", "slowest (highest latency)")
        };
        let _ = writeln!(
            out,
            " Median {:.2}, MAD {:.2}: a pair {worse} {:.2} (median {} {OUTLIER_MADS}x the \
             scaled MAD, at least {}% of the median) is flagged",
            m.median,
            m.mad,
            m.threshold,
            if m.higher_is_better { "-" } else { "+" },
            MAD_FLOOR * 100.0
        );
        let flagged = self.slowest.iter().filter(|f| f.flagged).count();
        let _ = writeln!(out, " {side} pairs ({flagged} flagged):");
        for f in &self.slowest {
            let _ = writeln!(
                out,
                "   {} -> {} ({} -> {}): {:.2}, {:+.1}% from the median{}",
                f.client,
                f.server,
                f.client_host,
                f.server_host,
                f.value,
                f.from_median_percent,
                if f.flagged {
                    "  FLAGGED: check this link"
                } else {
                    ""
                }
            );
        }
        out
    }

    /// Prints the report on standard output.
    pub fn print(&self) {
        print!("{}", self.text());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bandwidth::BandwidthResult;
    use crate::cluster::wire::PairJob;

    pub(crate) fn member(rank: usize) -> Member {
        Member {
            rank,
            size: 4,
            host: format!("n{rank:02}"),
            pid: 100 + rank as u32,
            device: "rxe0".into(),
            port: 1,
            gid: "1 ::ffff:198.18.0.1 (RoCE v2)".into(),
            pair_addr: "198.18.0.1:4000".into(),
        }
    }

    fn side(mib_per_s: f64) -> SideReport {
        SideReport {
            role: "client".into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            intervals: Vec::new(),
            results: vec![SizeResult::Bandwidth(BandwidthResult {
                bytes: 65536,
                iterations: 1000,
                peak_bytes_per_sec: None,
                avg_bytes_per_sec: mib_per_s * 1_048_576.0,
                msg_rate_mpps: 0.01,
                intervals: None,
                cpu_util_percent: None,
            })],
        }
    }

    /// A 4-rank pairs report in which `slow` runs at `slow_rate` and the rest near 100.
    pub(crate) fn report(slow: (usize, usize), slow_rate: f64) -> ClusterReport {
        let mut results = Vec::new();
        for (k, job) in Pattern::Pairs.steps(4).into_iter().flatten().enumerate() {
            let rate = if (job.client, job.server) == slow {
                slow_rate
            } else {
                100.0 + (k % 3) as f64
            };
            let mut server = side(0.0);
            server.results.clear();
            results.push(PairResult {
                pair: PairJob {
                    client: job.client,
                    server: job.server,
                },
                client: side(rate),
                server,
            });
        }
        let params = crate::params::from_args(&["write", "bw"]).unwrap();
        ClusterReport::new(
            LauncherKind::OpenMpi,
            Pattern::Pairs,
            params,
            false,
            (0..4).map(member).collect(),
            results,
        )
    }

    #[test]
    fn the_bad_link_is_flagged_and_named_first() {
        let r = report((2, 3), 40.0);
        assert_eq!(r.matrix.cells[2][3].map(f64::round), Some(40.0));
        assert_eq!(r.matrix.cells[1][1], None);
        assert_eq!(r.slowest[0].client, 2);
        assert_eq!(r.slowest[0].server, 3);
        assert!(r.slowest[0].flagged);
        assert_eq!(r.slowest.iter().filter(|f| f.flagged).count(), 1);
        let text = r.text();
        assert!(text.contains("2 -> 3 (n02 -> n03): 40.00"), "{text}");
        assert!(text.contains("FLAGGED"), "{text}");
        assert!(text.contains(" 2 -> 3   65536"), "{text}");
    }

    #[test]
    fn equal_links_flag_nobody() {
        let r = report((2, 3), 101.0);
        assert!(r.slowest.iter().all(|f| !f.flagged), "{:?}", r.slowest);
        assert_eq!(r.slowest.len(), SLOWEST_SHOWN);
        // The JSON round-trips.
        let json = serde_json::to_string(&r).unwrap();
        let back: ClusterReport = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (back.pairs.len(), &back.matrix.cells),
            (12, &r.matrix.cells)
        );
        assert_eq!(back.members, r.members);
    }
}
