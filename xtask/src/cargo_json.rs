//! cargo's `--message-format=json` output: one JSON object per line on stdout.

use serde_json::Value;

/// A test binary cargo built: the harness to run, and the directory of its package's
/// Cargo.toml (where `cargo test` runs it from).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TestBinary {
    pub(crate) executable: String,
    pub(crate) package_dir: String,
}

/// The test harnesses among cargo's messages, in the order cargo reported them.
///
/// Only `compiler-artifact` messages whose profile says `"test": true` and that name an
/// executable count: cargo also reports the binaries it builds for integration tests to run,
/// which are programs, not test harnesses. A line that is not a JSON object, an artifact
/// without a manifest path, or a `build-finished` message saying the build failed is an
/// error: a list missing binaries would look like a shorter test run.
pub(crate) fn test_binaries(input: &str) -> Result<Vec<TestBinary>, String> {
    let mut found = Vec::new();
    let mut finished = false;
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = serde_json::from_str(line)
            .map_err(|e| format!("line {n} is not one of cargo's JSON messages ({e}): {line}"))?;
        let reason = msg
            .get("reason")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("line {n} has no \"reason\": {line}"))?;
        match reason {
            "compiler-artifact" => {
                let is_test = msg
                    .pointer("/profile/test")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| format!("line {n}: an artifact without profile.test"))?;
                let Some(exe) = msg.get("executable").and_then(Value::as_str) else {
                    continue; // a library or build script: null executable
                };
                if !is_test {
                    continue;
                }
                let manifest = msg
                    .get("manifest_path")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("line {n}: a test binary without manifest_path"))?;
                let package_dir = manifest.strip_suffix("/Cargo.toml").ok_or_else(|| {
                    format!("line {n}: manifest_path {manifest} is no Cargo.toml")
                })?;
                found.push(TestBinary {
                    executable: exe.to_string(),
                    package_dir: package_dir.to_string(),
                });
            }
            "build-finished" => {
                if msg.get("success").and_then(Value::as_bool) != Some(true) {
                    return Err(
                        "cargo's build failed (run it without --message-format to see why)".into(),
                    );
                }
                finished = true;
            }
            _ => {}
        }
    }
    if !finished {
        return Err("cargo's messages end before its build finished".into());
    }
    if found.is_empty() {
        return Err("cargo listed no test binaries".into());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from `cargo test -p xtask --no-run --message-format=json` (paths shortened):
    // a library, the xtask binary built for the integration test, and two harnesses.
    const SAMPLE: &str = include_str!("../tests/data/cargo-test-no-run.jsonl");

    #[test]
    fn lists_only_test_harnesses() {
        let bins = test_binaries(SAMPLE).unwrap();
        assert_eq!(bins.len(), 2, "{bins:?}");
        for b in &bins {
            assert!(b.executable.contains("/deps/"), "{b:?}");
            assert!(b.package_dir.ends_with("/xtask"), "{b:?}");
        }
        // The binary built for the integration tests (target/debug/xtask) is no harness.
        assert!(bins.iter().all(|b| !b.executable.ends_with("/debug/xtask")));
    }

    #[test]
    fn a_failed_build_is_an_error() {
        let failed = SAMPLE.replace(r#""success":true"#, r#""success":false"#);
        assert!(test_binaries(&failed).unwrap_err().contains("build failed"));
    }

    #[test]
    fn a_cut_stream_is_an_error() {
        let cut: String = SAMPLE
            .lines()
            .filter(|l| !l.contains("build-finished"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(test_binaries(&cut)
            .unwrap_err()
            .contains("before its build finished"));
    }

    #[test]
    fn text_is_an_error() {
        let err = test_binaries("   Compiling xtask v0.1.0\n").unwrap_err();
        assert!(err.contains("line 1 is not"), "{err}");
    }

    #[test]
    fn no_harness_is_an_error() {
        let err = test_binaries(r#"{"reason":"build-finished","success":true}"#).unwrap_err();
        assert_eq!(err, "cargo listed no test binaries");
    }

    #[test]
    fn quotes_in_paths_survive() {
        // The sed this replaces stopped at the first quote of a path.
        let line = r#"{"reason":"compiler-artifact","manifest_path":"/a \"b\"/p/Cargo.toml","profile":{"test":true},"executable":"/a \"b\"/t"}
{"reason":"build-finished","success":true}"#;
        let bins = test_binaries(line).unwrap();
        assert_eq!(
            bins,
            [TestBinary {
                executable: "/a \"b\"/t".into(),
                package_dir: "/a \"b\"/p".into()
            }]
        );
    }
}
