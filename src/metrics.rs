//! Prometheus metrics: the one module that owns every metric name.
//!
//! Names follow Prometheus conventions (`seeker_` prefix, `_seconds` and
//! `_total` unit suffixes; `docs/protocols.md` §5). Labels are bounded: `route` is a route
//! template (`/v1/chat/completions`, or `unmatched`), `status` an HTTP status
//! code, `backend` a configured backend name, `kind` a [`SearchError`] kind,
//! `phase` one of `before_first_token`, `decode`, `search`. Query text,
//! request ids and client addresses never become labels.
//!
//! [`SearchError`]: crate::search::SearchError

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Latency buckets in seconds, 5 ms to 10 min: search calls take
/// milliseconds, CPU rollouts tens of seconds, and a request may run for
/// `server.request_timeout_s` (600 s by default).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];

/// Buckets for small counts (rounds per request, queries per round).
const COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 16.0];

/// Every metric seeker exports, registered in its own [`Registry`].
pub struct Metrics {
    registry: Registry,
    /// `seeker_http_requests_total{route,status}`: finished HTTP requests;
    /// `status="499"` when the client closed the connection before the
    /// response started (nginx's convention).
    pub http_requests: IntCounterVec,
    /// `seeker_http_request_duration_seconds{route}`: from the request to the
    /// end of its response body (the whole stream for SSE).
    pub http_request_duration: HistogramVec,
    /// `seeker_requests_in_flight`: requests whose response has not finished.
    pub requests_in_flight: IntGauge,
    /// `seeker_requests_rejected_total{reason}`: `overloaded` (429),
    /// `unauthorized` (401), `host` or `origin` (403, `server::hosts`).
    pub requests_rejected: IntCounterVec,
    /// `seeker_time_to_first_token_seconds`: from the request to the first
    /// generated text (reasoning or answer), question search included.
    pub time_to_first_token: Histogram,
    /// `seeker_time_to_first_answer_token_seconds`: to the first answer text.
    pub time_to_first_answer_token: Histogram,
    /// `seeker_rollout_duration_seconds`: a finished chat completion, end to end.
    pub rollout_duration: Histogram,
    /// `seeker_prompt_tokens_total`: prompt plus spliced documents, per usage.
    pub prompt_tokens: IntCounter,
    /// `seeker_generated_tokens_total`: tokens generated in all rounds.
    pub generated_tokens: IntCounter,
    /// `seeker_rollout_rounds`: generation rounds per finished rollout.
    pub rollout_rounds: Histogram,
    /// `seeker_search_queries_per_round`: queries of one search call.
    pub queries_per_round: Histogram,
    /// `seeker_search_duration_seconds{backend}`: one query to a backend
    /// (slot wait, rate limit and retries included; cache hits excluded).
    pub search_duration: HistogramVec,
    /// `seeker_search_queries_total{backend}`: queries sent to a backend.
    pub search_queries: IntCounterVec,
    /// `seeker_search_errors_total{backend,kind}`: queries that failed.
    pub search_errors: IntCounterVec,
    /// `seeker_search_retries_total{backend}`: retries after 429/5xx/connection errors.
    pub search_retries: IntCounterVec,
    /// `seeker_search_cache_hits_total{backend}`: queries served by the shared cache.
    pub search_cache_hits: IntCounterVec,
    /// `seeker_search_cache_entries`: result lists the shared search cache
    /// holds (read when `/metrics` is scraped).
    pub search_cache_entries: IntGauge,
    /// `seeker_search_cache_bytes`: bytes the shared search cache holds,
    /// queries and documents counted (`search.cache_max_bytes` bounds it;
    /// read when `/metrics` is scraped).
    pub search_cache_bytes: IntGauge,
    /// `seeker_page_fetches_total{outcome}`: pages a page action asked for:
    /// `ok` (a web page fetched), `cached` (a web page the page cache
    /// answered), `corpus` (a corpus document opened), or why
    /// not ([`crate::pages::PageError::kind`]: `refused`, `disabled`,
    /// `not_found`, `unsupported`, `http_status`, `timeout`, `redirect`,
    /// `connection`).
    pub page_fetches: IntCounterVec,
    /// `seeker_page_fetch_duration_seconds`: opening one page, cache hits and
    /// refusals included.
    pub page_fetch_duration: Histogram,
    /// `seeker_page_bytes_total`: bytes of readable text returned by opened pages.
    pub page_bytes: IntCounter,
    /// `seeker_page_extractions_running`: HTML pages being turned into text
    /// now, on blocking threads (at most `pages.extract_concurrency`); an
    /// extraction keeps running after its page's deadline has passed.
    pub page_extractions_running: IntGauge,
    /// `seeker_page_flattened_total`: HTML pages too deep or too large to
    /// parse whose text was read without their structure
    /// ([`crate::pages::shape`]).
    pub page_flattened: IntCounter,
    /// `seeker_client_disconnects_total{phase}`: requests whose client left
    /// before the response was finished.
    pub client_disconnects: IntCounterVec,
    /// `seeker_request_timeouts_total`: requests ended by the per-request deadline.
    pub request_timeouts: IntCounter,
    /// `seeker_prompt_tokens_cached_total`: prompt tokens taken from a prefix
    /// cache instead of prefilled, per round (a remote engine's report; the
    /// embedded engine's reuse, `engine::reuse`).
    pub prompt_tokens_cached: IntCounter,
    /// `seeker_prompt_tokens_prefilled_total`: prompt tokens an engine
    /// prefilled, round by round: a round's prompt less what it reused (the
    /// embedded engine's count; a remote server's report of its cached
    /// tokens, all of the prompt when it reports none).
    pub prompt_tokens_prefilled: IntCounter,
    /// `seeker_prefix_cache_flushes_total{reason}`: times the embedded
    /// engine's prefix cache was emptied; `reason` = `budget` (over
    /// `model.prefix_cache_mib`), `covered` (a prompt held a whole cached
    /// key), `unknown_end` (a sequence ended on a token seeker could not
    /// confirm), `startup` (the warm-up run's entry).
    pub prefix_cache_flushes: IntCounterVec,
    /// `seeker_prefix_cache_bytes`: KV bytes the embedded engine's prefix
    /// cache holds (seeker's count of its entries' rows).
    pub prefix_cache_bytes: IntGauge,
    /// `seeker_prefix_cache_entries`: sequences in that cache.
    pub prefix_cache_entries: IntGauge,
    /// `seeker_engine_requests_total{replica}`: generation requests sent to a
    /// remote engine replica (a round re-run after a failure counts again).
    pub engine_requests: IntCounterVec,
    /// `seeker_engine_errors_total{replica,kind}`: failed requests to a
    /// replica; `kind` = `connection`, `status`, `stream`, `timeout`.
    pub engine_errors: IntCounterVec,
    /// `seeker_engine_time_to_first_token_seconds{replica}`: from sending a
    /// round to a replica to its first text.
    pub engine_time_to_first_token: HistogramVec,
    /// `seeker_engine_replicas_up`: replicas not marked down.
    pub engine_replicas_up: IntGauge,
    /// `seeker_engine_round_duration_seconds{replica}`: from sending a round
    /// to a replica to the end of its stream (finished, cut at a stop
    /// string, or dropped by the rollout at its closing tag). A rollout's
    /// duration less these and its searches is seeker's own time.
    pub engine_round_duration: HistogramVec,
    /// `seeker_engine_queue_wait_seconds`: a round's wait for an engine slot
    /// (embedded engine; `engine::gate`).
    pub engine_queue_wait: Histogram,
    /// `seeker_engine_queue_depth`: rounds waiting for an engine slot.
    pub engine_queue_depth: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("valid histogram")
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid histogram")
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid counter")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter")
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::new(),
            http_requests: counter_vec(
                "seeker_http_requests_total",
                "Finished HTTP requests by route template and status code (499: the client closed the connection before the response).",
                &["route", "status"],
            ),
            http_request_duration: histogram_vec(
                "seeker_http_request_duration_seconds",
                "Time from a request to the end of its response body.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            requests_in_flight: IntGauge::new(
                "seeker_requests_in_flight",
                "Requests whose response has not finished.",
            )
            .expect("valid gauge"),
            requests_rejected: counter_vec(
                "seeker_requests_rejected_total",
                "Requests refused before running: overloaded (429) or unauthorized (401).",
                &["reason"],
            ),
            time_to_first_token: histogram(
                "seeker_time_to_first_token_seconds",
                "Time from a chat request to its first generated token.",
                LATENCY_BUCKETS,
            ),
            time_to_first_answer_token: histogram(
                "seeker_time_to_first_answer_token_seconds",
                "Time from a chat request to the first token of its answer.",
                LATENCY_BUCKETS,
            ),
            rollout_duration: histogram(
                "seeker_rollout_duration_seconds",
                "Time from a chat request to the end of its rollout.",
                LATENCY_BUCKETS,
            ),
            prompt_tokens: counter(
                "seeker_prompt_tokens_total",
                "Prompt tokens of finished rollouts, spliced documents included.",
            ),
            generated_tokens: counter(
                "seeker_generated_tokens_total",
                "Tokens generated by finished rollouts, all rounds.",
            ),
            rollout_rounds: histogram(
                "seeker_rollout_rounds",
                "Generation rounds per finished rollout.",
                COUNT_BUCKETS,
            ),
            queries_per_round: histogram(
                "seeker_search_queries_per_round",
                "Queries in one search call.",
                COUNT_BUCKETS,
            ),
            search_duration: histogram_vec(
                "seeker_search_duration_seconds",
                "Time to answer one query from a backend, waits and retries included.",
                &["backend"],
                LATENCY_BUCKETS,
            ),
            search_queries: counter_vec(
                "seeker_search_queries_total",
                "Queries sent to a backend (cache misses).",
                &["backend"],
            ),
            search_errors: counter_vec(
                "seeker_search_errors_total",
                "Queries that failed, by backend and failure kind.",
                &["backend", "kind"],
            ),
            search_retries: counter_vec(
                "seeker_search_retries_total",
                "Backend calls retried after a 429, 5xx or connection error.",
                &["backend"],
            ),
            search_cache_hits: counter_vec(
                "seeker_search_cache_hits_total",
                "Queries answered by the shared search cache.",
                &["backend"],
            ),
            page_fetches: counter_vec(
                "seeker_page_fetches_total",
                "Pages asked for by page actions, by outcome (ok, corpus, or why not).",
                &["outcome"],
            ),
            page_fetch_duration: histogram(
                "seeker_page_fetch_duration_seconds",
                "Time to open one page, refusals and cache hits included.",
                LATENCY_BUCKETS,
            ),
            page_bytes: counter(
                "seeker_page_bytes_total",
                "Bytes of readable text returned by opened pages.",
            ),
            page_extractions_running: IntGauge::new(
                "seeker_page_extractions_running",
                "HTML pages being turned into text now (blocking threads).",
            )
            .expect("valid gauge"),
            page_flattened: counter(
                "seeker_page_flattened_total",
                "HTML pages too deep or too large to parse, read as flat text.",
            ),
            client_disconnects: counter_vec(
                "seeker_client_disconnects_total",
                "Requests whose client left before the response finished, by phase.",
                &["phase"],
            ),
            request_timeouts: counter(
                "seeker_request_timeouts_total",
                "Requests ended by the per-request deadline.",
            ),
            prompt_tokens_cached: counter(
                "seeker_prompt_tokens_cached_total",
                "Prompt tokens taken from a prefix cache instead of prefilled.",
            ),
            prompt_tokens_prefilled: counter(
                "seeker_prompt_tokens_prefilled_total",
                "Prompt tokens the embedded engine prefilled.",
            ),
            prefix_cache_flushes: counter_vec(
                "seeker_prefix_cache_flushes_total",
                "Times the embedded engine's prefix cache was emptied, by reason.",
                &["reason"],
            ),
            prefix_cache_bytes: IntGauge::new(
                "seeker_prefix_cache_bytes",
                "KV bytes the embedded engine's prefix cache holds.",
            )
            .expect("valid gauge"),
            prefix_cache_entries: IntGauge::new(
                "seeker_prefix_cache_entries",
                "Sequences in the embedded engine's prefix cache.",
            )
            .expect("valid gauge"),
            engine_requests: counter_vec(
                "seeker_engine_requests_total",
                "Generation requests sent to a remote engine replica.",
                &["replica"],
            ),
            engine_errors: counter_vec(
                "seeker_engine_errors_total",
                "Failed requests to a remote engine replica, by kind.",
                &["replica", "kind"],
            ),
            engine_time_to_first_token: histogram_vec(
                "seeker_engine_time_to_first_token_seconds",
                "From sending a round to a remote engine replica to its first text.",
                &["replica"],
                LATENCY_BUCKETS,
            ),
            engine_round_duration: histogram_vec(
                "seeker_engine_round_duration_seconds",
                "From sending a round to a remote engine replica to the end of its stream.",
                &["replica"],
                LATENCY_BUCKETS,
            ),
            engine_queue_wait: histogram(
                "seeker_engine_queue_wait_seconds",
                "A round's wait for an engine slot (embedded engine).",
                LATENCY_BUCKETS,
            ),
            engine_queue_depth: IntGauge::new(
                "seeker_engine_queue_depth",
                "Rounds waiting for an engine slot (embedded engine).",
            )
            .expect("valid gauge"),
            engine_replicas_up: IntGauge::new(
                "seeker_engine_replicas_up",
                "Remote engine replicas not marked down.",
            )
            .expect("valid gauge"),
            search_cache_entries: IntGauge::new(
                "seeker_search_cache_entries",
                "Result lists the shared search cache holds.",
            )
            .expect("valid gauge"),
            search_cache_bytes: IntGauge::new(
                "seeker_search_cache_bytes",
                "Bytes the shared search cache holds, queries and documents counted.",
            )
            .expect("valid gauge"),
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.http_requests.clone()),
            Box::new(m.http_request_duration.clone()),
            Box::new(m.requests_in_flight.clone()),
            Box::new(m.requests_rejected.clone()),
            Box::new(m.time_to_first_token.clone()),
            Box::new(m.time_to_first_answer_token.clone()),
            Box::new(m.rollout_duration.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.generated_tokens.clone()),
            Box::new(m.rollout_rounds.clone()),
            Box::new(m.queries_per_round.clone()),
            Box::new(m.search_duration.clone()),
            Box::new(m.search_queries.clone()),
            Box::new(m.search_errors.clone()),
            Box::new(m.search_retries.clone()),
            Box::new(m.search_cache_hits.clone()),
            Box::new(m.search_cache_entries.clone()),
            Box::new(m.search_cache_bytes.clone()),
            Box::new(m.page_fetches.clone()),
            Box::new(m.page_fetch_duration.clone()),
            Box::new(m.page_bytes.clone()),
            Box::new(m.page_extractions_running.clone()),
            Box::new(m.page_flattened.clone()),
            Box::new(m.client_disconnects.clone()),
            Box::new(m.request_timeouts.clone()),
            Box::new(m.prompt_tokens_cached.clone()),
            Box::new(m.prompt_tokens_prefilled.clone()),
            Box::new(m.prefix_cache_flushes.clone()),
            Box::new(m.prefix_cache_bytes.clone()),
            Box::new(m.prefix_cache_entries.clone()),
            Box::new(m.engine_requests.clone()),
            Box::new(m.engine_errors.clone()),
            Box::new(m.engine_time_to_first_token.clone()),
            Box::new(m.engine_replicas_up.clone()),
            Box::new(m.engine_round_duration.clone()),
            Box::new(m.engine_queue_wait.clone()),
            Box::new(m.engine_queue_depth.clone()),
        ];
        for c in collectors {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Every metric in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_names_with_units() {
        let m = Metrics::new();
        m.search_duration
            .with_label_values(&["tantivy"])
            .observe(0.01);
        m.http_requests.with_label_values(&["/health", "200"]).inc();
        let text = m.render();
        assert!(text.contains("seeker_search_duration_seconds_bucket{backend=\"tantivy\""));
        assert!(text.contains("seeker_http_requests_total{route=\"/health\",status=\"200\"} 1"));
        assert!(text.contains("seeker_requests_in_flight 0"));
        assert!(text.contains("seeker_time_to_first_token_seconds_count 0"));
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(line.starts_with("# TYPE seeker_"), "{line}");
        }
    }
}
