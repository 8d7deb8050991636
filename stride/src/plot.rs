//! `stride-perf plot`: bandwidth or latency against message size as an SVG line chart, one
//! line per result file. Written by hand: a chart this simple needs no plotting library.

use std::fmt::Write as _;
use std::path::Path;

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

/// Reads the result files and writes the chart to `output`.
pub fn plot_files(inputs: &[impl AsRef<Path>], output: &Path) -> Result<(), String> {
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

/// The SVG text of the chart.
pub fn render(title: &str, quantity: Quantity, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, f64::MIN, 0f64);
    for &(b, v) in all {
        let x = (b.max(1) as f64).log2();
        xmin = xmin.min(x);
        xmax = xmax.max(x);
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
    let ylabel = match quantity {
        Quantity::Bandwidth { gbits: true } => "average bandwidth [Gb/s]",
        Quantity::Bandwidth { gbits: false } => "average bandwidth [MiB/s]",
        Quantity::Latency => "typical latency [µs]",
    };

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
    // X ticks at each power of two present.
    let mut xs: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_unstable();
    xs.dedup();
    let every = xs.len().div_ceil(12).max(1);
    for (i, &b) in xs.iter().enumerate() {
        let px = sx((b.max(1) as f64).log2());
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#999"/>"##,
            TOP + ph,
            TOP + ph + 5.0
        );
        if i % every == 0 {
            let _ = writeln!(
                svg,
                r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + ph + 18.0,
                size_label(b)
            );
        }
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size [bytes]</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{ylabel}</text>"#,
        TOP + ph / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(b, v)| format!("{:.1},{:.1}", sx((b.max(1) as f64).log2()), sy(v)))
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
            escape(&s.label)
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
            clock: None,
            posting: None,
            polling: None,
            results,
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
}
