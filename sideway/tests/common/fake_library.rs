//! Test doubles of the C libraries the shim loads (`tests/support/fake_*.c`): building one
//! with the C compiler, and running a test against it in a child process of the test binary
//! (a process loads each library once, so the double goes in through the shim's
//! `RDMA_MUMMY_*` variable, set for the child only).

#![allow(dead_code)] // each test binary uses its own subset

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/support/SOURCE` into `LIBRARY` (e.g. `libmlx5.so.1`) under the target's
/// temporary directory with `extra` compiler flags, or says why it cannot (no C compiler: the
/// SoftRoCE guest) and returns `None`.
pub(crate) fn build(source: &str, library: &str, extra: &[&str]) -> Option<PathBuf> {
    let stem = source.trim_end_matches(".c").replace('_', "-");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&stem[..]);
    std::fs::create_dir_all(&dir).expect("the target dir is writable");
    let lib = dir.join(library);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(source);
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let built = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror"])
        .args(extra)
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status();
    match built {
        Ok(status) if status.success() => Some(lib),
        Ok(status) => panic!("{cc} could not build {}: {status}", src.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let what = stem.trim_start_matches("fake-");
            println!("skipped: no C compiler ({cc}) here to build the fake {what}");
            None
        }
        Err(e) => panic!("cannot run {cc}: {e}"),
    }
}

/// Runs the ignored test `child` of this binary in a child process, with `marker` set to "1"
/// and `envs`; fails with its output unless it passed and printed "child checks passed".
/// Returns its standard output.
pub(crate) fn run_child(marker: &str, child: &str, envs: &[(&str, &Path)]) -> String {
    let exe = env::current_exe().expect("the test binary knows its path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        child,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(marker, "1");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the test binary can be re-run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{child} failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("child checks passed"),
        "{child} did not run its checks:\n{stdout}\n{stderr}"
    );
    stdout
}

/// True in the child process `run_child` started with `marker`.
pub(crate) fn in_child(marker: &str) -> bool {
    env::var(marker).as_deref() == Ok("1")
}
