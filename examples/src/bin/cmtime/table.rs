//! The per-step times of each connection and the table both sides print from them.

use super::*;

/// When one connection started and ended each step.
#[derive(Debug, Clone, Default)]
pub(super) struct Times(pub(super) [Option<(Instant, Instant)>; STEPS.len()]);

impl Times {
    pub(super) fn set(&mut self, step: Step, start: Instant, end: Instant) {
        self.0[step as usize] = Some((start, end));
    }

    /// Runs `f`, recording how long it took as `step`.
    pub(super) fn time<T>(&mut self, step: Step, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.set(step, start, Instant::now());
        out
    }
}

/// One row of the table, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Row {
    pub(super) total: u128,
    pub(super) sum: u128,
    pub(super) max: u128,
    pub(super) min: u128,
}

/// The rows of the table: per step, from the connections' own spans, and the step's whole
/// span from `whole` where the program timed it as one (the socket test), else from the
/// first connection's start to the last one's end.
pub(super) fn rows(conns: &[Times], whole: &Times) -> Vec<Row> {
    (0..STEPS.len())
        .map(|s| {
            let spans: Vec<(Instant, Instant)> = conns.iter().filter_map(|t| t.0[s]).collect();
            let each: Vec<u128> = spans.iter().map(|(a, b)| (*b - *a).as_micros()).collect();
            let total = match whole.0[s] {
                Some((first, last)) => (last - first).as_micros(),
                None => match (
                    spans.iter().map(|s| s.0).min(),
                    spans.iter().map(|s| s.1).max(),
                ) {
                    (Some(first), Some(last)) => (last - first).as_micros(),
                    _ => 0,
                },
            };
            Row {
                total,
                sum: each.iter().sum(),
                max: each.iter().copied().max().unwrap_or(0),
                min: each.iter().copied().min().unwrap_or(0),
            }
        })
        .collect()
}

/// The table, as rdma-core's cmtime lays it out: headed `qp_conn` when the connections had
/// real QPs, `cm_conn` otherwise (simulated or none, and the socket test).
pub(super) fn table(real_qps: bool, threads: u32, conns: &[Times], whole: &Times) -> String {
    let n = conns.len().max(1) as u128;
    let label = if real_qps { "qp_conn" } else { "cm_conn" };
    let mut out = format!(
        "{label:<16}{:>9}\n{:<16}{:>9}\n",
        conns.len(),
        "threads",
        threads
    );
    out += &format!(
        "{:<16}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}\n",
        "step", "avg/iter", "total(us)", "us/conn", "sum(us)", "max(us)", "min(us)"
    );
    for ((_, name), row) in STEPS.iter().zip(rows(conns, whole)) {
        out += &format!(
            "{name:<16}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}\n",
            row.total / n,
            row.total,
            row.sum / n,
            row.sum,
            row.max,
            row.min
        );
    }
    out
}
