//! The public-path analyzer behind sideway's `public_paths` test: every path by which a user
//! of a crate can name each of its public items.
//!
//! It reads the crate's `.rs` files with the module-graph analyzer's scanner (the includer
//! declares that one as `module_graph`): comments, string and character literals and
//! `#[cfg(test)]` items are blanked first, so none of them defines or re-exports anything.
//! Each file, and each inline `mod x { .. }` in it, is a module; its items are read from its
//! top level only (what sits inside an `impl`, `trait` or `fn` body is no module item):
//!
//! - items: `struct`, `enum`, `union`, `trait`, `type`, `const`, `static` and `fn`, public
//!   when declared plain `pub` (`pub(crate)`, `pub(super)`, `pub(in ..)` are not), including
//!   those written in the body of a macro invoked at the top level (`bitflags! { pub struct
//!   F: u32 { .. } }`, the crate's `c_enum! { pub enum .. }`) and in `extern { .. }` blocks;
//!   `macro_rules!` definitions are skipped;
//! - child modules: `mod x;` (its file is `x.rs` or `x/mod.rs`) and `mod x { .. }`;
//! - imports: every `use` tree, public or not, leaf by leaf, with `as` renames, `self` and
//!   globs.
//!
//! Paths resolve as the 2018 edition reads them: `crate::`, `self::`, `super::`, or a name in
//! scope in the module (a child module, an item, an import, a glob's names). A path that does
//! not land inside the crate (`std::..`, `rdma_mummy_sys`) names nothing here.
//!
//! The walk starts at the crate root and follows public child modules and public imports: an
//! import of a module walks it under the import's name, a glob walks its module under the
//! importing module's path, an import of an item gives the item one more path. A private
//! module's items are thus reached only through public re-exports of them, as a user sees
//! them. A module met again on its own way down is not walked twice. The analyzer's tests, on
//! small made-up crates, are in `sideway/tests/public_paths.rs`.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::module_graph::{code_only, crate_files, is_ident, skip_ws, use_tree, ModPath, UseLeaf};

/// An item declared at a module's top level.
#[derive(Debug, Clone)]
pub struct Item {
    pub name: String,
    /// As rustdoc's JSON names it: `struct`, `enum`, `union`, `trait`, `type_alias`,
    /// `constant`, `static`, `function`.
    pub kind: &'static str,
    /// Declared plain `pub`.
    pub public: bool,
}

/// One leaf of a module's `use` tree.
#[derive(Debug, Clone)]
pub struct Import {
    pub leaf: UseLeaf,
    /// Declared plain `pub use`.
    pub public: bool,
}

/// What a module declares at its top level.
#[derive(Debug, Clone, Default)]
pub struct Module {
    /// Child modules, each with whether it is declared plain `pub mod`.
    pub children: BTreeMap<String, bool>,
    pub items: Vec<Item>,
    pub imports: Vec<Import>,
}

/// Every module of a crate by its path from the root.
pub type Modules = BTreeMap<ModPath, Module>;

/// What a name or path resolves to: a module, or an item by its module and index there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Module(ModPath),
    Item(ModPath, usize),
}

/// A public item with every path that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicItem {
    pub kind: &'static str,
    pub paths: BTreeSet<String>,
}

impl PublicItem {
    /// `kind path | path ..`, the paths sorted (the line rustdoc's JSON walk gives).
    pub fn line(&self) -> String {
        let paths: Vec<&str> = self.paths.iter().map(String::as_str).collect();
        format!("{} {}", self.kind, paths.join(" | "))
    }
}

/// The identifier at `i` (empty when none starts there) and where it ends.
fn word_at(code: &[u8], i: usize) -> (&str, usize) {
    let mut e = i;
    while e < code.len() && is_ident(code[e]) {
        e += 1;
    }
    (std::str::from_utf8(&code[i..e]).unwrap_or(""), e)
}

/// Where the bracket opened at `open` (`(`, `[` or `{`) is closed, counting all three kinds
/// (the end of `code` if never).
fn matching_close(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Where the item whose header continues at `i` ends: after its `;`, or after the block of
/// its first `{` (a struct's fields, an `fn`'s or `impl`'s body), both outside brackets.
fn end_of_item(code: &[u8], mut i: usize, end: usize) -> usize {
    while i < end {
        match code[i] {
            b';' => return i + 1,
            b'{' => return matching_close(code, i) + 1,
            b'(' | b'[' => i = matching_close(code, i) + 1,
            _ => i += 1,
        }
    }
    end
}

/// What a declaration keyword declares, in rustdoc's words.
fn item_kind(word: &str) -> Option<&'static str> {
    Some(match word {
        "struct" => "struct",
        "enum" => "enum",
        "union" => "union",
        "trait" => "trait",
        "type" => "type_alias",
        "const" => "constant",
        "static" => "static",
        "fn" => "function",
        _ => return None,
    })
}

/// Reads the items of the module `here` from `code[i..end]` (a file, or the body of an inline
/// module, a top-level macro invocation or an `extern` block) into `modules`.
fn scan(code: &[u8], mut i: usize, end: usize, here: &ModPath, modules: &mut Modules) {
    modules.entry(here.clone()).or_default();
    while i < end {
        i = skip_ws(code, i);
        if i >= end {
            break;
        }
        // Attributes (`#[..]`, `#![..]`) and stray `;` (after `const X: T = T { .. };`).
        if code[i] == b'#' {
            let open = skip_ws(code, i + 1);
            let open = if code.get(open) == Some(&b'!') {
                skip_ws(code, open + 1)
            } else {
                open
            };
            i = if code.get(open) == Some(&b'[') {
                matching_close(code, open) + 1
            } else {
                open
            };
            continue;
        }
        if code[i] == b';' {
            i += 1;
            continue;
        }
        let (mut word, mut j) = word_at(code, i);
        if word.is_empty() {
            i += 1;
            continue;
        }
        let mut public = false;
        if word == "pub" {
            let k = skip_ws(code, j);
            if code.get(k) == Some(&b'(') {
                j = matching_close(code, k) + 1;
            } else {
                public = true;
            }
            (word, j) = word_at(code, skip_ws(code, j));
        }
        // Qualifiers before the declaring keyword: `const unsafe extern "C" fn`, `unsafe
        // trait`, `async fn`; `extern { .. }` is a block of items, `extern crate` skipped.
        loop {
            let next = skip_ws(code, j);
            match word {
                "async" | "unsafe" | "default" | "auto" => {}
                "const"
                    if matches!(word_at(code, next).0, "fn" | "unsafe" | "async" | "extern") => {}
                "extern" if code.get(next) == Some(&b'{') => {
                    let close = matching_close(code, next);
                    scan(code, next + 1, close, here, modules);
                    word = "";
                    j = close + 1;
                    break;
                }
                // `extern "C" fn` (the ABI string is blanked); `extern crate` is no item.
                "extern" if word_at(code, next).0 != "crate" => {}
                _ => break,
            }
            (word, j) = word_at(code, next);
        }
        let after = skip_ws(code, j);
        if word.is_empty() {
            // An `extern { .. }` block, read above, or something this reader does not know.
            i = j.max(i + 1);
            continue;
        }
        if word == "use" {
            let (leaves, tree_end) = use_tree(code, after);
            let module = modules.entry(here.clone()).or_default();
            module
                .imports
                .extend(leaves.into_iter().map(|leaf| Import { leaf, public }));
            i = end_of_item(code, tree_end, end);
            continue;
        }
        if word == "mod" {
            let (name, e) = word_at(code, after);
            let name = name.to_string();
            let k = skip_ws(code, e);
            modules
                .entry(here.clone())
                .or_default()
                .children
                .insert(name.clone(), public);
            if code.get(k) == Some(&b'{') {
                let close = matching_close(code, k);
                let mut inner = here.clone();
                inner.push(name);
                scan(code, k + 1, close, &inner, modules);
                i = close + 1;
            } else {
                i = end_of_item(code, k, end);
            }
            continue;
        }
        let kind = item_kind(word).filter(|_| {
            // `union` is a keyword only before a name.
            word != "union" || code.get(after).is_some_and(|&c| is_ident(c))
        });
        if let Some(kind) = kind {
            let (mut name, mut e) = word_at(code, after);
            if kind == "static" && name == "mut" {
                (name, e) = word_at(code, skip_ws(code, e));
            }
            if !name.is_empty() && name != "_" {
                let item = Item {
                    name: name.to_string(),
                    kind,
                    public,
                };
                modules.entry(here.clone()).or_default().items.push(item);
            }
            i = end_of_item(code, e, end);
            continue;
        }
        // A macro invocation at the top level (`bitflags! { .. }`, `a::b!(..);`): its body's
        // items are this module's. A `macro_rules!` definition is skipped.
        let mut k = after;
        while code.get(k) == Some(&b':') && code.get(k + 1) == Some(&b':') {
            (word, k) = word_at(code, skip_ws(code, k + 2));
            k = skip_ws(code, k);
        }
        if code.get(k) == Some(&b'!') {
            let open = skip_ws(code, k + 1);
            if word == "macro_rules" {
                i = end_of_item(code, open, end);
                continue;
            }
            if matches!(code.get(open), Some(b'{' | b'(' | b'[')) {
                let close = matching_close(code, open);
                scan(code, open + 1, close, here, modules);
                i = close + 1;
                continue;
            }
        }
        // `impl`, `extern crate`, or anything else: skipped whole.
        i = end_of_item(code, j, end);
    }
}

/// Reads the modules of a crate given as (module path, source) pairs.
pub fn read_modules(files: &[(ModPath, String)]) -> Modules {
    let mut modules = Modules::new();
    for (here, src) in files {
        let code = code_only(src);
        scan(&code, 0, code.len(), here, &mut modules);
    }
    modules
}

/// Resolves names and paths in a crate's modules.
struct Resolver<'a> {
    modules: &'a Modules,
    /// Look-ups under way, so that an import that names itself (`use log;`, an extern crate)
    /// or a circle of globs ends.
    under_way: BTreeSet<(ModPath, String)>,
}

impl Resolver<'_> {
    /// What `name` means in module `m`: its child modules, items and imports of that name,
    /// else what its globs bring of it.
    fn lookup(&mut self, m: &ModPath, name: &str) -> BTreeSet<Target> {
        let modules = self.modules;
        let mut found = BTreeSet::new();
        let Some(module) = modules.get(m) else {
            return found;
        };
        let key = (m.clone(), name.to_string());
        if !self.under_way.insert(key.clone()) {
            return found;
        }
        if module.children.contains_key(name) {
            let mut child = m.clone();
            child.push(name.to_string());
            found.insert(Target::Module(child));
        }
        for (index, item) in module.items.iter().enumerate() {
            if item.name == name {
                found.insert(Target::Item(m.clone(), index));
            }
        }
        for import in &module.imports {
            if import.leaf.binding() == Some(name) {
                found.extend(self.resolve(m, &import.leaf.path));
            }
        }
        if found.is_empty() {
            for import in module.imports.iter().filter(|import| import.leaf.glob) {
                for target in self.resolve(m, &import.leaf.path) {
                    if let Target::Module(there) = target {
                        found.extend(self.lookup(&there, name));
                    }
                }
            }
        }
        self.under_way.remove(&key);
        found
    }

    /// What `path`, written in module `m`, names (nothing when it leaves the crate).
    fn resolve(&mut self, m: &ModPath, path: &[String]) -> BTreeSet<Target> {
        let parent = |m: &ModPath| (!m.is_empty()).then(|| m[..m.len() - 1].to_vec());
        let Some((first, rest)) = path.split_first() else {
            return BTreeSet::new();
        };
        let mut current: BTreeSet<Target> = match first.as_str() {
            "crate" => BTreeSet::from([Target::Module(ModPath::new())]),
            "self" => BTreeSet::from([Target::Module(m.clone())]),
            "super" => parent(m).map(Target::Module).into_iter().collect(),
            name => self.lookup(m, name),
        };
        for seg in rest {
            let mut next = BTreeSet::new();
            for target in current {
                // An item's own names (an enum's variants) are not followed.
                let Target::Module(there) = target else {
                    continue;
                };
                if seg == "super" {
                    next.extend(parent(&there).map(Target::Module));
                } else {
                    next.extend(self.lookup(&there, seg));
                }
            }
            current = next;
        }
        current
    }

    /// Gives every public item reachable from module `m`, named `prefix`, its paths.
    fn walk(
        &mut self,
        m: &ModPath,
        prefix: &[String],
        on_the_way: &mut Vec<ModPath>,
        found: &mut BTreeMap<(ModPath, usize), BTreeSet<String>>,
    ) {
        let modules = self.modules;
        let Some(module) = modules.get(m) else {
            return;
        };
        if on_the_way.contains(m) {
            return;
        }
        on_the_way.push(m.clone());
        let named = |name: &str| {
            let mut path = prefix.to_vec();
            path.push(name.to_string());
            path
        };
        for (child, &public) in &module.children {
            if public {
                let mut there = m.clone();
                there.push(child.clone());
                self.walk(&there, &named(child), on_the_way, found);
            }
        }
        for (index, item) in module.items.iter().enumerate() {
            if item.public {
                let path = named(&item.name).join("::");
                found.entry((m.clone(), index)).or_default().insert(path);
            }
        }
        for import in module.imports.iter().filter(|import| import.public) {
            let targets = self.resolve(m, &import.leaf.path);
            let name = import.leaf.binding();
            for target in targets {
                match (target, name) {
                    (Target::Module(there), _) if import.leaf.glob => {
                        self.walk(&there, prefix, on_the_way, found);
                    }
                    (Target::Module(there), Some(name)) => {
                        self.walk(&there, &named(name), on_the_way, found);
                    }
                    (Target::Item(there, index), Some(name))
                        if modules[&there].items[index].public =>
                    {
                        let path = named(name).join("::");
                        found.entry((there, index)).or_default().insert(path);
                    }
                    _ => {}
                }
            }
        }
        on_the_way.pop();
    }
}

/// Every public item of the crate given as (module path, source) pairs, named
/// `crate_name`, with its paths; sorted by each item's first path.
pub fn public_items(files: &[(ModPath, String)], crate_name: &str) -> Vec<PublicItem> {
    let modules = read_modules(files);
    let mut resolver = Resolver {
        modules: &modules,
        under_way: BTreeSet::new(),
    };
    let mut found = BTreeMap::new();
    resolver.walk(
        &ModPath::new(),
        &[crate_name.to_string()],
        &mut Vec::new(),
        &mut found,
    );
    let mut items: Vec<PublicItem> = found
        .into_iter()
        .map(|((m, index), paths)| PublicItem {
            kind: modules[&m].items[index].kind,
            paths,
        })
        .collect();
    items.sort_by(|a, b| a.paths.first().cmp(&b.paths.first()));
    items
}

/// Every public item of the crate whose sources are under `src_dir`.
pub fn crate_public_items(src_dir: &Path, crate_name: &str) -> Vec<PublicItem> {
    public_items(&crate_files(src_dir), crate_name)
}

/// The items reachable by more than one path, one line each (`a  also  b`), under a line
/// that counts them; empty when every item has one path.
pub fn duplicates_report(items: &[PublicItem]) -> String {
    let dual: Vec<&PublicItem> = items.iter().filter(|item| item.paths.len() > 1).collect();
    if dual.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "{} of {} public items are reachable by more than one path (each should have one: \
         drop the re-export that makes the extra name):",
        dual.len(),
        items.len()
    );
    for item in dual {
        let paths: Vec<&str> = item.paths.iter().map(String::as_str).collect();
        text.push_str("\n  ");
        text.push_str(&paths.join("  also  "));
    }
    text
}
