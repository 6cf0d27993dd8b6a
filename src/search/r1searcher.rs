//! R1-Searcher's local retriever protocol (RUCAIBox/R1-Searcher,
//! `train/wiki_corpus_load.py`: a Flask app over a FAISS index of corpus
//! lines), as wire types for seeker's own `POST /queries` and as a client
//! backend.
//!
//! `POST /queries {"queries": [str], "k": int = 3}` answers
//! `{"queries": [str], "answers": [[str, ...], ...]}`: per query, its top-k
//! corpus lines as plain strings, which R1-Searcher's rollout splices as
//! they are. seeker writes each document as `"{title}"\n{text}` (the
//! `contents` of its other retriever routes) and reads a line without a
//! newline as text without a title.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::retriever::WireDocument;
use super::web::{http_client, parse_json, read_body, transport_error};
use super::{Document, SearchBackend, SearchError};

/// The reference server's default `k`.
pub const DEFAULT_K: usize = 3;

fn default_k() -> usize {
    DEFAULT_K
}

/// `POST /queries` request body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(example = json!({"queries": ["Mona Lisa painter"], "k": 3}))]
pub struct QueriesRequest {
    /// Searched at once; seeker takes at most 64.
    #[schema(max_items = 64)]
    pub queries: Vec<String>,
    /// Documents per query (seeker takes 1 to 50).
    #[serde(default = "default_k")]
    #[schema(minimum = 1, maximum = 50, default = 3)]
    pub k: usize,
    /// seeker's addition: a configured search backend instead of the
    /// server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// `POST /queries` response body.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct QueriesResponse {
    /// The request's queries, echoed.
    #[serde(default)]
    pub queries: Vec<String>,
    /// Per query, its documents as strings.
    pub answers: Vec<Vec<String>>,
    /// seeker's addition, present when a query failed: per query, its error
    /// message or `null` (that query's `answers` entry is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<Option<String>>>,
}

/// A document as one answer string: `"{title}"\n{text}`.
pub fn answer_of(d: &Document) -> String {
    WireDocument::from_document(d).contents
}

/// A seeker document from an answer string: `"{title}"\n{text}` (or any first
/// line as the title) when it has a newline, else the whole string as text.
/// The protocol has no ids: the id is `r1-` and the first 16 hex digits of
/// the string's sha256, so the same passage has the same id in every query.
pub fn document_of(answer: String) -> Document {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(answer.as_bytes());
    let id = format!(
        "r1-{}",
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    if answer.contains('\n') {
        WireDocument {
            id,
            contents: answer,
            ..WireDocument::default()
        }
        .into_document(0.0)
    } else {
        Document {
            id,
            text: answer,
            ..Document::default()
        }
    }
}

/// An R1-Searcher-protocol server as a backend: one `POST /queries` per query.
/// Its answers carry no ids or scores: ids come from the text
/// ([`document_of`]) and every score is 0.
pub struct R1SearcherBackend {
    client: reqwest::Client,
    url: String,
}

impl R1SearcherBackend {
    /// `url` is the full `/queries` route.
    pub fn new(url: &str) -> Self {
        Self {
            client: http_client(),
            url: url.to_string(),
        }
    }
}

#[async_trait]
impl SearchBackend for R1SearcherBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let request = QueriesRequest {
            queries: vec![query.to_string()],
            k,
            backend: None,
        };
        let response = self
            .client
            .post(&self.url)
            .json(&request)
            .send()
            .await
            .map_err(transport_error)?;
        // Flask's errors are HTML pages; the status says enough.
        let body = read_body(response, |_| None).await?;
        let parsed: QueriesResponse = parse_json(&body)?;
        let Some(answers) = parsed.answers.into_iter().next() else {
            return Err(SearchError::Malformed(
                "`answers` holds no list for the query".into(),
            ));
        };
        Ok(answers.into_iter().take(k).map(document_of).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_plain_lines_are_text() {
        let d = Document {
            id: "5".into(),
            title: "Mona Lisa".into(),
            text: "A portrait.".into(),
            ..Document::default()
        };
        let back = document_of(answer_of(&d));
        assert_eq!(
            (back.title.as_str(), back.text.as_str()),
            ("Mona Lisa", "A portrait.")
        );
        let line = document_of("Mona Lisa   A portrait by Leonardo.".into());
        assert_eq!(line.title, "");
        assert!(
            line.id.starts_with("r1-") && line.id.len() == 19,
            "{}",
            line.id
        );
        assert_eq!(line.id, document_of(line.text.clone()).id, "stable");
        assert_ne!(line.id, back.id);
        assert_eq!(line.text, "Mona Lisa   A portrait by Leonardo.");
    }

    #[test]
    fn the_reference_answer_parses() {
        let body = br#"{"queries": ["q"], "answers": [["line one", "line two"]]}"#;
        let r: QueriesResponse = parse_json(body).unwrap();
        assert_eq!(r.answers[0].len(), 2);
        assert!(r.errors.is_none());
    }
}
