//! Printing results the way perftest prints them, and the JSON file that holds both sides.
//!
//! The column layout follows perftest's, so the two tools' outputs line up when put side by
//! side. The JSON file is written once, at the end, and holds this side's results and, when
//! the peer measured too (`-b`, or the server of a bandwidth test), the peer's.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bandwidth::{BandwidthResult, Interval};
use crate::latency::LatencySummary;
use crate::params::TestParams;

/// One size's latency result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyResult {
    /// Message size in bytes.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// The statistics, in microseconds.
    pub summary: LatencySummary,
}

/// One size's result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SizeResult {
    /// A bandwidth test's.
    Bandwidth(BandwidthResult),
    /// A latency test's.
    Latency(LatencyResult),
}

impl SizeResult {
    /// The message size.
    pub fn bytes(&self) -> u64 {
        match self {
            SizeResult::Bandwidth(r) => r.bytes,
            SizeResult::Latency(r) => r.bytes,
        }
    }
}

/// What one side measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideReport {
    /// "client" or "server".
    pub role: String,
    /// The RDMA device used.
    pub device: String,
    /// The GID index used.
    pub gid_index: u8,
    /// The memory of the test buffers (`host`, `huge pages (2048 KiB)`, `GPU 0 (...)`);
    /// absent in files written before stride-perf recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<String>,
    /// How the QPs' buffers are registered (`one memory region shared by 4 QPs`, `4 memory
    /// regions, one per QP (--mr-per-qp)`); absent in files written before stride-perf
    /// recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_regions: Option<String>,
    /// The kernel's clocksource and what one clock reading cost (`tsc, 23 ns per read`),
    /// and whether the clocksource changed during the run; absent in files written before
    /// stride-perf recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<String>,
    /// How this side posted its work requests (`ibv_wr_* (extended QPs)`, `ibv_post_send
    /// (classic QPs)`, with the reason when the device lacked what was asked); absent in
    /// files written before stride-perf recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub posting: Option<String>,
    /// How this side polled its completion queues (`ibv_poll_cq (classic CQs)` or
    /// `ibv_start_poll (extended CQs)`, likewise); absent in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polling: Option<String>,
    /// One entry per size, in run order.
    pub results: Vec<SizeResult>,
    /// The reporting intervals of a duration run (`-D`, `--run-infinitely`), one series per
    /// size; empty otherwise and in files written before stride-perf had them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<IntervalSeries>,
}

/// The intervals of one size's duration run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntervalSeries {
    /// Message size in bytes.
    pub bytes: u64,
    /// The reporting period in seconds (`--report-interval`).
    pub period_s: f64,
    /// The intervals in run order.
    pub intervals: Vec<Interval>,
}

/// The most intervals a report sent to the peer carries: the out-of-band channel's frames
/// are at most 1 MiB. A longer series keeps its first intervals in the peer's file (this
/// side's own file has them all).
pub const PEER_MAX_INTERVALS: usize = 4096;

impl SideReport {
    /// The report as sent to the peer: the interval series cut to [`PEER_MAX_INTERVALS`]
    /// in all.
    pub fn for_peer(&self) -> Self {
        let mut out = self.clone();
        let mut left = PEER_MAX_INTERVALS;
        for series in &mut out.intervals {
            series.intervals.truncate(left);
            left -= series.intervals.len();
        }
        out
    }

    /// The report with its text made printable ([`sideway::peer_text::printable`]): the
    /// peer's report is printed and written to the JSON file, which a person may print in
    /// turn, and JSON escapes only the C0 controls.
    pub fn printable(self) -> Self {
        let text = |s: &str| sideway::peer_text::printable(s, sideway::peer_text::PEER_TEXT_MAX);
        SideReport {
            role: text(&self.role),
            device: text(&self.device),
            buffer: self.buffer.as_deref().map(text),
            memory_regions: self.memory_regions.as_deref().map(text),
            clock: self.clock.as_deref().map(text),
            posting: self.posting.as_deref().map(text),
            polling: self.polling.as_deref().map(text),
            ..self
        }
    }
}

/// The most bytes per second a peer's bandwidth may claim: 10^15 (8 Pb/s), far above any
/// link.
pub const PEER_MAX_BYTES_PER_SEC: f64 = 1e15;
/// The most millions of messages per second a peer may claim: 10^6 (a trillion a second).
pub const PEER_MAX_MPPS: f64 = 1e6;
/// The longest latency a peer may claim, in microseconds: 10^12 (about 11.6 days).
pub const PEER_MAX_LATENCY_US: f64 = 1e12;
/// The latest time a peer's interval may name, in seconds: 10^9 (about 31.7 years).
pub const PEER_MAX_SECONDS: f64 = 1e9;

/// A number in the peer's results that no measurement gives: not finite, negative, or past
/// its bound (a forged average of 1e300 once printed a 300-digit bandwidth).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} of {value:?}, {rule}")]
pub struct BadNumber {
    /// Which number, and of which row: `the 65536-byte row's average bandwidth (bytes/s)`.
    pub what: String,
    /// What the peer sent (printed in Rust's short form: `1e300`, `NaN`, `-5.0`).
    pub value: f64,
    /// What it breaks.
    pub rule: String,
}

/// Checks one number: finite, at least 0, at most `max`.
fn check_number(what: impl FnOnce() -> String, value: f64, max: f64) -> Result<(), BadNumber> {
    let rule = if !value.is_finite() {
        "which is not a finite number".to_owned()
    } else if value < 0.0 {
        "which is negative".to_owned()
    } else if value > max {
        format!("more than the most any run measures ({max:e})")
    } else {
        return Ok(());
    };
    Err(BadNumber {
        what: what(),
        value,
        rule,
    })
}

impl SideReport {
    /// Checks every number of a report that came from the peer before it is printed or
    /// written: finite, not negative, and within the bounds above ([`PEER_MAX_BYTES_PER_SEC`]
    /// and the rest; percentages at most 100).
    pub fn check_numbers(&self) -> Result<(), BadNumber> {
        for r in &self.results {
            let row = |what: &str| format!("the {}-byte row's {what}", r.bytes());
            match r {
                SizeResult::Bandwidth(b) => {
                    let bw = PEER_MAX_BYTES_PER_SEC;
                    check_number(
                        || row("average bandwidth (bytes/s)"),
                        b.avg_bytes_per_sec,
                        bw,
                    )?;
                    if let Some(peak) = b.peak_bytes_per_sec {
                        check_number(|| row("peak bandwidth (bytes/s)"), peak, bw)?;
                    }
                    check_number(
                        || row("message rate (Mpps)"),
                        b.msg_rate_mpps,
                        PEER_MAX_MPPS,
                    )?;
                    if let Some(cpu) = b.cpu_util_percent {
                        check_number(|| row("CPU utilization (%)"), cpu, 100.0)?;
                    }
                    if let Some(iv) = &b.intervals {
                        for (name, value, max) in [
                            ("slowest interval (bytes/s)", iv.min_bytes_per_sec, bw),
                            ("median interval (bytes/s)", iv.median_bytes_per_sec, bw),
                            ("fastest interval (bytes/s)", iv.max_bytes_per_sec, bw),
                            ("slowest interval (Mpps)", iv.min_mpps, PEER_MAX_MPPS),
                            ("median interval (Mpps)", iv.median_mpps, PEER_MAX_MPPS),
                            ("fastest interval (Mpps)", iv.max_mpps, PEER_MAX_MPPS),
                        ] {
                            check_number(|| row(name), value, max)?;
                        }
                    }
                }
                SizeResult::Latency(l) => {
                    let s = &l.summary;
                    for (name, value) in [
                        ("minimum latency (usec)", s.t_min),
                        ("maximum latency (usec)", s.t_max),
                        ("typical latency (usec)", s.t_typical),
                        ("average latency (usec)", s.t_avg),
                        ("latency deviation (usec)", s.t_stdev),
                        ("99% latency (usec)", s.p99),
                        ("99.9% latency (usec)", s.p99_9),
                    ] {
                        check_number(|| row(name), value, PEER_MAX_LATENCY_US)?;
                    }
                }
            }
        }
        for series in &self.intervals {
            let what = |name: &str| format!("the {}-byte interval series' {name}", series.bytes);
            check_number(|| what("period (s)"), series.period_s, PEER_MAX_SECONDS)?;
            for (i, iv) in series.intervals.iter().enumerate() {
                let name = |field: &str| what(&format!("interval {i}'s {field}"));
                check_number(|| name("start (s)"), iv.start_s, PEER_MAX_SECONDS)?;
                check_number(|| name("end (s)"), iv.end_s, PEER_MAX_SECONDS)?;
                let bw = iv.bytes_per_sec;
                check_number(|| name("bandwidth (bytes/s)"), bw, PEER_MAX_BYTES_PER_SEC)?;
                check_number(
                    || name("message rate (Mpps)"),
                    iv.msg_rate_mpps,
                    PEER_MAX_MPPS,
                )?;
            }
        }
        Ok(())
    }
}

/// The JSON file: parameters, this side's results and the peer's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always "stride-perf".
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// The run's parameters.
    pub params: TestParams,
    /// Whether bandwidth is in Gb/s (else MiB/s) in printed tables.
    pub report_gbits: bool,
    /// This side.
    pub this_side: SideReport,
    /// The peer, when it measured and sent its results.
    pub peer: Option<SideReport>,
}

impl Report {
    /// Writes the report as pretty JSON, replacing `path` atomically (a temp file, then a
    /// rename), so a crash never leaves half a file.
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        write_json_file(self, path)
    }

    /// Reads a report written by [`Report::write_json`].
    pub fn read_json(path: &Path) -> Result<Self, String> {
        read_json_file(path, "a stride-perf result file")
    }
}

/// Writes `value` as pretty JSON, replacing `path` atomically (a temp file, then a rename),
/// so a crash never leaves half a file.
pub(crate) fn write_json_file<T: Serialize>(value: &T, path: &Path) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    // One temporary name per process: two sides on one host may write the same path.
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, path)
}

/// Reads the JSON file at `path` as a `T`; `what` names the kind of file for the error
/// ("a stride-perf result file").
pub(crate) fn read_json_file<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not {what}: {e}", path.display()))
}

/// The rule perftest prints above and below its tables.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The bandwidth table's header, as perftest prints it.
pub fn bandwidth_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
    format!(
        "{RULE}\n #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
    )
}

/// One bandwidth row, in perftest's column layout.
pub fn bandwidth_row(r: &BandwidthResult, gbits: bool) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.bytes,
        r.iterations,
        r.peak(gbits),
        r.avg(gbits),
        r.msg_rate_mpps
    )
}

/// A `-b` (bidirectional) size's row as perftest prints it: the sum of both directions (the
/// peaks too, when both sides have one; the iterations are this side's), and under it each
/// direction's average bandwidth, this side's first (on a line of its own, so that the row
/// keeps perftest's five columns for whatever reads them).
pub fn bidirectional_row(ours: &BandwidthResult, peer: &BandwidthResult, gbits: bool) -> String {
    let both = BandwidthResult {
        bytes: ours.bytes,
        iterations: ours.iterations,
        peak_bytes_per_sec: ours
            .peak_bytes_per_sec
            .zip(peer.peak_bytes_per_sec)
            .map(|(a, b)| a + b),
        avg_bytes_per_sec: ours.avg_bytes_per_sec + peer.avg_bytes_per_sec,
        msg_rate_mpps: ours.msg_rate_mpps + peer.msg_rate_mpps,
        intervals: None,
        cpu_util_percent: None,
    };
    let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
    format!(
        "{}\n Each direction  : this side {:.2} {unit}, peer {:.2} {unit}",
        bandwidth_row(&both, gbits),
        ours.avg(gbits),
        peer.avg(gbits)
    )
}

/// The latency table's header, as perftest prints it.
pub fn latency_header() -> String {
    format!(
        "{RULE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
         t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    )
}

/// One latency row, in perftest's column layout.
pub fn latency_row(r: &LatencyResult) -> String {
    let s = &r.summary;
    let mut out = String::new();
    let _ = write!(
        out,
        " {:<7} {:<10}      {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}  \t\t{:<7.2}",
        r.bytes, r.iterations, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p99_9
    );
    out
}

/// The header for this kind of result.
pub fn header_for(result: &SizeResult, gbits: bool) -> String {
    match result {
        SizeResult::Bandwidth(_) => bandwidth_header(gbits),
        SizeResult::Latency(_) => latency_header(),
    }
}

/// The row for a result.
pub fn row_for(result: &SizeResult, gbits: bool) -> String {
    match result {
        SizeResult::Bandwidth(r) => bandwidth_row(r, gbits),
        SizeResult::Latency(r) => latency_row(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Verb};
    use clap::Parser;

    fn lat() -> LatencyResult {
        LatencyResult {
            bytes: 2,
            iterations: 1000,
            summary: LatencySummary {
                t_min: 1.0,
                t_max: 9.0,
                t_typical: 2.5,
                t_avg: 2.75,
                t_stdev: 0.5,
                p99: 8.0,
                p99_9: 9.0,
            },
        }
    }

    fn bw() -> BandwidthResult {
        BandwidthResult {
            bytes: 65536,
            iterations: 5000,
            peak_bytes_per_sec: Some(2.0 * 1048576.0 * 1000.0),
            avg_bytes_per_sec: 1048576.0 * 1000.0,
            msg_rate_mpps: 0.016,
            intervals: None,
            cpu_util_percent: None,
        }
    }

    #[test]
    fn a_bidirectional_row_is_the_sum_with_each_direction_beside_it() {
        let ours = bw();
        let peer = BandwidthResult {
            peak_bytes_per_sec: Some(1048576.0 * 1000.0),
            avg_bytes_per_sec: 1048576.0 * 500.0,
            msg_rate_mpps: 0.008,
            ..bw()
        };
        let row = bidirectional_row(&ours, &peer, false);
        let sum = BandwidthResult {
            peak_bytes_per_sec: Some(3.0 * 1048576.0 * 1000.0),
            avg_bytes_per_sec: 1048576.0 * 1500.0,
            msg_rate_mpps: 0.024,
            ..bw()
        };
        assert_eq!(
            row,
            format!(
                "{}\n Each direction  : this side 1000.00 MiB/sec, peer 500.00 MiB/sec",
                bandwidth_row(&sum, false)
            )
        );
        assert!(row.contains("1500.00"), "{row}");
        // A side without a peak (perftest's rule: over 20,000 iterations) has none summed.
        let no_peak = BandwidthResult {
            peak_bytes_per_sec: None,
            ..peer
        };
        let row = bidirectional_row(&ours, &no_peak, false);
        assert!(
            row.starts_with(" 65536      5000             0.00 "),
            "{row}"
        );
    }

    #[test]
    fn bandwidth_columns_line_up_with_the_header() {
        let head = bandwidth_header(false);
        assert!(head.ends_with(
            " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
        ));
        let row = bandwidth_row(&bw(), false);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["65536", "5000", "2000.00", "1000.00", "0.016000"]
        );
        assert!(bandwidth_header(true).contains("BW average[Gb/sec]"));
        // 1000 MiB/s = 8.388608 Gb/s.
        assert!(bandwidth_row(&bw(), true).contains("8.39"));
    }

    #[test]
    fn a_peers_report_text_is_made_printable() {
        let theirs = SideReport {
            role: "server\u{9b}2J".into(),
            device: "rxe0\u{1b}]0;x\u{7}".into(),
            gid_index: 1,
            buffer: Some("host\u{202e}".into()),
            memory_regions: Some("one memory region shared by 2 QPs\u{202e}".into()),
            clock: Some("tsc\u{7f}".into()),
            posting: Some("ibv_wr_*\u{1b}[2J".into()),
            polling: None,
            results: vec![SizeResult::Bandwidth(bw())],
            intervals: vec![],
        }
        .printable();
        assert_eq!(theirs.role, "server\\u{9b}2J");
        assert_eq!(theirs.device, "rxe0\\x1b]0;x\\x07");
        assert_eq!(theirs.buffer.as_deref(), Some("host\\u{202e}"));
        assert_eq!(
            theirs.memory_regions.as_deref(),
            Some("one memory region shared by 2 QPs\\u{202e}")
        );
        assert_eq!(theirs.clock.as_deref(), Some("tsc\\x7f"));
        let json = serde_json::to_string(&theirs).unwrap();
        assert!(!json.chars().any(|c| c.is_control()), "{json}");
    }

    #[test]
    fn a_peers_numbers_no_run_measures_are_refused() {
        let side = |r: SizeResult| SideReport {
            role: "server".into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            results: vec![r],
            intervals: vec![],
        };
        let with = |f: &dyn Fn(&mut BandwidthResult)| {
            let mut b = bw();
            f(&mut b);
            side(SizeResult::Bandwidth(b)).check_numbers()
        };
        assert_eq!(with(&|_| {}), Ok(()));
        let e = with(&|b| b.avg_bytes_per_sec = 1e300)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the 65536-byte row's average bandwidth (bytes/s) of 1e300, more than the most any \
             run measures (1e15)"
        );
        let e = with(&|b| b.msg_rate_mpps = -1.0).unwrap_err().to_string();
        assert!(
            e.ends_with("message rate (Mpps) of -1.0, which is negative"),
            "{e}"
        );
        let e = with(&|b| b.peak_bytes_per_sec = Some(f64::NAN)).unwrap_err();
        assert!(e
            .to_string()
            .contains("peak bandwidth (bytes/s) of NaN, which is not a finite"));
        let e = with(&|b| b.cpu_util_percent = Some(100.5)).unwrap_err();
        assert!(
            e.to_string().contains("CPU utilization (%) of 100.5"),
            "{e}"
        );
        assert_eq!(with(&|b| b.cpu_util_percent = Some(100.0)), Ok(()));
        let e = with(&|b| {
            b.intervals = Some(crate::bandwidth::IntervalStats {
                count: 3,
                min_bytes_per_sec: 1.0,
                median_bytes_per_sec: 2.0,
                max_bytes_per_sec: f64::INFINITY,
                min_mpps: 0.0,
                median_mpps: 0.0,
                max_mpps: 0.0,
            })
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("fastest interval (bytes/s) of inf"),
            "{e}"
        );
        let mut lat = lat();
        assert_eq!(side(SizeResult::Latency(lat)).check_numbers(), Ok(()));
        lat.summary.t_avg = -3.0;
        let e = side(SizeResult::Latency(lat)).check_numbers().unwrap_err();
        assert!(
            e.to_string()
                .contains("2-byte row's average latency (usec) of -3.0"),
            "{e}"
        );
        let mut s = side(SizeResult::Bandwidth(bw()));
        s.intervals = vec![IntervalSeries {
            bytes: 65536,
            period_s: 1.0,
            intervals: vec![Interval {
                start_s: 0.0,
                end_s: 1e20,
                messages: 1,
                bytes_per_sec: 1.0,
                msg_rate_mpps: 0.0,
                partial: false,
            }],
        }];
        let e = s.check_numbers().unwrap_err().to_string();
        assert!(
            e.contains("interval series' interval 0's end (s) of 1e20"),
            "{e}"
        );
    }

    #[test]
    fn latency_row_has_every_column() {
        let r = lat();
        let cols: Vec<String> = latency_row(&r)
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(
            cols,
            ["2", "1000", "1.00", "9.00", "2.50", "2.75", "0.50", "8.00", "9.00"]
        );
        assert_eq!(latency_header().split("[usec]").count(), 8);
    }

    #[test]
    fn json_round_trip_keeps_both_sides() {
        let cli = Cli::try_parse_from(["stride-perf", "write", "bw"]).unwrap();
        let (verb, a) = cli.command.run_args().unwrap();
        assert_eq!(verb, Verb::Write);
        let side = |role: &str| SideReport {
            role: role.into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: Some("huge pages (2048 KiB)".into()),
            memory_regions: Some("4 memory regions, one per QP (--mr-per-qp)".into()),
            clock: Some("tsc, 23 ns per read".into()),
            posting: Some("ibv_wr_* (extended QPs)".into()),
            polling: Some("ibv_poll_cq (classic CQs)".into()),
            results: vec![SizeResult::Bandwidth(bw())],
            intervals: vec![],
        };
        let report = Report {
            tool: "stride-perf".into(),
            version: "0.1.0".into(),
            params: TestParams::resolve(verb, a).unwrap(),
            report_gbits: false,
            this_side: side("client"),
            peer: Some(side("server")),
        };
        let dir = std::env::temp_dir().join(format!("stride-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        report.write_json(&path).unwrap();
        assert_eq!(Report::read_json(&path).unwrap(), report);
        // A file from before the buffer kind, the clock and the verbs API were recorded
        // still reads.
        let mut old: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(old["this_side"]["buffer"], "huge pages (2048 KiB)");
        assert_eq!(old["peer"]["clock"], "tsc, 23 ns per read");
        assert_eq!(
            old["peer"]["memory_regions"],
            "4 memory regions, one per QP (--mr-per-qp)"
        );
        for side in ["this_side", "peer"] {
            old[side].as_object_mut().unwrap().remove("buffer");
            old[side].as_object_mut().unwrap().remove("memory_regions");
            old[side].as_object_mut().unwrap().remove("clock");
            old[side].as_object_mut().unwrap().remove("posting");
            old[side].as_object_mut().unwrap().remove("polling");
        }
        std::fs::write(&path, old.to_string()).unwrap();
        let read = Report::read_json(&path).unwrap();
        assert_eq!(read.this_side.buffer, None);
        assert_eq!(read.this_side.memory_regions, None);
        assert_eq!(read.peer.as_ref().unwrap().clock, None);
        assert_eq!(read.this_side.posting, None);
        assert_eq!(read.peer.as_ref().unwrap().polling, None);
        assert_eq!(read.this_side.results, report.this_side.results);
        std::fs::write(&path, "{ not json").unwrap();
        assert!(Report::read_json(&path)
            .unwrap_err()
            .contains("not a stride-perf result file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
