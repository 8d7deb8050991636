//! What the test scripts read back from the output of the tests and checks they ran.

/// The "skipped: REASON" lines of a test's or check's output (a device test on a device
/// without the feature, a check that cannot run here), as "WHERE: REASON", in order. A line
/// counts when "skipped: " starts it, after any indentation; "skipped" anywhere else in a
/// line (a test named `..._skipped`, a sentence) is no skip.
pub(crate) fn skips(where_: &str, output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("skipped: "))
        .map(|reason| format!("{where_}: {reason}"))
        .collect()
}

/// What scripts/test repeats under its summary for a failed step: the failure lines the
/// step's own summary wrote ("failed: NAME, ..." and its "failed| " excerpts, as
/// scripts/guest-tests prints them), at most the last 200; a step without any, its last 40
/// lines, each indented as "  | ".
pub(crate) fn failure_excerpt(log: &str) -> Vec<String> {
    let marked: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("failed: ") || l.starts_with("failed| "))
        .collect();
    if !marked.is_empty() {
        return last(&marked, 200).iter().map(|l| l.to_string()).collect();
    }
    let all: Vec<&str> = log.lines().collect();
    last(&all, 40).iter().map(|l| format!("  | {l}")).collect()
}

fn last<T>(v: &[T], n: usize) -> &[T] {
    &v[v.len().saturating_sub(n)..]
}

#[cfg(test)]
mod tests {
    use super::*;

    // The end of a real run's log of scripts/guest-tests (paths shortened): its skip and
    // failure lines, its summary, and what the step that ran it said after.
    const GUEST_LOG: &str = include_str!("../tests/data/guest-tests-end.log");

    #[test]
    fn skips_keep_their_reason_and_say_where() {
        let out = "running 3 tests\n\
                   test a ... ok\n\
                   \x20   skipped: no ODP on rxe0 (general_odp_caps empty)\n\
                   skipped: link faults need two hosts\n\
                   test cq_skipped_entries ... ok\n\
                   the run skipped: nothing\n";
        assert_eq!(
            skips("scripts/e2e/x.sh", out),
            [
                "scripts/e2e/x.sh: no ODP on rxe0 (general_odp_caps empty)",
                "scripts/e2e/x.sh: link faults need two hosts",
            ]
        );
        assert!(skips("x", "test skipped_ok ... ok\nskipped:no space\n").is_empty());
    }

    #[test]
    fn a_guest_failure_repeats_its_marked_lines() {
        let ex = failure_excerpt(GUEST_LOG);
        assert_eq!(ex.len(), 5, "{ex:?}");
        assert!(ex
            .iter()
            .all(|l| l.starts_with("failed: ") || l.starts_with("failed| ")));
        assert!(ex[0].starts_with("failed: "), "{ex:?}");
        assert_eq!(ex[4], "failed: scripts/e2e/stride-stream.sh");
        // A "skipped:" or summary line is not repeated.
        assert!(!ex
            .iter()
            .any(|l| l.contains("passed,") || l.contains("skipped")));
        // The skips as the guest lists them again under its summary.
        assert_eq!(skips("g", GUEST_LOG).len(), 7);
    }

    #[test]
    fn marked_lines_are_capped_at_200() {
        let log: String = (0..250).map(|i| format!("failed| line {i}\n")).collect();
        let ex = failure_excerpt(&log);
        assert_eq!(ex.len(), 200);
        assert_eq!(ex[0], "failed| line 50");
        assert_eq!(ex[199], "failed| line 249");
    }

    #[test]
    fn an_unmarked_failure_repeats_its_last_40_lines() {
        let log: String = (0..50).map(|i| format!("line {i}\n")).collect();
        let ex = failure_excerpt(&log);
        assert_eq!(ex.len(), 40);
        assert_eq!(ex[0], "  | line 10");
        assert_eq!(ex[39], "  | line 49");
        // "failed" inside a line is no mark.
        assert_eq!(
            failure_excerpt("cargo: build failed: x\n"),
            ["  | cargo: build failed: x"]
        );
        assert!(failure_excerpt("").is_empty());
    }
}
