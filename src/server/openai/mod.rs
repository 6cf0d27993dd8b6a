//! OpenAI wire types for `/v1/chat/completions` and `/v1/models`, with seeker's
//! one extension: a `seeker` object on the final message and the last chunk
//! that names the policy, counts the searches and lists the spliced documents.
//!
//! Files: `request.rs` (what a client sends: the request, messages, tools,
//! options), `response.rs` (what seeker answers: the completion, its chunks,
//! the one-value `object` types); this file holds what both the answer and
//! the Responses API share (usage, citations, the `seeker` object) and
//! `/v1/models`.

mod request;
mod response;

use serde::{Deserialize, Serialize};

pub use request::*;
pub use response::*;

use crate::rollout::RoundRecord;
use crate::search::Document;

/// Token counts: `prompt_tokens` covers the prompt and every spliced document
/// block; `completion_tokens` every token generated in every round.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// A document the answer was grounded on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Citation {
    pub id: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Search backend that returned it (`tantivy`).
    pub backend: String,
}

/// A document of a `results` event: a [`Citation`] with the passage and
/// the backend's score.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SearchHit {
    pub id: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Search backend that returned it (`tantivy`).
    pub backend: String,
    /// The backend's score (BM25 for `tantivy`, 0 where a web API gives
    /// none); higher is better.
    pub score: f32,
    /// The passage (a snippet for web backends), as spliced before the
    /// profile's formatting.
    pub text: String,
}

impl From<&Document> for SearchHit {
    fn from(doc: &Document) -> Self {
        Self {
            id: doc.id.clone(),
            title: doc.title.clone(),
            url: doc.url.clone(),
            backend: doc.backend.clone(),
            score: doc.score,
            text: doc.text.clone(),
        }
    }
}

/// seeker's extension object on the final message / last chunk.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct SeekerInfo {
    /// Policy profile that served the request.
    pub policy: String,
    /// Search calls the model made that ran a query (the question search of
    /// prefetch profiles is not counted).
    pub searches: usize,
    /// Every spliced document, in splice order.
    pub documents: Vec<Citation>,
    /// With `return_transcript`: the exact text after the prompt that the model
    /// saw, splices included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    /// With `return_transcript`: every round with its queries, documents and
    /// generated token count.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub rounds: Option<Vec<RoundRecord>>,
    /// With `continue_final_message`: the part of the continued message taken
    /// as written (its calls answered by the client's own documents, counted
    /// against the policy's `max_searches`); absent when it held none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<crate::rollout::Resumed>,
}

/// A search event, sent in a chunk of its own (`seeker.event`) with an empty
/// delta, as it happens.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SeekerEvent {
    /// A search call with its cleaned queries and what cleaning changed.
    Search {
        round: usize,
        queries: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        notes: Vec<String>,
    },
    /// The chunk's `reasoning_content` was spliced by seeker (documents, or the
    /// profile's text for no query, an invalid action or a failed search), not
    /// generated.
    Splice,
    /// A generation round (from 1) ended: its outcome (`search`, `no_query`,
    /// `answer`, `invalid_action`, `eos`, `length`, `page`, `read`), the tokens it
    /// generated, and the prompt tokens a remote engine took from its cache.
    Round {
        round: usize,
        #[schema(value_type = String)]
        outcome: crate::rollout::RoundOutcome,
        tokens_generated: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        prompt_tokens_cached: Option<usize>,
    },
    /// One query's documents, as the backend returned them (before the
    /// profile's splice format).
    Results {
        round: usize,
        query: String,
        /// The backend that answered (or failed).
        backend: String,
        documents: Vec<SearchHit>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Bounded failure label: `timeout`, `rate_limited`, `auth`, `http_status`,
        /// `connection`, `malformed`, `backend`.
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<&'static str>,
        /// Answered from this request's cache or the server's shared cache.
        cached: bool,
        /// Members of a `fallback` or `merge` backend that failed this
        /// query, in the order asked (absent when none did).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        failed_backends: Vec<crate::search::dispatch::BackendFailure>,
    },
    /// A page action: what the model asked to open and what was read
    /// (`url` after redirects, or the corpus document's id), in how many
    /// chunks; or why it was not (`error_kind`: `refused`, `disabled`,
    /// `not_found`, `unsupported`, `http_status`, `timeout`, `redirect`,
    /// `connection`, `empty`). OpenAI's Responses API calls this action
    /// `open_page`.
    OpenPage {
        round: usize,
        target: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        #[serde(skip_serializing_if = "String::is_empty")]
        title: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        source: String,
        chars: usize,
        chunks: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<&'static str>,
    },
}

/// The `seeker` field of a chunk: a search event, or the final information.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SeekerChunk {
    Event { event: SeekerEvent },
    Final(SeekerInfo),
}

impl From<&Document> for Citation {
    fn from(doc: &Document) -> Self {
        Self {
            id: doc.id.clone(),
            title: doc.title.clone(),
            url: doc.url.clone(),
            backend: doc.backend.clone(),
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    pub object: ListTag,
    pub data: Vec<ModelObject>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelObject {
    pub id: String,
    pub object: ModelTag,
    pub created: u64,
    pub owned_by: String,
    /// Policy profile used when a request names none.
    pub policy: String,
    /// Every profile a request may name in `policy`.
    pub policies: Vec<String>,
    /// Every search backend a request may name in `search.backend`.
    pub search_backends: Vec<String>,
    /// Each backend's kind by name (`tantivy`, `dense`, `hybrid`, a web
    /// provider such as `brave`, `fallback`, `merge`, a retriever protocol).
    pub search_backend_kinds: std::collections::BTreeMap<String, String>,
    /// The backend of requests that name none.
    pub default_search_backend: String,
    /// `max_tokens` of a request that sets none.
    pub max_tokens: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
}
