//! Document hygiene before splicing: what a web snippet may carry that a policy
//! must never read as markup.
//!
//! Web APIs return highlighting markup (`<b>`, `<strong>`) and HTML entities in
//! titles and snippets (`docs/protocols.md` §2). [`strip_html`] removes tags and
//! comments, unescapes entities and collapses whitespace; [`truncate_chars`]
//! bounds a document. Neutralising a policy's own control tags inside document
//! text is the profile's job ([`crate::profile::Profile::neutralise`]), since
//! only the profile knows its tags.

use std::sync::LazyLock;

use regex::Regex;

/// HTML comments and tags: `<b>`, `</strong>`, `<a href="...">`, `<br/>`.
/// Text such as `a < b` or `x<3` is left alone: a tag starts with a letter.
static TAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)<!--.*?-->|</?([A-Za-z][A-Za-z0-9:-]*)(?:\s[^<>]*)?/?>").expect("valid regex")
});

/// Formatting tags that sit inside words, as search engines use them to
/// highlight matches.
const INLINE: &[&str] = &[
    "a", "abbr", "b", "code", "em", "i", "mark", "s", "small", "span", "strong", "sub", "sup", "u",
];

/// Removes HTML tags and comments, then unescapes entities (`&amp;` → `&`,
/// `&#39;` → `'`), then collapses runs of whitespace to one space and trims.
///
/// Tags are removed before entities are unescaped, so an escaped `&lt;b&gt;`
/// in a snippet stays visible as the text `<b>`.
pub fn strip_html(text: &str) -> String {
    // Inline tags vanish (`<b>Seine</b>'s` → `Seine's`); any other tag or
    // comment separates words (`a<br/>b` → `a b`).
    let without_tags = TAG.replace_all(text, |c: &regex::Captures<'_>| {
        let name = c.get(1).map_or("", |m| m.as_str()).to_ascii_lowercase();
        if INLINE.contains(&name.as_str()) {
            ""
        } else {
            " "
        }
    });
    let unescaped = html_escape::decode_html_entities(&without_tags);
    collapse_whitespace(&unescaped)
}

/// Runs of whitespace (spaces, tabs, newlines, NBSP) become one space; the
/// ends are trimmed.
pub fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to at most `max_chars` characters (Unicode scalar values), at the
/// last whitespace before the limit when there is one in the last fifth, so a
/// word is not cut in half. `max_chars == 0` keeps everything.
pub fn truncate_chars(text: &str, max_chars: usize) -> &str {
    if max_chars == 0 {
        return text;
    }
    let Some((cut, _)) = text.char_indices().nth(max_chars) else {
        return text;
    };
    let head = &text[..cut];
    match head.rfind(char::is_whitespace) {
        Some(space) if head[..space].chars().count() >= max_chars * 4 / 5 => {
            head[..space].trim_end()
        }
        _ => head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_entities_become_plain_text() {
        assert_eq!(
            strip_html("<b>Paris</b> &amp; the   <strong>Seine</strong>&#39;s\n banks"),
            "Paris & the Seine's banks"
        );
        assert_eq!(strip_html("a <!-- hidden --> b<br/>c"), "a b c");
        assert_eq!(strip_html(r#"<a href="x">link</a>"#), "link");
        // Not tags: comparisons and escaped markup stay as text.
        assert_eq!(strip_html("1 < 2 and x<3"), "1 < 2 and x<3");
        assert_eq!(strip_html("&lt;b&gt;bold&lt;/b&gt;"), "<b>bold</b>");
        assert_eq!(strip_html("caf&eacute; &nbsp;x"), "café x");
    }

    #[test]
    fn truncation_counts_characters_and_prefers_a_word_boundary() {
        assert_eq!(truncate_chars("hello world", 0), "hello world");
        assert_eq!(truncate_chars("hello world", 11), "hello world");
        assert_eq!(truncate_chars("hello world", 10), "hello worl");
        assert_eq!(
            truncate_chars("one two three four five", 20),
            "one two three four"
        );
        // Multi-byte characters are never split.
        assert_eq!(truncate_chars("ééééé", 3), "ééé");
        assert_eq!(truncate_chars("日本語のテキスト", 4), "日本語の");
    }
}
