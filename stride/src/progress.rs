//! The progress line of a size sweep (`-a`): shown on standard error when it is a terminal,
//! rewritten in place, and erased before each result row, so that piped output holds only
//! the tables.

use std::io::Write;

/// The text of the progress line before size `index` (from 0) of `count`.
pub fn progress_text(index: usize, count: usize, size: u64) -> String {
    format!("[{}/{count}] measuring {size}-byte messages ...", index + 1)
}

/// A progress line, or nothing when disabled.
#[derive(Debug)]
pub struct Progress {
    count: usize,
    enabled: bool,
    shown: bool,
}

impl Progress {
    /// A progress line over `count` sizes; `enabled` is false when standard error is not a
    /// terminal or there is only one size.
    pub fn new(count: usize, enabled: bool) -> Self {
        Progress {
            count,
            enabled,
            shown: false,
        }
    }

    /// Shows that size `index` (from 0) is being measured.
    pub fn show(&mut self, index: usize, size: u64) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            // A progress line that cannot be written is not worth failing the run for.
            let _ = write!(err, "\r\x1b[2K{}", progress_text(index, self.count, size));
            let _ = err.flush();
            self.shown = true;
        }
    }

    /// Erases the line, before a result row is printed.
    pub fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_counts_from_one_and_names_the_size() {
        let t = progress_text(2, 23, 8);
        assert!(t.starts_with("[3/23] measuring 8-byte"), "{t}");
        let t = progress_text(22, 23, 8 << 20);
        assert!(t.starts_with("[23/23]"), "{t}");
    }

    #[test]
    fn disabled_progress_writes_nothing() {
        let mut p = Progress::new(3, false);
        p.show(0, 2);
        assert!(!p.shown);
        p.clear();
    }
}
