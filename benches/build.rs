//! Build script: compiles the C side of the benchmarks (`csrc/`): the null provider and the
//! same data-path operations written in C twice, with verbs.h's static inlines and with the
//! provider's function pointers read once.
//!
//! Only verbs.h is needed (from `libibverbs-dev` / `rdma-core-devel`, as for rdma-mummy-sys);
//! nothing is linked from rdma-core: the C code calls no libibverbs function, only the
//! provider function pointers that verbs.h's inlines read from the objects.

use std::env;
use std::path::PathBuf;

/// Extra include directory for verbs.h, shared with rdma-mummy-sys's build script.
const INCLUDE_ENV: &str = "RDMA_MUMMY_SYS_INCLUDE_DIR";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let csrc = manifest.join("csrc");
    println!("cargo:rerun-if-changed={}", csrc.display());
    println!("cargo:rerun-if-env-changed={INCLUDE_ENV}");

    let mut build = cc::Build::new();
    build
        .files(
            [
                "null_provider.c",
                "null_provider_xrc.c",
                // On-demand paging on the null provider (query_device_ex, advise_mr, an
                // implicit MR).
                "null_provider_odp.c",
                "data_path.c",
                "data_path_cached.c",
            ]
            .map(|f| csrc.join(f)),
        )
        .include(&csrc)
        .std("gnu11")
        // The C side is measured: always optimised as a release build would be, whatever
        // the profile that builds the tests.
        .opt_level(3)
        .warnings(true)
        .extra_warnings(true)
        // GCC zeroes a 128-byte `struct ibv_send_wr` initialiser with `rep stosq`, whose
        // start-up cost is most of a post on the null provider; rustc's LLVM zeroes with
        // vector stores. Ask GCC for unrolled stores, so the table compares the code and
        // not the two compilers' memset strategies (clang ignores the flag).
        .flag_if_supported("-mstringop-strategy=unrolled_loop");
    if let Some(dir) = env::var_os(INCLUDE_ENV).filter(|v| !v.is_empty()) {
        build.include(dir);
    }
    // The table names the C compiler it compared against.
    let compiler = build.get_compiler();
    let version = compiler
        .to_command()
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.lines().next().map(str::to_owned))
        .unwrap_or_else(|| compiler.path().display().to_string());
    println!("cargo:rustc-env=BENCHES_C_COMPILER={version}");
    let rustc = env::var_os("RUSTC")
        .and_then(|rustc| {
            std::process::Command::new(rustc)
                .arg("--version")
                .output()
                .ok()
        })
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "rustc".to_owned(), |v| v.trim().to_owned());
    println!("cargo:rustc-env=BENCHES_RUSTC={rustc}");
    if let Err(e) = build.try_compile("benches-c") {
        eprintln!(
            "\nerror: benches: cannot compile csrc/ (the C side of the benchmarks)\n  help: \
             install the rdma-core development headers: `apt install libibverbs-dev` \
             (Debian/Ubuntu) or `dnf install rdma-core-devel` (RHEL/Fedora), or point \
             {INCLUDE_ENV} at a directory holding infiniband/verbs.h\n  details: {e}\n"
        );
        std::process::exit(1);
    }
    compile_extension(&csrc, "null_provider_dm.c", "benches-c-dm");
}

/// One more C file of the test provider (device memory, ...), compiled on its own so each
/// extension of the provider adds a line here, not an edit of the list above.
fn compile_extension(csrc: &std::path::Path, file: &str, lib: &str) {
    let mut build = cc::Build::new();
    build
        .file(csrc.join(file))
        .include(csrc)
        .std("gnu11")
        .warnings(true)
        .extra_warnings(true);
    if let Some(dir) = env::var_os(INCLUDE_ENV).filter(|v| !v.is_empty()) {
        build.include(dir);
    }
    if let Err(e) = build.try_compile(lib) {
        eprintln!("\nerror: benches: cannot compile csrc/{file}: {e}\n");
        std::process::exit(1);
    }
}
