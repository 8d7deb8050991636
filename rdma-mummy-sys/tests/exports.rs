//! The shim defines exactly what the export lists say it forwards, and the lists hold every
//! function the installed libraries export.
//!
//! `rdma-core-mummy/exports/{libibverbs,librdmacm,libmlx5}.symbols` are written by `gen_shim.py
//! exports` from `nm -D` of each supported rdma-core release's libraries; each line says
//! whether the shim forwards the export or leaves it out (and why). These tests read the
//! symbol tables themselves with `nm` (binutils, installed with the C compiler the build needs):
//! the built shim archive against the lists, and the installed libraries against the lists, so
//! an export of a newer rdma-core cannot go missing from the shim unnoticed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const LISTS: [(&str, &str); 3] = [
    (
        "libibverbs",
        include_str!("../rdma-core-mummy/exports/libibverbs.symbols"),
    ),
    (
        "librdmacm",
        include_str!("../rdma-core-mummy/exports/librdmacm.symbols"),
    ),
    (
        "libmlx5",
        include_str!("../rdma-core-mummy/exports/libmlx5.symbols"),
    ),
];

/// One line of an export list: NAME VERSION-NODE RELEASES DISPOSITION.
struct Export<'a> {
    name: &'a str,
    forwarded: bool,
    /// Not every release the list covers (its `# releases:` line) exports it: an export of
    /// a newer rdma-core than some supported one.
    newer: bool,
}

// Functions the installed headers declare that the shim does not define (build.rs).
include!(concat!(env!("OUT_DIR"), "/unshimmed_functions.rs"));

fn exports(list: &str) -> Vec<Export<'_>> {
    let releases: BTreeSet<&str> = list
        .lines()
        .find_map(|line| line.strip_prefix("# releases: "))
        .expect("an export list names its releases")
        .split(',')
        .collect();
    list.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            assert_eq!(fields.len(), 4, "malformed export list line: {line:?}");
            let disposition = fields[3];
            assert!(
                disposition.starts_with("forward") || disposition.starts_with("left out: "),
                "export list line without a disposition: {line:?}"
            );
            let present: BTreeSet<&str> = fields[2].split(',').collect();
            Export {
                name: fields[0],
                forwarded: disposition.starts_with("forward"),
                newer: !releases.is_subset(&present),
            }
        })
        .collect()
}

/// `nm ARGS... FILE`, or None (with the reason printed as a skip) when nm is not installed,
/// as in the SoftRoCE guest, which has no compiler; the host run always has it.
fn nm(args: &[&str], file: &Path) -> Option<String> {
    match Command::new("nm").args(args).arg(file).output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "nm {args:?} {} failed: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8(out.stdout).expect("nm prints ASCII symbol names"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("skipped: nm (binutils) is not installed here");
            None
        }
        Err(e) => panic!("cannot run nm: {e}"),
    }
}

#[test]
fn the_shim_defines_every_forwarded_export_and_nothing_left_out() {
    // cc builds the shim into OUT_DIR as librdma-core-mummy.a.
    let archive = PathBuf::from(env!("OUT_DIR")).join("librdma-core-mummy.a");
    assert!(archive.exists(), "{} is missing", archive.display());
    let Some(text) = nm(&["--defined-only", "--extern-only"], &archive) else {
        return;
    };
    // "ADDRESS T NAME" lines for the functions (archive member headers and U lines aside).
    let defined: BTreeSet<&str> = text
        .lines()
        .filter_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [_, "T", name] => Some(name),
                _ => None,
            },
        )
        .collect();
    let mut forwarded = BTreeSet::new();
    let mut left_out = BTreeSet::new();
    let mut newer = BTreeSet::new();
    for (_, list) in LISTS {
        for e in exports(list) {
            if e.forwarded {
                forwarded.insert(e.name);
            } else {
                left_out.insert(e.name);
            }
            if e.newer {
                newer.insert(e.name);
            }
        }
    }
    // Present in the headers => forwarded: an export of a newer release than the installed
    // headers' (the lists follow rdma-core's newest release) is generated from a header that
    // declares it; while none does, the shim need not define it. One the headers do declare
    // is in UNSHIMMED_FUNCTIONS, and must be defined.
    let (missing, undeclared): (Vec<&str>, Vec<&str>) = forwarded
        .difference(&defined)
        .copied()
        .partition(|name| !newer.contains(name) || UNSHIMMED_FUNCTIONS.contains(name));
    if !undeclared.is_empty() {
        println!(
            "not defined, as the installed headers do not declare them (a newer rdma-core's): \
             {undeclared:?}"
        );
    }
    assert!(
        missing.is_empty(),
        "the shim does not define {missing:?}, which the export lists say it forwards; run \
         `make -C rdma-mummy-sys/rdma-core-mummy regen`"
    );
    let wrongly: Vec<_> = left_out.intersection(&defined).collect();
    assert!(
        wrongly.is_empty(),
        "the shim defines left-out exports {wrongly:?}"
    );
    // Everything else it defines is its own: rdma_mummy_* and the loader's mummy_load.
    let unknown: Vec<_> = defined
        .iter()
        .filter(|n| !forwarded.contains(*n) && !n.starts_with("rdma_mummy_") && **n != "mummy_load")
        .collect();
    assert!(
        unknown.is_empty(),
        "the shim defines {unknown:?}, which no export list names"
    );
    // rdma-core 44 and 56 export 145 functions a program may call, and libmlx5 130 more; far fewer means the
    // lists or the generator lost functions.
    assert!(
        forwarded.len() >= 145 + 130,
        "only {} forwarded",
        forwarded.len()
    );
    println!(
        "{} forwarded exports defined, {} left out, {} shim functions",
        forwarded.len() - undeclared.len(),
        left_out.len(),
        defined.len() - forwarded.len()
    );
}

/// Where the dynamic linker finds SONAME (`ldconfig -p`), if it does. Its lines read
/// "\tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1"; on x86-64
/// the 64-bit one, not a 32-bit multiarch copy.
fn installed(soname: &str) -> Option<PathBuf> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| Command::new(l).arg("-p").output().ok())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let candidates: Vec<&str> = text
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with(&format!("{soname} (")))
        .collect();
    let line = candidates
        .iter()
        .find(|line| !cfg!(target_arch = "x86_64") || line.contains("x86-64"))?;
    line.rsplit(" => ").next().map(PathBuf::from)
}

#[test]
fn the_installed_libraries_export_nothing_the_lists_lack() {
    let mut checked = 0;
    for (lib, list) in LISTS {
        let soname = format!("{lib}.so.1");
        let Some(path) = installed(&soname) else {
            println!("skipped: {soname} is not installed here (ldconfig -p does not list it)");
            continue;
        };
        let Some(text) = nm(&["-D", "--defined-only", "--with-symbol-versions"], &path) else {
            return;
        };
        let listed: BTreeSet<&str> = exports(list).iter().map(|e| e.name).collect();
        // "ADDRESS TYPE NAME@VERSION" or "NAME@@VERSION"; type A lines are version nodes.
        let exported: BTreeSet<&str> = text
            .lines()
            .filter_map(
                |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                    [_, kind, sym] if kind != "A" => sym.split('@').next(),
                    _ => None,
                },
            )
            .collect();
        let unlisted: Vec<_> = exported.difference(&listed).collect();
        assert!(
            unlisted.is_empty(),
            "{} exports {unlisted:?}, which rdma-core-mummy/exports/{lib}.symbols lacks: run \
             `make -C rdma-mummy-sys/rdma-core-mummy exports LIBDIRS=\"...\"` with this \
             library's directory among the others, then `make regen`",
            path.display()
        );
        println!("{}: all {} exports listed", path.display(), exported.len());
        checked += 1;
    }
    println!("{checked} installed libraries checked");
}
