//! Search backends and the dispatcher that sends a round's queries to them.
//!
//! A [`SearchBackend`] answers one query with its top-k documents or a typed
//! [`SearchError`]. The [`dispatch::Dispatcher`] owns every configured backend
//! and runs all queries of a round at once, under per-backend concurrency and
//! rate limits, with retries, deadlines, a shared cache and document hygiene
//! ([`clean`]). Backends: the local tantivy index ([`bm25`]), Bing Web Search v7
//! and SearXNG ([`web`]), Search-R1's `POST /retrieve` protocol
//! ([`retriever`]), and in-process dense and hybrid retrieval over the local
//! index ([`dense`], [`hybrid`], with the sentence encoder of [`embed`]).
//! [`dispatcher_from_config`] wires them from `[search]`.

pub mod bm25;
pub mod clean;
pub mod dense;
mod dense_build;
pub mod dispatch;
pub mod embed;
pub mod flashrag;
pub mod hybrid;
pub mod r1searcher;
pub mod retriever;
mod setup;
pub mod signbits;
pub mod web;

pub use setup::dispatcher_from_config;

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

/// One retrieved document, as spliced into the transcript and shown to clients.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Document {
    /// Backend-specific id (the corpus line's `id` for the local index, the URL
    /// for web backends).
    pub id: String,
    /// Title without decoration (profiles add quotes where a policy expects them).
    pub title: String,
    /// Passage text (a snippet for web backends).
    pub text: String,
    /// Source URL when the backend knows one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Backend score (BM25 for the local index, the retriever's score, 0 for
    /// web backends that give none); higher is better.
    pub score: f32,
    /// Name of the configured backend that returned it, for citations.
    pub backend: String,
}

/// Why one query failed. The other queries of a round are unaffected; the
/// profile's `failed` text is spliced with this error's message as `{reason}`.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    /// The backend itself failed (I/O, a corrupt index, a worker that panicked).
    #[error("search backend failed: {0}")]
    Backend(String),
    /// The query's deadline (or the round's) passed first.
    #[error("search timed out after {} ms", .0.as_millis())]
    Timeout(Duration),
    /// HTTP 429; `retry_after` from the `Retry-After` header when given.
    #[error("rate limited by the search provider{}", retry_after_text(.retry_after))]
    RateLimited {
        /// How long the provider asked us to wait.
        retry_after: Option<Duration>,
    },
    /// The provider refused the API key (401 or 403, or the provider's own
    /// code for a bad key), with its message (never the key). Not retried:
    /// the same key fails again.
    #[error("search provider refused the API key: {0}")]
    Auth(String),
    /// The provider's quota or credits are spent (Tavily 432/433, Serper's
    /// "Not enough credits", Exa 402, Google's daily limit): counted as
    /// `rate_limited`, but not retried, since waiting a second does not help.
    #[error("search provider quota exhausted: {0}")]
    Quota(String),
    /// Any other non-success HTTP status, with the provider's own message
    /// (never the request's credentials).
    #[error("search provider answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    /// The provider could not be reached (connect, reset, TLS, ...).
    #[error("search provider unreachable: {0}")]
    Connection(String),
    /// The provider answered, but not in the documented shape (malformed JSON,
    /// an empty body, a body over the size limit).
    #[error("search provider answered malformed data: {0}")]
    Malformed(String),
    /// The request named a backend that is not configured.
    #[error("unknown search backend `{0}`")]
    UnknownBackend(String),
}

fn retry_after_text(d: &Option<Duration>) -> String {
    match d {
        Some(d) => format!(" (retry after {} s)", d.as_secs_f64()),
        None => String::new(),
    }
}

impl SearchError {
    /// A short, bounded label for logs, traces and metrics: `backend`,
    /// `timeout`, `rate_limited` (429 or a spent quota), `auth`,
    /// `http_status`, `connection`, `malformed`, `unknown_backend`.
    pub fn kind(&self) -> &'static str {
        match self {
            SearchError::Backend(_) => "backend",
            SearchError::Timeout(_) => "timeout",
            SearchError::RateLimited { .. } | SearchError::Quota(_) => "rate_limited",
            SearchError::Auth(_) => "auth",
            SearchError::Status { .. } => "http_status",
            SearchError::Connection(_) => "connection",
            SearchError::Malformed(_) => "malformed",
            SearchError::UnknownBackend(_) => "unknown_backend",
        }
    }

    /// Whether trying again may help: 429, 5xx and connection errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            SearchError::RateLimited { .. } | SearchError::Connection(_) => true,
            SearchError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// This error with every occurrence of `secret` (an API key) in its
    /// message, as written or URL-encoded, written as `[redacted]`
    /// ([`redact_secret`]): a provider may quote the key it refused, or the
    /// URL that carried it.
    #[must_use]
    pub fn redact(self, secret: &str) -> Self {
        let r = |m: String| redact_secret(m, secret);
        match self {
            SearchError::Backend(m) => SearchError::Backend(r(m)),
            SearchError::Auth(m) => SearchError::Auth(r(m)),
            SearchError::Quota(m) => SearchError::Quota(r(m)),
            SearchError::Status { status, message } => SearchError::Status {
                status,
                message: r(message),
            },
            SearchError::Connection(m) => SearchError::Connection(r(m)),
            SearchError::Malformed(m) => SearchError::Malformed(r(m)),
            other => other,
        }
    }

    /// The wait the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            SearchError::RateLimited { retry_after } => *retry_after,
            _ => None,
        }
    }
}

/// `text` with every occurrence of `secret`, as written and as a URL's
/// query encodes it (`a+b/c` → `a%2Bb%2Fc`), written as `[redacted]`. An
/// empty secret changes nothing; providers' keys shorter than 8 characters
/// are refused at start (`search::setup`), so no short word is replaced.
pub fn redact_secret(text: String, secret: &str) -> String {
    if secret.is_empty() {
        return text;
    }
    let mut text = text.replace(secret, "[redacted]");
    let encoded: String = reqwest::Url::parse_with_params("http://x/", [("k", secret)])
        .ok()
        .and_then(|u| u.query().map(|q| q.trim_start_matches("k=").to_string()))
        .unwrap_or_default();
    if !encoded.is_empty() && encoded != secret {
        text = text.replace(&encoded, "[redacted]");
    }
    text
}

/// A search backend: one query → its top `k` documents, best first.
///
/// Implementations do no retries, limits, caching or clean-up of their own:
/// the [`dispatch::Dispatcher`] does that for every backend alike. A returned
/// future may be dropped at any time (deadline, client gone); dropping it must
/// abandon the work (an HTTP request is closed).
#[async_trait]
pub trait SearchBackend: Send + Sync {
    /// Searches `query` for its top `k` documents.
    ///
    /// # Errors
    /// A [`SearchError`] for this query only.
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_redacted_as_written_and_url_encoded() {
        let key = "ab+cd/ef=gh12&x";
        let text = format!("bad key {key} in GET /v1?key=ab%2Bcd%2Fef%3Dgh12%26x&q=1");
        let out = redact_secret(text, key);
        assert_eq!(out, "bad key [redacted] in GET /v1?key=[redacted]&q=1");
        assert_eq!(redact_secret("nothing".into(), ""), "nothing");
        let e = SearchError::Auth(format!("token {key} refused")).redact(key);
        assert_eq!(
            e.to_string(),
            "search provider refused the API key: token [redacted] refused"
        );
    }
}
