//! Citations as OpenAI's `url_citation` annotations: which spans of an answer
//! cite which documents, computed from the answer and the rollout's
//! documents alone (a pure function, shared by Chat Completions and the
//! Responses API).
//!
//! Two sources of citations, in this order:
//! 1. **Markers the answer writes**: `[n]` or `[n, m]` (1 to 3 digits), where
//!    `n` is a source number as the web UI shows it: the n-th distinct
//!    document (by backend and id) of the rollout's search results, in the
//!    order they were spliced. A marker naming a number no search returned is
//!    left alone. Each number of a marker is one annotation spanning the
//!    whole marker.
//! 2. **Otherwise, the documents that contain the answer**: when the answer
//!    has no usable marker, every document (search results and pages read)
//!    whose title or text contains the whole answer, compared after the
//!    normalisation EM uses (SQuAD's: lower case, no punctuation or
//!    articles; [`crate::eval::metrics::contains_answer`]), is cited over
//!    the whole answer, at most [`MAX_SUPPORTING`] of them in rollout order.
//!    Short answers, the policies' norm ("1632", "Leonardo da Vinci"), are
//!    what this finds; a long answer that no document holds word for word
//!    gets no annotation rather than a guessed one.
//!
//! Indices are in Unicode scalar values (Python `str` indices, as OpenAI's
//! API counts them): `start_index` is the first cited character,
//! `end_index` one past the last.
//!
//! The URL of a document is its own `url` when the backend gave one, else
//! `seeker://BACKEND/ID` with the id percent-encoded (stable for a corpus:
//! the same id names the same passage in `/retrieve` and page reads).

use std::collections::HashSet;

use rmcp::schemars;
use serde::{Deserialize, Serialize};

use crate::rollout::RolloutOutcome;
use crate::search::Document;

/// Most documents cited for an answer that carries no marker.
pub const MAX_SUPPORTING: usize = 3;

/// One citation: a span of the answer and the document it cites. The Chat
/// Completions shape nests it (`{"type": "url_citation", "url_citation":
/// {…}}`); the Responses API's is flat (`{"type": "url_citation", …}`).
#[derive(
    Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema, schemars::JsonSchema,
)]
pub struct UrlCitation {
    /// First cited character (Unicode scalar index into the answer).
    pub start_index: usize,
    /// One past the last cited character.
    pub end_index: usize,
    /// The document's title.
    pub title: String,
    /// The document's URL, or `seeker://BACKEND/ID` for a corpus passage.
    pub url: String,
}

/// The URL a citation gives for `doc`: its own, or `seeker://BACKEND/ID`.
pub fn document_url(doc: &Document) -> String {
    match &doc.url {
        Some(url) if !url.is_empty() => url.clone(),
        _ => format!("seeker://{}/{}", encode(&doc.backend), encode(&doc.id)),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The documents `[n]` markers refer to: the distinct search-result
/// documents of the rollout, in splice order (`sources[n - 1]` is source n).
pub fn numbered_sources(outcome: &RolloutOutcome) -> Vec<&Document> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for round in &outcome.rounds {
        for record in &round.results {
            for doc in &record.documents {
                if seen.insert((doc.backend.as_str(), doc.id.as_str())) {
                    out.push(doc);
                }
            }
        }
    }
    out
}

/// The citations of `outcome`'s answer (see the module documentation), in
/// the order of their spans.
pub fn annotate(outcome: &RolloutOutcome) -> Vec<UrlCitation> {
    let sources = numbered_sources(outcome);
    let marked = from_markers(&outcome.answer, &sources);
    if !marked.is_empty() {
        return marked;
    }
    supporting(&outcome.answer, &outcome.documents)
}

/// Citations from `[n]` / `[n, m]` markers.
fn from_markers(answer: &str, sources: &[&Document]) -> Vec<UrlCitation> {
    let chars: Vec<(usize, char)> = answer.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1 != '[' {
            i += 1;
            continue;
        }
        let Some((numbers, end)) = marker_at(&chars, i) else {
            i += 1;
            continue;
        };
        if numbers.iter().all(|&n| n >= 1 && n <= sources.len()) {
            for n in numbers {
                let doc = sources[n - 1];
                out.push(UrlCitation {
                    start_index: i,
                    end_index: end,
                    title: doc.title.clone(),
                    url: document_url(doc),
                });
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// The numbers of a marker `[n(, m)*]` starting at `chars[start]` (a `[`),
/// and the index one past its `]`.
fn marker_at(chars: &[(usize, char)], start: usize) -> Option<(Vec<usize>, usize)> {
    let mut numbers = Vec::new();
    let mut i = start + 1;
    loop {
        while chars.get(i).is_some_and(|c| c.1 == ' ') {
            i += 1;
        }
        let digits_from = i;
        while chars.get(i).is_some_and(|c| c.1.is_ascii_digit()) {
            i += 1;
        }
        let len = i - digits_from;
        if len == 0 || len > 3 {
            return None;
        }
        let n: String = chars[digits_from..i].iter().map(|c| c.1).collect();
        numbers.push(n.parse().ok()?);
        while chars.get(i).is_some_and(|c| c.1 == ' ') {
            i += 1;
        }
        match chars.get(i).map(|c| c.1) {
            Some(']') => return Some((numbers, i + 1)),
            Some(',') => i += 1,
            _ => return None,
        }
    }
}

/// Citations over the whole answer for the documents that contain it.
fn supporting(answer: &str, documents: &[Document]) -> Vec<UrlCitation> {
    let trimmed = answer.trim();
    if trimmed.is_empty() {
        return Vec::new();
    }
    // The span is the answer without surrounding whitespace.
    let lead = answer.len() - answer.trim_start().len();
    let start_index = answer[..lead].chars().count();
    let end_index = start_index + trimmed.chars().count();
    let golds = [trimmed.to_string()];
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for doc in documents {
        if out.len() == MAX_SUPPORTING {
            break;
        }
        if !seen.insert((doc.backend.as_str(), doc.id.as_str())) {
            continue;
        }
        let holds = crate::eval::metrics::contains_answer(&doc.text, &golds)
            || crate::eval::metrics::contains_answer(&doc.title, &golds);
        if holds {
            out.push(UrlCitation {
                start_index,
                end_index,
                title: doc.title.clone(),
                url: document_url(doc),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{FinishReason, QueryRecord, RolloutUsage, RoundOutcome, RoundRecord};

    fn doc(backend: &str, id: &str, title: &str, text: &str, url: Option<&str>) -> Document {
        Document {
            id: id.into(),
            title: title.into(),
            text: text.into(),
            url: url.map(str::to_string),
            score: 1.0,
            backend: backend.into(),
        }
    }

    fn outcome(answer: &str, results: Vec<Vec<Document>>, pages: Vec<Document>) -> RolloutOutcome {
        let mut documents: Vec<Document> = results.iter().flatten().cloned().collect();
        documents.extend(pages);
        let records = results
            .into_iter()
            .enumerate()
            .map(|(i, docs)| QueryRecord {
                round: 1,
                query: format!("q{i}"),
                backend: "tantivy".into(),
                documents: docs,
                error: None,
                error_kind: None,
                cached: false,
                failed_backends: Vec::new(),
            })
            .collect();
        RolloutOutcome {
            answer: answer.into(),
            finish_reason: FinishReason::Stop,
            usage: RolloutUsage::default(),
            searches: 1,
            documents,
            tool_calls: Vec::new(),
            prompt: String::new(),
            transcript: String::new(),
            rounds: vec![RoundRecord {
                round: 1,
                outcome: RoundOutcome::Search,
                queries: Vec::new(),
                notes: Vec::new(),
                results: records,
                pages: Vec::new(),
                prompt_tokens: None,
                prompt_tokens_cached: None,
                tokens_generated: 0,
            }],
            resumed: None,
        }
    }

    fn taj() -> Document {
        doc(
            "tantivy",
            "12",
            "Taj Mahal",
            "Construction began in 1632 and was completed in 1653.",
            None,
        )
    }

    fn agra() -> Document {
        doc(
            "tantivy",
            "40",
            "Agra",
            "Agra is a city on the banks of the Yamuna.",
            Some("https://example.org/agra"),
        )
    }

    #[test]
    fn markers_cite_the_numbered_sources_across_queries_without_repeats() {
        // Source 1 is Taj Mahal (twice returned, numbered once), 2 is Agra.
        let o = outcome(
            "Built from 1632 [1], in Agra [2, 1]. [7] is unknown.",
            vec![vec![taj()], vec![taj(), agra()]],
            Vec::new(),
        );
        let a = annotate(&o);
        assert_eq!(a.len(), 3);
        assert_eq!((a[0].start_index, a[0].end_index), (16, 19));
        assert_eq!(a[0].title, "Taj Mahal");
        assert_eq!(a[0].url, "seeker://tantivy/12");
        assert_eq!((a[1].start_index, a[1].end_index), (29, 35));
        assert_eq!(a[1].url, "https://example.org/agra");
        assert_eq!((a[2].start_index, a[2].end_index), (29, 35));
        assert_eq!(a[2].title, "Taj Mahal");
        let chars: Vec<char> = o.answer.chars().collect();
        let span: String = chars[29..35].iter().collect();
        assert_eq!(span, "[2, 1]");
    }

    #[test]
    fn indices_count_characters_not_bytes() {
        let o = outcome("Année 1632 — oui [1]", vec![vec![taj()]], Vec::new());
        let a = annotate(&o);
        assert_eq!((a[0].start_index, a[0].end_index), (17, 20));
    }

    #[test]
    fn without_markers_the_documents_holding_the_answer_are_cited() {
        let o = outcome(" 1632 ", vec![vec![agra(), taj()]], Vec::new());
        let a = annotate(&o);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].title, "Taj Mahal");
        assert_eq!((a[0].start_index, a[0].end_index), (1, 5));
        // Normalised like EM: case, punctuation and articles do not matter.
        let o = outcome("the Yamuna.", vec![vec![agra(), taj()]], Vec::new());
        assert_eq!(annotate(&o)[0].title, "Agra");
        // Word boundaries: "163" is not in "1632".
        let o = outcome("163", vec![vec![taj()]], Vec::new());
        assert!(annotate(&o).is_empty());
    }

    #[test]
    fn pages_read_support_an_answer_and_at_most_three_are_cited() {
        let page = doc(
            "web",
            "https://example.org/p",
            "P",
            "It opened in 1887.",
            Some("https://example.org/p"),
        );
        let o = outcome("1887", vec![vec![taj()]], vec![page]);
        assert_eq!(annotate(&o)[0].url, "https://example.org/p");
        let many: Vec<Document> = (0..5)
            .map(|i| doc("tantivy", &i.to_string(), "T", "in 1632", None))
            .collect();
        let o = outcome("1632", vec![many], Vec::new());
        assert_eq!(annotate(&o).len(), MAX_SUPPORTING);
    }

    #[test]
    fn nothing_is_guessed() {
        assert!(annotate(&outcome("", vec![vec![taj()]], Vec::new())).is_empty());
        let o = outcome(
            "It was built by Shah Jahan over twenty years.",
            vec![vec![taj()]],
            Vec::new(),
        );
        assert!(annotate(&o).is_empty());
        // Not markers: no closing bracket, too many digits, a word.
        let o = outcome("[1 and [1234] and [a]", vec![vec![taj()]], Vec::new());
        assert!(from_markers(&o.answer, &numbered_sources(&o)).is_empty());
    }

    #[test]
    fn corpus_urls_are_stable_and_encoded() {
        let d = doc("my corpus", "a/b c", "T", "", None);
        assert_eq!(document_url(&d), "seeker://my%20corpus/a%2Fb%20c");
        let d = doc("tantivy", "1", "T", "", Some(""));
        assert_eq!(document_url(&d), "seeker://tantivy/1");
    }
}
