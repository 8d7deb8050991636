//! The parsing jobs of the test scripts (scripts/test, scripts/guest-tests, scripts/lib/),
//! done by parsing what they read rather than by grep, sed and awk:
//!
//! - `xtask test-binaries [--executables]`: reads `cargo test --no-run --message-format=json`
//!   on stdin and prints each test harness as `EXECUTABLE<TAB>PACKAGE_DIR` (or, with
//!   `--executables`, its path alone). Fails when cargo's build failed or listed none.
//! - `xtask skips WHERE`: reads a test's or check's output on stdin and prints each of its
//!   "skipped: REASON" lines as "WHERE: REASON".
//! - `xtask failure-excerpt LOG`: what scripts/test repeats under its summary for a failed
//!   step whose output is in LOG.
//!
//! Built by scripts/test before its first use (`cargo build -p xtask --release`); the
//! SoftRoCE guest, which has no compiler, runs the host's build from the shared repository.

mod cargo_json;
mod results;

use std::io::{Read, Write};
use std::process::ExitCode;

const USAGE: &str = "usage: xtask test-binaries [--executables] < CARGO_JSON
       xtask skips WHERE < OUTPUT
       xtask failure-excerpt LOG";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(&args) {
        Ok(lines) => {
            let mut out = std::io::stdout().lock();
            for line in lines {
                if writeln!(out, "{line}").is_err() {
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(Error::Usage(msg)) => {
            eprintln!("xtask: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Error::Failed(msg)) => {
            eprintln!("xtask: {msg}");
            ExitCode::FAILURE
        }
    }
}

enum Error {
    Usage(String),
    Failed(String),
}

fn run(args: &[&str]) -> Result<Vec<String>, Error> {
    match args {
        ["test-binaries"] | ["test-binaries", "--executables"] => {
            let bins = cargo_json::test_binaries(&stdin()?).map_err(Error::Failed)?;
            bins.into_iter()
                .map(|b| {
                    // The list is one line per binary, tab-separated.
                    if [&b.executable, &b.package_dir]
                        .iter()
                        .any(|s| s.contains(['\t', '\n']))
                    {
                        return Err(Error::Failed(format!(
                            "a tab or newline in a path cannot be listed: {b:?}"
                        )));
                    }
                    Ok(if args.len() == 2 {
                        b.executable
                    } else {
                        format!("{}\t{}", b.executable, b.package_dir)
                    })
                })
                .collect()
        }
        ["skips", where_] => Ok(results::skips(where_, &stdin()?)),
        ["failure-excerpt", log] => {
            let bytes =
                std::fs::read(log).map_err(|e| Error::Failed(format!("cannot read {log}: {e}")))?;
            Ok(results::failure_excerpt(&String::from_utf8_lossy(&bytes)))
        }
        [] => Err(Error::Usage("no command".into())),
        _ => Err(Error::Usage(format!(
            "unknown arguments: {}",
            args.join(" ")
        ))),
    }
}

/// All of stdin; test output need not be UTF-8 (a test may print raw bytes), so invalid
/// sequences become U+FFFD rather than an error.
fn stdin() -> Result<String, Error> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Failed(format!("cannot read stdin: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
