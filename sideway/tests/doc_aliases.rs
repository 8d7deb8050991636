//! Every data-path inline of rdma-core's `verbs.h` (`ibv_wr_*`, `ibv_*_poll`,
//! `ibv_wc_read_*`) is findable in sideway's docs by its C name: the method or type that does
//! its work carries `#[doc(alias = "...")]`, or the inline is listed below as one sideway
//! does not offer, with the reason. A new inline in a newer `verbs.h` fails this test until
//! someone decides which it is.
//!
//! Reads the `verbs.h` the crate was built against (`RDMA_MUMMY_SYS_INCLUDE_DIR`, else
//! `/usr/include`), and every `.rs` file under `sideway/src`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Inlines sideway does not wrap, with why.
const NOT_OFFERED: &[(&str, &str)] = &[
    (
        "ibv_wr_atomic_write",
        "the 8-byte atomic write (rdma-core 43) is not wrapped yet",
    ),
    (
        "ibv_wr_send_tso",
        "TSO sends are for raw packet QPs, which sideway does not make",
    ),
    (
        "ibv_wc_read_completion_wallclock_ns",
        "not read: the completion timestamp is the device clock's",
    ),
    ("ibv_wc_read_cvlan", "raw packet QPs only"),
    (
        "ibv_wc_read_flow_tag",
        "raw packet QPs (flow steering) only",
    ),
    ("ibv_wc_read_tm_info", "tag matching is not wrapped"),
];

fn header() -> Option<PathBuf> {
    let dir = std::env::var_os("RDMA_MUMMY_SYS_INCLUDE_DIR")
        .map_or_else(|| PathBuf::from("/usr/include"), PathBuf::from);
    let h = dir.join("infiniband/verbs.h");
    h.exists().then_some(h)
}

/// The names of `static inline` functions in `text` that are data-path inlines.
fn inlines(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut pending = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("static inline") {
            pending = true;
        }
        if !pending {
            continue;
        }
        if let Some(open) = line.find('(') {
            let name: String = line[..open]
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
                .to_owned();
            pending = false;
            let data_path = name.starts_with("ibv_wr_")
                || name.starts_with("ibv_wc_read_")
                || matches!(
                    name.as_str(),
                    "ibv_start_poll" | "ibv_next_poll" | "ibv_end_poll"
                );
            if data_path {
                names.insert(name);
            }
        }
    }
    names
}

fn aliases(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("read sideway/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            aliases(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            for piece in text.split("alias = \"").skip(1) {
                if let Some(end) = piece.find('"') {
                    out.insert(piece[..end].to_owned());
                }
            }
        }
    }
}

#[test]
fn every_data_path_inline_of_verbs_h_is_an_alias_or_said_to_be_missing() {
    let Some(h) = header() else {
        println!("skipped: no infiniband/verbs.h under RDMA_MUMMY_SYS_INCLUDE_DIR or /usr/include");
        return;
    };
    let inl = inlines(&std::fs::read_to_string(&h).expect("read verbs.h"));
    assert!(
        inl.contains("ibv_wr_set_sge") && inl.contains("ibv_next_poll"),
        "{} does not look like verbs.h: found {inl:?}",
        h.display()
    );
    let mut have = BTreeSet::new();
    aliases(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut have,
    );
    let skipped: BTreeSet<&str> = NOT_OFFERED.iter().map(|(n, _)| *n).collect();
    let missing: Vec<&String> = inl
        .iter()
        .filter(|n| !have.contains(*n) && !skipped.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "data-path inlines of {} with no doc(alias) in sideway and not in NOT_OFFERED: {missing:?}",
        h.display()
    );
    let stale: Vec<&&str> = skipped
        .iter()
        .filter(|n| have.contains(**n) || !inl.contains(**n))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_OFFERED names inlines that sideway aliases or verbs.h no longer has: {stale:?}"
    );
    println!(
        "{} data-path inlines, {} not offered",
        inl.len(),
        skipped.len()
    );
}

#[test]
fn the_header_scan_finds_multi_line_declarations() {
    let text = "static inline int ibv_post_send(struct ibv_qp *qp)\n\
                static inline void\nibv_wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey)\n\
                static inline uint32_t ibv_wc_read_qp_num(struct ibv_cq_ex *cq)\n";
    let found = inlines(text);
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["ibv_wc_read_qp_num", "ibv_wr_set_sge"]
    );
}
