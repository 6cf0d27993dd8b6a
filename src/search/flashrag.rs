//! The FlashRAG retriever protocol as ReCall and ReSearch serve it
//! (`scripts/serving/retriever_serving.py` of Agent-RL/ReCall), as wire types
//! for seeker's own `POST /search` and `POST /batch_search`, and as a client
//! backend for such a server.
//!
//! - `POST /search {"query": str, "top_n": int = 10, "return_score": bool = false}`
//!   answers `[doc, ...]`, or `[[doc, ...], [score, ...]]` with scores (a
//!   Python tuple serialised by FastAPI).
//! - `POST /batch_search {"query": [str], "top_n", "return_score"}` answers
//!   `[[doc, ...], ...]`, one list per query, or `[[[doc, ...], ...],
//!   [[score, ...], ...]]` with scores.
//! - A `doc` is `{"id": str, "contents": str}` with `contents` =
//!   `"{title}"\n{text}` (FlashRAG's corpus format, Search-R1's too); seeker's
//!   own documents also carry `title` and `text`, which pydantic clients ignore.
//!
//! An empty query is refused (HTTP 400) by the reference server and by seeker.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::retriever::WireDocument;
use super::web::{http_client, parse_json, read_body, transport_error};
use super::{Document, SearchBackend, SearchError};

/// The reference server's default `top_n`.
pub const DEFAULT_TOP_N: usize = 10;

fn default_top_n() -> usize {
    DEFAULT_TOP_N
}

/// `POST /search` request body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(example = json!({"query": "Mona Lisa painter", "top_n": 3, "return_score": true}))]
pub struct SearchRequest {
    /// Any text but an empty one.
    pub query: String,
    /// Documents to return (seeker's routes take 1 to 50).
    #[serde(default = "default_top_n")]
    #[schema(minimum = 1, maximum = 50, default = 10)]
    pub top_n: usize,
    /// Answer `[docs, scores]` instead of `docs`.
    #[serde(default)]
    pub return_score: bool,
    /// seeker's addition: a configured search backend instead of the
    /// server's default (`tantivy`, `dense`, `hybrid`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// `POST /batch_search` request body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(example = json!({"query": ["Mona Lisa painter", "Louvre city"], "top_n": 3}))]
pub struct BatchSearchRequest {
    /// Searched at once; seeker takes at most 64, none empty.
    #[schema(max_items = 64)]
    pub query: Vec<String>,
    #[serde(default = "default_top_n")]
    #[schema(minimum = 1, maximum = 50, default = 10)]
    pub top_n: usize,
    #[serde(default)]
    pub return_score: bool,
    /// As in [`SearchRequest::backend`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// A `/search` answer: documents, or documents and their scores. Its
/// OpenAPI schema is written by hand ([`schema`]): utoipa describes a
/// two-field tuple variant as an array of objects.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum SearchResponse {
    /// `[[doc, ...], [score, ...]]` (`return_score: true`).
    Scored(Vec<WireDocument>, Vec<f64>),
    /// `[doc, ...]`.
    Plain(Vec<WireDocument>),
}

/// A `/batch_search` answer, one list per query (OpenAPI schema by hand, as
/// for [`SearchResponse`]).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum BatchSearchResponse {
    /// `[[[doc, ...], ...], [[score, ...], ...]]` (`return_score: true`).
    Scored(Vec<Vec<WireDocument>>, Vec<Vec<f64>>),
    /// `[[doc, ...], ...]`.
    Plain(Vec<Vec<WireDocument>>),
}

/// The OpenAPI schemas of the two answers: `anyOf` the scored pair (an
/// array of exactly `[docs, scores]`, as `prefixItems`) and the plain list
/// (`oneOf` would refuse `[[], []]`, which both forms of a batch can be).
mod schema {
    use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    use super::{BatchSearchResponse, SearchResponse, WireDocument};

    fn docs() -> Schema {
        ArrayBuilder::new()
            .items(Ref::from_schema_name("WireDocument"))
            .into()
    }

    fn scores() -> Schema {
        ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::Number))
            .into()
    }

    fn list_of(item: Schema) -> Schema {
        ArrayBuilder::new().items(RefOr::T(item)).into()
    }

    fn pair(docs: Schema, scores: Schema, description: &str) -> Schema {
        ArrayBuilder::new()
            .prefix_items([docs, scores])
            .min_items(Some(2))
            .max_items(Some(2))
            .description(Some(description))
            .into()
    }

    /// FlashRAG's two answer forms: the `[documents, scores]` pair with
    /// `return_score`, the documents alone without.
    fn scored_or_plain(scored: Schema, plain: Schema) -> RefOr<Schema> {
        AnyOfBuilder::new().item(scored).item(plain).into()
    }

    /// Both answers reference `WireDocument`.
    fn with_document(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((WireDocument::name().into(), WireDocument::schema()));
        <WireDocument as ToSchema>::schemas(schemas);
    }

    impl PartialSchema for SearchResponse {
        fn schema() -> RefOr<Schema> {
            let scored = pair(
                docs(),
                scores(),
                "`[[doc, ...], [score, ...]]` (`return_score: true`).",
            );
            let plain = ArrayBuilder::new()
                .items(Ref::from_schema_name("WireDocument"))
                .description(Some("`[doc, ...]`."))
                .into();
            scored_or_plain(scored, plain)
        }
    }

    impl ToSchema for SearchResponse {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            with_document(schemas);
        }
    }

    impl PartialSchema for BatchSearchResponse {
        fn schema() -> RefOr<Schema> {
            let scored = pair(
                list_of(docs()),
                list_of(scores()),
                "`[[[doc, ...], ...], [[score, ...], ...]]` (`return_score: true`).",
            );
            let plain = ArrayBuilder::new()
                .items(RefOr::T(docs()))
                .description(Some("`[[doc, ...], ...]`, one list per query."))
                .into();
            scored_or_plain(scored, plain)
        }
    }

    impl ToSchema for BatchSearchResponse {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            with_document(schemas);
        }
    }
}

impl SearchResponse {
    /// The answer for `docs` in the requested form.
    pub fn of(docs: &[Document], return_score: bool) -> Self {
        let wire = docs.iter().map(WireDocument::from_document).collect();
        if return_score {
            SearchResponse::Scored(wire, docs.iter().map(|d| f64::from(d.score)).collect())
        } else {
            SearchResponse::Plain(wire)
        }
    }

    /// seeker documents (scores 0 when the server sent none).
    pub fn into_documents(self) -> Vec<Document> {
        match self {
            SearchResponse::Scored(docs, scores) => docs
                .into_iter()
                .zip(scores.into_iter().map(Some).chain(std::iter::repeat(None)))
                .map(|(d, s)| d.into_document(s.unwrap_or(0.0) as f32))
                .collect(),
            SearchResponse::Plain(docs) => docs.into_iter().map(|d| d.into_document(0.0)).collect(),
        }
    }
}

impl BatchSearchResponse {
    /// The answer for each query's `docs` in the requested form.
    pub fn of(lists: &[Vec<Document>], return_score: bool) -> Self {
        let wire = lists
            .iter()
            .map(|docs| docs.iter().map(WireDocument::from_document).collect())
            .collect();
        if return_score {
            let scores = lists
                .iter()
                .map(|docs| docs.iter().map(|d| f64::from(d.score)).collect())
                .collect();
            BatchSearchResponse::Scored(wire, scores)
        } else {
            BatchSearchResponse::Plain(wire)
        }
    }
}

/// A FlashRAG-protocol server (ReCall's `retriever_serving.py`, or another
/// seeker) as a backend: one `POST /search` per query with `return_score:
/// true`, so each query has its own deadline, retries and failure.
pub struct FlashragBackend {
    client: reqwest::Client,
    url: String,
}

impl FlashragBackend {
    /// `url` is the full `/search` route (`http://127.0.0.1:80/search`).
    pub fn new(url: &str) -> Self {
        Self {
            client: http_client(),
            url: url.to_string(),
        }
    }
}

#[async_trait]
impl SearchBackend for FlashragBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        if query.trim().is_empty() {
            // The reference server answers 400 to an empty query.
            return Ok(Vec::new());
        }
        let request = SearchRequest {
            query: query.to_string(),
            top_n: k,
            return_score: true,
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
        let parsed: SearchResponse = parse_json(&body)?;
        let mut docs = parsed.into_documents();
        docs.truncate(k);
        Ok(docs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_answer_forms_parse_as_the_reference_server_writes_them() {
        let scored = br#"[[{"id": "3", "contents": "\"Mona Lisa\"\nA portrait."}], [12.5]]"#;
        let docs = parse_json::<SearchResponse>(scored)
            .unwrap()
            .into_documents();
        assert_eq!(
            (
                docs[0].id.as_str(),
                docs[0].title.as_str(),
                docs[0].text.as_str(),
                docs[0].score
            ),
            ("3", "Mona Lisa", "A portrait.", 12.5)
        );
        let plain = br#"[{"id": "3", "contents": "\"Mona Lisa\"\nA portrait."}]"#;
        let docs = parse_json::<SearchResponse>(plain)
            .unwrap()
            .into_documents();
        assert_eq!((docs.len(), docs[0].score), (1, 0.0));
        // An empty answer is an empty list, in both forms.
        assert!(parse_json::<SearchResponse>(b"[]")
            .unwrap()
            .into_documents()
            .is_empty());
        assert!(parse_json::<SearchResponse>(b"[[], []]")
            .unwrap()
            .into_documents()
            .is_empty());
    }

    #[test]
    fn seeker_writes_the_tuple_form_with_scores() {
        let d = Document {
            id: "7".into(),
            title: "Paris".into(),
            text: "Capital.".into(),
            score: 2.0,
            ..Document::default()
        };
        let v = serde_json::to_value(SearchResponse::of(std::slice::from_ref(&d), true)).unwrap();
        assert_eq!(v[1], serde_json::json!([2.0]));
        assert_eq!(v[0][0]["contents"], "\"Paris\"\nCapital.");
        let v = serde_json::to_value(BatchSearchResponse::of(&[vec![d], vec![]], false)).unwrap();
        assert_eq!(v[0][0]["id"], "7");
        assert_eq!(v[1], serde_json::json!([]));
    }
}
