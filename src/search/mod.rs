//! Search backends and the dispatcher that sends a round's queries to them.
//!
//! A [`SearchBackend`] answers one query with its top-k documents or a typed
//! [`SearchError`]. The [`dispatch::Dispatcher`] owns every configured backend
//! and runs all queries of a round at once, under per-backend concurrency and
//! rate limits, with retries, deadlines, a shared cache and document hygiene
//! ([`clean`]). Backends: the local tantivy index ([`bm25`]), Bing Web Search v7
//! and SearXNG ([`web`]), and Search-R1's `POST /retrieve` protocol
//! ([`retriever`]).

pub mod bm25;
pub mod clean;
pub mod dispatch;
pub mod retriever;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use crate::config::{BackendKind, SearchConfig};
use dispatch::{BackendLimits, DispatchConfig, Dispatcher};

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
    /// `timeout`, `rate_limited`, `http_status`, `connection`, `malformed`,
    /// `unknown_backend`.
    pub fn kind(&self) -> &'static str {
        match self {
            SearchError::Backend(_) => "backend",
            SearchError::Timeout(_) => "timeout",
            SearchError::RateLimited { .. } => "rate_limited",
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

    /// The wait the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            SearchError::RateLimited { retry_after } => *retry_after,
            _ => None,
        }
    }
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

/// The dispatcher for a `[search]` config: the built-in `tantivy` index plus
/// every `[search.backends.NAME]`, with `search.default` as the default.
/// `env` looks up API keys by the variable names the config gives.
///
/// # Errors
/// An index that does not open, or a Bing backend whose key variable is unset
/// (named in the message; the key itself never is).
pub fn dispatcher_from_config(
    config: &SearchConfig,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Dispatcher> {
    let mut d = Dispatcher::new(DispatchConfig {
        round_timeout: Duration::from_millis(config.round_timeout_ms),
        query_timeout: Duration::from_millis(config.query_timeout_ms),
        cache_ttl: Duration::from_secs(config.cache_ttl_s),
        cache_capacity: config.cache_capacity,
        max_document_chars: config.max_document_chars,
    });
    let open = |path: &std::path::Path| -> anyhow::Result<Arc<dyn SearchBackend>> {
        let index = bm25::Bm25Index::open(path)?;
        tracing::info!(index = %path.display(), documents = index.num_docs(), "search index ready");
        Ok(Arc::new(bm25::Bm25Backend::new(Arc::new(index))))
    };
    let local = BackendLimits {
        concurrency: std::thread::available_parallelism().map_or(2, |n| n.get()),
        retries: 0,
        ..BackendLimits::default()
    };
    let built_in = open(&config.index).map_err(|e| anyhow::anyhow!("search.index: {e}"))?;
    d.add("tantivy", built_in, local.clone());
    for (name, b) in &config.backends {
        let url = b.url.clone().unwrap_or_default();
        let limits = BackendLimits {
            concurrency: b.concurrency,
            requests_per_second: b.requests_per_second,
            retries: b.retries,
            strip_html: matches!(b.kind, BackendKind::Bing | BackendKind::Searxng),
        };
        let backend: Arc<dyn SearchBackend> = match b.kind {
            BackendKind::Tantivy => {
                let index = b
                    .index
                    .as_deref()
                    .expect("validated: tantivy backends have an index");
                open(index)?
            }
            BackendKind::Bing => {
                let var = b.api_key_env.as_deref().unwrap_or("BING_SEARCH_KEY");
                let key = env(var).filter(|k| !k.is_empty()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "search.backends.{name}: the Bing API key variable {var} is not set"
                    )
                })?;
                let market = b.market.as_deref().unwrap_or("en-US");
                Arc::new(
                    web::BingBackend::new(&url, &key, market)
                        .map_err(|e| anyhow::anyhow!("search.backends.{name}: {e}"))?,
                )
            }
            BackendKind::Searxng => Arc::new(web::SearxngBackend::new(&url)),
            BackendKind::Retriever => Arc::new(retriever::RetrieverBackend::new(&url)),
        };
        tracing::info!(backend = %name, kind = ?b.kind, url = %url, "search backend configured");
        d.add(name, backend, limits);
    }
    d.set_default(&config.default)
        .map_err(|e| anyhow::anyhow!("search.default: {e}"))?;
    Ok(d)
}
