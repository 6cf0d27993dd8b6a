//! The dispatcher: every query of a round at once, to the backend the request
//! chose, under limits shared by all requests.
//!
//! For each query of a round, concurrently:
//! 1. the shared cache (moka, TTL and size bound) answers repeats across
//!    requests; concurrent misses of the same key are searched once;
//! 2. otherwise the query waits for a slot of its backend (a semaphore: at most
//!    `concurrency` calls in flight, shared by all requests) and for its
//!    requests-per-second budget (a GCRA limiter, `governor`);
//! 3. 429, 5xx and connection errors are retried up to `retries` times, after
//!    the provider's `Retry-After` or a jittered exponential backoff (100 ms ×
//!    2^attempt, full jitter), never past the deadline;
//! 4. documents are cleaned ([`super::clean`]) and bounded;
//! 5. the whole query has a deadline (`query_timeout`) inside the round's
//!    (`round_timeout`); a late query fails with [`SearchError::Timeout`].
//!
//! Results come back in query order, one per query; a failure is that query's
//! alone. Dropping the round's future drops every in-flight backend call.
//!
//! A backend may also be a list of others ([`ListMode`]): a `fallback` asks
//! its members in order, each within an equal share of what is left of the
//! query's deadline, until one answers; a `merge` asks them all at once and
//! fuses their lists by reciprocal rank (k = 60, Cormack et al., SIGIR 2009),
//! one document per normalised URL. Each member call goes through that
//! member's own cache, limits and retries; a member's failure is counted
//! under its own name and reported with the query's result
//! ([`QueryResult::failed_backends`]).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use unicode_normalization::UnicodeNormalization;

use super::clean::{collapse_whitespace, strip_html, truncate_chars};
use super::{Document, SearchBackend, SearchError};
use crate::metrics::Metrics;
use crate::pages::PageReader;

mod lists;
pub use lists::{fuse, normalise_url, BackendFailure, ListMode, MERGE_RRF_K};

/// First retry delay before jitter; doubles per attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest backoff between two attempts, before jitter.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Settings shared by all backends (`[search]` in `config/seeker.toml`).
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Deadline for a whole round, from its start (default 10 s).
    pub round_timeout: Duration,
    /// Deadline for one query, retries included (default 5 s).
    pub query_timeout: Duration,
    /// How long a cached result is served (default 600 s); zero disables the
    /// shared cache.
    pub cache_ttl: Duration,
    /// Result lists kept in the shared cache (default 10,000).
    pub cache_capacity: u64,
    /// Bytes the shared cache may hold, queries and documents counted (default
    /// 64 MiB): without it, 10,000 entries of long queries or documents could
    /// hold gigabytes for the whole TTL (seeker issue 18).
    pub cache_max_bytes: u64,
    /// Characters kept per document title + text (default 2,000; 0 keeps all).
    pub max_document_chars: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            round_timeout: Duration::from_secs(10),
            query_timeout: Duration::from_secs(5),
            cache_ttl: Duration::from_secs(600),
            cache_capacity: 10_000,
            cache_max_bytes: 64 * 1024 * 1024,
            max_document_chars: 2000,
        }
    }
}

/// Limits and clean-up for one backend.
#[derive(Clone, Debug)]
pub struct BackendLimits {
    /// Calls in flight at once, across all requests (at least 1).
    pub concurrency: usize,
    /// Calls started per second, across all requests; 0 for no limit. A burst
    /// of this many may start at once, then one every 1/n s (GCRA).
    pub requests_per_second: u32,
    /// Extra attempts after a retryable failure.
    pub retries: u32,
    /// Strip HTML tags and entities and collapse whitespace (web snippets).
    pub strip_html: bool,
}

impl Default for BackendLimits {
    fn default() -> Self {
        Self {
            concurrency: 4,
            requests_per_second: 0,
            retries: 2,
            strip_html: false,
        }
    }
}

/// One query's outcome in a round.
#[derive(Clone, Debug)]
pub struct QueryResult {
    /// The query's documents (top k, best first), or why it failed.
    pub result: Result<Vec<Document>, SearchError>,
    /// Served from the shared cache (another request searched it).
    pub cached: bool,
    /// Members of a `fallback` or `merge` that failed for this query (in
    /// the order asked), whether or not another one answered.
    pub failed_backends: Vec<BackendFailure>,
}

impl QueryResult {
    pub(crate) fn of(result: Result<Vec<Document>, SearchError>, cached: bool) -> Self {
        Self {
            result,
            cached,
            failed_backends: Vec::new(),
        }
    }
}

struct Limited {
    backend: Arc<dyn SearchBackend>,
    limits: BackendLimits,
    slots: Semaphore,
    rate: Option<DefaultDirectRateLimiter>,
}

type CacheKey = (String, usize, String);

/// Bytes one cache entry holds: its key's strings, and each document's
/// strings plus the size of the struct itself.
fn cache_entry_bytes(key: &CacheKey, docs: &[Document]) -> usize {
    let strings = |d: &Document| {
        d.id.len()
            + d.title.len()
            + d.text.len()
            + d.backend.len()
            + d.url.as_ref().map_or(0, String::len)
    };
    key.0.len()
        + key.2.len()
        + std::mem::size_of::<CacheKey>()
        + docs
            .iter()
            .map(|d| strings(d) + std::mem::size_of::<Document>())
            .sum::<usize>()
}

/// Owns the configured backends and the shared cache; see the module docs.
pub struct Dispatcher {
    backends: BTreeMap<String, Arc<Limited>>,
    /// Backend lists: name → how and which members (each in `backends`).
    lists: BTreeMap<String, (ListMode, Vec<String>)>,
    /// What each backend is (`tantivy`, `brave`, `fallback`, …), for
    /// `/v1/models`; a backend added without one is `custom`.
    kinds: BTreeMap<String, String>,
    /// Built-in backends that could not start, with why (not listed, not
    /// served; a request naming one is told the reason).
    unavailable: BTreeMap<String, String>,
    default: String,
    config: DispatchConfig,
    cache: Option<moka::future::Cache<CacheKey, Arc<Vec<Document>>>>,
    metrics: Arc<Metrics>,
    pages: Option<Arc<PageReader>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("backends", &self.backends.keys().collect::<Vec<_>>())
            .field("default", &self.default)
            .finish()
    }
}

impl Dispatcher {
    /// A dispatcher with no backends yet; the first one added is the default
    /// until [`Dispatcher::set_default`] says otherwise.
    pub fn new(config: DispatchConfig) -> Self {
        let enabled =
            !config.cache_ttl.is_zero() && config.cache_capacity > 0 && config.cache_max_bytes > 0;
        let cache = enabled.then(|| {
            // moka bounds one weight: bytes. Each entry weighs at least
            // `max_bytes / capacity`, so the entry count stays within
            // `cache_capacity` as well.
            let floor = (config.cache_max_bytes / config.cache_capacity).max(1);
            moka::future::Cache::builder()
                .max_capacity(config.cache_max_bytes)
                .weigher(move |key: &CacheKey, docs: &Arc<Vec<Document>>| {
                    let bytes = (cache_entry_bytes(key, docs) as u64).max(floor);
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .time_to_live(config.cache_ttl)
                .build()
        });
        Self {
            backends: BTreeMap::new(),
            lists: BTreeMap::new(),
            kinds: BTreeMap::new(),
            unavailable: BTreeMap::new(),
            default: String::new(),
            config,
            cache,
            metrics: Arc::new(Metrics::new()),
            pages: None,
        }
    }

    /// Opens pages for page actions with `reader` (built on this
    /// dispatcher's [`Dispatcher::metrics`]).
    pub fn set_pages(&mut self, reader: PageReader) {
        self.pages = Some(Arc::new(reader));
    }

    /// The page reader, when one is configured; without one, page actions
    /// get the policy's failure text.
    pub fn pages(&self) -> Option<&PageReader> {
        self.pages.as_deref()
    }

    /// Entries and bytes the shared cache holds now (after its pending
    /// evictions); `(0, 0)` when it is off.
    pub async fn cache_usage(&self) -> (u64, u64) {
        match &self.cache {
            Some(cache) => {
                cache.run_pending_tasks().await;
                (cache.entry_count(), cache.weighted_size())
            }
            None => (0, 0),
        }
    }

    /// One backend under `name` with default settings and limits (tests, tools).
    pub fn single(name: &str, backend: Arc<dyn SearchBackend>) -> Self {
        let mut d = Self::new(DispatchConfig::default());
        d.add(name, backend, BackendLimits::default());
        d
    }

    /// Adds (or replaces) a backend.
    pub fn add(&mut self, name: &str, backend: Arc<dyn SearchBackend>, limits: BackendLimits) {
        let rate = NonZeroU32::new(limits.requests_per_second)
            .map(|rps| RateLimiter::direct(Quota::per_second(rps)));
        let slots = Semaphore::new(limits.concurrency.max(1));
        self.backends.insert(
            name.to_string(),
            Arc::new(Limited {
                backend,
                limits,
                slots,
                rate,
            }),
        );
        if self.default.is_empty() {
            self.default = name.to_string();
        }
    }

    /// Adds (or replaces) a backend list `name` over `members`.
    ///
    /// # Errors
    /// [`SearchError::UnknownBackend`] naming the first member that is not a
    /// backend of this dispatcher (a list is not a member).
    pub fn add_list(
        &mut self,
        name: &str,
        mode: ListMode,
        members: Vec<String>,
    ) -> Result<(), SearchError> {
        if let Some(missing) = members.iter().find(|m| !self.backends.contains_key(*m)) {
            return Err(SearchError::UnknownBackend(missing.clone()));
        }
        self.backends.remove(name);
        self.lists.insert(name.to_string(), (mode, members));
        let kind = match mode {
            ListMode::Fallback => "fallback",
            ListMode::Merge => "merge",
        };
        self.set_kind(name, kind);
        if self.default.is_empty() {
            self.default = name.to_string();
        }
        Ok(())
    }

    /// Records what backend `name` is (`tantivy`, `brave`, …).
    pub fn set_kind(&mut self, name: &str, kind: &str) {
        self.kinds.insert(name.to_string(), kind.to_string());
    }

    /// Each backend's kind, by name (`custom` where none was recorded).
    pub fn backend_kinds(&self) -> BTreeMap<String, String> {
        self.backend_names()
            .into_iter()
            .map(|n| {
                let kind = self.kinds.get(n).map_or("custom", String::as_str);
                (n.to_string(), kind.to_string())
            })
            .collect()
    }

    /// Makes `name` the backend of requests that name none.
    ///
    /// # Errors
    /// [`SearchError::UnknownBackend`] when no backend has that name.
    pub fn set_default(&mut self, name: &str) -> Result<(), SearchError> {
        if !self.has_backend(name) {
            return Err(SearchError::UnknownBackend(name.to_string()));
        }
        self.default = name.to_string();
        Ok(())
    }

    /// The backend of requests that name none.
    pub fn default_backend(&self) -> &str {
        &self.default
    }

    /// The backend a search on `name` runs on: `name`, or the default when
    /// `None` (the one place the default is applied, for rollouts and for
    /// [`Dispatcher::search_round`] alike).
    pub fn resolve<'a>(&'a self, name: Option<&'a str>) -> &'a str {
        name.unwrap_or(&self.default)
    }

    /// Configured backend names (lists too), sorted.
    pub fn backend_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .backends
            .keys()
            .chain(self.lists.keys())
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        names
    }

    /// Whether a backend (or list) of that name is configured.
    pub fn has_backend(&self, name: &str) -> bool {
        self.backends.contains_key(name) || self.lists.contains_key(name)
    }

    /// Records that the backend `name` cannot serve, and why: it is not
    /// listed by [`Self::backend_names`], and [`Self::check_backend`] gives a
    /// request naming it `reason` instead of "unknown".
    pub fn set_unavailable(&mut self, name: &str, reason: String) {
        self.unavailable.insert(name.to_string(), reason);
    }

    /// `Ok` when `name` is a configured backend; otherwise the message a
    /// client gets: why it is unavailable, or that it is unknown with the
    /// names this dispatcher has (a long `name` is cut at 100 characters).
    pub fn check_backend(&self, name: &str) -> Result<(), String> {
        if self.has_backend(name) {
            return Ok(());
        }
        let shown = match name.char_indices().nth(100) {
            Some((at, _)) => format!("{}…", &name[..at]),
            None => name.to_string(),
        };
        Err(match self.unavailable.get(name) {
            Some(reason) => format!("search backend `{shown}` is unavailable: {reason}"),
            None => format!(
                "unknown search backend `{shown}`; this server has: {}",
                self.backend_names().join(", ")
            ),
        })
    }

    /// Records search metrics into `metrics` instead of the dispatcher's own
    /// registry (the server shares one registry for everything).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where search latency, queries, errors, retries and cache hits are
    /// counted (`seeker_search_*`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Searches every query of a round at once on `backend` (the default when
    /// `None`) for its top `k`; one [`QueryResult`] per query, in query order.
    /// Never fails as a whole, and returns by the round's deadline.
    pub async fn search_round(
        &self,
        backend: Option<&str>,
        queries: &[String],
        k: usize,
    ) -> Vec<QueryResult> {
        let name = self.resolve(backend);
        let list = self.lists.get(name);
        let single = self.backends.get(name);
        if list.is_none() && single.is_none() {
            let error = SearchError::UnknownBackend(name.to_string());
            return queries
                .iter()
                .map(|_| QueryResult::of(Err(error.clone()), false))
                .collect();
        }
        let round_deadline = Instant::now() + self.config.round_timeout;
        let searches = queries.iter().map(|q| {
            let deadline = round_deadline.min(Instant::now() + self.config.query_timeout);
            // Whole milliseconds, rounded up: the configured 5000 ms, not
            // the 4999 ms left a moment after the round started.
            let left = deadline.saturating_duration_since(Instant::now());
            let limit = Duration::from_millis(left.as_micros().div_ceil(1000) as u64);
            async move {
                let search = async {
                    match (list, single) {
                        (Some((mode, members)), _) => {
                            self.search_list(*mode, members, q, k, deadline).await
                        }
                        (None, Some(limited)) => {
                            self.search_one(name, limited, q, k, deadline).await
                        }
                        (None, None) => unreachable!("checked above"),
                    }
                };
                match tokio::time::timeout_at(deadline, search).await {
                    Ok(result) => result,
                    Err(_) => QueryResult::of(Err(SearchError::Timeout(limit)), false),
                }
            }
        });
        self.metrics.queries_per_round.observe(queries.len() as f64);
        let results = futures::future::join_all(searches).await;
        for r in &results {
            if let Err(e) = &r.result {
                if list.is_some() {
                    // Its members' failures are counted under their names
                    // (and its queries are theirs): counting it again would
                    // count one failure twice, against no query of its own.
                    tracing::warn!(backend = name, kind = e.kind(), error = %e, "search failed on every member");
                } else {
                    self.count_failure(name, e);
                }
            }
        }
        results
    }

    fn count_failure(&self, name: &str, e: &SearchError) {
        self.metrics
            .search_errors
            .with_label_values(&[name, e.kind()])
            .inc();
        tracing::warn!(backend = name, kind = e.kind(), error = %e, "search failed");
    }

    async fn search_one(
        &self,
        name: &str,
        limited: &Limited,
        query: &str,
        k: usize,
        deadline: Instant,
    ) -> QueryResult {
        let fetch = async {
            self.metrics.search_queries.with_label_values(&[name]).inc();
            let started = Instant::now();
            let docs = self.attempts(name, limited, query, k, deadline).await;
            self.metrics
                .search_duration
                .with_label_values(&[name])
                .observe(started.elapsed().as_secs_f64());
            let docs = docs?;
            Ok::<_, SearchError>(Arc::new(self.tidy(name, limited, docs)))
        };
        let Some(cache) = &self.cache else {
            return QueryResult::of(fetch.await.map(|d| d.as_ref().clone()), false);
        };
        let key = (name.to_string(), k, normalise_query(query));
        match cache.entry(key).or_try_insert_with(fetch).await {
            Ok(entry) => {
                let cached = !entry.is_fresh();
                if cached {
                    self.metrics
                        .search_cache_hits
                        .with_label_values(&[name])
                        .inc();
                }
                QueryResult::of(Ok(entry.into_value().as_ref().clone()), cached)
            }
            Err(e) => QueryResult::of(Err(e.as_ref().clone()), false),
        }
    }

    /// The backend call with its slot, rate budget and retries.
    async fn attempts(
        &self,
        name: &str,
        limited: &Limited,
        query: &str,
        k: usize,
        deadline: Instant,
    ) -> Result<Vec<Document>, SearchError> {
        let mut attempt = 0;
        loop {
            let result = {
                let _slot = limited
                    .slots
                    .acquire()
                    .await
                    .map_err(|_| SearchError::Backend("backend closed".into()))?;
                if let Some(rate) = &limited.rate {
                    rate.until_ready().await;
                }
                limited.backend.search(query, k).await
            };
            match result {
                Err(e) if e.is_retryable() && attempt < limited.limits.retries => {
                    let wait = e.retry_after().unwrap_or_else(|| backoff(attempt));
                    if Instant::now() + wait >= deadline {
                        // Waiting would pass the deadline: fail now with the
                        // provider's reason rather than a timeout.
                        return Err(e);
                    }
                    tracing::debug!(
                        kind = e.kind(),
                        wait_ms = wait.as_millis() as u64,
                        "retrying search"
                    );
                    self.metrics.search_retries.with_label_values(&[name]).inc();
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Backend name on every document, HTML stripped where configured,
    /// title + text bounded, documents beyond `k` dropped.
    fn tidy(&self, name: &str, limited: &Limited, docs: Vec<Document>) -> Vec<Document> {
        let max = self.config.max_document_chars;
        docs.into_iter()
            .map(|mut d| {
                d.backend = name.to_string();
                if limited.limits.strip_html {
                    d.title = strip_html(&d.title);
                    d.text = strip_html(&d.text);
                }
                if max > 0 {
                    let title_chars = d.title.chars().count();
                    d.title = truncate_chars(&d.title, max).to_string();
                    d.text =
                        truncate_chars(&d.text, max.saturating_sub(title_chars).max(1)).to_string();
                }
                d
            })
            .collect()
    }
}

/// Full-jitter exponential backoff: uniform in [0, min(2 s, 100 ms × 2^attempt)].
fn backoff(attempt: u32) -> Duration {
    let cap = BACKOFF_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(BACKOFF_MAX);
    cap.mul_f64(fastrand::f64())
}

/// The shared cache's key for a query: NFKC, lower-cased, whitespace collapsed,
/// so `Paris  Capital` and `paris capital` are one search.
pub fn normalise_query(query: &str) -> String {
    collapse_whitespace(&query.nfkc().collect::<String>().to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_its_cap() {
        for attempt in 0..20 {
            let d = backoff(attempt);
            assert!(d <= BACKOFF_MAX, "{attempt}: {d:?}");
            assert!(
                d <= BACKOFF_BASE * 2u32.pow(attempt.min(10)),
                "{attempt}: {d:?}"
            );
        }
    }

    #[test]
    fn cache_keys_ignore_case_width_and_spacing() {
        assert_eq!(normalise_query("  Paris\tCapital "), "paris capital");
        assert_eq!(normalise_query("ＰＡＲＩＳ"), "paris");
        assert_ne!(normalise_query("paris"), normalise_query("pari s"));
    }
}
