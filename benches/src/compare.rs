//! Interleaved timing of the two sides of each [`Pair`]: the numbers of the comparison
//! table (`cargo bench -p benches --bench compare`).
//!
//! Shared machines are noisy: a burst of load during one side's measurement would skew a
//! ratio taken from two separate runs. Here each pair is measured in many short rounds;
//! every round times the Rust side and the C side back to back (alternating which goes
//! first) over the same number of iterations. The table reports each side's fastest round:
//! noise (other processes, interrupts, frequency changes) only ever adds time, so the
//! fastest round is the best estimate of what the code itself costs, and both sides had the
//! same chances at a quiet moment. The median is kept too, as a check on the spread.

use std::time::{Duration, Instant};

use crate::alloc_counter::count_allocations;
use crate::data_path::Pair;

/// How long to measure.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Rounds per pair (each times both sides once).
    pub rounds: u32,
    /// Target duration of one side's sample in one round.
    pub sample: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rounds: 101,
            sample: Duration::from_millis(1),
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The operation.
    pub name: String,
    /// Fastest Rust round's time per operation (per work request for batches), ns.
    pub rust_ns: f64,
    /// Fastest C round's time per operation, ns.
    pub c_ns: f64,
    /// Median Rust time per operation over the rounds, ns.
    pub rust_median_ns: f64,
    /// Median C time per operation over the rounds, ns.
    pub c_median_ns: f64,
    /// Heap allocations per operation on the Rust side, over every timed round (0 is the
    /// claim; only meaningful where the counting allocator is the global allocator).
    pub rust_allocs: f64,
}

impl Row {
    /// Rust time over C time (fastest rounds).
    pub fn ratio(&self) -> f64 {
        self.rust_ns / self.c_ns
    }

    /// Rust time over C time (medians).
    pub fn median_ratio(&self) -> f64 {
        self.rust_median_ns / self.c_median_ns
    }
}

fn time(f: &mut dyn FnMut(u64), iters: u64) -> Duration {
    let start = Instant::now();
    f(iters);
    start.elapsed()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Measures one pair.
pub fn measure(pair: &mut Pair, settings: Settings) -> Row {
    // Warm up both sides (caches, branch predictors, lazily resolved symbols), then find
    // an iteration count whose slower side takes about one sample.
    (pair.rust)(1000);
    (pair.c)(1000);
    let mut iters: u64 = 64;
    loop {
        let slower = time(&mut pair.rust, iters).max(time(&mut pair.c, iters));
        if slower >= settings.sample || iters >= 1 << 32 {
            break;
        }
        let scale = settings.sample.as_secs_f64() / slower.as_secs_f64().max(1e-9);
        iters = (iters as f64 * scale.clamp(1.5, 16.0)) as u64;
    }
    let per_op = |d: Duration| d.as_secs_f64() * 1e9 / (iters * pair.per_iter) as f64;
    let mut rust = Vec::with_capacity(settings.rounds as usize);
    let mut c = Vec::with_capacity(settings.rounds as usize);
    let mut allocs = 0;
    for round in 0..settings.rounds {
        let mut time_rust = || {
            let (d, n) = count_allocations(|| time(&mut pair.rust, iters));
            allocs += n;
            per_op(d)
        };
        if round % 2 == 0 {
            rust.push(time_rust());
            c.push(per_op(time(&mut pair.c, iters)));
        } else {
            c.push(per_op(time(&mut pair.c, iters)));
            rust.push(time_rust());
        }
    }
    let ops = u64::from(settings.rounds) * iters * pair.per_iter;
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    Row {
        name: pair.name.clone(),
        rust_ns: min(&rust),
        c_ns: min(&c),
        rust_median_ns: median(&mut rust),
        c_median_ns: median(&mut c),
        rust_allocs: allocs as f64 / ops as f64,
    }
}

/// What the numbers were measured on: CPU model, the C compiler and flags, rustc.
pub fn environment() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "CPU: {cpu} ({cpus} CPUs available)\n\
         C: {}, -O3 (GCC: -mstringop-strategy=unrolled_loop)\n\
         Rust: {}, the bench profile (opt-level 3)",
        env!("BENCHES_C_COMPILER"),
        env!("BENCHES_RUSTC"),
    )
}

/// The table, in Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| operation | Rust ns/op | C ns/op | Rust/C | Rust/C (medians) | Rust allocs/op |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.3} | {:.3} | {} |\n",
            r.name,
            r.rust_ns,
            r.c_ns,
            r.ratio(),
            r.median_ratio(),
            r.rust_allocs
        ));
    }
    out
}
