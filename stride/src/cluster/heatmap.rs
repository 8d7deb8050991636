//! The pair matrix of a cluster run as an SVG heatmap: initiating rank by row, target rank
//! by column, each cell coloured from red (the worst pair) to green (the best), flagged pairs
//! framed in black, pairs the pattern did not run in grey. Written by hand, like
//! [`crate::plot`].

use std::fmt::Write as _;

use super::report::ClusterReport;
use crate::plot::{escape, trim_number};

const CELL: f64 = 64.0;
const LEFT: f64 = 110.0;
const TOP: f64 = 90.0;
const LEGEND: f64 = 150.0;

/// Red (0) through yellow to green (1).
fn colour(t: f64) -> String {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let (r, g, b) = if t < 0.5 {
        let u = t * 2.0;
        (
            215.0 + (254.0 - 215.0) * u,
            48.0 + (224.0 - 48.0) * u,
            39.0 + (139.0 - 39.0) * u,
        )
    } else {
        let u = (t - 0.5) * 2.0;
        (
            254.0 + (26.0 - 254.0) * u,
            224.0 + (152.0 - 224.0) * u,
            139.0 + (80.0 - 139.0) * u,
        )
    };
    format!("#{:02x}{:02x}{:02x}", r as u8, g as u8, b as u8)
}

/// The SVG text of the report's heatmap.
pub fn render(report: &ClusterReport) -> String {
    let m = &report.matrix;
    let n = m.cells.len();
    let values: Vec<f64> = m.cells.iter().flatten().flatten().copied().collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // The goodness of a value, 0 (worst) to 1 (best).
    let good = |v: f64| {
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
        if m.higher_is_better {
            t
        } else {
            1.0 - t
        }
    };
    let flagged = |i: usize, j: usize| {
        report
            .slowest
            .iter()
            .any(|f| f.flagged && f.client == i && f.server == j)
    };
    let size = n as f64 * CELL;
    let width = LEFT + size + LEGEND;
    let height = TOP + size + 70.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(&report.title())
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="44" text-anchor="middle">{} at {} B; flagged pairs framed</text>"#,
        width / 2.0,
        escape(&m.quantity),
        m.bytes
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">target rank</text>"#,
        LEFT + size / 2.0,
        TOP - 28.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="24" y="{:.1}" text-anchor="middle" transform="rotate(-90 24 {:.1})">initiating rank</text>"#,
        TOP + size / 2.0,
        TOP + size / 2.0
    );
    let host = |r: usize| {
        report
            .members
            .get(r)
            .map_or_else(String::new, |m| m.host.clone())
    };
    for k in 0..n {
        let c = k as f64 * CELL + CELL / 2.0;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{k}<title>{}</title></text>"#,
            LEFT + c,
            TOP - 8.0,
            escape(&host(k))
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{k}<title>{}</title></text>"#,
            LEFT - 8.0,
            TOP + c + 4.0,
            escape(&host(k))
        );
    }
    for (i, row) in m.cells.iter().enumerate() {
        for (j, cell) in row.iter().enumerate() {
            let (x, y) = (LEFT + j as f64 * CELL, TOP + i as f64 * CELL);
            let (fill, label) = match cell {
                Some(v) => (colour(good(*v)), trim_number((v * 100.0).round() / 100.0)),
                None => ("#e8e8e8".to_owned(), "-".to_owned()),
            };
            let frame = if flagged(i, j) {
                r#" stroke="black" stroke-width="4""#
            } else {
                r#" stroke="white" stroke-width="1""#
            };
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{CELL}" height="{CELL}" fill="{fill}"{frame}><title>{i} -> {j} ({} -> {}): {}</title></rect>"#,
                escape(&host(i)),
                escape(&host(j)),
                escape(&label)
            );
            if n <= 16 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
                    x + CELL / 2.0,
                    y + CELL / 2.0 + 4.0,
                    escape(&label)
                );
            }
        }
    }
    // The legend: a bar from the worst value to the best.
    let lx = LEFT + size + 40.0;
    let steps = 10;
    let bar = size.max(CELL * 2.0);
    for s in 0..steps {
        let t = 1.0 - (s as f64 + 0.5) / steps as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="20" height="{:.1}" fill="{}"/>"#,
            TOP + s as f64 * bar / steps as f64,
            bar / steps as f64 + 0.5,
            colour(t)
        );
    }
    if lo.is_finite() && hi.is_finite() {
        let (best, worst) = if m.higher_is_better {
            (hi, lo)
        } else {
            (lo, hi)
        };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{} (best)</text><text x="{:.1}" y="{:.1}">{} (worst)</text>"#,
            lx + 26.0,
            TOP + 10.0,
            trim_number((best * 100.0).round() / 100.0),
            lx + 26.0,
            TOP + bar,
            trim_number((worst * 100.0).round() / 100.0)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}">median {}, flagged {} {}</text>"#,
        TOP + size + 30.0,
        trim_number((m.median * 100.0).round() / 100.0),
        if m.higher_is_better { "below" } else { "above" },
        trim_number((m.threshold * 100.0).round() / 100.0)
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heatmap_has_a_cell_per_pair_and_frames_the_bad_one() {
        let report = crate::cluster::report::tests::report((1, 0), 30.0);
        let svg = render(&report);
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        // 16 cells (4 of them the unmeasured diagonal) and 10 legend steps.
        assert_eq!(svg.matches("<rect x=").count(), 16 + 10);
        assert_eq!(svg.matches(r#"stroke="black""#).count(), 1);
        assert!(
            svg.contains("<title>1 -> 0 (n01 -> n00): 30</title>"),
            "{svg}"
        );
        assert_eq!(svg.matches(r##"fill="#e8e8e8""##).count(), 4);
    }

    #[test]
    fn colours_run_from_red_to_green() {
        assert_eq!(colour(0.0), "#d73027");
        assert_eq!(colour(1.0), "#1a9850");
        assert_eq!(colour(f64::NAN), colour(0.5));
    }
}
