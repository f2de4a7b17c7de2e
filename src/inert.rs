//! Trace text made inert: the one rule by which every output of a trace shows the names,
//! span descriptions and thread names it holds (and the endpoint its messages, which may
//! quote a path or a writer's error).
//!
//! A trace is untrusted input, and its strings are whatever bytes the traced program (or a
//! hostile writer) put there: a span field value `\x1b]0;PWNED\x07` would retitle the
//! terminal that prints it, U+202E reverses the rest of a line, a newline forges a row of a
//! table or of folded stacks. [`inert`] shows every such character as a visible escape and
//! leaves all other text alone, so the shown name is still the name (and the one that
//! `--span` and `--inside` accept):
//!
//! - control characters (C0, DEL: `\x1b`, `\x0a`; C1: `\u{9b}`),
//! - format characters (Unicode category Cf: the bidi marks, embeddings, overrides and
//!   isolates U+200E–U+200F, U+202A–U+202E, U+2066–U+2069, zero-width characters, U+FEFF,
//!   tag characters, …) and the line and paragraph separators U+2028, U+2029: `\u{202e}`;
//! - with [`inert_bytes`], bytes that are not UTF-8: `\xff`.
//!
//! `\xNN` is thus always one byte below U+0080 or one byte of invalid UTF-8, and `\u{…}` one
//! code point. A backslash is left as it is (paths and names keep their spelling), so a name
//! holding the text `\x1b` reads like one holding ESC: a crafted trace can make two names
//! look alike, which it can as well by repeating a name. Markup (`<`, `&`) is not this
//! rule's business: HTML and SVG outputs escape it on top.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control and format character written as a visible escape: C0 and DEL as
/// `\x1b`, C1 and the format characters (bidi marks, overrides and isolates, zero-width
/// characters, U+2028/U+2029) as `\u{202e}`; borrowed when there is none.
pub fn inert(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(shown_escaped) else { return Cow::Borrowed(text) };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    push_inert(&mut out, &text[first..]);
    Cow::Owned(out)
}

/// `bytes` as [`inert`] text, each byte that is not part of valid UTF-8 written as `\xNN`.
#[cfg(feature = "analysis")]
pub fn inert_bytes(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return inert(text);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        push_inert(&mut out, chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// Append `text` to `out` with the characters of the rule escaped.
fn push_inert(out: &mut String, text: &str) {
    for c in text.chars() {
        if !shown_escaped(c) {
            out.push(c);
        } else if c < '\u{80}' {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// Whether `c` is a control character, a format character (category Cf, as of Unicode 15) or a
/// line or paragraph separator.
fn shown_escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{890}'..='\u{891}'
                | '\u{8e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0001}'
                | '\u{e0020}'..='\u{e007f}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_shown_escaped() {
        for (raw, shown) in [
            ("req{v=\x1b]0;PWNED\x07\x1b[2J}", "req{v=\\x1b]0;PWNED\\x07\\x1b[2J}"),
            ("a\rb\nc\td\0e\x7f", "a\\x0db\\x0ac\\x09d\\x00e\\x7f"),
            ("csi\u{9b}31m", "csi\\u{9b}31m"),
            ("user \u{202e}gnp.exe", "user \\u{202e}gnp.exe"),
            (
                "\u{2066}\u{2069}\u{200e}\u{200f}\u{feff}\u{2028}",
                "\\u{2066}\\u{2069}\\u{200e}\\u{200f}\\u{feff}\\u{2028}",
            ),
            ("tag\u{e0041}", "tag\\u{e0041}"),
        ] {
            assert_eq!(inert(raw), shown, "{raw:?}");
            assert_eq!(inert(shown), shown, "the shown form is left as it is");
        }
    }

    #[test]
    fn other_text_is_borrowed_unchanged() {
        for text in ["<alloc::vec::Vec<T> as Clone>::clone", "C:\\src\\x1b.rs", "データ {ü=ß} 🦀", "עברית", ""]
        {
            assert!(matches!(inert(text), Cow::Borrowed(t) if t == text), "{text}");
        }
    }

    #[test]
    #[cfg(feature = "analysis")]
    fn invalid_utf8_is_shown_byte_by_byte() {
        assert_eq!(inert_bytes(b"ok\xff\xfe-\xe2\x80\xae-\xc3"), "ok\\xff\\xfe-\\u{202e}-\\xc3");
        assert_eq!(inert_bytes(b"plain"), "plain");
    }
}
