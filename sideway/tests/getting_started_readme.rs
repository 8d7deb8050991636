//! The Getting Started programs in README.md and sideway/README.md are the files under
//! sideway/examples/, word for word: each `<!-- file: PATH -->` marker is followed by a code
//! block whose text must equal that file.

use std::path::Path;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// Every (path, code block) pair a README marks.
fn marked_blocks(readme: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(path) = line
            .strip_prefix("<!-- file: ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "no code block after the marker of {path}"
        );
        let mut text = String::new();
        for line in lines.by_ref() {
            if line == "```" {
                break;
            }
            text.push_str(line);
            text.push('\n');
        }
        out.push((path.to_owned(), text));
    }
    out
}

fn check(readme: &Path) {
    let text = std::fs::read_to_string(readme)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", readme.display()));
    let blocks = marked_blocks(&text);
    let names: Vec<&str> = blocks.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "sideway/examples/getting_started_rc.rs",
            "sideway/examples/getting_started_cm.rs"
        ],
        "{}",
        readme.display()
    );
    for (path, block) in blocks {
        let file = Path::new(MANIFEST_DIR)
            .join("examples")
            .join(Path::new(&path).file_name().expect("a file name"));
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        assert!(
            block == source,
            "{} shows {path} differently from the file: copy the file into the README",
            readme.display()
        );
    }
}

#[test]
fn the_readmes_show_the_getting_started_files() {
    check(&Path::new(MANIFEST_DIR).join("README.md"));
    let workspace = Path::new(MANIFEST_DIR).join("../README.md");
    if workspace.exists() {
        check(&workspace);
    } else {
        // A packaged crate has no workspace README; its own was checked above.
        println!("no workspace README.md next to this crate: checked the crate's own only");
    }
}
