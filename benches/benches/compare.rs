//! Prints one table: every benchmarked operation, Rust ns/op, C ns/op and their ratio, from
//! interleaved rounds of the same run (see `benches::compare`).
//!
//! `cargo bench -p benches --bench compare` (any machine: the null provider needs no
//! device). `BENCH_ROUNDS` and `BENCH_SAMPLE_MS` change the rounds per operation (101) and
//! the length of one side's sample (1 ms); a filter argument keeps the operations whose name
//! contains it.

use std::time::Duration;

use benches::alloc_counter::CountingAllocator;
use benches::compare::{environment, measure, table, Settings};
use benches::data_path::null_provider_pairs;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("ignoring {name}={value}: not a number");
            None
        }
    }
}

fn main() {
    let mut settings = Settings::default();
    if let Some(n) = env_number("BENCH_ROUNDS") {
        settings.rounds = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    }
    if let Some(ms) = env_number("BENCH_SAMPLE_MS") {
        settings.sample = Duration::from_millis(ms.max(1));
    }
    // `cargo bench` passes `--bench`; anything else not starting with `-` is a filter.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let rows: Vec<_> = null_provider_pairs()
        .into_iter()
        .filter(|p| filter.as_deref().is_none_or(|f| p.name.contains(f)))
        .map(|mut pair| {
            let row = measure(&mut pair, settings);
            eprintln!(
                "{:<48} Rust {:>8.2} ns  C {:>8.2} ns  {:.3}",
                row.name,
                row.rust_ns,
                row.c_ns,
                row.ratio()
            );
            row
        })
        .collect();
    println!(
        "null provider; {} interleaved rounds of about {} ms per side; ns/op of each side's \
         fastest round\n",
        settings.rounds,
        settings.sample.as_millis()
    );
    println!("{}\n", environment());
    print!("{}", table(&rows));
}
