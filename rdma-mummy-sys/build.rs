//! Build script: compiles the C shim and generates the bindings.
//!
//! 1. Probes the rdma-core headers with the C compiler, so a missing `-dev` package is one
//!    clear message instead of a wall of compiler errors.
//! 2. Compiles `rdma-core-mummy/` (the dlopen shim) with `cc` into a static library. Only
//!    `dl` and `pthread` are linked; never `ibverbs` or `rdmacm`.
//! 3. Runs bindgen over `rdma-core-mummy/include/rdma_mummy.h` (which includes verbs.h,
//!    rdma_cma.h, rdma_verbs.h and rsocket.h, declares the few exports those headers lack,
//!    and the shim's own functions), binding every function the export lists
//!    (`rdma-core-mummy/exports/`) say the shim forwards.
//! 4. Writes two generated Rust sources next to the bindings: the re-exports that give the
//!    shim's wrappers of verbs.h static inlines their C names (`inline_wrappers.rs`), and the
//!    table the coverage test uses to take the address of every bound function
//!    (`coverage_table.rs`).

use std::env;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process;

/// Extra include directory for rdma-core headers outside the compiler's default search path
/// (an rdma-core built from source, say).
const INCLUDE_ENV: &str = "RDMA_MUMMY_SYS_INCLUDE_DIR";

const HEADERS_HELP: &str = "install the rdma-core development headers: \
    `apt install libibverbs-dev librdmacm-dev` (Debian/Ubuntu) or \
    `dnf install rdma-core-devel` (RHEL/Fedora), or point RDMA_MUMMY_SYS_INCLUDE_DIR at a \
    directory holding infiniband/verbs.h and rdma/rdma_cma.h";

const LIBCLANG_HELP: &str = "bindgen needs libclang: `apt install libclang-dev` \
    (Debian/Ubuntu) or `dnf install clang-devel` (RHEL/Fedora), or set LIBCLANG_PATH to the \
    directory holding libclang.so";

/// Stops the build with a message; cargo shows a failed build script's stderr.
fn fail(what: &str, help: &str, detail: &str) -> ! {
    eprintln!("\nerror: rdma-mummy-sys: {what}\n  help: {help}\n");
    if !detail.is_empty() {
        eprintln!("  details: {detail}\n");
    }
    process::exit(1);
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    let shim = manifest.join("rdma-core-mummy");

    println!("cargo:rerun-if-env-changed={INCLUDE_ENV}");
    // Read by bindgen's libclang loader (clang-sys), named here so a change rebuilds.
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo:rerun-if-env-changed=BINDGEN_EXTRA_CLANG_ARGS");
    for dir in ["src", "include", "exports"] {
        println!("cargo:rerun-if-changed={}", shim.join(dir).display());
    }

    let extra_include: Option<PathBuf> = env::var_os(INCLUDE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);

    probe_headers(&out, extra_include.as_deref());
    compile_shim(&shim, extra_include.as_deref());
    let forwarded = forwarded_exports(&shim);
    let mut bindings = generate_bindings(&shim, extra_include.as_deref(), &forwarded, &[]);
    let defined = shim_definitions(&shim);
    let unshimmed: Vec<String> = bound_functions(&bindings)
        .into_iter()
        .filter(|f| !f.starts_with("rdma_mummy_") && !defined.contains(f))
        .collect();
    if !unshimmed.is_empty() {
        // Headers newer than the shim's generated sources declare functions it does not
        // define. Binding them would turn a user's first call into a link error; leaving them
        // out makes it a compile error naming a missing function, and this warning says why.
        println!(
            "cargo:warning=rdma-mummy-sys: the installed rdma-core headers declare {} \
             function(s) the shim does not define yet, left out of the bindings: {}; \
             regenerate the shim with `make -C rdma-core-mummy regen`",
            unshimmed.len(),
            unshimmed.join(", ")
        );
        bindings = generate_bindings(&shim, extra_include.as_deref(), &forwarded, &unshimmed);
    }
    fs::write(out.join("bindings.rs"), &bindings)
        .unwrap_or_else(|e| fail("cannot write bindings.rs", "check OUT_DIR", &e.to_string()));
    write_generated(
        &out.join("unshimmed_functions.rs"),
        &format!(
            "/// Functions the headers declare that the shim does not define (left unbound).\n\
             const UNSHIMMED_FUNCTIONS: &[&str] = &{unshimmed:?};\n"
        ),
    );

    let functions = bound_functions(&bindings);
    write_generated(
        &out.join("inline_wrappers.rs"),
        &inline_wrappers(&functions),
    );
    write_generated(&out.join("coverage_table.rs"), &coverage_table(&functions));
}

fn write_generated(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| {
        fail(
            &format!("cannot write {}", path.display()),
            "check OUT_DIR",
            &e.to_string(),
        )
    });
}

/// Preprocesses a file that includes the three headers; failure means a missing package.
fn probe_headers(out: &Path, extra_include: Option<&Path>) {
    let probe = out.join("rdma_header_probe.c");
    let text = "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\
                #include <rdma/rdma_verbs.h>\n#include <rdma/rsocket.h>\n\
                #include <infiniband/mlx5dv.h>\n";
    write_generated(&probe, text);
    let mut build = cc::Build::new();
    build.file(&probe).cargo_metadata(false);
    if let Some(dir) = extra_include {
        build.include(dir);
    }
    if let Err(e) = build.try_expand() {
        fail(
            "cannot find the rdma-core headers (infiniband/verbs.h, rdma/rdma_cma.h, rdma/rsocket.h, \
             infiniband/mlx5dv.h)",
            HEADERS_HELP,
            &e.to_string(),
        );
    }
}

fn compile_shim(shim: &Path, extra_include: Option<&Path>) {
    let mut build = cc::Build::new();
    build
        .files(["loader.c", "forward.c", "inline.c"].map(|f| shim.join("src").join(f)))
        .include(shim.join("include"))
        .include(shim.join("src"))
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter");
    if let Some(dir) = extra_include {
        build.include(dir);
    }
    if let Err(e) = build.try_compile("rdma-core-mummy") {
        fail(
            "cannot compile the C shim (rdma-core-mummy)",
            HEADERS_HELP,
            &e.to_string(),
        );
    }
    // `links = "rdma-core-mummy"`: dependents' build scripts find the shim's headers in
    // DEP_RDMA_CORE_MUMMY_INCLUDE, should they compile C against it.
    println!("cargo:include={}", shim.join("include").display());
    // dlopen and pthread_once: separate libraries before glibc 2.34, harmless after.
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-link-lib=dylib=pthread");
}

/// The exported functions the shim's generated `forward.c` defines: each definition
/// parenthesises its name, `int (ibv_fork_init)(void)`, at the start of a line.
fn shim_definitions(shim: &Path) -> std::collections::HashSet<String> {
    let path = shim.join("src").join("forward.c");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| {
        fail(
            &format!("cannot read {}", path.display()),
            "the crate's sources are incomplete; reinstall it",
            &e.to_string(),
        )
    });
    text.lines()
        .filter(|line| line.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        .filter(|line| !line.starts_with("static"))
        .filter_map(|line| {
            let rest = &line[line.find('(')? + 1..];
            let name = &rest[..rest.find(")(")?];
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_owned())
        })
        .collect()
}

/// The functions the export lists (`exports/*.symbols`, written by `gen_shim.py exports`) mark
/// as forwarded by the shim: every public export, rsocket's `r*` functions included.
fn forwarded_exports(shim: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for lib in ["libibverbs", "librdmacm", "libmlx5"] {
        let path = shim.join("exports").join(format!("{lib}.symbols"));
        let text = fs::read_to_string(&path).unwrap_or_else(|e| {
            fail(
                &format!("cannot read {}", path.display()),
                "the crate's sources are incomplete; reinstall it",
                &e.to_string(),
            )
        });
        names.extend(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    // NAME VERSION-NODE RELEASES DISPOSITION
                    let mut fields = line.splitn(4, ' ');
                    let name = fields.next()?;
                    fields.next()?;
                    fields.next()?;
                    fields
                        .next()?
                        .starts_with("forward")
                        .then(|| name.to_owned())
                }),
        );
    }
    names
}

fn generate_bindings(
    shim: &Path,
    extra_include: Option<&Path>,
    forwarded: &[String],
    leave_out: &[String],
) -> String {
    let header = shim.join("include").join("rdma_mummy.h");
    let mut builder = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_arg(format!("-I{}", shim.join("include").display()))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("ibv_.*|_ibv_.*|rdma_.*|mult_to_ibv_rate|mbps_to_ibv_rate")
        .allowlist_type("ibv_.*|_ibv_.*|_compat_ibv_.*|rdma_.*|verbs_.*|ib_uverbs_.*|ibv_gid")
        .allowlist_var("IBV_.*|RDMA_.*|IB_UVERBS_.*")
        // mlx5's direct verbs (mlx5dv.h): the types of its functions, its enums and the
        // WQE/CQE layouts it describes.
        .allowlist_type("mlx5dv_.*|mlx5_.*|mlx5dv_dc_type")
        .allowlist_var("MLX5DV_.*|MLX5_.*")
        // Packed and 4-byte aligned at once, which a Rust struct cannot be: bound as an
        // opaque blob of the right size and alignment (it is written through
        // mlx5dv_set_ctrl_seg, which the shim compiles in C).
        .opaque_type("mlx5_wqe_ctrl_seg")
        // The error numbers the data path reports: ibv_start_poll and ibv_next_poll say
        // "empty" with ENOENT, and a missing operation is EOPNOTSUPP.
        .allowlist_var("ENOENT|EOPNOTSUPP")
        // Module constants keep each C enum's values together (`ibv_qp_state::IBV_QPS_RTS`)
        // and its type a plain integer alias (`ibv_qp_state::Type`), so flag enums can be
        // or-ed and values from a newer rdma-core are representable.
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        // Anonymous enums (`enum { IBV_LINK_LAYER_ETHERNET, ... }`) have no name to hold a
        // module, so their values become plain constants; bindgen matches an anonymous enum
        // by its variants' names, and no named enum has an upper-case name.
        .constified_enum("IBV_.*|RDMA_.*|IB_UVERBS_.*|MLX5DV_.*|MLX5_.*")
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .layout_tests(true)
        .wrap_unsafe_ops(true)
        .generate_comments(true)
        .merge_extern_blocks(true)
        .sort_semantically(true);
    if let Some(dir) = extra_include {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    for name in forwarded {
        builder = builder.allowlist_function(format!("^{name}$"));
    }
    for name in leave_out {
        builder = builder.blocklist_function(format!("^{name}$"));
    }
    // bindgen panics when it cannot load libclang; turn that into the install hint. The
    // builder is consumed inside, so no broken state can be observed after a panic.
    let result = panic::catch_unwind(AssertUnwindSafe(move || builder.generate()));
    match result {
        Ok(Ok(bindings)) => bindings.to_string(),
        Ok(Err(e)) => fail(
            "bindgen could not parse the rdma-core headers",
            HEADERS_HELP,
            &e.to_string(),
        ),
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            fail(
                "bindgen failed (is libclang installed?)",
                LIBCLANG_HELP,
                &detail,
            )
        }
    }
}

/// The names of the functions bindgen declared, in order: the `pub fn` lines of its
/// `extern "C"` blocks (other `pub fn`s are methods of its helper types).
fn bound_functions(bindings: &str) -> Vec<String> {
    let mut in_extern = false;
    let mut names = Vec::new();
    for line in bindings.lines() {
        if line.ends_with("extern \"C\" {") && !line.starts_with(' ') {
            in_extern = true;
        } else if line == "}" {
            in_extern = false;
        } else if in_extern {
            if let Some(rest) = line.trim_start().strip_prefix("pub fn ") {
                if let Some(name) = rest.split('(').next() {
                    names.push(name.to_owned());
                }
            }
        }
    }
    names
}

/// `pub use` lines giving each shim wrapper of a static inline (`rdma_mummy_ibv_create_cq_ex`)
/// the C name callers know (`ibv_create_cq_ex`). `rdma_mummy_ibv_query_port` thereby takes
/// the name `ibv_query_port` from the compat entry point, as verbs.h's macro does in C.
fn inline_wrappers(functions: &[String]) -> String {
    let mut text = String::from("// Generated by build.rs; see its `inline_wrappers`.\n");
    for wrapper in functions {
        let Some(c_name) = wrapper.strip_prefix("rdma_mummy_") else {
            continue;
        };
        if !(c_name.starts_with("ibv_")
            || c_name.starts_with("rdma_")
            || c_name.starts_with("mlx5dv_"))
        {
            continue;
        }
        text.push_str(&format!(
            "/// `{c_name}()`: a static inline of the rdma-core headers, compiled into the \
             shim as `{wrapper}()`.\n#[doc(inline)]\npub use crate::ffi::{wrapper} as {c_name};\n"
        ));
    }
    text
}

/// The coverage test's table: every bound function, by name, with its address. Taking the
/// address makes the linker resolve the symbol, so a function the headers declare but the
/// shim does not define fails to link this test.
fn coverage_table(functions: &[String]) -> String {
    let mut text = String::from(
        "// Generated by build.rs; see its `coverage_table`.\n\
         /// Every function bindgen declared, with the address the linker resolved for it.\n\
         fn bound_functions() -> Vec<(&'static str, usize)> {\n    vec![\n",
    );
    for f in functions {
        text.push_str(&format!(
            "        (\"{f}\", rdma_mummy_sys::ffi::{f} as *const () as usize),\n"
        ));
    }
    text.push_str("    ]\n}\n");
    text
}
