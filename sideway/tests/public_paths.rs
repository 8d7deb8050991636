//! Every public item of sideway is reachable by exactly one path.
//!
//! The crate promises each public item one name: a root re-export that duplicates a module
//! path (`sideway::QueuePair` and `sideway::queue_pair::QueuePair`) makes two names for one
//! type, in the docs (two pages, or one page that links either way), in compiler errors (which
//! pick one) and in users' code (two spellings to grep for and to keep stable).
//!
//! The analyzer is `support/public_paths.rs` (its header says what it reads and how paths
//! resolve), built on the module-graph analyzer's scanner (`support/module_graph.rs`). This
//! file runs it on sideway, prints the API surface, and tests the analyzer itself on small
//! made-up crates. Its ground truth is rustdoc's JSON (`cargo +nightly rustdoc -p sideway-rdma
//! --lib -- -Z unstable-options --output-format json`, walked from the root module through
//! public modules and `use` items): at commit a93d3db both found the same 202 items with the
//! same paths, 102 of them with two or more.

#[path = "support/module_graph.rs"]
mod module_graph;
#[path = "support/public_paths.rs"]
mod public_paths;

use std::path::Path;

use module_graph::{module_path, ModPath};
use public_paths::{crate_public_items, duplicates_report, public_items, PublicItem};

fn sideway_items() -> Vec<PublicItem> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let items = crate_public_items(&src, "sideway");
    // Guards against a wrong folder or a reader that lost its way: the crate has far more.
    assert!(
        items.len() > 100,
        "sideway's public items were found: {items:?}"
    );
    items
}

#[test]
fn every_public_item_is_reachable_by_exactly_one_path() {
    let report = duplicates_report(&sideway_items());
    assert!(report.is_empty(), "{report}");
}

/// Prints every public item with its paths, one item a line (`kind path | path ..`), so a
/// maintainer can see the API surface (`cargo test -p sideway-rdma --test public_paths --
/// --nocapture`).
#[test]
fn print_the_public_paths() {
    let items = sideway_items();
    for item in &items {
        println!("{}", item.line());
    }
    let dual = items.iter().filter(|item| item.paths.len() > 1).count();
    println!(
        "{} public items, {dual} of them reachable by more than one path",
        items.len()
    );
}

// The analyzer itself, on small made-up crates.

/// The public items of a made-up crate `demo`, one line each (`kind path | path ..`).
fn synthetic(files: &[(&str, &str)]) -> Vec<String> {
    let root = Path::new("/src");
    let files: Vec<(ModPath, String)> = files
        .iter()
        .map(|(p, s)| (module_path(root, &root.join(p)), s.to_string()))
        .collect();
    public_items(&files, "demo")
        .iter()
        .map(PublicItem::line)
        .collect()
}

#[test]
fn a_root_reexport_of_a_public_modules_type_is_two_paths() {
    let lines = synthetic(&[
        ("lib.rs", "pub mod a;\npub use a::A;\n"),
        ("a.rs", "pub struct A;\npub enum E {}\n"),
    ]);
    assert_eq!(lines, ["struct demo::A | demo::a::A", "enum demo::a::E"]);
    let items = public_items(
        &[
            (Vec::new(), "pub mod a;\npub use a::A;\n".to_string()),
            (vec!["a".to_string()], "pub struct A;\n".to_string()),
        ],
        "demo",
    );
    let report = duplicates_report(&items);
    assert!(
        report.starts_with("1 of 1 public items are reachable by more than one path"),
        "{report}"
    );
    assert!(
        report.ends_with("\n  demo::A  also  demo::a::A"),
        "{report}"
    );
}

#[test]
fn a_group_reexport_with_as_renames_and_self() {
    let lines = synthetic(&[
        (
            "lib.rs",
            "mod a;\npub use a::{self as alpha, A as Alpha, B};\npub use a::C as _;\n",
        ),
        ("a.rs", "pub struct A;\npub trait B {}\npub struct C;\n"),
    ]);
    assert_eq!(
        lines,
        [
            "struct demo::Alpha | demo::alpha::A",
            "trait demo::B | demo::alpha::B",
            "struct demo::alpha::C",
        ]
    );
}

#[test]
fn a_glob_reexport_brings_every_public_item_of_its_module() {
    let lines = synthetic(&[
        (
            "lib.rs",
            "mod inner;\npub mod open;\npub use inner::*;\npub use open::*;\n",
        ),
        (
            "inner.rs",
            "pub struct S;\npub fn f() {}\npub(crate) struct Hidden;\nuse crate::open::O;\n",
        ),
        ("open.rs", "pub struct O;\n"),
    ]);
    assert_eq!(
        lines,
        [
            "struct demo::O | demo::open::O",
            "struct demo::S",
            "function demo::f"
        ]
    );
}

#[test]
fn a_type_in_a_private_module_reexported_once_is_one_path() {
    let lines = synthetic(&[
        ("lib.rs", "mod hidden;\npub use hidden::H;\n"),
        ("hidden.rs", "pub struct H;\npub struct NeverReexported;\n"),
    ]);
    assert_eq!(lines, ["struct demo::H"]);
    assert_eq!(
        duplicates_report(&public_items(
            &[
                (Vec::new(), "mod h;\npub use h::H;\n".to_string()),
                (vec!["h".to_string()], "pub struct H;\n".to_string()),
            ],
            "demo"
        )),
        ""
    );
}

#[test]
fn restricted_and_unit_test_items_are_not_counted() {
    let lines = synthetic(&[
        (
            "lib.rs",
            "pub mod a;\n#[cfg(test)]\npub use a::Kept as Twice;\n",
        ),
        (
            "a.rs",
            "pub(crate) struct P;\npub(super) fn q() {}\npub(in crate) const C: u8 = 0;\n\
             pub(self) type T = u8;\n#[cfg(test)]\npub struct UnitTestOnly;\n\
             #[cfg(test)]\npub mod tests {\n    pub struct U;\n}\n\
             /// `pub struct InDoc;`\n// pub struct InComment;\n\
             const S: &str = \"pub struct InString;\";\npub struct Kept;\n",
        ),
    ]);
    assert_eq!(lines, ["struct demo::a::Kept"]);
}

#[test]
fn items_in_impl_trait_and_fn_bodies_are_not_module_items() {
    let lines = synthetic(&[(
        "lib.rs",
        "pub struct S;\nimpl S {\n    pub fn new() -> Self { S }\n    pub const N: u8 = 1;\n}\n\
         pub trait T {\n    fn f();\n    const C: u8;\n    type A;\n}\n\
         pub fn g() {\n    pub struct Inner;\n}\n\
         const _: () = {\n    pub struct InConst;\n};\n",
    )]);
    assert_eq!(
        lines,
        ["struct demo::S", "trait demo::T", "function demo::g"]
    );
}

#[test]
fn a_nested_reexport_chain_counts_every_public_hop() {
    // a re-exports from its private b; the root re-exports from a.
    let lines = synthetic(&[
        (
            "lib.rs",
            "pub mod a;\npub use crate::a::B as Bee;\npub use a::C;\n",
        ),
        ("a/mod.rs", "mod b;\npub use self::b::B;\npub use b::C;\n"),
        ("a/b.rs", "pub struct B;\npub struct C;\n"),
    ]);
    assert_eq!(
        lines,
        [
            "struct demo::Bee | demo::a::B",
            "struct demo::C | demo::a::C"
        ]
    );
}

#[test]
fn a_path_may_start_with_a_name_an_import_brought() {
    // 2018 paths: the root imports module `m` from its private `v`, then re-exports from it.
    let lines = synthetic(&[
        ("lib.rs", "mod v;\npub use v::m;\npub use m::X;\n"),
        ("v/mod.rs", "pub mod m;\n"),
        ("v/m.rs", "pub struct X;\n"),
    ]);
    assert_eq!(lines, ["struct demo::X | demo::m::X"]);
}

#[test]
fn inline_modules_and_super_paths_resolve() {
    let lines = synthetic(&[(
        "lib.rs",
        "pub mod outer {\n    pub use super::hidden::H;\n    pub mod deeper {\n        \
         pub use super::super::hidden::H;\n    }\n}\nmod hidden {\n    pub struct H;\n}\n",
    )]);
    assert_eq!(lines, ["struct demo::outer::H | demo::outer::deeper::H"]);
}

#[test]
fn reexports_of_other_crates_are_not_walked() {
    let lines = synthetic(&[(
        "lib.rs",
        "pub use rdma_mummy_sys as sys;\npub use std::fmt::{self, Display};\nuse log;\n\
         pub use log::Level;\npub struct Own;\n",
    )]);
    assert_eq!(lines, ["struct demo::Own"]);
}

#[test]
fn every_kind_of_item_is_read_including_those_in_macro_bodies() {
    let lines = synthetic(&[(
        "lib.rs",
        "bitflags::bitflags! {\n    #[derive(Debug)]\n    pub struct F: u32 {\n        \
         const A = 1;\n    }\n}\n\
         c_enum! {\n    pub enum E : \"c_e\" {\n        One = 1,\n    }\n}\n\
         macro_rules! m {\n    () => { pub struct FromMacroRules; };\n}\n\
         pub const fn k() {}\npub unsafe extern \"C\" fn e() {}\npub async fn a() {}\n\
         pub static mut S: u8 = 0;\npub static T: [u8; 2] = [0; 2];\npub type Alias = u8;\n\
         pub union U {\n    a: u8,\n}\npub const C: Alias = 0;\npub unsafe trait Tr {}\n\
         extern \"C\" {\n    pub fn foreign();\n}\n",
    )]);
    assert_eq!(
        lines,
        [
            "type_alias demo::Alias",
            "constant demo::C",
            "enum demo::E",
            "struct demo::F",
            "static demo::S",
            "static demo::T",
            "trait demo::Tr",
            "union demo::U",
            "function demo::a",
            "function demo::e",
            "function demo::foreign",
            "function demo::k",
        ]
    );
}

#[test]
fn a_module_that_reexports_its_parent_does_not_loop() {
    let lines = synthetic(&[
        ("lib.rs", "pub mod a;\npub use a::*;\n"),
        (
            "a.rs",
            "pub use crate::*;\npub use super::a as again;\npub struct X;\n",
        ),
    ]);
    // Each module is walked once on its own way down, as rustdoc's JSON walk does.
    assert_eq!(lines, ["struct demo::X | demo::a::X"]);
}
