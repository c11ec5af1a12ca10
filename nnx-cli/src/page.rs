//! The page of `nnx inspect --html`: one HTML file with its style, script and data inline, so
//! that it opens from disk with nothing fetched (its content security policy forbids any
//! request). The report goes in as JSON inside a `<script type="application/json">` element,
//! with `<`, `>` and `&` escaped so that no text from a file can close the element, and the
//! script puts every text from files on the page as text, never as markup.

use serde_json::Value;

const TEMPLATE: &str = include_str!("page/page.html");
const STYLE: &str = include_str!("page/page.css");
const SCRIPT: &str = include_str!("page/page.js");

/// The page showing `report`.
pub fn render(report: &Value) -> String {
    let data = embeddable(&report.to_string());
    TEMPLATE.replacen("/* nnx:style */", STYLE, 1).replacen("/* nnx:script */", SCRIPT, 1).replacen(
        "/* nnx:data */",
        &data,
        1,
    )
}

/// JSON text that can stand inside a `<script>` element: the characters that could end it or
/// start markup, and the line separators old parsers choke on, as `\u` escapes (valid JSON,
/// since they only occur inside strings).
fn embeddable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_text_cannot_close_the_data_element() {
        let report = serde_json::json!({ "metadata": [{ "key": "</script><script>alert(1)</script>", "value": "a & b\u{2028}" }] });
        let page = render(&report);
        assert_eq!(page.matches("</script>").count(), TEMPLATE.matches("</script>").count());
        let data = embeddable(&report.to_string());
        assert!(!data.contains('<') && !data.contains('&') && !data.contains('\u{2028}'));
        let back: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn the_template_has_each_placeholder_once() {
        for placeholder in ["/* nnx:style */", "/* nnx:script */", "/* nnx:data */"] {
            assert_eq!(TEMPLATE.matches(placeholder).count(), 1, "{placeholder}");
        }
        assert!(!SCRIPT.contains("</script") && !STYLE.contains("</style"));
    }
}
