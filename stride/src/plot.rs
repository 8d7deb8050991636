//! `stride-perf plot`: bandwidth or latency against message size as an SVG line chart, one
//! line per result file; with `--intervals`, bandwidth against time from the reporting
//! intervals of timed runs. Written by hand: a chart this simple needs no plotting library.

use std::fmt::Write as _;
use std::path::Path;

use crate::bandwidth::in_unit;
use crate::report::{Report, SizeResult};

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend label.
    pub label: String,
    /// `(bytes, value)` points, in size order.
    pub points: Vec<(u64, f64)>,
}

/// What the y axis shows, decided by the first input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Average bandwidth, in MiB/s or Gb/s.
    Bandwidth {
        /// Gb/s instead of MiB/s.
        gbits: bool,
    },
    /// Typical (median) latency in µs.
    Latency,
}

/// The results of the side that measured: this side's, or the peer's when this side measured
/// nothing.
pub fn measured(report: &Report) -> &[SizeResult] {
    match &report.peer {
        Some(peer) if report.this_side.results.is_empty() => &peer.results,
        _ => &report.this_side.results,
    }
}

/// The series of one report: the results of the side that measured: this side's, or the
/// peer's when this side measured nothing (the server of a one-sided test).
pub fn series_of(report: &Report, label: String, quantity: Quantity) -> Result<Series, String> {
    let mut points = Vec::new();
    for r in measured(report) {
        match (r, quantity) {
            (SizeResult::Bandwidth(b), Quantity::Bandwidth { gbits }) => {
                points.push((b.bytes, b.avg(gbits)))
            }
            (SizeResult::Latency(l), Quantity::Latency) => {
                points.push((l.bytes, l.summary.t_typical))
            }
            _ => {
                return Err(format!(
                    "{label}: mixes bandwidth and latency results with the first file; plot \
                     them separately"
                ))
            }
        }
    }
    if points.is_empty() {
        return Err(format!("{label}: holds no results"));
    }
    points.sort_by_key(|p| p.0);
    Ok(Series { label, points })
}

/// Reads the result files and writes the chart to `output`: against message size, or with
/// `intervals` bandwidth against time from the reporting intervals.
pub fn plot_files(
    inputs: &[impl AsRef<Path>],
    output: &Path,
    intervals: bool,
) -> Result<(), String> {
    let mut reports = Vec::new();
    for path in inputs {
        let path = path.as_ref();
        let label = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        reports.push((label, Report::read_json(path)?));
    }
    let Some((_, first)) = reports.first() else {
        return Err("no input files".into());
    };
    if intervals {
        let title = format!(
            "stride-perf {} {}: bandwidth per interval",
            first.params.verb.as_str(),
            first.params.test.as_str()
        );
        let gbits = first.report_gbits;
        let mut lines = Vec::new();
        for (label, r) in &reports {
            lines.extend(interval_series_of(r, label)?);
        }
        let svg = render_intervals(&title, gbits, &lines);
        return std::fs::write(output, svg)
            .map_err(|e| format!("cannot write {}: {e}", output.display()));
    }
    let quantity = match measured(first).first() {
        Some(SizeResult::Latency(_)) => Quantity::Latency,
        _ => Quantity::Bandwidth {
            gbits: first.report_gbits,
        },
    };
    let title = format!(
        "stride-perf {} {}",
        first.params.verb.as_str(),
        first.params.test.as_str()
    );
    let series = reports
        .iter()
        .map(|(label, r)| series_of(r, label.clone(), quantity))
        .collect::<Result<Vec<_>, _>>()?;
    let svg = render(&title, quantity, &series);
    std::fs::write(output, svg).map_err(|e| format!("cannot write {}: {e}", output.display()))
}

/// A human size label: 2, 64, 4K, 1M.
pub fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// A "nice" step (1, 2 or 5 times a power of ten) for about `ticks` ticks up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG text of the chart of `series` against message size (a log2 axis).
pub fn render(title: &str, quantity: Quantity, series: &[Series]) -> String {
    let ylabel = match quantity {
        Quantity::Bandwidth { gbits: true } => "average bandwidth [Gb/s]",
        Quantity::Bandwidth { gbits: false } => "average bandwidth [MiB/s]",
        Quantity::Latency => "typical latency [µs]",
    };
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .map(|&(b, v)| ((b.max(1) as f64).log2(), v))
                .collect();
            (s.label.as_str(), pts)
        })
        .collect();
    // X ticks at each power of two present.
    let mut xs: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_unstable();
    xs.dedup();
    let every = xs.len().div_ceil(12).max(1);
    let ticks: Vec<(f64, Option<String>)> = xs
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            (
                (b.max(1) as f64).log2(),
                (i % every == 0).then(|| size_label(b)),
            )
        })
        .collect();
    chart(title, "message size [bytes]", ylabel, &lines, &ticks)
}

/// One line of an interval chart: bandwidth (in the report's unit) at each interval's end,
/// in seconds from the start of its run.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeSeries {
    /// The legend label.
    pub label: String,
    /// `(seconds, bandwidth)` points in time order.
    pub points: Vec<(f64, f64)>,
}

/// The interval series of one report (this side's, or the peer's when this side has none),
/// one line per size, labelled `label` (and the size when there are several).
pub fn interval_series_of(report: &Report, label: &str) -> Result<Vec<TimeSeries>, String> {
    let series = match &report.peer {
        Some(peer) if report.this_side.intervals.is_empty() => &peer.intervals,
        _ => &report.this_side.intervals,
    };
    if series.is_empty() {
        return Err(format!(
            "{label}: holds no reporting intervals (they come from bandwidth runs with -D or \
             --run-infinitely)"
        ));
    }
    Ok(series
        .iter()
        .map(|s| TimeSeries {
            label: if series.len() > 1 {
                format!("{label} {}", size_label(s.bytes))
            } else {
                label.to_owned()
            },
            points: s
                .intervals
                .iter()
                .map(|iv| (iv.end_s, in_unit(iv.bytes_per_sec, report.report_gbits)))
                .collect(),
        })
        .collect())
}

/// The SVG text of bandwidth against time, from the reporting intervals.
pub fn render_intervals(title: &str, gbits: bool, series: &[TimeSeries]) -> String {
    let xmax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0f64, f64::max);
    let step = nice_step(if xmax > 0.0 { xmax } else { 1.0 }, 8.0);
    let mut ticks = Vec::new();
    let mut x = 0.0;
    while x <= xmax + step / 2.0 {
        ticks.push((x, Some(trim_number(x))));
        x += step;
    }
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| (s.label.as_str(), s.points.clone()))
        .collect();
    let ylabel = if gbits {
        "interval bandwidth [Gb/s]"
    } else {
        "interval bandwidth [MiB/s]"
    };
    chart(title, "time [s]", ylabel, &lines, &ticks)
}

/// The chart: `lines` of `(x, y)` points, x ticks at `ticks` (with a label or none).
fn chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    lines: &[(&str, Vec<(f64, f64)>)],
    ticks: &[(f64, Option<String>)],
) -> String {
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, f64::MIN, 0f64);
    // The x range covers every point and every tick (an interval chart starts at 0 s).
    let xs = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.0))
        .chain(ticks.iter().map(|t| t.0));
    for x in xs {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
    }
    for &(_, v) in lines.iter().flat_map(|l| l.1.iter()) {
        ymax = ymax.max(v);
    }
    if xmin > xmax {
        (xmin, xmax) = (0.0, 1.0);
    }
    if (xmax - xmin).abs() < f64::EPSILON {
        xmin -= 1.0;
        xmax += 1.0;
    }
    let step = nice_step(if ymax > 0.0 { ymax } else { 1.0 }, 5.0);
    let ytop = (ymax / step).ceil().max(1.0) * step;
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| TOP + ph - y / ytop * ph;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= ytop + step / 2.0 {
        let py = sy(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            trim_number(y)
        );
        y += step;
    }
    for (x, label) in ticks {
        let px = sx(*x);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#999"/>"##,
            TOP + ph,
            TOP + ph + 5.0
        );
        if let Some(label) = label {
            let _ = writeln!(
                svg,
                r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + ph + 18.0,
                escape(label)
            );
        }
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{xlabel}</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{ylabel}</text>"#,
        TOP + ph / 2.0
    );
    for (i, (label, points)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = points
            .iter()
            .map(|&(x, v)| format!("{:.1},{:.1}", sx(x), sy(v)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(svg, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

pub(crate) fn trim_number(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(2), "2");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(8 << 20), "8M");
        assert_eq!(size_label(1500), "1500");
    }

    #[test]
    fn a_server_file_plots_the_client_results() {
        use crate::cli::Cli;
        use crate::latency::LatencySummary;
        use crate::params::TestParams;
        use crate::report::{LatencyResult, SideReport};
        use clap::Parser;
        let cli = Cli::try_parse_from(["stride-perf", "read", "lat"]).unwrap();
        let (verb, a) = cli.command.run_args().unwrap();
        let lat = |bytes, t| {
            SizeResult::Latency(LatencyResult {
                bytes,
                iterations: 1000,
                summary: LatencySummary {
                    t_min: t,
                    t_max: t,
                    t_typical: t,
                    t_avg: t,
                    t_stdev: 0.0,
                    p99: t,
                    p99_9: t,
                },
            })
        };
        let side = |role: &str, results| SideReport {
            role: role.into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            results,
            intervals: vec![],
        };
        let report = Report {
            tool: "stride-perf".into(),
            version: "0".into(),
            params: TestParams::resolve(verb, a).unwrap(),
            report_gbits: false,
            this_side: side("server", vec![]),
            peer: Some(side("client", vec![lat(64, 3.0), lat(2, 2.0)])),
        };
        let s = series_of(&report, "r".into(), Quantity::Latency).unwrap();
        assert_eq!(s.points, [(2, 2.0), (64, 3.0)]);
        let mut lonely = report.clone();
        lonely.peer = None;
        assert!(series_of(&lonely, "r".into(), Quantity::Latency)
            .unwrap_err()
            .contains("holds no results"));
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 2.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
    }

    #[test]
    fn chart_has_a_line_per_series_and_escapes_labels() {
        let series = vec![
            Series {
                label: "stride <rxe>".into(),
                points: vec![(64, 10.0), (4096, 200.0), (65536, 450.0)],
            },
            Series {
                label: "perftest".into(),
                points: vec![(64, 9.0), (4096, 190.0), (65536, 400.0)],
            },
        ];
        let svg = render("write bw", Quantity::Bandwidth { gbits: false }, &series);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(svg.contains("stride &lt;rxe&gt;"));
        assert!(svg.contains(">4K<") && svg.contains(">64K<"));
        assert!(svg.contains("average bandwidth [MiB/s]"));
    }

    #[test]
    fn intervals_plot_against_time() {
        use crate::bandwidth::Interval;
        use crate::report::IntervalSeries;
        use clap::Parser;
        let cli =
            crate::cli::Cli::try_parse_from(["stride-perf", "write", "bw", "-D", "3"]).unwrap();
        let (verb, a) = cli.command.run_args().unwrap();
        let iv = |end: f64, bps: f64| Interval {
            start_s: end - 1.0,
            end_s: end,
            messages: 10,
            bytes_per_sec: bps,
            msg_rate_mpps: 1e-5,
            partial: false,
        };
        let side = |intervals| crate::report::SideReport {
            role: "client".into(),
            device: "rxe0".into(),
            gid_index: 1,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            results: vec![],
            intervals,
        };
        let mut report = Report {
            tool: "stride-perf".into(),
            version: "0".into(),
            params: crate::params::TestParams::resolve(verb, a).unwrap(),
            report_gbits: false,
            this_side: side(vec![IntervalSeries {
                bytes: 65536,
                period_s: 1.0,
                intervals: vec![
                    iv(1.0, 1048576.0),
                    iv(2.0, 2.0 * 1048576.0),
                    iv(3.0, 1048576.0),
                ],
            }]),
            peer: None,
        };
        let lines = interval_series_of(&report, "run").unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].points, [(1.0, 1.0), (2.0, 2.0), (3.0, 1.0)]);
        let svg = render_intervals("t", false, &lines);
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("time [s]") && svg.contains("interval bandwidth [MiB/s]"));
        // A server's file holds the client's series as the peer's.
        report.peer = Some(report.this_side.clone());
        report.this_side = side(vec![]);
        assert_eq!(interval_series_of(&report, "run").unwrap(), lines);
        report.peer = None;
        assert!(interval_series_of(&report, "run")
            .unwrap_err()
            .contains("no reporting intervals"));
    }
}
