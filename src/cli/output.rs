//! What the commands write: their output on stdout and stderr, and text from the cluster made
//! safe to print on a terminal.

use std::{borrow::Cow, io::Write as _};

/// Writes a command's output. Failures (a closed pipe, as in `| head`) are ignored, as kubectl
/// does: there is nobody left to tell.
pub(super) fn emit(stdout: &str, stderr: &str) {
    let _ = std::io::stdout().write_all(stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(stderr.as_bytes());
}

/// Text from the cluster made safe to print on a terminal. Status fields, condition messages
/// and Events are written by whoever may write them, not only by the operator: a message with
/// an escape sequence could move the cursor, rewrite earlier lines or set the window title, and
/// bidirectional overrides can make text read differently than it is. Control characters
/// (newlines too: one value, one line) and those overrides become visible escapes (`\n`,
/// `\u{1b}`); everything else, any script included, is kept.
pub(super) fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if unsafe_char(c) => escaped.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escape_injection_from_cluster_text_is_printed_inert() {
        let cases = [
            ("KernelReady", "KernelReady"),
            ("naïve 日本語 ✓", "naïve 日本語 ✓"),
            ("\u{1b}]0;pwned\u{7}", "\\u{1b}]0;pwned\\u{7}"),
            (
                "\u{1b}[2J\u{1b}[Hfake prompt",
                "\\u{1b}[2J\\u{1b}[Hfake prompt",
            ),
            ("line one\nline two\r", "line one\\nline two\\r"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
            ("\u{7f}", "\\u{7f}"),
        ];
        for (text, shown) in cases {
            assert_eq!(printable(text), shown, "{text:?}");
        }
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
    }
}
