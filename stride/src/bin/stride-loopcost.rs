//! `stride-loopcost`: the instructions one iteration of a measured loop executes outside its
//! waits, by object, from two callgrind profiles of the same run with ITERATIONS more
//! iterations in LONG (see [`stride::loop_cost`]); and the runs of
//! `scripts/loop-instructions`, whose rows it reads, plans and reports:
//!
//! ```text
//! stride-loopcost SHORT_PROFILE LONG_PROFILE ITERATIONS [LABEL]   one comparison
//! stride-loopcost rows [ROW...]                  the rows, checked (none: the defaults)
//! stride-loopcost plan SHORT LONG [ROW...]       one line per run, for the guest script
//! stride-loopcost report DIR SHORT LONG [ROW...] every row's comparison and a table
//! ```
//!
//! `plan` reads the hosts from the guest's environment: `STRIDE_BIN`, `RDMA_TEST_DEVICE`,
//! `RDMA_TEST_GID_INDEX`, `RDMA_TEST_PEER_DEVICE`, `RDMA_TEST_PEER_GID_INDEX`,
//! `RDMA_TEST_PEER_IP`.

use std::process::ExitCode;

use stride::loop_cost::{
    by_crate, by_group, label, loose_by_crate, loose_by_group, loose_per_iteration, parse_rows,
    per_iteration, plan, profile_name, program_of, Group, Hosts, LooseCost, ObjectCost, Profile,
    Row,
};

/// Functions listed per object.
const TOP_FUNCTIONS: usize = 5;
/// The port of the first run of a plan; each run takes the next.
const FIRST_PORT: u16 = 19701;

const USAGE: &str = concat!(
    "usage: stride-loopcost SHORT_PROFILE LONG_PROFILE ITERATIONS [LABEL]\n",
    "       stride-loopcost rows [ROW...]\n",
    "       stride-loopcost plan SHORT_ITERS LONG_ITERS [ROW...]\n",
    "       stride-loopcost report DIR SHORT_ITERS LONG_ITERS [ROW...]"
);

/// A failure: its message, and whether it was the caller's mistake (exit 2) or not (1).
struct Failure(String, bool);

fn usage(what: String) -> Failure {
    Failure(what, true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("rows") => rows(&args[1..]),
        Some("plan") => plan_runs(&args[1..]),
        Some("report") => report(&args[1..]),
        _ => one(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(e, caller)) => {
            if e.starts_with("usage:") {
                eprintln!("{e}");
            } else {
                eprintln!("stride-loopcost: {e}");
            }
            ExitCode::from(if caller { 2 } else { 1 })
        }
    }
}

fn one(args: &[String]) -> Result<(), Failure> {
    let (short, long, iterations, label) = match args {
        [s, l, n] => (s, l, n, None),
        [s, l, n, label] => (s, l, n, Some(label.as_str())),
        _ => return Err(usage(USAGE.to_owned())),
    };
    let Ok(iterations) = iterations.parse::<u64>() else {
        return Err(usage(format!(
            "ITERATIONS must be a whole number, not \"{iterations}\""
        )));
    };
    let (short, long) = (load(short)?, load(long)?);
    if iterations == 0 {
        return Err(usage(
            "ITERATIONS must be above 0: the two runs must differ".into(),
        ));
    }
    print_cost(&short, &long, iterations, label);
    Ok(())
}

fn rows(args: &[String]) -> Result<(), Failure> {
    let rows = parse_rows(args).map_err(usage)?;
    let words: Vec<String> = rows.iter().map(Row::to_string).collect();
    println!("{}", words.join(" "));
    Ok(())
}

/// SHORT LONG from `args`, checked: whole numbers, LONG the larger.
fn iterations(short: &str, long: &str) -> Result<(u64, u64), Failure> {
    match (short.parse::<u64>(), long.parse::<u64>()) {
        (Ok(s), Ok(l)) if l > s => Ok((s, l)),
        _ => Err(usage(format!(
            "SHORT_ITERS and LONG_ITERS must be whole numbers, LONG_ITERS the larger (got \
             {short} and {long})"
        ))),
    }
}

fn plan_runs(args: &[String]) -> Result<(), Failure> {
    let [short, long, rest @ ..] = args else {
        return Err(usage(USAGE.to_owned()));
    };
    let (short, long) = iterations(short, long)?;
    let rows = parse_rows(rest).map_err(usage)?;
    let var = |name: &str| {
        std::env::var(name).map_err(|_| {
            usage(format!(
                "{name} is not set: plan runs in the two-host guest (scripts/loop-instructions)"
            ))
        })
    };
    let hosts = Hosts {
        stride_perf: var("STRIDE_BIN")?,
        device: var("RDMA_TEST_DEVICE")?,
        gid_index: var("RDMA_TEST_GID_INDEX")?,
        peer_device: var("RDMA_TEST_PEER_DEVICE")?,
        peer_gid_index: var("RDMA_TEST_PEER_GID_INDEX")?,
        peer_ip: var("RDMA_TEST_PEER_IP")?,
    };
    for run in plan(&rows, short, long, FIRST_PORT, &hosts) {
        println!("{}", run.line().map_err(usage)?);
    }
    Ok(())
}

fn report(args: &[String]) -> Result<(), Failure> {
    let [dir, short, long, rest @ ..] = args else {
        return Err(usage(USAGE.to_owned()));
    };
    let (short_n, long_n) = iterations(short, long)?;
    let rows = parse_rows(rest).map_err(usage)?;
    let mut table = vec![format!(
        "| row | per iteration | {} |",
        Group::ALL.map(Group::heading).join(" | ")
    )];
    table.push(format!("| --- |{}", " ---: |".repeat(1 + Group::ALL.len())));
    for row in rows {
        for &tool in row.test.tools() {
            let path = |n| format!("{dir}/{}", profile_name(row, tool, n));
            let (short, long) = (load(&path(short_n))?, load(&path(long_n))?);
            let name = label(row, tool);
            let (cost, loose) = print_cost(&short, &long, long_n - short_n, Some(&name));
            let program = program_of(&long.command);
            let strict = by_group(&cost, program);
            let loose = loose_by_group(&loose, program);
            let cell = |s: u64, l: f64| format!("{s} / {l:.0}");
            let cells: Vec<String> = strict.iter().zip(loose).map(|(&s, l)| cell(s, l)).collect();
            table.push(format!(
                "| {name} | {} | {} |",
                cell(strict.iter().sum(), loose.iter().sum()),
                cells.join(" | ")
            ));
        }
    }
    println!(
        "\nInstructions per iteration (one round trip), by object: strict / loose \
         (stride/src/loop_cost.rs: per_iteration, loose_per_iteration)\n"
    );
    for line in table {
        println!("{line}");
    }
    Ok(())
}

fn load(path: &str) -> Result<Profile, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure(format!("reading {path}: {e}"), false))?;
    Profile::parse(&text).map_err(|e| Failure(format!("{path}: {e}"), false))
}

/// Prints one comparison: the total, and per object its functions; for a Rust program also
/// its crates; then the looser count likewise. Returns both counts by object.
fn print_cost(
    short: &Profile,
    long: &Profile,
    iterations: u64,
    label: Option<&str>,
) -> (Vec<ObjectCost>, Vec<LooseCost>) {
    let cost = per_iteration(short, long, iterations);
    let loose = loose_per_iteration(short, long, iterations);
    let total: u64 = cost.iter().map(|c| c.per_iteration).sum();
    let loose_total: f64 = loose.iter().map(|c| c.per_iteration).sum();
    let label = label.unwrap_or(&long.command);
    println!(
        "{label}: {total} instructions per iteration outside waits (strict); \
         {loose_total:.0} loose"
    );
    let program = program_of(&long.command);
    for c in &cost {
        let functions: Vec<(String, f64)> = c
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), *n as f64))
            .collect();
        print_object(&c.per_iteration.to_string(), &c.object, &functions);
        let crates = by_crate(c);
        if c.object == program && crates.iter().any(|(k, _)| k != "(other)") {
            let crates: Vec<String> = crates.iter().map(|(k, n)| format!("{k} {n}")).collect();
            println!("  {:>6}  {:<28} (by crate: {})", "", "", crates.join(", "));
        }
    }
    println!("  loose:");
    for c in &loose {
        print_object(&format!("{:.0}", c.per_iteration), &c.object, &c.functions);
        let crates = loose_by_crate(c);
        if c.object == program && crates.iter().any(|(k, _)| k != "(other)") {
            let crates: Vec<String> = crates.iter().map(|(k, n)| format!("{k} {n:.0}")).collect();
            println!("  {:>6}  {:<28} (by crate: {})", "", "", crates.join(", "));
        }
    }
    (cost, loose)
}

/// One object's line: its count, its name, its first functions.
fn print_object(count: &str, object: &str, functions: &[(String, f64)]) {
    let top: Vec<String> = functions
        .iter()
        .take(TOP_FUNCTIONS)
        .map(|(f, n)| format!("{} {n:.0}", short_name(f)))
        .collect();
    let more = functions.len().saturating_sub(TOP_FUNCTIONS);
    let more = if more > 0 {
        format!(", {more} more")
    } else {
        String::new()
    };
    println!("  {count:>6}  {object:<28} ({}{more})", top.join(", "));
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
