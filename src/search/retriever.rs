//! The Search-R1 / RAG-R1 retriever protocol (`docs/protocols.md` §1), as a client
//! backend and as wire types for seeker's own `POST /retrieve` route.
//!
//! Request: `{"queries": [str], "topk": int|null, "return_scores": bool}`.
//! Response: `{"result": [[item, ...], ...]}`, one list per query, where an item
//! is `{"document": doc, "score": float}` with scores, or `doc` itself without.
//! A `doc` is `{"id": str|int, "contents": str}` (dense e5/bge servers, where
//! `contents` is `"{title}"\n{text}`), or `{"id", "title", "text", "contents"}`
//! (BM25 servers). Both shapes and both id types are accepted.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::web::{http_client, parse_json, read_body, transport_error};
use super::{Document, SearchBackend, SearchError};

/// `POST /retrieve` request body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(example = json!({"queries": ["Mona Lisa painter"], "topk": 3, "return_scores": true}))]
pub struct RetrieveRequest {
    /// Searched at once; seeker's `/retrieve` takes at most 64.
    #[schema(max_items = 64)]
    pub queries: Vec<String>,
    /// Documents per query; `null` for the server's default (Search-R1: 3;
    /// seeker's `/retrieve` takes 1 to 50).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub topk: Option<usize>,
    /// Wrap each document as `{"document", "score"}`.
    #[serde(default)]
    pub return_scores: bool,
    /// seeker's addition: a configured search backend instead of the
    /// server's default (`tantivy`, `dense`, `hybrid`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// `POST /retrieve` response body.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RetrieveResponse {
    /// One list per query, in query order.
    pub result: Vec<Vec<RetrievedItem>>,
}

/// One retrieved item: scored (`{"document", "score"}`) or the document itself.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum RetrievedItem {
    Scored { document: WireDocument, score: f64 },
    Plain(WireDocument),
}

/// A document on the wire; see the module docs for the accepted shapes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
pub struct WireDocument {
    /// A string here; a string or an integer from other servers.
    #[serde(default, deserialize_with = "string_or_int")]
    #[schema(required = true)]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `"{title}"\n{text}` (Search-R1's corpus format).
    #[serde(default)]
    #[schema(required = true)]
    pub contents: String,
}

fn string_or_int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        S(String),
        I(i64),
        U(u64),
    }
    Ok(match Id::deserialize(d)? {
        Id::S(s) => s,
        Id::I(i) => i.to_string(),
        Id::U(u) => u.to_string(),
    })
}

impl WireDocument {
    /// The wire form of a seeker document: `contents` in Search-R1's corpus
    /// format `"{title}"\n{text}`, with `title` and `text` alongside.
    pub fn from_document(d: &Document) -> Self {
        Self {
            id: d.id.clone(),
            title: Some(d.title.clone()),
            text: Some(d.text.clone()),
            contents: format!("\"{}\"\n{}", d.title, d.text),
        }
    }

    /// A seeker document. Without `title`/`text`, they come from `contents`
    /// as Search-R1's `_passages2string` reads it: the first line is the title
    /// (its surrounding quotes removed here, since profiles add their own),
    /// the other lines are the text.
    pub fn into_document(self, score: f32) -> Document {
        let (title, text) = match (self.title, self.text) {
            (Some(title), Some(text)) => (title, text),
            (title, text) => {
                let (first, rest) = self
                    .contents
                    .split_once('\n')
                    .unwrap_or((&self.contents, ""));
                let first = first.trim();
                let unquoted = first
                    .strip_prefix('"')
                    .and_then(|t| t.strip_suffix('"'))
                    .unwrap_or(first);
                (
                    title.unwrap_or_else(|| unquoted.to_string()),
                    text.unwrap_or_else(|| rest.to_string()),
                )
            }
        };
        Document {
            id: self.id,
            title,
            text,
            url: None,
            score,
            backend: String::new(),
        }
    }
}

/// A remote retriever speaking `POST /retrieve` (Search-R1's
/// `retrieval_server.py`, RAG-R1's, or another seeker). Each query is one
/// request with `return_scores: true`, so the dispatcher's per-query deadline,
/// retries and failure isolation apply to it alone.
pub struct RetrieverBackend {
    client: reqwest::Client,
    url: String,
}

impl RetrieverBackend {
    /// `url` is the full route (`http://127.0.0.1:8000/retrieve`).
    pub fn new(url: &str) -> Self {
        Self {
            client: http_client(),
            url: url.to_string(),
        }
    }
}

#[async_trait]
impl SearchBackend for RetrieverBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let request = RetrieveRequest {
            queries: vec![query.to_string()],
            topk: Some(k),
            return_scores: true,
            backend: None,
        };
        let response = self
            .client
            .post(&self.url)
            .json(&request)
            .send()
            .await
            .map_err(transport_error)?;
        let body = read_body(response, |b| {
            // FastAPI errors: {"detail": ...}
            let v: serde_json::Value = serde_json::from_slice(b).ok()?;
            v.get("detail").map(|d| match d {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        })
        .await?;
        let parsed: RetrieveResponse = parse_json(&body)?;
        let Some(items) = parsed.result.into_iter().next() else {
            return Err(SearchError::Malformed(
                "`result` holds no list for the query".into(),
            ));
        };
        Ok(items
            .into_iter()
            .take(k)
            .map(|item| match item {
                RetrievedItem::Scored { document, score } => document.into_document(score as f32),
                RetrievedItem::Plain(document) => document.into_document(0.0),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_document_shapes_and_id_types_parse() {
        let body = br#"{"result": [[
            {"document": {"id": 17, "contents": "\"Evan Morris\"\nEvan L. Morris was a lobbyist."}, "score": 12.5},
            {"document": {"id": "d2", "title": "Paris", "text": "Capital.", "contents": "Paris Capital."}, "score": 3},
            {"id": "d3", "contents": "Only a title line"}
        ]]}"#;
        let parsed: RetrieveResponse = parse_json(body).unwrap();
        let docs: Vec<Document> = parsed.result[0]
            .iter()
            .cloned()
            .map(|i| match i {
                RetrievedItem::Scored { document, score } => document.into_document(score as f32),
                RetrievedItem::Plain(document) => document.into_document(0.0),
            })
            .collect();
        assert_eq!(docs[0].id, "17");
        assert_eq!(docs[0].title, "Evan Morris");
        assert_eq!(docs[0].text, "Evan L. Morris was a lobbyist.");
        assert_eq!(docs[0].score, 12.5);
        assert_eq!(
            (docs[1].title.as_str(), docs[1].text.as_str()),
            ("Paris", "Capital.")
        );
        assert_eq!(
            (docs[2].title.as_str(), docs[2].text.as_str()),
            ("Only a title line", "")
        );
    }

    #[test]
    fn wire_contents_round_trip_search_r1_format() {
        let d = Document {
            id: "5".into(),
            title: "Mona Lisa".into(),
            text: "A portrait.\nSecond line.".into(),
            ..Document::default()
        };
        let w = WireDocument::from_document(&d);
        assert_eq!(w.contents, "\"Mona Lisa\"\nA portrait.\nSecond line.");
        let back = WireDocument {
            title: None,
            text: None,
            ..w
        }
        .into_document(1.0);
        assert_eq!((back.title, back.text), (d.title, d.text));
    }
}
