//! Text that came from outside (a server's error body, a file's metadata, an entry's name, a
//! dependency's message) made safe to print: control characters escaped, so that a hostile
//! input cannot move the cursor, clear the screen or forge lines; and every URL in it stripped
//! of its userinfo, query and fragment, where passwords and signed tokens travel.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether printing `c` raw could act on a terminal or hide what surrounds it: C0 and C1
/// controls, DEL, and the bidirectional overrides and isolates that reorder a line.
fn is_hostile(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}

/// `text` with every control character written as `\u{..}` (tab, newline and carriage return
/// as `\t`, `\n` and `\r`). Backslashes stay as they are, so escaping twice changes nothing.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_hostile) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_hostile(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `url` without userinfo (`user:password@`), query and fragment.
pub fn redact_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

/// `message` with every URL in it redacted as [`redact_url`] does: for the messages of
/// dependencies, which embed the URL they were given, credentials and all.
pub fn redact_urls(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` just before `://`.
        let scheme_start = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(at, |(index, _)| index);
        // The URL runs to the first character a URL cannot hold unquoted.
        let end = rest[at + 3..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | ')' | ']' | ','))
            .map_or(rest.len(), |offset| at + 3 + offset);
        out.push_str(&rest[..scheme_start]);
        out.push_str(&redact_url(&rest[scheme_start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_once() {
        assert_eq!(printable("plain"), Cow::Borrowed("plain"));
        let hostile = "a\u{1b}[2J\nb\u{7f}\u{9b}c\u{202e}d";
        let escaped = printable(hostile);
        assert_eq!(escaped, "a\\u{1b}[2J\\nb\\u{7f}\\u{9b}c\\u{202e}d");
        assert_eq!(printable(&escaped), escaped, "escaping is idempotent");
    }

    #[test]
    fn urls_lose_userinfo_and_queries_inside_messages() {
        assert_eq!(redact_url("https://user:secret@host/a/b?X-Amz-Signature=abc"), "https://host/a/b");
        assert_eq!(redact_url("s3://bucket/key"), "s3://bucket/key");
        let message = "Error performing GET http://user:pass@127.0.0.1:9/x.safetensors?sig=1 in 2s, (url: https://a:b@h/p#f), s3://b/k";
        assert_eq!(
            redact_urls(message),
            "Error performing GET http://127.0.0.1:9/x.safetensors in 2s, (url: https://h/p), s3://b/k"
        );
        assert_eq!(redact_urls("no url here"), "no url here");
    }
}
