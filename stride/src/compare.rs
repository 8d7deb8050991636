//! The statistics of `scripts/compare-perftest`: stride-perf against perftest, row by row,
//! with a confidence interval and a verdict instead of a bare ratio.
//!
//! The script runs, for each row (a test, a size and maybe extra flags), perftest's program
//! and the same stride-perf test alternately, round after round, and writes one line per run
//! into a raw TSV file: the result (average bandwidth in MiB/s, or typical latency in µs), the
//! CPU time the run's processes used (user + system, server and client) and the number of
//! messages. This module reads that file and makes the table (`stride-compare`, in
//! `src/bin/`).
//!
//! Per row and metric, the ratio is stride's median over the rounds divided by perftest's.
//! Its 95 % interval comes from a paired bootstrap over the rounds: a round is one run of
//! each program, close in time, so a resample draws whole rounds, keeping whatever the
//! machine was doing then common to both. The verdict says which program is better when the
//! whole interval is on one side of 1, and "indistinguishable at N rounds" otherwise. The
//! resampling uses a fixed seed, so the same raw file always gives the same table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The number of bootstrap resamples per interval.
pub const RESAMPLES: usize = 4000;

/// Which program a run was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tool {
    /// perftest's `ib_*` program.
    Perftest,
    /// `stride-perf`.
    Stride,
}

/// One run of one program, as the raw file records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The row: test (`write_bw`), size and extra flags (`-q 4`, or empty).
    pub row: RowKey,
    /// Which program ran.
    pub tool: Tool,
    /// The round, from 1.
    pub round: u32,
    /// MiB/s for bandwidth, µs (typical) for latency; `None` when the run gave no result.
    pub value: Option<f64>,
    /// User + system CPU seconds of the run's processes; `None` when not recorded.
    pub cpu_seconds: Option<f64>,
    /// Messages the run moved (for CPU per message); `None` when not recorded.
    pub messages: Option<u64>,
}

/// What identifies a row of the table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    /// `write_bw`, `read_lat`, ...
    pub test: String,
    /// Message size in bytes.
    pub size: u64,
    /// Flags both programs got beyond the shared ones (`-q 4`), or empty.
    pub flags: String,
}

impl RowKey {
    /// True for latency rows (lower is better).
    pub fn is_latency(&self) -> bool {
        self.test.ends_with("_lat")
    }

    /// The row as a label: `write_bw 65536 -q 4`.
    pub fn label(&self) -> String {
        if self.flags.is_empty() {
            format!("{} {}", self.test, self.size)
        } else {
            format!("{} {} {}", self.test, self.size, self.flags)
        }
    }
}

/// The raw file: its comment lines (the environment) and its runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Raw {
    /// The text of each `# ` line, in order.
    pub notes: Vec<String>,
    /// Every run, in file order.
    pub runs: Vec<Run>,
}

fn number(field: Option<&str>) -> Option<f64> {
    field
        .and_then(|f| f.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// Reads the raw TSV. Lines: `test size flags tool round value cpu_seconds messages`, tab
/// separated (the older five-column form `test size tool round value` reads too, without
/// flags and CPU); `# ` lines are notes. A value that is not a number (`nan`, `inf`, a failed
/// run) is no result. Malformed lines are reported with their number.
pub fn parse_raw(text: &str) -> Result<Raw, String> {
    let mut raw = Raw::default();
    for (i, line) in text.lines().enumerate() {
        if let Some(note) = line.strip_prefix('#') {
            raw.notes.push(note.trim().to_owned());
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        let (test, size, flags, tool, round, rest) = match f.len() {
            5 => (f[0], f[1], "", f[2], f[3], &f[4..]),
            8 => (f[0], f[1], f[2], f[3], f[4], &f[5..]),
            _ => return Err(bad("expected 5 or 8 tab-separated fields")),
        };
        let tool = match tool {
            "perftest" => Tool::Perftest,
            "stride" => Tool::Stride,
            _ => return Err(bad("the tool is neither perftest nor stride")),
        };
        let size = size.parse().map_err(|_| bad("the size is not a number"))?;
        let round = round
            .parse()
            .map_err(|_| bad("the round is not a number"))?;
        raw.runs.push(Run {
            row: RowKey {
                test: test.to_owned(),
                size,
                flags: if flags == "-" { "" } else { flags }.to_owned(),
            },
            tool,
            round,
            value: number(rest.first().copied()),
            cpu_seconds: number(rest.get(1).copied()),
            messages: rest
                .get(2)
                .and_then(|m| m.trim().parse::<u64>().ok())
                .filter(|&m| m > 0),
        });
    }
    Ok(raw)
}

/// The median of `v` (which it sorts); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A small deterministic generator (SplitMix64): the same raw file gives the same table.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        // n is small (rounds): the modulo bias is below 2^-50.
        (self.next_u64() % n as u64) as usize
    }
}

/// A ratio with its 95 % bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// stride's median / perftest's median.
    pub ratio: f64,
    /// The 2.5th percentile of the resampled ratios.
    pub lo: f64,
    /// The 97.5th percentile.
    pub hi: f64,
    /// The rounds that had a result from both programs.
    pub rounds: usize,
}

/// The ratio of medians `stride / perftest` over `pairs` (one `(perftest, stride)` per
/// round) and its 95 % paired-bootstrap percentile interval. `None` with no pair, or when
/// perftest's median is 0.
pub fn bootstrap_ratio(pairs: &[(f64, f64)], resamples: usize, seed: u64) -> Option<Interval> {
    let n = pairs.len();
    let ratio_of = |p: &mut Vec<f64>, s: &mut Vec<f64>| -> Option<f64> {
        let (mp, ms) = (median(p)?, median(s)?);
        (mp > 0.0).then(|| ms / mp)
    };
    let mut p: Vec<f64> = pairs.iter().map(|x| x.0).collect();
    let mut s: Vec<f64> = pairs.iter().map(|x| x.1).collect();
    let ratio = ratio_of(&mut p, &mut s)?;
    let mut rng = SplitMix::new(seed);
    let mut ratios = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        p.clear();
        s.clear();
        for _ in 0..n {
            let k = rng.below(n);
            p.push(pairs[k].0);
            s.push(pairs[k].1);
        }
        if let Some(r) = ratio_of(&mut p, &mut s) {
            ratios.push(r);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((ratios.len() - 1) as f64 * q).round() as usize;
        ratios[i]
    };
    if ratios.is_empty() {
        return None;
    }
    Some(Interval {
        ratio,
        lo: at(0.025),
        hi: at(0.975),
        rounds: n,
    })
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Bandwidth.
    Higher,
    /// Latency, CPU per message.
    Lower,
}

/// The verdict on an interval: which program wins when the whole interval is on its side
/// of 1, else "indistinguishable at N rounds". `faster` names the winning quality ("faster",
/// "cheaper").
pub fn verdict(iv: &Interval, better: Better, faster: &str) -> String {
    let stride_wins = match better {
        Better::Higher => iv.lo > 1.0,
        Better::Lower => iv.hi < 1.0,
    };
    let perftest_wins = match better {
        Better::Higher => iv.hi < 1.0,
        Better::Lower => iv.lo > 1.0,
    };
    if stride_wins {
        format!("stride {faster}")
    } else if perftest_wins {
        format!("perftest {faster}")
    } else {
        format!("indistinguishable at {} rounds", iv.rounds)
    }
}

/// One row of the table, computed.
#[derive(Debug, Clone, PartialEq)]
pub struct RowResult {
    /// The row.
    pub key: RowKey,
    /// perftest's and stride's medians of the result; `None` without any result.
    pub medians: (Option<f64>, Option<f64>),
    /// The result's ratio and interval.
    pub value: Option<Interval>,
    /// perftest's and stride's medians of CPU µs per message.
    pub cpu_medians: (Option<f64>, Option<f64>),
    /// CPU per message: ratio and interval.
    pub cpu: Option<Interval>,
    /// Runs without a result: perftest's, stride's.
    pub failed: (usize, usize),
}

/// Pairs the rounds of a row: `(perftest, stride)` of `metric` for every round in which both
/// programs have one.
fn pairs(runs: &[&Run], metric: impl Fn(&Run) -> Option<f64>) -> Vec<(f64, f64)> {
    let mut by_round: BTreeMap<u32, (Option<f64>, Option<f64>)> = BTreeMap::new();
    for r in runs {
        let e = by_round.entry(r.round).or_default();
        match r.tool {
            Tool::Perftest => e.0 = metric(r),
            Tool::Stride => e.1 = metric(r),
        }
    }
    by_round
        .into_values()
        .filter_map(|(p, s)| Some((p?, s?)))
        .collect()
}

fn medians(pairs: &[(f64, f64)]) -> (Option<f64>, Option<f64>) {
    let mut p: Vec<f64> = pairs.iter().map(|x| x.0).collect();
    let mut s: Vec<f64> = pairs.iter().map(|x| x.1).collect();
    (median(&mut p), median(&mut s))
}

/// CPU microseconds per message of a run.
fn cpu_per_message(r: &Run) -> Option<f64> {
    Some(r.cpu_seconds? * 1e6 / r.messages? as f64)
}

/// Every row of `raw`, in the order the rows first appear.
pub fn analyse(raw: &Raw, resamples: usize) -> Vec<RowResult> {
    let mut order: Vec<RowKey> = Vec::new();
    for r in &raw.runs {
        if !order.contains(&r.row) {
            order.push(r.row.clone());
        }
    }
    order
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let runs: Vec<&Run> = raw.runs.iter().filter(|r| r.row == key).collect();
            let failed = |tool| {
                runs.iter()
                    .filter(|r| r.tool == tool && r.value.is_none())
                    .count()
            };
            let values = pairs(&runs, |r| r.value);
            let cpus = pairs(&runs, cpu_per_message);
            let seed = 0x5eed_0000 + i as u64;
            RowResult {
                medians: medians(&values),
                value: bootstrap_ratio(&values, resamples, seed),
                cpu_medians: medians(&cpus),
                cpu: bootstrap_ratio(&cpus, resamples, seed ^ 0xc0u64),
                failed: (failed(Tool::Perftest), failed(Tool::Stride)),
                key,
            }
        })
        .collect()
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn interval_cells(iv: Option<&Interval>) -> (String, String) {
    match iv {
        Some(iv) => (
            format!("{:.2}", iv.ratio),
            format!("{:.2}-{:.2}", iv.lo, iv.hi),
        ),
        None => ("-".to_owned(), "-".to_owned()),
    }
}

/// The Markdown table of `rows`: per row both medians, the ratio with its interval and the
/// verdict, then the same for CPU per message.
pub fn markdown_table(rows: &[RowResult]) -> String {
    let mut md = String::new();
    md.push_str(
        "| row | perftest | stride | ratio | 95% interval | verdict | CPU/msg perftest [usec] \
         | CPU/msg stride [usec] | CPU ratio | CPU 95% interval | CPU verdict |\n",
    );
    md.push_str("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |\n");
    for r in rows {
        let better = if r.key.is_latency() {
            Better::Lower
        } else {
            Better::Higher
        };
        let (ratio, span) = interval_cells(r.value.as_ref());
        let (cpu_ratio, cpu_span) = interval_cells(r.cpu.as_ref());
        let verdict_of = |iv: Option<&Interval>, b, word| {
            iv.map_or_else(|| "no result".to_owned(), |iv| verdict(iv, b, word))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {ratio} | {span} | {} | {} | {} | {cpu_ratio} | {cpu_span} | {} |",
            r.key.label(),
            cell(r.medians.0),
            cell(r.medians.1),
            verdict_of(r.value.as_ref(), better, "faster"),
            cell(r.cpu_medians.0),
            cell(r.cpu_medians.1),
            verdict_of(r.cpu.as_ref(), Better::Lower, "cheaper"),
        );
    }
    md
}

/// The ratios of `rows` as an SVG bar chart with each interval as a whisker and a line at 1.
pub fn svg_chart(rows: &[RowResult]) -> String {
    let (w, h, left, top, bottom) = (900.0, 440.0, 60.0, 40.0, 130.0);
    let (pw, ph) = (w - left - 20.0, h - top - bottom);
    let max = rows
        .iter()
        .filter_map(|r| r.value.map(|iv| iv.hi.max(iv.ratio)))
        .fold(1.5f64, f64::max)
        .min(4.0);
    let max = (max * 2.0).ceil() / 2.0;
    let y = |v: f64| top + ph - v.min(max) / max * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"20\" font-size=\"14\" text-anchor=\"middle\">stride-perf / perftest \
         (bw: higher is better; lat: lower is better), with 95% intervals</text>",
        w / 2.0
    );
    let mut t = 0.0;
    while t <= max + 1e-9 {
        let colour = if (t - 1.0f64).abs() < 1e-9 {
            "black"
        } else {
            "#ddd"
        };
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{colour}\"/>",
            left + pw,
            y(t),
            y(t)
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{t:.1}</text>",
            left - 5.0,
            y(t) + 4.0
        );
        t += 0.5;
    }
    let bw = pw / rows.len().max(1) as f64;
    for (i, r) in rows.iter().enumerate() {
        let x = left + i as f64 * bw + bw * 0.15;
        let mid = x + bw * 0.35;
        if let Some(iv) = r.value {
            let colour = if r.key.is_latency() {
                "#d95f02"
            } else {
                "#1b9e77"
            };
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"/>",
                y(iv.ratio),
                bw * 0.7,
                top + ph - y(iv.ratio)
            );
            let _ = writeln!(
                s,
                "<line x1=\"{mid:.1}\" x2=\"{mid:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>",
                y(iv.lo),
                y(iv.hi)
            );
        }
        let _ = writeln!(
            s,
            "<text transform=\"translate({mid:.1},{}) rotate(-50)\" text-anchor=\"end\">{}</text>",
            top + ph + 12.0,
            r.key.label()
        );
    }
    let _ = writeln!(
        s,
        "<text transform=\"translate(15,{}) rotate(-90)\" text-anchor=\"middle\">ratio stride / \
         perftest</text>",
        top + ph / 2.0
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn the_raw_file_reads_both_forms() {
        let raw = parse_raw(
            "# 6.12; 2 CPUs\nwrite_bw\t65536\tperftest\t1\t40.5\n\
             write_bw\t65536\t-q 4\tstride\t2\tnan\t1.25\t5000\n\
             read_lat\t8\t-\tstride\t1\t31.5\t0.5\t2000\n\n",
        )
        .unwrap();
        assert_eq!(raw.notes, ["6.12; 2 CPUs"]);
        assert_eq!(raw.runs.len(), 3);
        assert_eq!(raw.runs[0].row.label(), "write_bw 65536");
        assert_eq!(
            (raw.runs[0].value, raw.runs[0].cpu_seconds),
            (Some(40.5), None)
        );
        assert_eq!(raw.runs[1].row.label(), "write_bw 65536 -q 4");
        assert_eq!(raw.runs[1].value, None, "nan is no result");
        assert_eq!(raw.runs[1].messages, Some(5000));
        assert_eq!(raw.runs[2].row.flags, "");
        assert!(raw.runs[2].row.is_latency());
        assert_eq!(cpu_per_message(&raw.runs[2]), Some(250.0));
        let e = parse_raw("write_bw\t1\tnobody\t1\t2\n").unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        assert!(parse_raw("a\tb\n").is_err());
    }

    #[test]
    fn the_bootstrap_is_deterministic_and_brackets_the_ratio() {
        let pairs: Vec<(f64, f64)> = (0..9)
            .map(|i| (100.0 + i as f64, 110.0 + 2.0 * i as f64))
            .collect();
        let a = bootstrap_ratio(&pairs, 2000, 7).unwrap();
        let b = bootstrap_ratio(&pairs, 2000, 7).unwrap();
        assert_eq!(a, b, "the same seed gives the same interval");
        // Medians 104 and 118.
        assert!((a.ratio - 118.0 / 104.0).abs() < 1e-12);
        assert!(a.lo <= a.ratio && a.ratio <= a.hi, "{a:?}");
        assert!(
            a.lo > 1.0,
            "every stride round is above every perftest round: {a:?}"
        );
        assert_eq!(a.rounds, 9);
        assert_eq!(bootstrap_ratio(&[], 100, 1), None);
        assert_eq!(bootstrap_ratio(&[(0.0, 1.0)], 100, 1), None);
    }

    #[test]
    fn identical_programs_are_indistinguishable() {
        // The same numbers in a shuffled order: the interval straddles 1.
        let p = [40.0, 52.0, 47.0, 38.0, 55.0, 44.0, 50.0];
        let s = [52.0, 38.0, 55.0, 47.0, 40.0, 50.0, 44.0];
        let pairs: Vec<(f64, f64)> = p.into_iter().zip(s).collect();
        let iv = bootstrap_ratio(&pairs, RESAMPLES, 3).unwrap();
        assert_eq!(iv.ratio, 1.0);
        assert!(iv.lo < 1.0 && iv.hi > 1.0, "{iv:?}");
        assert_eq!(
            verdict(&iv, Better::Higher, "faster"),
            "indistinguishable at 7 rounds"
        );
    }

    #[test]
    fn verdicts_follow_the_direction_of_better() {
        let above = Interval {
            ratio: 1.2,
            lo: 1.1,
            hi: 1.3,
            rounds: 5,
        };
        let below = Interval {
            ratio: 0.8,
            lo: 0.7,
            hi: 0.9,
            rounds: 5,
        };
        assert_eq!(verdict(&above, Better::Higher, "faster"), "stride faster");
        assert_eq!(verdict(&above, Better::Lower, "faster"), "perftest faster");
        assert_eq!(verdict(&below, Better::Higher, "faster"), "perftest faster");
        assert_eq!(verdict(&below, Better::Lower, "cheaper"), "stride cheaper");
        let touching = Interval { lo: 1.0, ..above };
        assert_eq!(
            verdict(&touching, Better::Higher, "faster"),
            "indistinguishable at 5 rounds"
        );
    }

    #[test]
    fn rows_pair_rounds_and_count_failures() {
        let mut text = String::new();
        for round in 1..=6 {
            // perftest's round 3 failed; stride is twice as fast, half the CPU.
            let p = if round == 3 {
                "nan".to_owned()
            } else {
                "10".to_owned()
            };
            text += &format!("read_lat\t8\t-\tperftest\t{round}\t{p}\t2.0\t1000\n");
            text += &format!("read_lat\t8\t-\tstride\t{round}\t5\t1.0\t1000\n");
        }
        text += "write_bw\t64\t-\tstride\t1\t3\t1\t10\n";
        let rows = analyse(&parse_raw(&text).unwrap(), 500);
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(r.failed, (1, 0));
        let iv = r.value.unwrap();
        assert_eq!((iv.ratio, iv.lo, iv.hi, iv.rounds), (0.5, 0.5, 0.5, 5));
        assert_eq!(r.medians, (Some(10.0), Some(5.0)));
        // CPU per message is recorded for every round, failed or not.
        let cpu = r.cpu.unwrap();
        assert_eq!((cpu.ratio, cpu.rounds), (0.5, 6));
        assert_eq!(r.cpu_medians, (Some(2000.0), Some(1000.0)));
        // A row that only one program ran has no ratio.
        assert_eq!(rows[1].value, None);
        let md = markdown_table(&rows);
        assert!(md.contains("| read_lat 8 | 10.00 | 5.00 | 0.50 | 0.50-0.50 | stride faster |"));
        assert!(md.contains("| 0.50 | 0.50-0.50 | stride cheaper |"), "{md}");
        assert!(
            md.contains("| write_bw 64 | - | - | - | - | no result |"),
            "{md}"
        );
        let svg = svg_chart(&rows);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("read_lat 8"));
    }
}
