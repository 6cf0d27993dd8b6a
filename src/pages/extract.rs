//! An HTML page's title and readable text: Mozilla Readability's article
//! (`dom_smoothie`), or the whole page as text (`html2text`) when it finds
//! none; a page too deep or too large for its depth to parse
//! ([`super::shape`]) is read as flat text instead.

/// The title and readable text of an HTML page: Readability's article, or
/// the whole page as text when Readability finds none. A page nested too
/// deep or too large for its depth to parse safely ([`super::shape`]) gives
/// its words without structure and no title.
pub fn html_to_text(html: &str, url: &str) -> (String, String) {
    let (title, text, _) = extract(html, url);
    (title, text)
}

/// [`html_to_text`], and whether the page was read as flat text.
pub(super) fn extract(html: &str, url: &str) -> (String, String, bool) {
    let shape = super::shape::measure(html);
    if !shape.parseable() {
        tracing::info!(
            depth = shape.depth,
            elements = shape.elements,
            cost = shape.cost,
            "page too deep or too large to parse: read as flat text"
        );
        return (
            String::new(),
            tidy_text(&super::shape::flat_text(html)),
            true,
        );
    }
    let config = dom_smoothie::Config {
        text_mode: dom_smoothie::TextMode::Formatted,
        ..Default::default()
    };
    let base = (!url.is_empty()).then_some(url);
    if let Ok(mut readability) = dom_smoothie::Readability::new(html, base, Some(config)) {
        if let Ok(article) = readability.parse() {
            let text = tidy_text(&article.text_content);
            if !text.is_empty() {
                return (article.title.trim().to_string(), text, false);
            }
        }
    }
    let text = html2text::from_read(html.as_bytes(), 100_000).unwrap_or_default();
    (String::new(), tidy_text(&text), false)
}

/// Trailing spaces removed, runs of blank lines made one, trimmed.
fn tidy_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readability_keeps_the_article_and_drops_the_menu() {
        let html = r#"<html><head><title>Taj Mahal - Wiki</title></head><body>
            <nav><ul><li><a href="/">Home</a></li><li><a href="/x">Menu item</a></li></ul></nav>
            <article><h1>Taj Mahal</h1>
            <p>The Taj Mahal is an ivory-white marble mausoleum on the right bank of the river
            Yamuna in Agra, India. It was commissioned in 1631 by the fifth Mughal emperor,
            Shah Jahan, to house the tomb of his beloved wife, Mumtaz Mahal.</p>
            <p>Construction of the mausoleum was essentially completed in 1643, but work
            continued on other phases of the project for another ten years.</p></article>
            <footer>Copyright footer text</footer></body></html>"#;
        let (title, text) = html_to_text(html, "");
        assert!(title.contains("Taj Mahal"), "{title}");
        assert!(text.contains("commissioned in 1631"), "{text}");
        assert!(text.contains("completed in 1643"), "{text}");
        assert!(!text.contains("Menu item"), "{text}");
        assert!(!text.contains("Copyright footer"), "{text}");
    }

    #[test]
    fn tidy_text_collapses_blank_lines() {
        assert_eq!(tidy_text("a  \n\n\n\nb\nc\n\n"), "a\n\nb\nc");
    }
}
