//! sideway's module graph has no import circle and no arrow up to `lib.rs`, and every module
//! sits in its layer of `sideway/ARCHITECTURE.md` (see that page).
//!
//! The analyzer, shared with stride-perf's `module_graph` test, is `support/module_graph.rs`:
//! its header says how arrows are drawn and what is checked. This file runs it on sideway,
//! and tests the detector itself on small made-up crates.

#[path = "support/module_graph.rs"]
mod module_graph;

use std::path::Path;

use module_graph::{
    build_graph, find_cycle, layer_of, layer_problems, layer_table, module_path, name, problems,
    Graph, ModPath,
};

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

/// Prints the graph (`cargo test -p sideway-rdma --test module_graph -- --nocapture`), to
/// compare with ARCHITECTURE.md.
#[test]
fn print_the_graph() {
    module_graph::print_graph(manifest_dir());
}

// The detector itself, on small made-up crates.

fn synthetic(files: &[(&str, &str)]) -> Graph {
    let root = Path::new("/src");
    let files: Vec<(ModPath, String)> = files
        .iter()
        .map(|(p, s)| (module_path(root, &root.join(p)), s.to_string()))
        .collect();
    build_graph(&files)
}

fn arrows_of(graph: &Graph, from: &str) -> Vec<String> {
    let key: ModPath = if from == "lib.rs" {
        Vec::new()
    } else {
        from.split("::").map(String::from).collect()
    };
    graph[&key].keys().map(name).collect()
}

#[test]
fn a_two_file_circle_is_found_with_its_lines() {
    let graph = synthetic(&[
        ("lib.rs", "mod a;\nmod b;\npub use a::A;\n"),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "b.rs",
            "pub struct B;\n\nimpl crate::a::A {\n    fn f() {}\n}\n",
        ),
    ]);
    let found = problems(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a -> b (line 1: `crate::b::B`)"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("b -> a (line 3: `crate::a::A`)"),
        "{}",
        found[0]
    );
}

#[test]
fn a_longer_circle_through_super_and_groups_is_found() {
    let graph = synthetic(&[
        ("lib.rs", "mod x;\n"),
        ("x/mod.rs", "mod p;\nmod q;\nmod r;\npub use p::P;\n"),
        ("x/p.rs", "use super::{q::{self, Q}};\n"),
        ("x/q.rs", "use crate::x::r::R;\n"),
        ("x/r.rs", "pub fn f() -> super::p::P { todo!() }\n"),
    ]);
    assert_eq!(arrows_of(&graph, "x::p"), ["x::q"]);
    assert_eq!(arrows_of(&graph, "x::r"), ["x::p"]);
    let cycle = find_cycle(&graph).expect("p -> q -> r -> p");
    assert_eq!(cycle.len(), 4, "{cycle:?}");
}

#[test]
fn a_child_using_its_folders_reexports_closes_a_circle() {
    // mod.rs re-exports the child; the child names the item through mod.rs.
    let graph = synthetic(&[
        ("lib.rs", "mod x;\n"),
        ("x/mod.rs", "mod p;\nmod q;\npub use p::P;\npub use q::Q;\n"),
        ("x/q.rs", "use super::P;\npub struct Q;\n"),
        ("x/p.rs", "pub struct P;\n"),
    ]);
    assert_eq!(arrows_of(&graph, "x"), ["x::p", "x::q"]);
    assert_eq!(arrows_of(&graph, "x::q"), ["x"]);
    assert!(find_cycle(&graph).is_some());
}

#[test]
fn an_arrow_up_to_the_root_is_reported() {
    let graph = synthetic(&[
        (
            "lib.rs",
            "mod a;\npub use a::A;\npub(crate) fn report() {}\n",
        ),
        ("a.rs", "pub struct A;\nfn f() { crate::report() }\n"),
    ]);
    let found = problems(&graph);
    assert_eq!(found.len(), 2, "a circle and the upward arrow: {found:?}");
    assert!(
        found[0].contains("a points up to lib.rs (line 2: `crate::report`)"),
        "{}",
        found[0]
    );
}

#[test]
fn comments_strings_and_unit_tests_draw_no_arrow() {
    let graph = synthetic(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "/// See [`B`](crate::b::B).\n// use crate::b::B;\n/* crate::b::B */\n\
             const S: &str = \"crate::b::B\";\nconst R: &str = r#\"crate::b::B\"#;\n\
             const C: char = '\"';\nfn f<'x>(s: &'x str) -> &'x str { s }\n\
             #[cfg(test)]\nmod tests {\n    use crate::b::B;\n    fn g() { let _ = '{'; }\n}\n",
        ),
        ("b.rs", "pub struct B;\n"),
    ]);
    assert_eq!(arrows_of(&graph, "a"), Vec::<String>::new());
    assert!(problems(&graph).is_empty());
}

#[test]
fn a_layered_crate_passes() {
    let graph = synthetic(&[
        (
            "lib.rs",
            "mod leaf;\nmod top;\npub use top::T;\npub use leaf::L;\n",
        ),
        ("leaf.rs", "pub struct L;\n"),
        (
            "top.rs",
            "use crate::leaf::L;\npub struct T(L);\nmod inner {\n    use super::T;\n}\n",
        ),
    ]);
    assert_eq!(arrows_of(&graph, "lib.rs"), ["leaf", "top"]);
    assert_eq!(arrows_of(&graph, "top"), ["leaf"]);
    assert!(problems(&graph).is_empty(), "{:?}", problems(&graph));
}

#[test]
fn layers_place_modules_by_their_longest_entry_and_catch_upward_arrows() {
    let table = layer_table(
        "| layer | what | modules |\n| --- | --- | --- |\n| 0 | leaves | `leaf` |\n\
         | 1 | objects | `obj`, `obj::low` |\n| 2 | top | `obj::high` |\n",
    );
    let path = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    assert_eq!(layer_of(&path("obj::low"), &table), Some(1));
    assert_eq!(layer_of(&path("obj::high::deep"), &table), Some(2));
    assert_eq!(layer_of(&path("other"), &table), None);
    let graph = synthetic(&[
        ("lib.rs", "mod leaf;\nmod obj;\nmod other;\n"),
        ("leaf.rs", "use crate::obj::low::L;\n"),
        ("obj/mod.rs", "mod low;\nmod high;\n"),
        ("obj/low.rs", "use crate::leaf::X;\n"),
        ("obj/high.rs", "use super::low::L;\n"),
        ("other.rs", "\n"),
    ]);
    let found = layer_problems(&graph, &table);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("leaf (layer 0) points up to obj::low (layer 1) (line 1"),
        "{}",
        found[0]
    );
    assert!(found[1].contains("other is in no layer"), "{}", found[1]);
}
