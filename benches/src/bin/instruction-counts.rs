//! Instructions per data-path operation, sideway against C, counted with Valgrind's
//! callgrind (see `benches::instruction_counts` and docs/benchmarks.md).
//!
//! ```text
//! instruction-counts measure [FILTER]   print the counts of every operation (or those whose
//!                                       name contains FILTER)
//! instruction-counts check              measure, compare with benches/instruction-counts.txt
//!                                       and docs/benchmarks.md; exit 1 when sideway grew
//! instruction-counts write              measure, rewrite benches/instruction-counts.txt and
//!                                       the generated tables of docs/benchmarks.md
//! instruction-counts table              print the tables of the committed counts
//! instruction-counts run INDEX          (under callgrind) run operation INDEX on each side
//! ```
//!
//! Build it optimised (`--release`): the counts are of the optimised data path.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use benches::data_path::{
    null_provider_operations, run_c_style, run_rust, CStyle, Operation, RawObjects, Write,
};
use benches::instruction_counts::{
    check, markdown, parse_dump, replace_doc_section, Costs, Counts, RowCounts, Side, DOC_BEGIN,
    FEW, MANY, REBASELINE, WARM,
};
use benches::null_provider::NullProvider;
use sideway::completion_queue::CompletionQueue;
use sideway::queue_pair::QueuePair;

type Error = Box<dyn std::error::Error>;

const COUNTS_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/instruction-counts.txt");
const DOC_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/benchmarks.md");

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["run", index] => run(index),
        ["measure"] => measure(None).map(|c| print!("{}", markdown(&c))),
        ["measure", filter] => measure(Some(filter)).map(|c| print!("{}", markdown(&c))),
        ["check"] => return check_committed(),
        ["write"] => write(),
        ["table"] => committed().map(|c| print!("{}", markdown(&c))),
        _ => Err(
            "usage: instruction-counts measure [FILTER] | check | write | table \
                  (see docs/benchmarks.md)"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("instruction-counts: error: {e}");
            ExitCode::from(2)
        }
    }
}

// ---- The runner, under callgrind ----
//
// Collection is on only inside these three functions (`--toggle-collect`), and callgrind
// dumps after each call (`--dump-after`). `no_mangle` gives them names callgrind matches
// exactly; `inline(never)` keeps them functions; and each keeps its result in memory across
// the call it makes (`black_box(&result)`), so the call is not a tail jump, which callgrind
// would count as leaving the function before the work.

/// What one side's calls need, built once per process.
struct Objects {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    rust_np: NullProvider,
    c_raw: RawObjects,
    cached_raw: RawObjects,
    w: Write,
    _c_providers: [NullProvider; 2],
}

#[no_mangle]
#[inline(never)]
fn rust_side_measured(op: &Operation, objs: &mut Objects, iters: u64) -> Result<u64, Error> {
    let result = run_rust(
        op.op,
        &mut objs.qp,
        &objs.cq,
        Some(&objs.rust_np),
        &objs.w,
        iters,
    );
    std::hint::black_box(&result);
    result
}

#[no_mangle]
#[inline(never)]
fn inline_c_measured(op: &Operation, objs: &Objects, iters: u64) -> Result<u64, Error> {
    // SAFETY: c_raw are the objects of one of objs' null providers, alive as long as objs and
    // used only by this thread; w goes to that null provider only.
    let result = unsafe {
        run_c_style(
            CStyle::Inline,
            op.op,
            &objs.c_raw,
            op.extended,
            &objs.w,
            iters,
        )
    };
    std::hint::black_box(&result);
    result
}

#[no_mangle]
#[inline(never)]
fn cached_c_measured(op: &Operation, objs: &Objects, iters: u64) -> Result<u64, Error> {
    // SAFETY: as in inline_c_measured, with the other provider.
    let result = unsafe {
        run_c_style(
            CStyle::Cached,
            op.op,
            &objs.cached_raw,
            op.extended,
            &objs.w,
            iters,
        )
    };
    std::hint::black_box(&result);
    result
}

fn raw_objects(np: &NullProvider) -> RawObjects {
    RawObjects {
        qp: np.qp_raw(),
        qp_ex: np.qp_ex_raw(),
        cq: np.cq_raw(),
        cq_ex: np.cq_ex_raw(),
    }
}

/// Runs operation `index` WARM, FEW and MANY times on each side, in [`Side::ALL`] order.
fn run(index: &str) -> Result<(), Error> {
    let ops = null_provider_operations();
    let op = index
        .parse::<usize>()
        .ok()
        .and_then(|i| ops.get(i))
        .ok_or_else(|| format!("no operation {index}"))?;
    let rust_np = NullProvider::new();
    let (qp, cq) = rust_np.sideway(op.extended);
    let c_providers = [NullProvider::new(), NullProvider::new()];
    let mut objs = Objects {
        qp,
        cq,
        rust_np,
        c_raw: raw_objects(&c_providers[0]),
        cached_raw: raw_objects(&c_providers[1]),
        // SAFETY: posted only to the null providers, which never dereference the SGE.
        w: unsafe { Write::null() },
        _c_providers: c_providers,
    };
    for side in Side::ALL {
        for iters in [WARM, FEW, MANY] {
            let sum = match side {
                Side::Rust => rust_side_measured(op, &mut objs, iters),
                Side::CInline => inline_c_measured(op, &objs, iters),
                Side::CCached => cached_c_measured(op, &objs, iters),
            }
            .map_err(|e| format!("{} ({}): {e}", op.name, side.key()))?;
            std::hint::black_box(sum);
        }
    }
    Ok(())
}

// ---- The driver ----

fn version(cmd: &str) -> Result<String, Error> {
    let out = Command::new(cmd).arg("--version").output().map_err(|e| {
        format!(
            "cannot run `{cmd} --version`: {e}; the instruction counts need Valgrind: install \
             Debian's `valgrind` package (apt-get install valgrind; scripts/test installs it)"
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs operation `index` under callgrind and returns its costs per operation.
fn measure_one(exe: &Path, index: usize, op: &Operation) -> Result<RowCounts, Error> {
    let dir = std::env::temp_dir().join(format!(
        "sideway-instruction-counts-{}-{index}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let out_file = dir.join("callgrind.out");
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg("--quiet")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--collect-atstart=no")
        .arg("--cache-sim=yes")
        // Fixed caches, not the host's: only reads and writes are kept, but the simulation
        // then says nothing about the machine (and warns about no odd-sized host cache).
        .args(["--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64"])
        .arg("--branch-sim=yes");
    for side in Side::ALL {
        cmd.arg(format!("--toggle-collect={}", side.function()))
            .arg(format!("--dump-after={}", side.function()));
    }
    let out = cmd.arg(exe).arg("run").arg(index.to_string()).output()?;
    let result = (|| {
        if !out.status.success() {
            return Err(format!(
                "valgrind exited with {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // One dump per call, numbered from 1: WARM, FEW, MANY of each side in turn.
        let mut sides = [Costs::default(); 3];
        for (s, side) in Side::ALL.into_iter().enumerate() {
            let dump = |call: usize| -> Result<Costs, String> {
                let path = PathBuf::from(format!("{}.{}", out_file.display(), 3 * s + call + 1));
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                // The dump must be the one of this side's function.
                if !text.contains(&format!("--dump-after={}", side.function())) {
                    return Err(format!(
                        "{}: not a dump after {}",
                        path.display(),
                        side.function()
                    ));
                }
                parse_dump(&text).map_err(|e| format!("{}: {e}", path.display()))
            };
            sides[s] = Costs::per_operation(&dump(1)?, &dump(2)?, op.per_iter);
        }
        // Every side hands the provider the same calls (benches/tests/null_provider.rs), so
        // the provider runs the same instructions for each; if not, the sides differ in
        // work, not in cost, and the comparison is void.
        let provider = sides.map(|c| c.provider_instructions());
        if provider.iter().any(|&p| (p - provider[0]).abs() > 1e-9) {
            return Err(format!(
                "the provider ran {provider:?} instructions per operation for Rust, C and C \
                 cached: the sides do not do the same work"
            ));
        }
        Ok(RowCounts {
            name: op.name.clone(),
            sides,
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result.map_err(|e| format!("{}: {e}", op.name).into())
}

/// Measures every operation (or those whose name contains `filter`), a few callgrind
/// processes at a time.
fn measure(filter: Option<&str>) -> Result<Counts, Error> {
    let valgrind = version("valgrind")?;
    let exe = std::env::current_exe()?;
    let ops: Vec<(usize, Operation)> = null_provider_operations()
        .into_iter()
        .enumerate()
        .filter(|(_, o)| filter.is_none_or(|f| o.name.contains(f)))
        .collect();
    if ops.is_empty() {
        return Err(format!("no operation's name contains {filter:?}").into());
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RowCounts, String>>>> =
        Mutex::new(ops.iter().map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((index, op)) = ops.get(i) else { break };
                let r = measure_one(&exe, *index, op).map_err(|e| e.to_string());
                results.lock().expect("no worker panics holding it")[i] = Some(r);
            });
        }
    });
    let rows = results
        .into_inner()
        .expect("no worker panics holding it")
        .into_iter()
        .map(|r| r.expect("every operation was measured"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Counts {
        rustc: env!("BENCHES_RUSTC").to_owned(),
        cc: env!("BENCHES_C_COMPILER").to_owned(),
        valgrind,
        rows,
    })
}

fn committed() -> Result<Counts, Error> {
    let text = std::fs::read_to_string(COUNTS_FILE).map_err(|e| format!("{COUNTS_FILE}: {e}"))?;
    Counts::parse(&text).map_err(|e| format!("{COUNTS_FILE}: {e}").into())
}

/// The doc with its generated section made from `counts`, and whether it changed.
fn doc_with(counts: &Counts) -> Result<(String, bool), Error> {
    let doc = std::fs::read_to_string(DOC_FILE).map_err(|e| format!("{DOC_FILE}: {e}"))?;
    let new = replace_doc_section(&doc, &markdown(counts))
        .ok_or_else(|| format!("{DOC_FILE}: no {DOC_BEGIN} ... end markers"))?;
    let changed = new != doc;
    Ok((new, changed))
}

fn write() -> Result<(), Error> {
    let text = measure(None)?.render();
    std::fs::write(COUNTS_FILE, &text)?;
    // The tables come from the file as written (rounded), as the check makes them.
    let counts = Counts::parse(&text)?;
    let (doc, _) = doc_with(&counts)?;
    std::fs::write(DOC_FILE, doc)?;
    print!("{}", markdown(&counts));
    eprintln!("wrote {COUNTS_FILE} and the tables of {DOC_FILE}");
    Ok(())
}

fn check_committed() -> ExitCode {
    let run = || -> Result<bool, Error> {
        let committed = committed()?;
        let (_, doc_stale) = doc_with(&committed)?;
        let measured = measure(None)?;
        for row in &measured.rows {
            let [r, c, cc] = row.sides.map(|s| s.instructions());
            println!(
                "{:<48} Rust {r:>9.2}  C {c:>9.2}  C cached {cc:>9.2}  instructions/op",
                row.name
            );
        }
        let verdict = check(&committed, &measured);
        for note in &verdict.notes {
            println!("note: {note}");
        }
        let mut ok = verdict.failures.is_empty();
        for failure in &verdict.failures {
            eprintln!("instruction-counts: FAILED: {failure}");
        }
        if doc_stale {
            ok = false;
            eprintln!(
                "instruction-counts: FAILED: the tables of docs/benchmarks.md are not those of \
                 benches/instruction-counts.txt; `{REBASELINE}` rewrites both"
            );
        }
        if ok {
            println!(
                "instruction counts: {} operations within the margin of the committed counts",
                measured.rows.len()
            );
        }
        Ok(ok)
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("instruction-counts: error: {e}");
            ExitCode::from(2)
        }
    }
}
