//! The C shim defines every function bindgen declares.
//!
//! build.rs writes `coverage_table.rs`, a table with the address of every function in the
//! bindings. Taking an address makes the linker resolve the symbol, and nothing links
//! rdma-core, so only the shim can supply it: a function the headers declare but the shim
//! lacks makes this test fail to link (`make -C rdma-mummy-sys/rdma-core-mummy regen` then
//! adds it). build.rs also compares the headers' functions with the shim's definitions and
//! leaves any the shim lacks (headers newer than the shim) out of the bindings, so users see a
//! missing function at compile time and a build warning, never a link error; the first test
//! here fails on that list.

use std::ffi::CString;

use rdma_mummy_sys::Library;

include!(concat!(env!("OUT_DIR"), "/coverage_table.rs"));
include!(concat!(env!("OUT_DIR"), "/unshimmed_functions.rs"));

#[test]
fn the_headers_declare_nothing_the_shim_lacks() {
    // build.rs leaves such functions out of the bindings (users get a compile error and a
    // build warning, never a link error); here, in the project's own tests, it is a failure.
    assert!(
        UNSHIMMED_FUNCTIONS.is_empty(),
        "the rdma-core headers declare functions the shim does not define: {UNSHIMMED_FUNCTIONS:?}; \
         run `make -C rdma-mummy-sys/rdma-core-mummy regen`"
    );
}

#[test]
fn every_bound_function_is_defined_by_the_shim() {
    let bound = bound_functions();
    // rdma-core 44 has 108 exported functions and 63 control-path inlines in these headers;
    // far fewer means the table generation lost functions, not that the headers shrank.
    assert!(bound.len() > 150, "only {} functions bound", bound.len());
    let mut addresses: Vec<usize> = bound.iter().map(|&(_, a)| a).collect();
    for &(name, address) in &bound {
        assert_ne!(address, 0, "{name} resolved to address 0");
    }
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(
        addresses.len(),
        bound.len(),
        "two bound functions share one definition"
    );
}

#[test]
fn forwarded_functions_are_exports_of_the_real_libraries() {
    // The other direction: each forwarding definition names a function the library really
    // exports (a typo or a header-only name would forward to nothing).
    // Which library exports a name: the export list says (rsocket's r* functions are
    // librdmacm's, so is every rdma_*).
    let rdmacm_exports: std::collections::HashSet<&str> =
        include_str!("../rdma-core-mummy/exports/librdmacm.symbols")
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split(' ').next())
            .collect();
    let mlx5_exports: std::collections::HashSet<&str> =
        include_str!("../rdma-core-mummy/exports/libmlx5.symbols")
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split(' ').next())
            .collect();
    // Exports that some supported release lacks (third field shorter than the `# releases:`
    // line): an older library may lack them, and the shim then reports EOPNOTSUPP.
    let newer_only: std::collections::HashSet<&str> = [
        include_str!("../rdma-core-mummy/exports/libibverbs.symbols"),
        include_str!("../rdma-core-mummy/exports/librdmacm.symbols"),
        include_str!("../rdma-core-mummy/exports/libmlx5.symbols"),
    ]
    .into_iter()
    .flat_map(|list| {
        let all = list
            .lines()
            .find_map(|line| line.strip_prefix("# releases: "))
            .unwrap_or_default();
        list.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(move |line| {
                let mut fields = line.split(' ');
                let name = fields.next()?;
                fields.next()?;
                (fields.next()? != all).then_some(name)
            })
    })
    .collect();
    let mut checked = 0;
    for (name, _) in bound_functions() {
        if name.starts_with("rdma_mummy_") {
            continue; // the shim's own functions
        }
        let library = if rdmacm_exports.contains(name) {
            Library::Rdmacm
        } else if mlx5_exports.contains(name) {
            Library::Mlx5
        } else {
            Library::Ibverbs
        };
        if let Err(e) = library.load() {
            println!("skipped: {name}: {e}");
            continue;
        }
        let c_name = CString::new(name).expect("function names have no NUL");
        if newer_only.contains(name) && !library.has_symbol(&c_name) {
            println!("{name}: not in this (older) {library}, as the export list says may be");
            continue;
        }
        assert!(
            library.has_symbol(&c_name),
            "{library} does not export {name}, yet the shim forwards it"
        );
        checked += 1;
    }
    println!("{checked} forwarded functions found in the loaded libraries");
}
