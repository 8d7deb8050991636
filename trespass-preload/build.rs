//! Builds `tests/c/pingpong.c`, the plain-socket echo program that the tests and benchmarks run
//! under the preload, into `$OUT_DIR/pingpong`, and tells the tests where it is through
//! `env!("PINGPONG_EXE")`. The library itself does not need it (nor a C compiler).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=tests/c/pingpong.c");

    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = manifest_dir.join("tests/c/pingpong.c");
    let exe = out_dir.join("pingpong");

    // The C compiler for the target, as the `cc` crate finds it (CC, CFLAGS, ...); the flags
    // below come after its own, so `-O2` wins over the profile's optimisation level.
    let compiler = cc::Build::new().get_compiler();
    let mut command = compiler.to_command();
    command
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-o"])
        .arg(&exe)
        .arg(&source);
    // The library does not need the program: without a working C compiler the library still
    // builds, with a warning, and the tests that run the program fail naming the reason.
    let failure = match command.output() {
        Err(e) => Some(format!(
            "cannot run the C compiler {:?}: {e}",
            compiler.path()
        )),
        Ok(output) if !output.status.success() => {
            let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
            Some(format!(
                "the C compiler failed ({}): {} {}: {}{}",
                output.status,
                compiler.path().display(),
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            ))
        }
        Ok(_) => None,
    };
    match failure {
        None => println!("cargo:rustc-env=PINGPONG_EXE={}", exe.display()),
        Some(why) => {
            let why = why.replace(['\n', '\r'], " ");
            println!("cargo:warning=tests/c/pingpong.c was not built (the tests that run it will fail): {why}");
            println!(
                "cargo:rustc-env=PINGPONG_EXE={} (not built: {})",
                exe.display(),
                why.chars().take(300).collect::<String>()
            );
        }
    }
}
