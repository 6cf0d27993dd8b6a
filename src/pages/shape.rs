//! The shape of an HTML page — how deep and how large its element tree will
//! be — measured by one linear pass over its tags, before any parser builds
//! the tree; and a flat, tag-free text of a page too deep to parse.
//!
//! Why: the extractors ([`super::extract::html_to_text`]: `dom_smoothie`,
//! then `html2text`, both over html5ever) recurse over the tree and score
//! every node against its ancestors. 40,000 nested `<span>`s overflow a
//! thread's stack and abort the process; the time grows about with the cube
//! of the depth (measured: 1,000 nested `<div>`s 5.3 s, 2,000 47 s; issue
//! 48). A page past [`MAX_DEPTH`] or [`MAX_COST`] is therefore never handed
//! to them: its text is read by [`flat_text`] instead, which keeps every
//! word and no structure.
//!
//! The scan follows the HTML parsing rules that decide depth: void elements
//! (`<br>`, `<img>`, …) open nothing, a self-closing slash only closes inside
//! `<svg>`/`<math>` (`<div/>` opens a `div`, as browsers read it), raw-text
//! elements (`<script>`, `<style>`, …) hide their content, an end tag closes
//! the nearest open element of its name, and `<p>`, `<li>`, `<td>`, `<tr>`,
//! `<option>`, … close an open sibling of their kind. It is an estimate
//! (the parser's adoption rules for misnested formatting tags are not
//! replayed) that never walks more than a few open elements per tag.

/// Deepest element nesting handed to the extractors. Chromium's parser
/// flattens past 512 (`kMaximumHTMLParserDOMTreeDepth`); real articles
/// nest a few dozen deep. Measured: Readability reads a chain of 128 nested
/// `<div>`s in 0.02 s, 256 in 0.07 s, 400 in 0.23 s.
pub const MAX_DEPTH: usize = 256;

/// Largest sum over all elements of their depth squared handed to the
/// extractors: the time grows with it (each element is scored against its
/// ancestors). Measured (Readability, optimised build, one core of this
/// project's 2-core machine): one chain of 250 nested `<div>`s costs 5.4
/// million and reads in 0.07 s, five side by side 27 million in 0.34 s; a
/// 1.6 MB page of ordinary markup (80,000 elements six deep) costs 2.3
/// million and reads in 0.64 s. So past this bound a page would keep a core
/// busy for about half a second or more.
pub const MAX_COST: u64 = 32_000_000;

/// Most elements handed to the extractors. Their time also grows with the
/// element count alone: measured from outside on this project's 2-core
/// machine, about 45 µs an element for 690,000 `<p>`s (a 2 MB page: 30 s, past
/// the page deadline). 50,000 elements is about two seconds at that rate.
pub const MAX_ELEMENTS: usize = 50_000;

/// Formatting elements (HTML Living Standard, "the list of active formatting
/// elements"): one left open is re-created by the parser in every later
/// block, so 16 unclosed `<b>`s before 75,000 `<p>`s make 1.2 million
/// elements of 94,000 tags.
const FORMATTING: &[&str] = &[
    "a", "b", "big", "code", "em", "font", "i", "nobr", "s", "small", "strike", "strong", "tt", "u",
];

/// What the scan found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Deepest nesting of open elements seen (stops growing past
    /// [`MAX_DEPTH`]: the scan ends there).
    pub depth: usize,
    /// Elements opened, the formatting elements the parser re-creates
    /// counted (stops growing past [`MAX_ELEMENTS`]: the scan ends there).
    pub elements: usize,
    /// Sum over the elements of their depth squared.
    pub cost: u64,
}

impl Shape {
    /// Whether the extractors may parse the page: at most [`MAX_DEPTH`]
    /// deep, [`MAX_ELEMENTS`] elements and [`MAX_COST`].
    pub fn parseable(&self) -> bool {
        self.depth <= MAX_DEPTH && self.elements <= MAX_ELEMENTS && self.cost <= MAX_COST
    }
}

/// Elements without content or end tag (HTML Living Standard, "void
/// elements", plus the obsolete ones parsers still treat so).
const VOID: &[&str] = &[
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input",
    "keygen", "link", "meta", "param", "source", "track", "wbr",
];

/// Elements whose content is text up to their end tag.
const RAW_TEXT: &[&str] = &[
    "script",
    "style",
    "textarea",
    "title",
    "xmp",
    "iframe",
    "noembed",
    "noframes",
    "plaintext",
];

/// Open elements an end tag looks through for its match; past them the end
/// tag is ignored (a misnesting that deep is rare, and the bound keeps the
/// scan linear).
const END_TAG_REACH: usize = 16;

/// Group of an element with an optional end tag (HTML Living Standard,
/// "optional tags"); 0 for the others.
fn group(name: &str) -> u8 {
    match name {
        "p" => P,
        "li" => 2,
        "dt" | "dd" => 3,
        "option" => 4,
        "optgroup" => 5,
        "tr" => TR,
        "td" | "th" => TD,
        "thead" | "tbody" | "tfoot" => 8,
        "rt" | "rp" => 9,
        _ => 0,
    }
}

const P: u8 = 1;
const TR: u8 = 6;
const TD: u8 = 7;

/// The groups of open elements a start tag of `name` closes while one is the
/// current element: an open sibling of its kind, a paragraph before a block.
fn closes(name: &str) -> &'static [u8] {
    match name {
        "p" | "address" | "article" | "aside" | "blockquote" | "details" | "div" | "dl"
        | "fieldset" | "figcaption" | "figure" | "footer" | "form" | "h1" | "h2" | "h3" | "h4"
        | "h5" | "h6" | "header" | "hr" | "main" | "menu" | "nav" | "ol" | "pre" | "section"
        | "table" | "ul" => &[P],
        "li" => &[2, P],
        "dt" | "dd" => &[3, P],
        "option" => &[4],
        "optgroup" => &[4, 5],
        "tr" => &[TD, TR],
        "td" | "th" => &[TD],
        "thead" | "tbody" | "tfoot" => &[TD, TR, 8],
        "rt" | "rp" => &[9],
        _ => &[],
    }
}

/// One tag of the page.
enum Tag<'a> {
    Start {
        name: &'a str,
        self_closing: bool,
    },
    End {
        name: &'a str,
    },
    /// A comment, doctype or processing instruction.
    Other,
}

/// The tags of `html` in order, each with the text before it; the content of
/// a raw-text element is the text before its end tag.
struct Tags<'a> {
    html: &'a str,
    at: usize,
    /// The raw-text element just opened, whose content comes next.
    raw: Option<&'static str>,
}

impl<'a> Tags<'a> {
    fn new(html: &'a str) -> Self {
        Self {
            html,
            at: 0,
            raw: None,
        }
    }

    /// The next tag and the byte range of the text before it; `None` when
    /// no tag is left (the rest, from where the call started, is text).
    fn next_tag(&mut self) -> Option<(std::ops::Range<usize>, Tag<'a>)> {
        let bytes = self.html.as_bytes();
        let text_start = self.at;
        if let Some(raw) = self.raw.take() {
            // The content runs to `</raw` (any case), read below as an end tag.
            self.at = find_end_tag(&bytes[text_start..], raw.as_bytes())
                .map_or(bytes.len(), |i| text_start + i);
        }
        loop {
            let lt = memchr(b'<', &bytes[self.at..])? + self.at;
            let rest = &bytes[lt + 1..];
            if rest.starts_with(b"!--") {
                self.at = find(&bytes[lt + 4..], b"-->").map_or(bytes.len(), |i| lt + 4 + i + 3);
                return Some((text_start..lt, Tag::Other));
            }
            if rest.first().is_some_and(|&c| c == b'!' || c == b'?') {
                self.at = memchr(b'>', rest).map_or(bytes.len(), |i| lt + 1 + i + 1);
                return Some((text_start..lt, Tag::Other));
            }
            let (end, name_at) = match rest.first() {
                Some(b'/') => (true, lt + 2),
                Some(c) if c.is_ascii_alphabetic() => (false, lt + 1),
                _ => {
                    // A lone `<` is text.
                    self.at = lt + 1;
                    continue;
                }
            };
            let name_len = bytes[name_at..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'-' || **c == b':')
                .count();
            let name = &self.html[name_at..name_at + name_len];
            let (close, self_closing) = tag_end(bytes, name_at + name_len);
            self.at = close;
            let tag = if name.is_empty() {
                Tag::Other
            } else if end {
                Tag::End { name }
            } else {
                if let Some(raw) = RAW_TEXT.iter().find(|r| r.eq_ignore_ascii_case(name)) {
                    self.raw = Some(raw);
                }
                Tag::Start { name, self_closing }
            };
            return Some((text_start..lt, tag));
        }
    }
}

/// The end of a tag whose attributes start at `from` (just past its `>`),
/// quotes respected; whether it ends `/>`.
fn tag_end(bytes: &[u8], from: usize) -> (usize, bool) {
    let mut quote = None;
    let mut i = from;
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == b'"' || c == b'\'' => quote = Some(c),
            None if c == b'>' => return (i + 1, i > from && bytes[i - 1] == b'/'),
            None => {}
        }
        i += 1;
    }
    (bytes.len(), false)
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&c| c == needle)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Where `</name` (any case) starts in `haystack`.
fn find_end_tag(haystack: &[u8], name: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = find(&haystack[from..], b"</") {
        let at = from + i;
        let rest = &haystack[at + 2..];
        if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

/// Measures `html`'s element tree; stops as soon as it is deeper than
/// [`MAX_DEPTH`] (the depth then reads `MAX_DEPTH + 1`).
pub fn measure(html: &str) -> Shape {
    let mut stack: Vec<(&str, u8)> = Vec::new();
    let mut foreign = 0usize;
    let mut shape = Shape {
        depth: 0,
        elements: 0,
        cost: 0,
    };
    // Formatting elements opened and not closed by their own end tag: the
    // parser re-creates each of them before a later element.
    let mut active = 0usize;
    let mut tags = Tags::new(html);
    while let Some((_, tag)) = tags.next_tag() {
        if shape.elements > MAX_ELEMENTS {
            return shape;
        }
        match tag {
            Tag::Start { name, self_closing } => {
                let lower = name.to_ascii_lowercase();
                if FORMATTING.contains(&lower.as_str()) {
                    active += 1;
                } else if active > 0 {
                    let depth = (stack.len() + active) as u64;
                    shape.elements += active;
                    shape.cost += active as u64 * depth * depth;
                }
                if VOID.contains(&lower.as_str()) {
                    continue;
                }
                let closed = closes(&lower);
                while stack
                    .last()
                    .is_some_and(|(_, g)| *g != 0 && closed.contains(g))
                {
                    pop(&mut stack, &mut foreign);
                }
                let is_foreign = lower == "svg" || lower == "math";
                if self_closing && (foreign > 0 || is_foreign) {
                    shape.elements += 1;
                    continue;
                }
                stack.push((name, group(&lower)));
                foreign += usize::from(is_foreign);
                let depth = stack.len();
                shape.elements += 1;
                shape.cost += (depth as u64) * (depth as u64);
                shape.depth = shape.depth.max(depth);
                if depth > MAX_DEPTH {
                    return shape;
                }
            }
            Tag::Other => {}
            Tag::End { name } => {
                if FORMATTING.iter().any(|f| f.eq_ignore_ascii_case(name)) {
                    active = active.saturating_sub(1);
                }
                let reach = stack.len().saturating_sub(END_TAG_REACH);
                if let Some(i) = stack[reach..]
                    .iter()
                    .rposition(|(open, _)| open.eq_ignore_ascii_case(name))
                {
                    while stack.len() > reach + i {
                        pop(&mut stack, &mut foreign);
                    }
                }
            }
        }
    }
    shape
}

fn pop(stack: &mut Vec<(&str, u8)>, foreign: &mut usize) {
    if let Some((name, _)) = stack.pop() {
        if name.eq_ignore_ascii_case("svg") || name.eq_ignore_ascii_case("math") {
            *foreign = foreign.saturating_sub(1);
        }
    }
}

/// Elements that start a new line in [`flat_text`].
const BLOCK: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "tr",
    "ul",
];

/// The words of `html` without its tags, in one linear pass: a line break at
/// block elements, a space between table cells, the content of `<script>`,
/// `<style>` and the other raw-text elements dropped (`<title>`'s and
/// `<textarea>`'s kept), character references decoded. For pages too deep to
/// parse ([`Shape::parseable`]).
pub fn flat_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut tags = Tags::new(html);
    // Inside a raw-text element whose content is code, not words.
    let mut dropping = false;
    loop {
        let at = tags.at;
        let Some((text, tag)) = tags.next_tag() else {
            if !dropping {
                out.push_str(&html_escape::decode_html_entities(&html[at..]));
            }
            break;
        };
        if !dropping {
            out.push_str(&html_escape::decode_html_entities(&html[text]));
        }
        dropping = false;
        let (Tag::Start { name, .. } | Tag::End { name }) = tag else {
            continue;
        };
        let start = matches!(tag, Tag::Start { .. });
        let name = name.to_ascii_lowercase();
        dropping = tags.raw.is_some_and(|r| r != "title" && r != "textarea");
        if BLOCK.contains(&name.as_str()) {
            out.push('\n');
        } else if start && (name == "td" || name == "th") {
            out.push(' ');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_markup_is_shallow() {
        let html = r#"<!DOCTYPE html><html><head><title>T</title><meta charset="utf-8">
            <script>if (a < b && "</div>") {}</script><style>p > a {}</style></head>
            <body><div class="x"><p>One<p>Two<br><img src="a.png"/><ul><li>a<li>b</ul>
            <table><tr><td>1<td>2<tr><td>3</table><!-- <div><div> --></div></body></html>"#;
        let shape = measure(html);
        // html > body > div > ul|table > tr > td (tbody is the parser's).
        assert_eq!(shape.depth, 6, "{shape:?}");
        assert!(shape.parseable());
    }

    #[test]
    fn unclosed_and_self_closed_divs_nest_as_browsers_nest_them() {
        let unclosed = "<div>x".repeat(300);
        assert_eq!(measure(&unclosed).depth, MAX_DEPTH + 1);
        assert!(!measure(&unclosed).parseable());
        // `<div/>` opens a div in HTML; inside <svg> the slash closes.
        assert_eq!(measure(&"<div/>".repeat(300)).depth, MAX_DEPTH + 1);
        let svg = format!("<svg>{}</svg>", "<g/>".repeat(1000));
        assert_eq!(measure(&svg).depth, 1);
        // Closed ones do not.
        let closed = "<div>x</div>".repeat(10_000);
        assert_eq!(measure(&closed).depth, 1);
        assert!(measure(&closed).parseable());
    }

    #[test]
    fn the_crash_page_is_refused_after_a_short_scan() {
        let page = format!("<html><body>{}", "<span>x".repeat(40_000));
        let shape = measure(&page);
        assert!(!shape.parseable(), "{shape:?}");
        assert!(shape.elements <= MAX_DEPTH + 2, "{shape:?}");
    }

    #[test]
    fn many_chains_at_the_depth_limit_are_past_the_cost_limit() {
        let chain = format!("{}x{}", "<div>".repeat(250), "</div>".repeat(250));
        assert!(measure(&chain).parseable());
        let page = chain.repeat(40);
        let shape = measure(&page);
        assert_eq!(shape.depth, 250);
        assert!(!shape.parseable(), "{shape:?}");
    }

    #[test]
    fn wide_pages_and_recreated_formatting_elements_are_counted() {
        // 690,000 paragraphs: shallow, but 30 s of extraction.
        let wide = "<p>x".repeat(690_000);
        let shape = measure(&wide);
        assert_eq!(shape.depth, 1);
        assert!(!shape.parseable(), "{shape:?}");
        assert!(shape.elements <= MAX_ELEMENTS + 2, "the scan stops early");
        // 16 unclosed <b>s re-created in each of 75,000 paragraphs.
        let open: String = (0..16).map(|i| format!("<b id={i}>")).collect();
        let page = format!("<html><body><p>{open}</p>{}", "<p><img>".repeat(75_000));
        assert!(!measure(&page).parseable());
        // Closed ones are not re-created.
        let closed: String = (0..16).map(|i| format!("<b id={i}>x</b>")).collect();
        let page = format!("<html><body><p>{closed}</p>{}", "<p><img>".repeat(20_000));
        let shape = measure(&page);
        assert!(shape.parseable(), "{shape:?}");
        assert!(shape.elements < 20_100, "{shape:?}");
    }

    #[test]
    fn flat_text_keeps_the_words_and_drops_scripts() {
        let html = "<html><head><title>Title</title><script>var x = '<p>no</p>';</script>\
                    </head><body><div><span>Tom &amp; Jerry</span><p>second&nbsp;line</p>\
                    <table><tr><td>a</td><td>b</td></tr></table></div></body></html>";
        let text = flat_text(html);
        assert!(text.contains("Tom & Jerry"), "{text:?}");
        assert!(text.contains("second\u{a0}line"), "{text:?}");
        assert!(text.contains("Title"), "{text:?}");
        assert!(!text.contains("no"), "{text:?}");
        assert!(text.contains("a b"), "{text:?}");
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert!(lines.contains(&"Tom & Jerry"), "{lines:?}");
    }

    #[test]
    fn flat_text_of_the_crash_page_is_linear_and_complete() {
        let page = format!("<html><body>{}", "<span>x".repeat(40_000));
        let text = flat_text(&page);
        assert_eq!(text.matches('x').count(), 40_000);
    }
}
