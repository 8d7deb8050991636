//! Diagnostics the crate cannot return as errors: a destroy verb that failed inside a
//! `Drop`. A leaf: every verbs object's `Drop` reports through it.

/// Reports a destroy verb that failed in a `Drop`: the resource may leak, but the program goes
/// on. Through the `log` facade, at error level, target `sideway`: the application's logger
/// decides where it goes (see "Diagnostics" in the crate docs); logging never panics.
pub(crate) fn report_drop_failure(call: &str, object: &str, error: &std::io::Error) {
    log::error!(
        target: "sideway",
        "{call} failed while dropping {object}: {error} (the resource may leak)"
    );
}
