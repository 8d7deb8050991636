//! The built xtask binary, as the scripts call it: arguments, stdin, exit status.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn xtask(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

const SAMPLE: &str = include_str!("data/cargo-test-no-run.jsonl");

#[test]
fn test_binaries_prints_tab_separated_lines() {
    let out = xtask(&["test-binaries"], SAMPLE);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    for line in text.lines() {
        let (exe, dir) = line.split_once('\t').unwrap();
        assert!(exe.contains("/deps/") && dir.ends_with("/xtask"), "{line}");
    }
    let out = xtask(&["test-binaries", "--executables"], SAMPLE);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .all(|l| !l.contains('\t') && l.contains("/deps/")),
        "{text}"
    );
}

#[test]
fn test_binaries_fails_on_a_failed_build() {
    let out = xtask(
        &["test-binaries"],
        &SAMPLE.replace(r#""success":true"#, r#""success":false"#),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("build failed"));
}

#[test]
fn skips_and_usage() {
    let out = xtask(&["skips", "t"], "  skipped: no device\nok\n");
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "t: no device\n");
    assert_eq!(xtask(&[], "").status.code(), Some(2));
    assert_eq!(xtask(&["skips"], "").status.code(), Some(2));
    assert_eq!(
        xtask(&["failure-excerpt", "/nonexistent/log"], "")
            .status
            .code(),
        Some(1)
    );
}
