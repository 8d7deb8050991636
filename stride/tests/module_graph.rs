//! stride-perf's module graph has no import circle and no arrow up to `lib.rs`, and every
//! module sits in its layer of `stride/ARCHITECTURE.md` (see that page).
//!
//! The analyzer is sideway's, shared by path (`sideway/tests/support/module_graph.rs`, whose
//! header says how arrows are drawn and what is checked; its own tests are in sideway's
//! `module_graph` test). A published crate does not have that file, so this test is left out
//! of the package (`exclude` in `stride/Cargo.toml`) and runs in the repository.

#[path = "../../sideway/tests/support/module_graph.rs"]
mod module_graph;

use std::path::Path;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_crate_has_no_import_circle_and_nothing_points_up_to_lib_rs() {
    module_graph::assert_no_circle(manifest_dir(), 10);
}

#[test]
fn every_module_sits_in_its_layer_of_architecture_md_and_no_arrow_points_up() {
    module_graph::assert_layers(manifest_dir(), 10);
}

/// Prints the graph (`cargo test -p stride-perf --test module_graph -- --nocapture`), to
/// compare with ARCHITECTURE.md.
#[test]
fn print_the_graph() {
    module_graph::print_graph(manifest_dir());
}
