//! Instructions per data-path operation, counted with Valgrind's callgrind: the deterministic
//! twin of the timing table, and the numbers `scripts/tests/instruction-counts.sh` gates on.
//!
//! The `instruction-counts` binary (`src/bin/instruction-counts.rs`) runs one operation of
//! [`null_provider_operations`](crate::data_path::null_provider_operations) per callgrind
//! process, on each of three sides ([`Side`]), `WARM`, `FEW` and `MANY` iterations per side,
//! with collection on only inside the side's measuring function and a dump after each call.
//! An operation costs `(cost(MANY) - cost(FEW)) / (MANY - FEW)` (per work request for the
//! batches): whatever a call does once (claiming the CQ, reading the provider's pointers,
//! entering and leaving the loop) cancels. The warm-up call takes the first-call costs
//! (the dynamic linker binding the C functions) out of both.
//!
//! This module owns what has no Valgrind in it: reading callgrind's dump files, the committed
//! counts file (`benches/instruction-counts.txt`), the comparison against it, and the Markdown
//! tables of docs/benchmarks.md.

use std::fmt::Write as _;

/// The iteration counts of one side's three calls: a warm-up, then the two that are
/// subtracted. `MANY - FEW` is a power of two, so a loop the compiler unrolled by any power
/// of two up to it leaves the same remainder in both and the difference is exact.
pub const WARM: u64 = 256;
/// The shorter measured call.
pub const FEW: u64 = 256;
/// The longer measured call.
pub const MANY: u64 = FEW + 1024;

/// The callgrind events kept per operation: instructions, data reads, data writes
/// (`--cache-sim=yes`), conditional and indirect branches executed (`--branch-sim=yes`).
pub const EVENTS: [&str; 5] = ["Ir", "Dr", "Dw", "Bc", "Bi"];

/// The counts file's columns: [`EVENTS`], then the instructions executed inside the null
/// provider's own functions (named `null_*`, `csrc/null_provider.c`), which every side calls
/// alike: the total less that is the data path's own cost.
pub const COLUMNS: [&str; 6] = ["Ir", "Dr", "Dw", "Bc", "Bi", "provider_Ir"];

/// Growth over the committed Rust instruction count that the check still accepts: this share
/// of the count, or [`MARGIN_MIN`] instructions, whichever is larger. Counts are exact for a
/// given build; the margin absorbs only small code-generation shifts.
pub const MARGIN_SHARE: f64 = 0.02;
/// See [`MARGIN_SHARE`].
pub const MARGIN_MIN: f64 = 1.0;

/// How to write new counts, for messages and docs.
pub const REBASELINE: &str = "scripts/tests/instruction-counts.sh --write";

/// Who runs the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// sideway (`data_path::run_rust`).
    Rust,
    /// C over verbs.h's inlines (`csrc/data_path.c`).
    CInline,
    /// C with the provider's pointers read once (`csrc/data_path_cached.c`).
    CCached,
}

impl Side {
    /// Every side, in the order of the counts file and of the runner's calls.
    pub const ALL: [Side; 3] = [Side::Rust, Side::CInline, Side::CCached];

    /// The side's name in the counts file.
    pub fn key(self) -> &'static str {
        match self {
            Side::Rust => "rust",
            Side::CInline => "c",
            Side::CCached => "c-cached",
        }
    }

    /// The runner's function that callgrind collects inside (`--toggle-collect`).
    pub fn function(self) -> &'static str {
        match self {
            Side::Rust => "rust_side_measured",
            Side::CInline => "inline_c_measured",
            Side::CCached => "cached_c_measured",
        }
    }

    fn from_key(key: &str) -> Option<Side> {
        Side::ALL.into_iter().find(|s| s.key() == key)
    }
}

/// One side's cost of one operation, column by column ([`COLUMNS`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Costs(pub [f64; COLUMNS.len()]);

impl Costs {
    /// Instructions.
    pub fn instructions(&self) -> f64 {
        self.0[0]
    }

    /// Instructions inside the null provider's functions.
    pub fn provider_instructions(&self) -> f64 {
        self.0[5]
    }

    /// Instructions outside the null provider: the data path's own.
    pub fn own_instructions(&self) -> f64 {
        self.instructions() - self.provider_instructions()
    }

    /// Per operation, from the totals of the `FEW` and `MANY` calls and the operations per
    /// iteration.
    pub fn per_operation(few: &Costs, many: &Costs, per_iter: u64) -> Costs {
        let ops = ((MANY - FEW) * per_iter) as f64;
        Costs(std::array::from_fn(|i| (many.0[i] - few.0[i]) / ops))
    }
}

/// The functions whose instructions are the provider's, not the data path's.
pub const PROVIDER_PREFIX: &str = "null_";

/// Reads one callgrind dump file (callgrind's format, as written by Valgrind 3.x): its
/// totals, and the instructions of the provider's functions (exclusive of what they call),
/// as [`Costs`].
pub fn parse_dump(text: &str) -> Result<Costs, String> {
    let mut names: Option<Vec<&str>> = None;
    let mut totals: Option<Vec<f64>> = None;
    let mut positions = 1;
    // Function names are compressed: `fn=(7) name` the first time (in `fn=` or `cfn=`),
    // `fn=(7)` after.
    let mut fn_names: std::collections::HashMap<&str, &str> = Default::default();
    let mut in_provider = false;
    let mut after_calls = false;
    let mut provider = 0.0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("events:") {
            names = Some(rest.split_whitespace().collect());
        } else if let Some(rest) = line.strip_prefix("positions:") {
            positions = rest.split_whitespace().count().max(1);
        } else if let Some(rest) = line
            .strip_prefix("totals:")
            .or_else(|| line.strip_prefix("summary:"))
        {
            let values = rest
                .split_whitespace()
                .map(|v| v.parse::<f64>().map_err(|e| format!("{line:?}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            totals = Some(values);
        } else if let Some(spec) = line
            .strip_prefix("fn=")
            .or_else(|| line.strip_prefix("cfn="))
        {
            let name = match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
                Some((id, "")) => fn_names.get(id).copied().unwrap_or(""),
                Some((id, name)) => {
                    let name = name.trim_start();
                    fn_names.insert(id, name);
                    name
                }
                None => spec,
            };
            if line.starts_with("fn=") {
                in_provider = name.starts_with(PROVIDER_PREFIX);
            }
        } else if line.starts_with("calls=") {
            // The next cost line is the call's inclusive cost, not the caller's own.
            after_calls = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            if in_provider && !after_calls {
                // The first event is Ir (checked below); a line may leave out trailing zeros.
                let ir = line.split_whitespace().nth(positions).unwrap_or("0");
                provider += ir.parse::<f64>().map_err(|e| format!("{line:?}: {e}"))?;
            }
            after_calls = false;
        }
    }
    let names = names.ok_or("no `events:` line")?;
    let totals = totals.ok_or("no `totals:` or `summary:` line")?;
    if names.first() != Some(&"Ir") {
        return Err("the dump does not count instructions first (Ir)".to_owned());
    }
    let mut total = Costs::default();
    for (i, event) in EVENTS.iter().enumerate() {
        if let Some(pos) = names.iter().position(|n| n == event) {
            // callgrind leaves out trailing zeros of a cost line.
            total.0[i] = totals.get(pos).copied().unwrap_or(0.0);
        }
    }
    total.0[5] = provider;
    Ok(total)
}

/// The measured or committed costs of one operation on every side.
#[derive(Debug, Clone, PartialEq)]
pub struct RowCounts {
    /// The operation's name (the timing table's row).
    pub name: String,
    /// Per [`Side::ALL`].
    pub sides: [Costs; 3],
}

impl RowCounts {
    /// One side's costs.
    pub fn side(&self, side: Side) -> &Costs {
        &self.sides[side as usize]
    }
}

/// A set of counts with the toolchain that produced them: the contents of
/// `benches/instruction-counts.txt`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Counts {
    /// `rustc --version` of the build measured.
    pub rustc: String,
    /// `cc --version` (first line) of the C side.
    pub cc: String,
    /// `valgrind --version`.
    pub valgrind: String,
    /// Every operation, in table order.
    pub rows: Vec<RowCounts>,
}

const HEADER: &str = "\
# Instructions (and data reads, data writes, conditional and indirect branches) per
# data-path operation on the null provider, counted with Valgrind's callgrind by
# `cargo run --release -p benches --bin instruction-counts`; see docs/benchmarks.md.
# Written by `scripts/tests/instruction-counts.sh --write`; checked by the same script
# without --write. Per work request for the batches, per operation otherwise.
# Sides: rust = sideway, c = C over verbs.h's inlines, c-cached = C with the provider's
# function pointers read once.
";

impl Counts {
    /// The counts file's text.
    pub fn render(&self) -> String {
        let mut out = String::from(HEADER);
        let _ = writeln!(out, "rustc\t{}", self.rustc);
        let _ = writeln!(out, "cc\t{}", self.cc);
        let _ = writeln!(out, "valgrind\t{}", self.valgrind);
        let _ = writeln!(out, "operation\tside\t{}", COLUMNS.join("\t"));
        for row in &self.rows {
            for side in Side::ALL {
                let _ = write!(out, "{}\t{}", row.name, side.key());
                for v in row.side(side).0 {
                    let _ = write!(out, "\t{v:.2}");
                }
                out.push('\n');
            }
        }
        out
    }

    /// Reads a counts file written by [`render`](Self::render).
    pub fn parse(text: &str) -> Result<Counts, String> {
        let mut counts = Counts::default();
        for (n, line) in text.lines().enumerate() {
            let at = |msg: &str| format!("line {}: {msg}: {line:?}", n + 1);
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            match fields[..] {
                ["rustc", v] => counts.rustc = v.to_owned(),
                ["cc", v] => counts.cc = v.to_owned(),
                ["valgrind", v] => counts.valgrind = v.to_owned(),
                ["operation", "side", ..] => {
                    if fields[2..] != COLUMNS {
                        return Err(at("the columns are not the events this build counts"));
                    }
                }
                [name, side, ref values @ ..] if values.len() == COLUMNS.len() => {
                    let side = Side::from_key(side).ok_or_else(|| at("unknown side"))?;
                    let mut costs = Costs::default();
                    for (slot, v) in costs.0.iter_mut().zip(values) {
                        *slot = v.parse().map_err(|_| at("not a number"))?;
                    }
                    if counts.rows.last().is_none_or(|r| r.name != name) {
                        counts.rows.push(RowCounts {
                            name: name.to_owned(),
                            sides: Default::default(),
                        });
                    }
                    let row = counts.rows.last_mut().expect("pushed above");
                    row.sides[side as usize] = costs;
                }
                _ => return Err(at("not a line of a counts file")),
            }
        }
        if counts.rows.is_empty() {
            return Err("no counts".to_owned());
        }
        Ok(counts)
    }

    fn row(&self, name: &str) -> Option<&RowCounts> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// The largest Rust instruction count per operation that the check accepts, over a committed
/// one.
pub fn allowed(committed: f64) -> f64 {
    committed + (committed * MARGIN_SHARE).max(MARGIN_MIN)
}

/// The outcome of comparing a measurement with the committed counts.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Why the check fails, one line per cause (empty: it passes).
    pub failures: Vec<String>,
    /// What is worth saying but does not fail: improvements, a toolchain change.
    pub notes: Vec<String>,
}

/// Compares `measured` (sideway's instructions per operation, row by row) with
/// `committed`. A row fails when sideway's count grew past [`allowed`], or when it has no
/// committed count; a toolchain that differs from the committed one is named, with the
/// command that re-baselines.
pub fn check(committed: &Counts, measured: &Counts) -> Verdict {
    let mut v = Verdict::default();
    for row in &measured.rows {
        let Some(old) = committed.row(&row.name) else {
            v.failures.push(format!(
                "{}: no committed count (a new operation?)",
                row.name
            ));
            continue;
        };
        let (was, now) = (
            old.side(Side::Rust).instructions(),
            row.side(Side::Rust).instructions(),
        );
        let c_was = old.side(Side::CCached).instructions();
        let c_now = row.side(Side::CCached).instructions();
        let c_moved = if (c_now - c_was).abs() >= 0.01 {
            format!(" (the C side with cached pointers moved too: {c_was:.2} -> {c_now:.2})")
        } else {
            String::new()
        };
        if now > allowed(was) {
            v.failures.push(format!(
                "{}: sideway takes {now:.2} instructions per operation, {:+.2} ({:+.1} %) over \
                 the committed {was:.2}; at most {:.2} passes{c_moved}",
                row.name,
                now - was,
                (now - was) / was * 100.0,
                allowed(was)
            ));
        } else if was - now > (was * MARGIN_SHARE).max(MARGIN_MIN) {
            v.notes.push(format!(
                "{}: sideway takes {now:.2} instructions per operation, {:.2} fewer than the \
                 committed {was:.2}{c_moved}",
                row.name,
                was - now
            ));
        }
    }
    for row in &committed.rows {
        if measured.row(&row.name).is_none() && measured.rows.len() > 1 {
            v.notes
                .push(format!("{}: committed but not measured", row.name));
        }
    }
    let mut toolchain = Vec::new();
    for (what, was, now) in [
        ("rustc", &committed.rustc, &measured.rustc),
        ("cc", &committed.cc, &measured.cc),
        ("valgrind", &committed.valgrind, &measured.valgrind),
    ] {
        if was != now {
            toolchain.push(format!(
                "{what}: committed with {was:?}, measured with {now:?}"
            ));
        }
    }
    if !toolchain.is_empty() {
        let line = format!(
            "the toolchain differs from the one the counts were recorded with ({}): if sideway \
             did not change, the compiler did; re-baseline with `{REBASELINE}` and commit \
             benches/instruction-counts.txt and docs/benchmarks.md",
            toolchain.join("; ")
        );
        if v.failures.is_empty() {
            v.notes.push(line);
        } else {
            v.failures.push(line);
        }
    } else if !v.failures.is_empty() {
        v.failures.push(format!(
            "same toolchain as the committed counts: sideway's data path itself executes more \
             instructions. Find where with callgrind_annotate (docs/benchmarks.md, \
             \"Instructions per operation\"); if the growth is wanted, re-baseline with \
             `{REBASELINE}` and say why in the commit"
        ));
    }
    v
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.3}", a / b)
}

/// The Markdown tables of docs/benchmarks.md: instructions per operation on each side, the
/// provider's share, the ratios and whether sideway meets the cached-pointer C; then data
/// reads, writes and branches.
pub fn markdown(counts: &Counts) -> String {
    let mut out = format!(
        "Recorded with {}; C: {}, -O3; {}.\n\n",
        counts.rustc, counts.cc, counts.valgrind
    );
    out.push_str(
        "| operation | Rust | C (verbs.h) | C (cached) | provider | Rust/C | Rust/C cached | \
         same, less the provider | verdict |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for row in &counts.rows {
        let [r, c, cc] = row.sides.map(|s| s.instructions());
        let provider = row.side(Side::CCached).provider_instructions();
        let verdict = if r <= cc {
            "met".to_owned()
        } else {
            format!("above by {:.2}", r - cc)
        };
        let _ = writeln!(
            out,
            "| {} | {r:.2} | {c:.2} | {cc:.2} | {provider:.2} | {} | {} | {} | {verdict} |",
            row.name,
            ratio(r, c),
            ratio(r, cc),
            ratio(
                row.side(Side::Rust).own_instructions(),
                row.side(Side::CCached).own_instructions()
            ),
        );
    }
    out.push_str(
        "\nData reads, data writes and branches (conditional + indirect) per operation, \
         Rust / C (verbs.h) / C (cached):\n\n\
         | operation | data reads | data writes | branches |\n\
         | --- | ---: | ---: | ---: |\n",
    );
    for row in &counts.rows {
        let triple = |f: &dyn Fn(&Costs) -> f64| {
            Side::ALL
                .map(|s| format!("{:.2}", f(row.side(s))))
                .join(" / ")
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.name,
            triple(&|c| c.0[1]),
            triple(&|c| c.0[2]),
            triple(&|c| c.0[3] + c.0[4]),
        );
    }
    out
}

/// The markers around the generated part of docs/benchmarks.md.
pub const DOC_BEGIN: &str =
    "<!-- instruction-counts: begin (generated from benches/instruction-counts.txt) -->";
/// See [`DOC_BEGIN`].
pub const DOC_END: &str = "<!-- instruction-counts: end -->";

/// `doc` with the text between the markers replaced by `tables`; `None` when the markers are
/// missing.
pub fn replace_doc_section(doc: &str, tables: &str) -> Option<String> {
    let start = doc.find(DOC_BEGIN)? + DOC_BEGIN.len();
    let end = start + doc[start..].find(DOC_END)?;
    Some(format!(
        "{}\n\n{}\n{}",
        &doc[..start],
        tables.trim_end(),
        &doc[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "version: 1\ncreator: callgrind-3.19.0\n\
        desc: Trigger: --dump-after=rust_side_measured\n\
        positions: line\n\
        events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim\n\
        summary: 1000 400 300 1 2 3 4 5 6 50 7 8\n\
        fl=(1) ???\n\
        fn=(1) loop\n\
        cfn=(2) null_post_send\n\
        calls=10 0\n\
        0 70 7\n\
        +1 900 390 300 0 0 0 0 0 0 50 7 8\n\
        fn=(2)\n\
        0 60 5\n\
        +2 10 5\n\
        fn=(3) null_cq_add\n\
        0 5\n\
        fn=(4) other\n\
        0 25\n\
        totals: 1000 400 300 1 2 3 4 5 6 50 7 8\n";

    #[test]
    fn a_dump_gives_its_totals_and_the_providers_share() {
        // Bi is 8; Bim, the last, was left out as callgrind does with trailing zeros. The
        // provider: null_post_send's own lines (60 + 10) and null_cq_add's (5), not the
        // call's 70.
        assert_eq!(
            parse_dump(DUMP).unwrap(),
            Costs([1000.0, 400.0, 300.0, 50.0, 8.0, 75.0])
        );
        assert!(parse_dump("events: Ir\n").is_err(), "no totals");
        assert!(parse_dump("totals: 5\n").is_err(), "no events");
        assert!(
            parse_dump("events: Dr Ir\ntotals: 1 2\n").is_err(),
            "Ir not first"
        );
    }

    #[test]
    fn per_operation_subtracts_the_short_call() {
        let few = Costs([100.0, 10.0, 0.0, 0.0, 0.0, 50.0]);
        let many = Costs([
            100.0 + 1024.0 * 40.0,
            10.0 + 1024.0 * 4.0,
            0.0,
            0.0,
            0.0,
            50.0 + 1024.0 * 16.0,
        ]);
        assert_eq!(
            Costs::per_operation(&few, &many, 1),
            Costs([40.0, 4.0, 0.0, 0.0, 0.0, 16.0])
        );
        assert_eq!(Costs::per_operation(&few, &many, 8).0[0], 5.0);
    }

    fn sample(rust: f64) -> Counts {
        Counts {
            rustc: "rustc 1".to_owned(),
            cc: "cc 1".to_owned(),
            valgrind: "valgrind-3".to_owned(),
            rows: vec![RowCounts {
                name: "post 1 WRITE (classic)".to_owned(),
                sides: [
                    Costs([rust, 10.0, 5.0, 3.0, 1.0, 20.0]),
                    Costs([50.5, 11.0, 5.0, 3.0, 2.0, 20.0]),
                    Costs([48.25, 9.0, 5.0, 3.0, 1.0, 20.0]),
                ],
            }],
        }
    }

    #[test]
    fn the_counts_file_reads_back_what_was_written() {
        let counts = sample(40.0);
        assert_eq!(Counts::parse(&counts.render()).unwrap(), counts);
        assert!(Counts::parse("# nothing\n").is_err());
        assert!(Counts::parse("op\tperl\t1\t2\t3\t4\t5\n").is_err());
    }

    #[test]
    fn growth_past_the_margin_fails_and_names_the_row() {
        let committed = sample(100.0);
        assert!(check(&committed, &sample(102.0)).failures.is_empty());
        let v = check(&committed, &sample(102.5));
        assert_eq!(v.failures.len(), 2, "{:?}", v.failures);
        assert!(v.failures[0].starts_with("post 1 WRITE (classic): sideway takes 102.50"));
        assert!(v.failures[0].contains("+2.50 (+2.5 %)"));
        assert!(v.failures[1].contains("same toolchain"));
        // Small counts get at least one instruction of slack.
        assert!(check(&sample(10.0), &sample(11.0)).failures.is_empty());
        assert!(!check(&sample(10.0), &sample(11.01)).failures.is_empty());
    }

    #[test]
    fn a_new_toolchain_is_named_with_the_rebaseline_command() {
        let committed = sample(100.0);
        let mut measured = sample(110.0);
        measured.rustc = "rustc 2".to_owned();
        let v = check(&committed, &measured);
        let last = v.failures.last().unwrap();
        assert!(last.contains("rustc: committed with \"rustc 1\", measured with \"rustc 2\""));
        assert!(last.contains(REBASELINE));
        measured = sample(100.0);
        measured.cc = "cc 2".to_owned();
        let v = check(&committed, &measured);
        assert!(v.failures.is_empty());
        assert!(
            v.notes[0].contains("cc: committed"),
            "a note, not a failure"
        );
    }

    #[test]
    fn improvements_and_new_rows_are_reported() {
        let v = check(&sample(100.0), &sample(90.0));
        assert!(v.failures.is_empty());
        assert!(v.notes[0].contains("10.00 fewer"));
        let mut measured = sample(100.0);
        measured.rows[0].name = "new".to_owned();
        assert!(check(&sample(100.0), &measured).failures[0].starts_with("new: no committed"));
    }

    #[test]
    fn the_table_gives_ratios_and_verdicts() {
        let t = markdown(&sample(40.0));
        assert!(t.contains(
            "| post 1 WRITE (classic) | 40.00 | 50.50 | 48.25 | 20.00 | 0.792 | 0.829 | 0.708 | met |"
        ));
        let t = markdown(&sample(50.0));
        assert!(t.contains("| above by 1.75 |"), "{t}");
        assert!(t.contains("| 10.00 / 11.00 / 9.00 | 5.00 / 5.00 / 5.00 | 4.00 / 5.00 / 4.00 |"));
    }

    #[test]
    fn the_doc_section_is_replaced_between_its_markers() {
        let doc = format!("a\n{DOC_BEGIN}\nold\n{DOC_END}\nb\n");
        assert_eq!(
            replace_doc_section(&doc, "new\n").unwrap(),
            format!("a\n{DOC_BEGIN}\n\nnew\n{DOC_END}\nb\n")
        );
        assert!(replace_doc_section("a\n", "new").is_none());
    }
}
