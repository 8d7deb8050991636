//! `stride-loopcost SHORT LONG ITERATIONS [LABEL]`: the instructions one iteration of a
//! measured loop executes outside its waits, by object, from two callgrind profiles of the
//! same run with ITERATIONS more iterations in LONG (see [`stride::loop_cost`]; made by
//! `scripts/loop-instructions`).

use std::process::ExitCode;

use stride::loop_cost::{per_iteration, Profile};

/// Functions listed per object.
const TOP_FUNCTIONS: usize = 4;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (short, long, iterations, label) = match args.as_slice() {
        [s, l, n] => (s, l, n, None),
        [s, l, n, label] => (s, l, n, Some(label.as_str())),
        _ => {
            eprintln!("usage: stride-loopcost SHORT_PROFILE LONG_PROFILE ITERATIONS [LABEL]");
            return ExitCode::from(2);
        }
    };
    let Ok(iterations) = iterations.parse::<u64>() else {
        eprintln!("stride-loopcost: ITERATIONS must be a whole number, not \"{iterations}\"");
        return ExitCode::from(2);
    };
    match run(short, long, iterations, label) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stride-loopcost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: &str) -> Result<Profile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    Profile::parse(&text).map_err(|e| format!("{path}: {e}"))
}

fn run(short: &str, long: &str, iterations: u64, label: Option<&str>) -> Result<(), String> {
    let (short, long) = (load(short)?, load(long)?);
    if iterations == 0 {
        return Err("ITERATIONS must be above 0: the two runs must differ".into());
    }
    let cost = per_iteration(&short, &long, iterations);
    let total: u64 = cost.iter().map(|c| c.per_iteration).sum();
    let label = label.unwrap_or(&long.command);
    println!("{label}: {total} instructions per iteration outside waits");
    for c in &cost {
        let top: Vec<String> = c
            .functions
            .iter()
            .take(TOP_FUNCTIONS)
            .map(|(f, n)| format!("{} {n}", short_name(f)))
            .collect();
        let more = c.functions.len().saturating_sub(TOP_FUNCTIONS);
        let more = if more > 0 {
            format!(", {more} more")
        } else {
            String::new()
        };
        println!(
            "  {:>6}  {:<28} ({}{more})",
            c.per_iteration,
            c.object,
            top.join(", ")
        );
    }
    Ok(())
}

/// A function's name without its path and generic arguments: `run_size`, not
/// `stride::engine::lat::run_size`; unnamed code (`0x2cc0`) as it is.
fn short_name(f: &str) -> String {
    let mut plain = String::with_capacity(f.len());
    let mut depth = 0usize;
    for c in f.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            c if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    match plain.rsplit("::").find(|s| !s.is_empty()) {
        Some(last) => last.to_owned(),
        None => f.to_owned(),
    }
}
