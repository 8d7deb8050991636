//! Instructions per iteration of a measured loop, from two callgrind profiles of the same
//! program: one run of `n1` iterations and one of `n2` (`scripts/loop-instructions`).
//!
//! A latency loop spins while it waits, and how long it spins depends on timing, so a
//! profile's totals are not deterministic. Its loop body is: an instruction on the path that
//! every iteration takes runs exactly `k` times per iteration (k = 1 for most, 2 for code the
//! loop reaches twice), so between the two runs its count grows by exactly `k × (n2 − n1)`.
//! Setup and teardown instructions do not grow at all, and a spin's instructions grow by
//! however much longer the second run waited, which is an exact small multiple of
//! `n2 − n1` only by coincidence (and a spinning wait runs them tens of times per iteration,
//! beyond [`MAX_PER_ITERATION`]). Summing `k` over the instructions that grew by an exact
//! multiple therefore counts the instructions one iteration executes outside its waits: the
//! same for the C program and for the Rust one, measured the same way, by object (the
//! program, the provider library, libc, ...). Kernel work (the doorbell's system call) is
//! not seen: callgrind counts user-space instructions only.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The most times per iteration an instruction may run and still count as loop body rather
/// than spin: the ping-pongs reach some code twice (both halves of a round trip).
pub const MAX_PER_ITERATION: u64 = 4;

/// One callgrind profile: instructions executed (`Ir`) per instruction address, by object
/// and function.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Profile {
    /// The profiled command line, from the file's `cmd:` line.
    pub command: String,
    counts: HashMap<(String, String, u64), u64>,
}

/// Why a profile could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line.
    pub line: usize,
    /// What was wrong with it.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

impl std::error::Error for ParseError {}

impl Profile {
    /// Reads a callgrind output file written with `--dump-instr=yes --compress-pos=no` (so
    /// every cost line names its instruction address) and event `Ir`; names may be
    /// compressed or not.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut profile = Profile::default();
        let mut positions: Option<usize> = None;
        let mut ir_column: Option<usize> = None;
        let mut object = String::new();
        let mut function = String::new();
        let mut skip_next_cost = false;
        // Compressed names: "(3) name" defines id 3, a later "(3)" refers to it; objects
        // (ob=, cob=) and functions (fn=, cfn=) number theirs separately.
        let mut objects: HashMap<String, String> = HashMap::new();
        let mut functions: HashMap<String, String> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let err = |what: String| ParseError { line: i + 1, what };
            if let Some(rest) = line.strip_prefix("positions:") {
                let cols: Vec<&str> = rest.split_whitespace().collect();
                if cols.first() != Some(&"instr") {
                    return Err(err(format!(
                        "positions are \"{}\", not by instruction: run callgrind with \
                         --dump-instr=yes",
                        rest.trim()
                    )));
                }
                positions = Some(cols.len());
            } else if let Some(rest) = line.strip_prefix("events:") {
                let at = rest.split_whitespace().position(|e| e == "Ir");
                ir_column = Some(at.ok_or_else(|| err("no Ir event in the profile".into()))?);
            } else if let Some(rest) = line.strip_prefix("cmd:") {
                profile.command = rest.trim().to_owned();
            } else if let Some(rest) = line.strip_prefix("ob=") {
                object = resolve(&mut objects, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("cob=") {
                resolve(&mut objects, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("fn=") {
                function = resolve(&mut functions, rest).map_err(err)?;
            } else if let Some(rest) = line.strip_prefix("cfn=") {
                resolve(&mut functions, rest).map_err(err)?;
            } else if line.starts_with("calls=") {
                // The next cost line is the call's inclusive cost, not the caller's own.
                skip_next_cost = true;
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                if skip_next_cost {
                    skip_next_cost = false;
                    continue;
                }
                let (Some(npos), Some(ir)) = (positions, ir_column) else {
                    return Err(err(
                        "a cost line before the positions: and events: lines".into()
                    ));
                };
                let fields: Vec<&str> = line.split_whitespace().collect();
                let Some(addr) = fields.first().and_then(|a| a.strip_prefix("0x")) else {
                    return Err(err(format!(
                        "\"{line}\" has a relative position: run callgrind with \
                         --compress-pos=no"
                    )));
                };
                let addr = u64::from_str_radix(addr, 16)
                    .map_err(|e| err(format!("address \"{addr}\": {e}")))?;
                // A missing trailing event counts 0, as callgrind writes them.
                let count = match fields.get(npos + ir) {
                    Some(c) => c
                        .parse::<u64>()
                        .map_err(|e| err(format!("count \"{c}\": {e}")))?,
                    None => 0,
                };
                *profile
                    .counts
                    .entry((object.clone(), function.clone(), addr))
                    .or_default() += count;
            }
            // Every other line (fl=, fi=, fe=, cob=, cfn=, totals:, ...) changes nothing
            // counted here.
        }
        if positions.is_none() || ir_column.is_none() {
            return Err(ParseError {
                line: 0,
                what: "not a callgrind profile (no positions: or events: line)".into(),
            });
        }
        Ok(profile)
    }

    /// The instructions counted, over all addresses.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// A name as callgrind writes it: plain, `(12) name` (defining id 12), or `(12)` (a name
/// defined before).
fn resolve(table: &mut HashMap<String, String>, s: &str) -> Result<String, String> {
    let s = s.trim();
    let Some(rest) = s.strip_prefix('(') else {
        return Ok(s.to_owned());
    };
    match rest.split_once(')') {
        Some((id, "")) => table
            .get(id)
            .cloned()
            .ok_or_else(|| format!("name ({id}) used before it was defined")),
        Some((id, name)) => {
            let name = name.trim().to_owned();
            table.insert(id.to_owned(), name.clone());
            Ok(name)
        }
        None => Ok(s.to_owned()),
    }
}

/// Instructions per iteration of one object (the program, a library).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectCost {
    /// The object's file name (`stride-perf`, `librxe-rdmav34.so`, ...).
    pub object: String,
    /// Instructions one iteration executes in it, outside waits.
    pub per_iteration: u64,
    /// The functions they are in, most first: `(function, instructions per iteration)`.
    pub functions: Vec<(String, u64)>,
}

/// The loop body of `short` → `long` (the same program and loop, `iterations` more
/// iterations in `long`), by object, most first; see the module documentation.
pub fn per_iteration(short: &Profile, long: &Profile, iterations: u64) -> Vec<ObjectCost> {
    let mut by_object: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    if iterations == 0 {
        return Vec::new();
    }
    for ((object, function, addr), &n_long) in &long.counts {
        let key = (object.clone(), function.clone(), *addr);
        let n_short = short.counts.get(&key).copied().unwrap_or(0);
        let Some(grew) = n_long.checked_sub(n_short) else {
            continue;
        };
        if grew == 0 || grew % iterations != 0 {
            continue;
        }
        let k = grew / iterations;
        if k > MAX_PER_ITERATION {
            continue;
        }
        let file = object.rsplit('/').next().unwrap_or(object).to_owned();
        *by_object
            .entry(file)
            .or_default()
            .entry(function.clone())
            .or_default() += k;
    }
    let mut out: Vec<ObjectCost> = by_object
        .into_iter()
        .map(|(object, fns)| {
            let mut functions: Vec<(String, u64)> = fns.into_iter().collect();
            functions.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            ObjectCost {
                object,
                per_iteration: functions.iter().map(|f| f.1).sum(),
                functions,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.per_iteration
            .cmp(&a.per_iteration)
            .then_with(|| a.object.cmp(&b.object))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile in callgrind's format: a loop body at 0x10..0x12 run `n` times (0x12 twice
    /// per iteration), a spin at 0x20 run `spins` times, setup at 0x30 once, and a provider
    /// call whose inclusive cost must not count as the caller's.
    fn profile(n: u64, spins: u64) -> String {
        format!(
            "version: 1\ncreator: callgrind-3.24.0\ncmd: ./prog -n {n}\npart: 1\n\n\
             positions: instr line\nevents: Ir\nsummary: 1\n\n\
             ob=(1) /usr/bin/prog\nfl=(1) ???\nfn=(1) main\n\
             0x10 0 {n}\n0x11 0 {n}\n0x12 0 {twice}\n0x20 0 {spins}\n0x30 0 1\n\
             cob=(2) /usr/lib/libprov.so\ncfn=(2) post\ncalls={n} 0x400\n0x13 0 {inclusive}\n\
             ob=(2)\nfn=(2)\n0x400 0 {n}\n0x401 0 {n}\n0x402 0 {n}\n",
            twice = 2 * n,
            inclusive = 3 * n,
        )
    }

    #[test]
    fn counts_the_body_not_the_spins_setup_or_inclusive_costs() {
        let short = Profile::parse(&profile(1000, 61_237)).unwrap();
        let long = Profile::parse(&profile(2000, 119_001)).unwrap();
        assert_eq!(long.command, "./prog -n 2000");
        let cost = per_iteration(&short, &long, 1000);
        assert_eq!(cost.len(), 2, "{cost:?}");
        // main: 0x10 once, 0x11 once, 0x12 twice; the call's line 0x13 is not the caller's.
        assert_eq!(cost[0].object, "prog");
        assert_eq!(cost[0].per_iteration, 4);
        assert_eq!(cost[0].functions, vec![("main".to_owned(), 4)]);
        assert_eq!(cost[1].object, "libprov.so");
        assert_eq!(cost[1].per_iteration, 3);
        assert_eq!(cost[1].functions, vec![("post".to_owned(), 3)]);
    }

    #[test]
    fn a_spin_that_grew_by_an_exact_multiple_still_does_not_count() {
        // 50 spins per iteration: an exact multiple, but far beyond any body instruction.
        let short = Profile::parse(&profile(1000, 50_000)).unwrap();
        let long = Profile::parse(&profile(2000, 100_000)).unwrap();
        let cost = per_iteration(&short, &long, 1000);
        assert_eq!(cost[0].per_iteration, 4);
    }

    #[test]
    fn compressed_positions_and_missing_headers_are_refused_with_the_fix() {
        let relative = "positions: instr line\nevents: Ir\nfn=(1) f\n+3 0 7\n";
        let e = Profile::parse(relative).unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.to_string().contains("--compress-pos=no"), "{e}");
        let by_line = "positions: line\nevents: Ir\n";
        assert!(Profile::parse(by_line)
            .unwrap_err()
            .to_string()
            .contains("--dump-instr=yes"));
        assert!(Profile::parse("hello\n").is_err());
        let undefined = "positions: instr\nevents: Ir\nfn=(7)\n0x1 5\n";
        assert!(Profile::parse(undefined)
            .unwrap_err()
            .to_string()
            .contains("(7) used before"));
        let no_ir = "positions: instr\nevents: Dr\n";
        assert!(Profile::parse(no_ir)
            .unwrap_err()
            .to_string()
            .contains("Ir"));
    }

    #[test]
    fn no_iterations_means_no_body() {
        let p = Profile::parse(&profile(1000, 5)).unwrap();
        assert!(per_iteration(&p, &p, 0).is_empty());
        assert!(per_iteration(&p, &p, 1000).is_empty());
        assert_eq!(p.total(), 1000 + 1000 + 2000 + 5 + 1 + 3000);
    }
}
