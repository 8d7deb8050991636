//! The module-graph analyzer behind the `module_graph` tests of sideway and stride-perf
//! (each includes this file with `#[path]` and names its own crate's folder).
//!
//! Reads every `.rs` file under a crate's `src`, takes each one as a node (`lib.rs` is the
//! crate root, `a/mod.rs` and `a.rs` are module `a`, `a/b.rs` is `a::b`), and draws an arrow
//! from a file to every file its code names: `crate::...`, `super::...` and `self::...` paths
//! anywhere in the code (`use` lines, `impl crate::x::T`, `crate::x::f(..)`), `use` lines
//! that start with a child module's name, with `{...}` groups expanded. A path lands on the
//! deepest module file it walks through, so `crate::verbs::device::DeviceContext` is an arrow
//! to `verbs/device/mod.rs` (which re-exports it) and `super::context::DeviceContext` one to
//! `context.rs`. Comments, string and character literals and `#[cfg(test)]` items are left
//! out: unit tests may reach anywhere, the library may not. `mod` declarations are not
//! arrows: a folder's `mod.rs` declaring its files is ownership, not use; its `pub use` lines
//! are arrows.
//!
//! The checks: no arrow points to `lib.rs` (the crate root only re-exports), the arrows form
//! no circle (a failure prints it with the line that drew each arrow), and every module sits
//! in a layer of the crate's `ARCHITECTURE.md` table with no arrow to a higher layer, so the
//! drawing stays true to the code. The detector's own tests, on small made-up crates, are in
//! `sideway/tests/module_graph.rs`.
//!
//! The scanner (`code_only`, `use_tree`, `crate_files`) also serves the public-path analyzer,
//! `public_paths.rs`, which includes this file as `module_graph`.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `[]` for `lib.rs`, `["verbs", "device"]` for
/// `verbs/device/mod.rs`.
pub type ModPath = Vec<String>;

/// Why an arrow was drawn: the file, the line, and the path as written.
#[derive(Debug, Clone)]
pub struct Origin {
    pub line: usize,
    pub text: String,
}

/// Arrows between modules, each with the first reference that drew it.
pub type Graph = BTreeMap<ModPath, BTreeMap<ModPath, Origin>>;

pub fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The source with comments and string/char literals blanked (newlines kept, so line
/// numbers hold), then `#[cfg(test)]` items blanked too.
pub fn code_only(src: &str) -> Vec<u8> {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r')))
            && (i == 0 || !is_ident(b[i - 1]))
            && {
                let s = if c == b'r' { i + 1 } else { i + 2 };
                let hashes = b[s..].iter().take_while(|&&c| c == b'#').count();
                b.get(s + hashes) == Some(&b'"')
            }
        {
            // Raw string: r"..", r#".."#, br"..".
            let s = if c == b'r' { i + 1 } else { i + 2 };
            let hashes = b[s..].iter().take_while(|&&c| c == b'#').count();
            let mut closing = vec![b'"'];
            closing.extend(std::iter::repeat_n(b'#', hashes));
            let body = s + hashes + 1;
            let end = b[body..]
                .windows(closing.len())
                .position(|w| w == closing.as_slice())
                .map_or(b.len(), |p| body + p + closing.len());
            blank(&mut out, i, end);
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"'), or a lifetime ('a), left alone.
            let lit_end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte UTF-8 char: its closing quote within 4 bytes.
                (i + 2..(i + 6).min(b.len()))
                    .find(|&j| b[j] == b'\'')
                    .filter(|_| b.get(i + 1).is_some_and(|&c| c >= 0x80))
            };
            match lit_end {
                Some(end) => {
                    blank(&mut out, i, end + 1);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    blank_cfg_test(&mut out);
    out
}

/// Blanks every item behind `#[cfg(test)]`: up to its `;`, or its `{..}` block.
fn blank_cfg_test(code: &mut [u8]) {
    let needle = b"#[cfg(test)]";
    let mut from = 0;
    while let Some(p) = code[from..].windows(needle.len()).position(|w| w == needle) {
        let start = from + p;
        let mut j = start + needle.len();
        let mut depth = 0usize;
        while j < code.len() {
            match code[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                b';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        let end = (j + 1).min(code.len());
        for c in &mut code[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = j.min(code.len());
    }
}

/// Inline `mod name { .. }` blocks: (body start, body end, name), so that `super::` inside
/// one is read from the inline module.
fn inline_mods(code: &[u8]) -> Vec<(usize, usize, String)> {
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(p) = find_word(code, i, b"mod") {
        let mut j = skip_ws(code, p + 3);
        let name_start = j;
        while j < code.len() && is_ident(code[j]) {
            j += 1;
        }
        let name = String::from_utf8_lossy(&code[name_start..j]).into_owned();
        let k = skip_ws(code, j);
        if !name.is_empty() && code.get(k) == Some(&b'{') {
            let mut depth = 0usize;
            let mut e = k;
            while e < code.len() {
                match code[e] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                e += 1;
            }
            found.push((k, e, name));
        }
        i = p + 3;
    }
    found
}

pub fn skip_ws(code: &[u8], mut i: usize) -> usize {
    while i < code.len() && code[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The next occurrence of `word` at or after `from` that is a whole identifier.
fn find_word(code: &[u8], from: usize, word: &[u8]) -> Option<usize> {
    let mut i = from;
    while i + word.len() <= code.len() {
        let p = code[i..].windows(word.len()).position(|w| w == word)? + i;
        let before_ok = p == 0 || !is_ident(code[p - 1]);
        let after_ok = code.get(p + word.len()).is_none_or(|&c| !is_ident(c));
        if before_ok && after_ok {
            return Some(p);
        }
        i = p + 1;
    }
    None
}

/// One leaf of a `use` tree: the full path it names (a `self` leaf names its parent,
/// `a::{self}` is `a`; a glob's is the module it imports from), the `as` rename if any
/// (`_` included), and whether it is a glob (`a::*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseLeaf {
    pub path: Vec<String>,
    pub rename: Option<String>,
    pub glob: bool,
}

impl UseLeaf {
    /// The name the leaf binds in its module: its rename, else its last segment; none for a
    /// glob or `as _`.
    pub fn binding(&self) -> Option<&str> {
        if self.glob {
            return None;
        }
        match self.rename.as_deref() {
            Some("_") => None,
            Some(rename) => Some(rename),
            None => self.path.last().map(String::as_str),
        }
    }
}

/// Parses the path (or `use` tree) that starts at `i`, expanding `{..}` groups and keeping
/// `as` renames and globs; returns its leaves and where the tree ends.
pub fn use_tree(code: &[u8], i: usize) -> (Vec<UseLeaf>, usize) {
    let leaf =
        |path: Vec<String>, rename: Option<String>, glob: bool| UseLeaf { path, rename, glob };
    let mut prefix: Vec<String> = Vec::new();
    let mut i = skip_ws(code, i);
    loop {
        if code.get(i) == Some(&b'{') {
            let mut all = Vec::new();
            i += 1;
            loop {
                i = skip_ws(code, i);
                match code.get(i) {
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    Some(b',') => i += 1,
                    None => break,
                    _ => {
                        let (leaves, end) = use_tree(code, i);
                        for mut sub in leaves {
                            // `a::{self}` names `a` itself.
                            if !prefix.is_empty() && sub.path.first().is_some_and(|s| s == "self") {
                                sub.path.remove(0);
                            }
                            let mut full = prefix.clone();
                            full.append(&mut sub.path);
                            sub.path = full;
                            all.push(sub);
                        }
                        if end == i {
                            i += 1;
                        } else {
                            i = end;
                        }
                    }
                }
            }
            return (all, i);
        }
        if code.get(i) == Some(&b'*') {
            return (vec![leaf(prefix, None, true)], i + 1);
        }
        let start = i;
        while i < code.len() && is_ident(code[i]) {
            i += 1;
        }
        if start == i {
            return (vec![leaf(prefix, None, false)], i);
        }
        let seg = String::from_utf8_lossy(&code[start..i]).into_owned();
        if seg != "self" || prefix.is_empty() {
            prefix.push(seg);
        }
        let j = skip_ws(code, i);
        if code.get(j) == Some(&b':') && code.get(j + 1) == Some(&b':') {
            i = skip_ws(code, j + 2);
            continue;
        }
        // `path as name` (or `as _`).
        if code[j..].starts_with(b"as") && code.get(j + 2).is_none_or(|&c| !is_ident(c)) {
            let k = skip_ws(code, j + 2);
            let mut e = k;
            while e < code.len() && is_ident(code[e]) {
                e += 1;
            }
            if e > k {
                let rename = String::from_utf8_lossy(&code[k..e]).into_owned();
                return (vec![leaf(prefix, Some(rename), false)], e);
            }
        }
        return (vec![leaf(prefix, None, false)], i);
    }
}

/// Parses the path (or `use` tree) that starts at `i`, expanding `{..}` groups; returns
/// every full path (segments, a glob's without its `*`, renames left out) and where the tree
/// ends.
fn parse_tree(code: &[u8], i: usize) -> (Vec<Vec<String>>, usize) {
    let (leaves, end) = use_tree(code, i);
    (leaves.into_iter().map(|leaf| leaf.path).collect(), end)
}

/// Every module path a file's code names, with the line and text that names it, resolved
/// to absolute segments (`crate` dropped). `here` is the file's module path, `children` the
/// modules it declares.
fn references(
    src: &str,
    here: &ModPath,
    children: &BTreeSet<String>,
) -> Vec<(Vec<String>, Origin)> {
    let code = code_only(src);
    let mods = inline_mods(&code);
    let line_of = |p: usize| code[..p].iter().filter(|&&c| c == b'\n').count() + 1;
    // The module the code at `p` is in: the file's, plus inline modules around `p`.
    let module_at = |p: usize| {
        let mut m = here.clone();
        for (s, e, name) in &mods {
            if *s < p && p < *e {
                m.push(name.clone());
            }
        }
        m
    };
    let mut refs = Vec::new();
    for start_word in [&b"crate"[..], b"super", b"self"] {
        let mut from = 0;
        while let Some(p) = find_word(&code, from, start_word) {
            from = p + start_word.len();
            let after = skip_ws(&code, from);
            if !(code.get(after) == Some(&b':') && code.get(after + 1) == Some(&b':')) {
                continue;
            }
            // `super::super::x` is read once, from its first `super`.
            if p >= 2 && &code[p - 2..p] == b"::" {
                continue;
            }
            let (paths, end) = parse_tree(&code, p);
            let text = String::from_utf8_lossy(&code[p..end])
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            for path in paths {
                let mut base = module_at(p);
                let mut segs = path.into_iter().peekable();
                match segs.peek().map(String::as_str) {
                    Some("crate") => {
                        segs.next();
                        base.clear();
                    }
                    Some("self") => {
                        segs.next();
                    }
                    _ => {
                        while segs.peek().map(String::as_str) == Some("super") {
                            segs.next();
                            base.pop();
                        }
                    }
                }
                base.extend(segs);
                refs.push((
                    base,
                    Origin {
                        line: line_of(p),
                        text: text.clone(),
                    },
                ));
            }
        }
    }
    // `use child::...` in the file that declares `mod child;`.
    let mut from = 0;
    while let Some(p) = find_word(&code, from, b"use") {
        from = p + 3;
        let (paths, end) = parse_tree(&code, p + 3);
        let text = String::from_utf8_lossy(&code[p..end])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for path in paths {
            if path.first().is_some_and(|first| children.contains(first)) {
                let mut full = module_at(p);
                full.extend(path);
                refs.push((
                    full,
                    Origin {
                        line: line_of(p),
                        text: text.clone(),
                    },
                ));
            }
        }
    }
    refs
}

/// The deepest module in `modules` that `path` walks through (the root when none).
fn resolve(path: &[String], modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
        .unwrap_or_default()
}

/// Builds the graph of a crate given as (module path, source) pairs.
pub fn build_graph(files: &[(ModPath, String)]) -> Graph {
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (here, src) in files {
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == here.len() + 1 && m.starts_with(here))
            .map(|m| m[here.len()].clone())
            .collect();
        let arrows = graph.entry(here.clone()).or_default();
        for (path, origin) in references(src, here, &children) {
            let to = resolve(&path, &modules);
            if &to != here {
                arrows.entry(to).or_insert(origin);
            }
        }
    }
    graph
}

/// A circle in the graph, as the modules along it (the first repeated at the end).
pub fn find_cycle(graph: &Graph) -> Option<Vec<ModPath>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &ModPath,
        graph: &Graph,
        marks: &mut BTreeMap<ModPath, Mark>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<ModPath>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack
                    .iter()
                    .position(|n| n == node)
                    .expect("an open node is on the stack");
                let mut cycle = stack[at..].to_vec();
                cycle.push(node.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        if let Some(arrows) = graph.get(node) {
            for next in arrows.keys() {
                if let Some(cycle) = visit(next, graph, marks, stack) {
                    return Some(cycle);
                }
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

pub fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "lib.rs".to_string()
    } else {
        m.join("::")
    }
}

/// What is wrong with the graph, in words: arrows up to the root and one circle.
pub fn problems(graph: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    for (from, arrows) in graph {
        if let Some(origin) = arrows.get(&ModPath::new()) {
            found.push(format!(
                "{} points up to lib.rs (line {}: `{}`): name the module that defines it",
                name(from),
                origin.line,
                origin.text
            ));
        }
    }
    if let Some(cycle) = find_cycle(graph) {
        let mut text = String::from("import circle:");
        for pair in cycle.windows(2) {
            let origin = &graph[&pair[0]][&pair[1]];
            let _ = write!(
                text,
                "\n  {} -> {} (line {}: `{}`)",
                name(&pair[0]),
                name(&pair[1]),
                origin.line,
                origin.text
            );
        }
        found.push(text);
    }
    found
}

/// The layer table of `ARCHITECTURE.md`: `| N | what | `a`, `b::c` |` rows, as (module
/// path, layer) entries.
pub fn layer_table(doc: &str) -> Vec<(ModPath, u32)> {
    let mut entries = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let Some(layer) = cells.first().and_then(|c| c.parse::<u32>().ok()) else {
            continue;
        };
        let modules = cells.last().copied().unwrap_or_default();
        for name in modules.split(',') {
            let name = name.trim().trim_matches('`');
            if !name.is_empty() {
                entries.push((name.split("::").map(String::from).collect(), layer));
            }
        }
    }
    entries
}

/// The layer of `module`: that of the longest table entry naming it or a parent of it.
pub fn layer_of(module: &ModPath, table: &[(ModPath, u32)]) -> Option<u32> {
    table
        .iter()
        .filter(|(entry, _)| module.starts_with(entry))
        .max_by_key(|(entry, _)| entry.len())
        .map(|(_, layer)| *layer)
}

/// Modules the table does not place, and arrows to a higher layer, in words.
pub fn layer_problems(graph: &Graph, table: &[(ModPath, u32)]) -> Vec<String> {
    let mut found = Vec::new();
    for (from, arrows) in graph {
        if from.is_empty() {
            continue;
        }
        let Some(here) = layer_of(from, table) else {
            found.push(format!(
                "{} is in no layer of ARCHITECTURE.md's table: add it where it belongs",
                name(from)
            ));
            continue;
        };
        for (to, origin) in arrows {
            if let Some(there) = layer_of(to, table).filter(|&there| there > here) {
                found.push(format!(
                    "{} (layer {here}) points up to {} (layer {there}) (line {}: `{}`)",
                    name(from),
                    name(to),
                    origin.line,
                    origin.text
                ));
            }
        }
    }
    found
}

pub fn module_path(root: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(root).expect("under src");
    let mut segs: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = segs.pop().expect("a file name");
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => segs.push(other.trim_end_matches(".rs").to_string()),
    }
    segs
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file under `src_dir`, as (module path, source) pairs.
pub fn crate_files(src_dir: &Path) -> Vec<(ModPath, String)> {
    let mut paths = Vec::new();
    sources(src_dir, &mut paths);
    paths
        .iter()
        .map(|p| {
            (
                module_path(src_dir, p),
                std::fs::read_to_string(p).expect("readable source"),
            )
        })
        .collect()
}

/// The graph of the crate whose sources are under `src_dir`.
pub fn crate_graph(src_dir: &Path) -> Graph {
    build_graph(&crate_files(src_dir))
}

/// Fails when the crate at `manifest_dir` has an import circle or an arrow up to `lib.rs`.
/// `min_modules` guards against a wrong folder: the crate has more files than that.
pub fn assert_no_circle(manifest_dir: &Path, min_modules: usize) {
    let graph = crate_graph(&manifest_dir.join("src"));
    assert!(
        graph.len() > min_modules,
        "the crate's files were found: {:?}",
        graph.keys()
    );
    let found = problems(&graph);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Fails when a module of the crate at `manifest_dir` is in no layer of its
/// `ARCHITECTURE.md` table, or points up to a higher layer. `min_entries` guards against a
/// table the reader did not find.
pub fn assert_layers(manifest_dir: &Path, min_entries: usize) {
    let path = manifest_dir.join("ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()));
    let table = layer_table(&doc);
    assert!(
        table.len() > min_entries,
        "the layer table was found: {table:?}"
    );
    let found = layer_problems(&crate_graph(&manifest_dir.join("src")), &table);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Prints every arrow of the crate at `manifest_dir`, one module a line, to compare with its
/// `ARCHITECTURE.md` (run the test with `--nocapture`).
pub fn print_graph(manifest_dir: &Path) {
    for (from, arrows) in crate_graph(&manifest_dir.join("src")) {
        let to: Vec<String> = arrows.keys().map(name).collect();
        println!("{} -> {}", name(&from), to.join(", "));
    }
}
