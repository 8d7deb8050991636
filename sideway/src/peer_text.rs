//! Text that came from a peer, made safe to print.
//!
//! Whatever a peer sends (an endpoint line, private data, an abort reason, ping data) may
//! end up on this side's terminal, in verbose output or in an error. A broken or hostile peer
//! could put terminal escape sequences there (clear the screen, retitle the window, rewrite
//! earlier lines), bidirectional-text controls that make a line read differently from what it
//! holds, or megabytes of text; [`printable`] is the one place such text goes through
//! before it is printed or put into an error. This workspace's programs (stride-perf, the
//! examples) all use it.
//!
//! ```
//! use sideway::peer_text::printable;
//! assert_eq!(printable("bye\u{1b}[2J", 64), "bye\\x1b[2J");
//! ```

use std::fmt::Write as _;

/// How many characters of one piece of peer text are shown; the rest is counted, not shown.
pub const PEER_TEXT_MAX: usize = 512;

/// `text` with every control character (C0 below 0x20, ESC among them; DEL; and C1,
/// 0x80-0x9f, with its one-character CSI) and every bidirectional-text control (the marks,
/// embeddings, overrides and isolates of U+061C, U+200E-U+200F, U+202A-U+202E and
/// U+2066-U+2069) written out as an escape (`\x1b`, `\u{9b}`, `\u{202e}`), cut to
/// `max_chars` characters with a note of how many more there were.
pub fn printable(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars));
    let mut chars = text.chars();
    for c in chars.by_ref().take(max_chars) {
        // Writing into a String cannot fail.
        let _ = match c {
            '\u{0}'..='\u{1f}' | '\u{7f}' => write!(out, "\\x{:02x}", u32::from(c)),
            '\u{80}'..='\u{9f}' => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c if is_bidi_control(c) => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c => {
                out.push(c);
                Ok(())
            }
        };
    }
    let rest = chars.count();
    if rest > 0 {
        let _ = write!(out, "... ({rest} more characters not shown)");
    }
    out
}

/// True for the characters that change the direction text is shown in: a peer's
/// `U+202E` would show `exe.txt` for `txt.exe`.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_written_out() {
        assert_eq!(printable("device lost", 100), "device lost");
        assert_eq!(
            printable("\u{1b}[2J\u{1b}]0;owned\u{7}", 100),
            "\\x1b[2J\\x1b]0;owned\\x07"
        );
        assert_eq!(printable("a\nb\r\t\u{7f}", 100), "a\\x0ab\\x0d\\x09\\x7f");
        assert_eq!(printable("\u{9b}31m\u{80}", 100), "\\u{9b}31m\\u{80}");
        assert_eq!(
            printable("a\u{202e}txt.exe\u{2066}\u{61c}\u{200f}", 100),
            "a\\u{202e}txt.exe\\u{2066}\\u{61c}\\u{200f}"
        );
        // Printable text beyond ASCII stays as it is, right-to-left scripts too.
        assert_eq!(printable("שלום", 100), "שלום");
        assert_eq!(printable("Grüße, ½ µs", 100), "Grüße, ½ µs");
    }

    #[test]
    fn long_text_is_cut() {
        let long = "x".repeat(10_000);
        let shown = printable(&long, 8);
        assert_eq!(shown, "xxxxxxxx... (9992 more characters not shown)");
        assert_eq!(printable("", 8), "");
        assert_eq!(printable("12345678", 8), "12345678");
    }
}
