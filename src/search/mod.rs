//! Search backends: where a round's queries go.
//!
//! A [`SearchBackend`] answers a batch of queries, one result list (or one typed
//! failure) per query, in query order. The only backend so far is the local
//! tantivy BM25 index ([`bm25`]); web and remote-retriever backends plug in
//! behind the same trait.

pub mod bm25;

use async_trait::async_trait;
use serde::Serialize;

/// One retrieved document, as spliced into the transcript and shown to clients.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Document {
    /// Backend-specific id (the corpus line's `id` for the local index).
    pub id: String,
    /// Title without decoration (profiles add quotes where a policy expects them).
    pub title: String,
    /// Passage text.
    pub text: String,
    /// Source URL when the backend knows one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Backend score (BM25 for the local index); higher is better.
    pub score: f32,
    /// Name of the backend that returned it (`tantivy`), for citations.
    pub backend: String,
}

/// Why one query failed. The other queries of a round are unaffected.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    /// The backend itself failed (I/O, a corrupt index, a worker that panicked).
    #[error("search backend failed: {0}")]
    Backend(String),
}

/// A search backend: `search(queries, k)` → one result per query, in order.
#[async_trait]
pub trait SearchBackend: Send + Sync {
    /// Name used in logs, traces and citations (`tantivy`).
    fn name(&self) -> &str;

    /// Searches every query (concurrently where the backend can) for its top
    /// `k` documents, best first. Never fails as a whole: a failure is per query.
    async fn search(&self, queries: &[String], k: usize)
        -> Vec<Result<Vec<Document>, SearchError>>;
}
