//! A remote engine: the policy runs on existing inference servers (vLLM,
//! SGLang, llama.cpp's `llama-server`), one or more replicas, driven through
//! the text completions API they all speak. seeker keeps the search loop:
//! it renders the chat template itself ([`ChatTemplate`], so a transcript is
//! the same text whichever engine runs it), sends the whole transcript each
//! round (the server's own prefix cache reuses what it has already seen) and
//! cuts the round at the closing tag itself.
//!
//! Protocol (OpenAI's legacy completions, `docs/protocols.md` §6):
//! `POST {url}/v1/completions` with `{"model", "prompt", "max_tokens",
//! "temperature", "top_p", "stream": true, "stream_options":
//! {"include_usage": true, "continuous_usage_stats": true},
//! "timings_per_token": true}`; the answer is SSE `data:` lines of
//! `{"choices": [{"text", "finish_reason"}], "usage"?, "timings"?}` ending
//! with `data: [DONE]`. Stop strings are **not** sent: these servers drop a
//! matched stop string from the text and not all of them say which one
//! matched (llama-server's `/v1/completions` does not), so seeker scans the
//! text for the round's stop strings and closes the connection at the first
//! one (the servers stop generating when the client disconnects). The
//! prompt's token count and the tokens taken from the prefix cache come from
//! vLLM's per-chunk usage (`continuous_usage_stats`,
//! `usage.prompt_tokens_details.cached_tokens`) or llama-server's per-token
//! timings (`timings.prompt_n` + `timings.cache_n`); servers ignore the
//! fields they do not know.
//!
//! Replicas: a rollout stays on the replica that ran its first round (its
//! prefix is cached there; [`GenerationParams::session`]) while that replica
//! is healthy and not slow (time to first token five times the fastest other
//! replica's); a new rollout goes to the healthy replica with the fewest
//! generations in flight, slow ones last. A
//! replica that refuses a connection, answers 5xx/408/429, breaks its stream
//! or stays silent past the read timeout is marked down (1 s, doubling to
//! 30 s) and the round goes on on another replica from the transcript plus
//! the text already received, so the client sees one uninterrupted stream.
//! A replica marked down counts as up again only once a readiness probe
//! succeeded (`GET /health`, then a one-token completion: a server that is
//! still busy with abandoned work, or stopped, fails it); the probe runs
//! when its time is up, from a background task every
//! [`PROBE_INTERVAL`] and before a request would use it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod tokens;
mod wire;

use self::wire::{context_overflow, parse_chunk, SseLines};
use super::chat_template::ChatTemplate;
use super::{
    ChatTurn, Engine, EngineError, EngineEvent, EngineFinish, Generation, GenerationParams,
};
use crate::metrics::Metrics;
use crate::secret::Secret;

/// Longest time a replica stays marked down before it is probed again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Deadline of a `/health` probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the one-token completion of a readiness probe (or the
/// read timeout, when shorter).
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the background task looks for replicas due for a probe.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// Error bodies read at most (they go to the log).
const MAX_ERROR_BODY: usize = 4096;

/// How to reach the servers.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// Base URLs, one per replica (`http://gpu1:8000`; `/v1/completions` is
    /// appended).
    pub urls: Vec<String>,
    /// Model name sent in requests; `None` = the first id the first
    /// reachable replica lists at `GET /v1/models`.
    pub model: Option<String>,
    /// `Authorization: Bearer` key for the servers (vLLM `--api-key`).
    pub api_key: Option<Secret>,
    /// Deadline to open a connection to a replica.
    pub connect_timeout: Duration,
    /// Longest silence from a replica: to the response headers, and between
    /// two chunks of a stream (the first token after a long prefill
    /// included). Past it the replica counts as failed.
    pub read_timeout: Duration,
    /// Send a rollout's later rounds as token ids (its previous round's
    /// prompt ids, its generated text and the splice each tokenized on its
    /// own), so the server's prefix cache matches past the round's own
    /// output; false sends every round as text ([`tokens`]).
    pub token_continuation: bool,
}

/// See the module documentation.
pub struct RemoteEngine {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    replicas: Vec<Replica>,
    model: String,
    api_key: Option<Secret>,
    template: ChatTemplate,
    special_tokens: Vec<String>,
    /// Rollout id → the replica its rounds go to.
    sessions: moka::future::Cache<u64, usize>,
    read_timeout: Duration,
    metrics: Arc<Metrics>,
    /// Each rollout's last round, for token prompts; `None` with
    /// `token_continuation` off.
    rounds: Option<tokens::Rounds>,
    /// Set once a server refused a token prompt: rounds go out as text.
    text_only: std::sync::atomic::AtomicBool,
}

struct Replica {
    /// Base URL without a trailing slash.
    url: String,
    /// Generations streaming from it now.
    in_flight: AtomicUsize,
    health: Mutex<Health>,
    /// Its recent times to first token, for [`Inner::slow`].
    first_token: Mutex<FirstTokens>,
}

/// A replica's times to first token over its last [`FIRST_TOKEN_ROUNDS`]
/// rounds within [`SLOW_MEMORY`] (seconds, with when each was measured).
#[derive(Default)]
struct FirstTokens(std::collections::VecDeque<(Instant, f64)>);

impl FirstTokens {
    fn push(&mut self, seconds: f64) {
        if self.0.len() == FIRST_TOKEN_ROUNDS {
            self.0.pop_front();
        }
        self.0.push_back((Instant::now(), seconds));
    }

    /// The recent times (within [`SLOW_MEMORY`]).
    fn recent(&self) -> impl Iterator<Item = f64> + '_ {
        self.0
            .iter()
            .filter(|(at, _)| at.elapsed() <= SLOW_MEMORY)
            .map(|&(_, s)| s)
    }
}

/// Rounds a replica's times to first token are kept for.
const FIRST_TOKEN_ROUNDS: usize = 8;
/// A replica is slow when its mean recent time to first token is this many
/// times the best recent time of the fastest other replica (and over
/// [`SLOW_FLOOR`]). The others' best, not their mean: a time to first token
/// grows with the prompt to prefill, and a healthy replica's best is what it
/// can do; on a loaded 2-core machine a healthy SmolLM2 server's mean was
/// 4.9 s while a replica stalled 12 s per request averaged 12.7 s.
const SLOW_FACTOR: f64 = 5.0;
/// Times to first token below this are never slow (noise on idle servers).
const SLOW_FLOOR: Duration = Duration::from_millis(500);
/// Times to first token count this long; after it a slow replica is tried
/// again (a new rollout may go to it), so one that recovered is used.
const SLOW_MEMORY: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Health {
    /// Failures in a row.
    failures: u32,
    /// Marked down until then.
    down_until: Option<Instant>,
}

/// Why a replica counts as failed: the `kind` label of
/// `seeker_engine_errors_total` and the `kind` field of the "marked down"
/// warning ([`FailureKind::label`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailureKind {
    /// The replica could not be reached: a refused or failed connection, no
    /// answer to `GET /v1/models` at start, or a failed readiness probe.
    Connection,
    /// The replica answered with an error status: 5xx, 408 or 429 (a
    /// replica failure), or a 4xx that is the request's fault and no context
    /// overflow (counted, the replica not marked down).
    Status,
    /// The stream broke: a read error, malformed SSE or JSON, or an end
    /// (`[DONE]` or the connection closing) without a finish reason.
    Stream,
    /// The replica stayed silent past the read timeout, before its response
    /// headers or between two chunks.
    Timeout,
}

impl FailureKind {
    /// The label: `connection`, `status`, `stream` or `timeout`.
    fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Status => "status",
            Self::Stream => "stream",
            Self::Timeout => "timeout",
        }
    }
}

/// Why one request to one replica did not start a stream.
enum Refusal {
    /// The replica failed: try another.
    Replica { kind: FailureKind, message: String },
    /// The request itself is refused (the same on every replica).
    Request(EngineError),
}

impl RemoteEngine {
    /// Connects to the replicas: waits until one of them answers
    /// `GET /v1/models` (retrying every second, with a warning every 10 s:
    /// a server may still be loading its model), taking the model name from
    /// it when `config.model` is `None`. Replicas that do not answer yet are
    /// marked down and probed later.
    ///
    /// # Errors
    /// [`EngineError::Load`] when no URL is configured or a URL is not http(s).
    pub async fn connect(
        config: &RemoteConfig,
        template: ChatTemplate,
        special_tokens: Vec<String>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EngineError> {
        if config.urls.is_empty() {
            return Err(EngineError::Load(
                "model.remote_urls is empty: give the base URL of at least one server".into(),
            ));
        }
        let mut replicas = Vec::new();
        for url in &config.urls {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| EngineError::Load(format!("model.remote_urls: {url}: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(EngineError::Load(format!(
                    "model.remote_urls: {url}: not an http(s) URL"
                )));
            }
            // An OpenAI-style base URL (`http://host:8000/v1`) names the
            // same server: seeker appends `/v1/...` itself.
            let base = url.trim_end_matches('/');
            let base = base.strip_suffix("/v1").unwrap_or(base);
            replicas.push(Replica {
                url: base.to_string(),
                in_flight: AtomicUsize::new(0),
                health: Mutex::new(Health::default()),
                first_token: Mutex::new(FirstTokens::default()),
            });
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| EngineError::Load(format!("HTTP client: {e}")))?;
        let started = Instant::now();
        let mut warned = Instant::now();
        // Every replica is asked; those that do not answer start marked
        // down (probed again before use). Until one answers, keep asking.
        let (model, answering) = loop {
            let mut answered = None;
            let mut answering = Vec::new();
            let mut failures = Vec::new();
            for (i, replica) in replicas.iter().enumerate() {
                match list_models(
                    &client,
                    &replica.url,
                    config.api_key.as_ref().map(Secret::expose),
                )
                .await
                {
                    Ok(ids) => {
                        answering.push(i);
                        answered.get_or_insert(ids);
                    }
                    Err(e) => failures.push(format!("{}: {e}", replica.url)),
                }
            }
            match answered {
                Some(ids) => {
                    for failure in &failures {
                        tracing::warn!(error = %failure, "engine replica not answering at start; marked down");
                    }
                    let model = match &config.model {
                        Some(name) => {
                            if !ids.is_empty() && !ids.contains(name) {
                                tracing::warn!(
                                    remote_model = %name,
                                    listed = %ids.join(", "),
                                    "model.remote_model is not among the models the server \
                                     lists; servers that check the name will refuse requests"
                                );
                            }
                            name.clone()
                        }
                        None => match ids.into_iter().next() {
                            Some(id) => id,
                            None => {
                                return Err(EngineError::Load(
                                    "the remote server lists no model; set model.remote_model"
                                        .into(),
                                ))
                            }
                        },
                    };
                    break (model, answering);
                }
                None => {
                    if warned.elapsed() >= Duration::from_secs(10) {
                        warned = Instant::now();
                        tracing::warn!(
                            waited_s = started.elapsed().as_secs(),
                            errors = %failures.join("; "),
                            "no remote engine replica answers GET /v1/models yet; still trying"
                        );
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let inner = Arc::new(Inner {
            client,
            replicas,
            model,
            api_key: config.api_key.clone(),
            template,
            special_tokens,
            sessions: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_idle(Duration::from_secs(600))
                .build(),
            read_timeout: config.read_timeout,
            metrics,
            rounds: config.token_continuation.then(tokens::rounds),
            text_only: std::sync::atomic::AtomicBool::new(false),
        });
        for i in 0..inner.replicas.len() {
            if !answering.contains(&i) {
                inner.mark_down(
                    i,
                    FailureKind::Connection,
                    "not answering GET /v1/models at start",
                );
            }
        }
        inner.metrics.engine_replicas_up.set(inner.up_count());
        tokio::spawn(probe_loop(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The model name sent to the servers.
    pub fn model(&self) -> &str {
        &self.inner.model
    }
}

/// The ids a server lists at `GET /v1/models`.
async fn list_models(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> Result<Vec<String>, String> {
    let mut request = client
        .get(format!("{url}/v1/models"))
        .timeout(PROBE_TIMEOUT * 5);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    Ok(body["data"]
        .as_array()
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// Probes every replica whose time marked down is up, every
/// [`PROBE_INTERVAL`], until the engine is dropped: `/health` and the
/// replicas-up gauge then follow the replicas without waiting for a request.
async fn probe_loop(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let due: Vec<usize> = (0..inner.replicas.len())
            .filter(|&i| {
                inner
                    .replica(i)
                    .health
                    .lock()
                    .expect("health lock")
                    .down_until
                    .is_some_and(|t| t <= now)
            })
            .collect();
        futures::future::join_all(due.into_iter().map(|i| inner.usable(i))).await;
    }
}

impl Inner {
    fn replica(&self, i: usize) -> &Replica {
        &self.replicas[i]
    }

    /// Replicas not marked down: never failed, or served or passed a
    /// readiness probe since they last failed. (A replica whose time marked
    /// down is over is not up until its probe succeeds.)
    fn up_count(&self) -> i64 {
        self.replicas
            .iter()
            .filter(|r| r.health.lock().expect("health lock").down_until.is_none())
            .count() as i64
    }

    fn mark_down(&self, i: usize, kind: FailureKind, message: &str) {
        let replica = self.replica(i);
        self.metrics
            .engine_errors
            .with_label_values(&[replica.url.as_str(), kind.label()])
            .inc();
        let backoff = {
            let mut h = replica.health.lock().expect("health lock");
            h.failures = h.failures.saturating_add(1);
            let backoff = Duration::from_secs(1 << (h.failures - 1).min(5)).min(MAX_BACKOFF);
            h.down_until = Some(Instant::now() + backoff);
            backoff
        };
        tracing::warn!(
            replica = %replica.url,
            kind = kind.label(),
            error = %message,
            backoff_s = backoff.as_secs(),
            "engine replica failed; marked down"
        );
        self.metrics.engine_replicas_up.set(self.up_count());
    }

    fn mark_up(&self, i: usize) {
        let mut h = self.replica(i).health.lock().expect("health lock");
        if h.failures > 0 || h.down_until.is_some() {
            *h = Health::default();
            drop(h);
            self.metrics.engine_replicas_up.set(self.up_count());
        }
    }

    /// Whether replica `i` may take a request now: not marked down, or its
    /// time is up and it passes [`Inner::ready`] (then it is marked up; a
    /// failed probe marks it down for longer).
    async fn usable(&self, i: usize) -> bool {
        let down_until = self
            .replica(i)
            .health
            .lock()
            .expect("health lock")
            .down_until;
        match down_until {
            None => true,
            Some(t) if Instant::now() < t => false,
            Some(_) => match self.ready(i).await {
                Ok(()) => {
                    self.mark_up(i);
                    true
                }
                Err(why) => {
                    self.mark_down(
                        i,
                        FailureKind::Connection,
                        &format!("readiness probe failed: {why}"),
                    );
                    false
                }
            },
        }
    }

    /// The readiness probe of replica `i`: `GET /health` answers 2xx within
    /// [`PROBE_TIMEOUT`], then a one-token greedy completion answers 2xx
    /// with a JSON body holding `choices` within [`READY_TIMEOUT`] (or the
    /// read timeout). The second half is
    /// what tells a server that is up from one that can serve: llama.cpp's
    /// `/health` says ok while its slots still finish generations whose
    /// clients left, and a new request waits behind them.
    async fn ready(&self, i: usize) -> Result<(), String> {
        let url = &self.replica(i).url;
        let health = self
            .client
            .get(format!("{url}/health"))
            .timeout(PROBE_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET /health: {e}"))?;
        if !health.status().is_success() {
            return Err(format!("GET /health: status {}", health.status()));
        }
        let mut request = self
            .client
            .post(format!("{url}/v1/completions"))
            .timeout(READY_TIMEOUT.min(self.read_timeout))
            .json(
                &json!({"model": self.model, "prompt": "OK", "max_tokens": 1,
                "temperature": 0.0, "stream": false}),
            );
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("a one-token completion: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "a one-token completion: status {}",
                response.status()
            ));
        }
        let body: Value = response
            .json()
            .await
            .map_err(|e| format!("a one-token completion: {e}"))?;
        if !body["choices"].is_array() {
            return Err("a one-token completion without `choices`".into());
        }
        Ok(())
    }

    /// Records a round's time to first token on replica `i`.
    fn first_token(&self, i: usize, seconds: f64) {
        self.replica(i)
            .first_token
            .lock()
            .expect("lock")
            .push(seconds);
    }

    /// Whether replica `i` is slow: its mean recent time to first token is
    /// over [`SLOW_FLOOR`] and [`SLOW_FACTOR`] times the best recent time of
    /// the fastest other replica that is up. A slow replica keeps its
    /// sessions only while no other can take them, and gets new rollouts
    /// last.
    fn slow(&self, i: usize) -> bool {
        let own: Vec<f64> = self
            .replica(i)
            .first_token
            .lock()
            .expect("lock")
            .recent()
            .collect();
        if own.is_empty() {
            return false;
        }
        let mean = own.iter().sum::<f64>() / own.len() as f64;
        if mean < SLOW_FLOOR.as_secs_f64() {
            return false;
        }
        let fastest_other = (0..self.replicas.len())
            .filter(|&j| j != i)
            .filter(|&j| {
                self.replica(j)
                    .health
                    .lock()
                    .expect("health lock")
                    .down_until
                    .is_none()
            })
            .flat_map(|j| {
                self.replica(j)
                    .first_token
                    .lock()
                    .expect("lock")
                    .recent()
                    .collect::<Vec<_>>()
            })
            .fold(f64::INFINITY, f64::min);
        mean > SLOW_FACTOR * fastest_other
    }

    /// The replica for the next request of `session`, not one of `tried`:
    /// the session's own replica when it is usable and not [slow](Inner::slow),
    /// else the usable one with the fewest generations in flight, slow ones
    /// last. The pick counts as in flight at once (requests that arrive
    /// together spread over the replicas); the caller gives it back with
    /// [`Inner::done`].
    async fn pick(&self, session: Option<u64>, tried: &[usize]) -> Option<usize> {
        if let Some(session) = session {
            if let Some(i) = self.sessions.get(&session).await {
                if !tried.contains(&i) && !self.slow(i) && self.usable(i).await {
                    self.replica(i).in_flight.fetch_add(1, Ordering::Relaxed);
                    return Some(i);
                }
            }
        }
        let mut order: Vec<usize> = (0..self.replicas.len())
            .filter(|i| !tried.contains(i))
            .collect();
        // Each key once (`slow` locks and reads every replica's times).
        order.sort_by_cached_key(|&i| {
            (
                self.slow(i),
                self.replica(i).in_flight.load(Ordering::Relaxed),
                i,
            )
        });
        for i in order {
            if self.usable(i).await {
                self.replica(i).in_flight.fetch_add(1, Ordering::Relaxed);
                return Some(i);
            }
        }
        None
    }

    /// A generation picked on replica `i` ended (or never started).
    fn done(&self, i: usize) {
        self.replica(i).in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A `/v1/completions` body; `prompt` is the text or its token ids.
    fn body(&self, prompt: Value, max_tokens: usize, params: &GenerationParams) -> Value {
        let mut body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens.max(1),
            "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true},
            "timings_per_token": true,
            "cache_prompt": true,
        });
        if self.rounds.is_some() {
            // The generated ids, for the next round's token prompt
            // ([`tokens`]): vLLM's `token_ids`, llama-server's logprobs.
            body["return_token_ids"] = json!(true);
            body["logprobs"] = json!(1);
        }
        if params.is_greedy() {
            body["temperature"] = json!(0.0);
        } else {
            body["temperature"] = json!(params.temperature);
            if let Some(p) = params.top_p {
                body["top_p"] = json!(p);
            }
        }
        body
    }

    /// Sends one round to replica `i`; the response once its headers say 200.
    async fn start(&self, i: usize, body: &Value) -> Result<reqwest::Response, Refusal> {
        let replica = self.replica(i);
        self.metrics
            .engine_requests
            .with_label_values(&[replica.url.as_str()])
            .inc();
        let mut request = self
            .client
            .post(format!("{}/v1/completions", replica.url))
            .json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = match tokio::time::timeout(self.read_timeout, request.send()).await {
            Err(_) => {
                return Err(Refusal::Replica {
                    kind: FailureKind::Timeout,
                    message: format!("no response within {:?}", self.read_timeout),
                })
            }
            Ok(Err(e)) => {
                return Err(Refusal::Replica {
                    kind: FailureKind::Connection,
                    message: e.to_string(),
                })
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = read_error_body(response).await;
        let message = format!("status {status}: {text}");
        if status.is_server_error()
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        {
            return Err(Refusal::Replica {
                kind: FailureKind::Status,
                message,
            });
        }
        // The request's own fault (the prompt is too long) is no replica error.
        if let Some((prompt_tokens, limit)) = context_overflow(&text) {
            return Err(Refusal::Request(EngineError::ContextLength {
                prompt_tokens,
                limit,
            }));
        }
        self.metrics
            .engine_errors
            .with_label_values(&[replica.url.as_str(), FailureKind::Status.label()])
            .inc();
        Err(Refusal::Request(EngineError::Internal(format!(
            "the remote engine at {} refused the request: {message}",
            replica.url
        ))))
    }

    /// Starts `prompt` (text or token ids) on a replica (the session's, or
    /// another after a failure), not one of `tried`; returns the replica, its
    /// response, and whether `prompt` went out as given. A server that
    /// refuses token ids (a 4xx that is not a context overflow) gets `text`
    /// instead; when that is taken, every later round goes out as text
    /// ([`Inner::refuse_token_prompts`]), and when it is refused too, the
    /// refusal was not about the ids and is the error.
    async fn start_anywhere(
        &self,
        prompt: Value,
        text: Option<&str>,
        max_tokens: usize,
        params: &GenerationParams,
        tried: &mut Vec<usize>,
    ) -> Result<(usize, reqwest::Response, bool), EngineError> {
        let mut body = self.body(prompt, max_tokens, params);
        let mut shrunk = false;
        // Why the token prompt was refused, once `text` replaced it.
        let mut refused_ids: Option<String> = None;
        loop {
            let Some(i) = self.pick(params.session, tried).await else {
                return Err(EngineError::Internal(format!(
                    "no remote engine replica can take the request: {} failed now, the rest of \
                     the {} configured are marked down",
                    tried.len(),
                    self.replicas.len()
                )));
            };
            let started = self.start(i, &body).await;
            if started.is_err() {
                self.done(i);
            }
            match started {
                Ok(response) => {
                    if let Some(session) = params.session {
                        self.sessions.insert(session, i).await;
                    }
                    if let Some(message) = &refused_ids {
                        self.refuse_token_prompts(message);
                    }
                    return Ok((i, response, refused_ids.is_none()));
                }
                Err(Refusal::Replica { kind, message }) => {
                    tried.push(i);
                    self.mark_down(i, kind, &message);
                }
                // vLLM refuses a prompt that fits when prompt + max_tokens
                // does not: ask once more for what is left of the context.
                Err(Refusal::Request(EngineError::ContextLength {
                    prompt_tokens,
                    limit,
                })) if prompt_tokens < limit && !shrunk => {
                    shrunk = true;
                    body["max_tokens"] = json!(limit - prompt_tokens);
                }
                Err(Refusal::Request(EngineError::Internal(message)))
                    if body["prompt"].is_array() && text.is_some() =>
                {
                    refused_ids = Some(message);
                    body["prompt"] = json!(text);
                }
                Err(Refusal::Request(e)) => return Err(e),
            }
        }
    }
}

/// An error body, at most [`MAX_ERROR_BODY`] bytes, as text.
async fn read_error_body(response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            body.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// What the round streamed so far, for a re-run elsewhere after a failure.
struct Progress {
    text: String,
    /// Each chunk's text as the server sent it (before a stop cut) with the
    /// ids it came from, for the next round's token prompt.
    chunks: Vec<(String, Vec<u32>)>,
    tokens: usize,
    prompt_reported: bool,
}

/// How one replica's stream ended.
enum StreamEnd {
    /// Finished (or cut at a stop string); nothing more to do.
    Done,
    /// The consumer left.
    Cancelled,
    /// The replica failed mid-stream: re-run elsewhere.
    Failed { kind: FailureKind, message: String },
}

impl Inner {
    /// Forwards one replica's stream to `tx`; cuts it at the first stop
    /// string.
    async fn forward(
        &self,
        i: usize,
        response: reqwest::Response,
        params: &GenerationParams,
        progress: &mut Progress,
        tx: &mpsc::Sender<Result<EngineEvent, EngineError>>,
        sent_at: Instant,
    ) -> StreamEnd {
        let replica = self.replica(i);
        // The generation `pick` counted ends with this stream.
        struct InFlight<'a>(&'a Inner, usize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.done(self.1);
            }
        }
        let _in_flight = InFlight(self, i);
        // The round's time on this replica, however its stream ends.
        struct RoundTimer<'a>(&'a prometheus::Histogram, Instant);
        impl Drop for RoundTimer<'_> {
            fn drop(&mut self) {
                self.0.observe(self.1.elapsed().as_secs_f64());
            }
        }
        let round_seconds = self
            .metrics
            .engine_round_duration
            .with_label_values(&[replica.url.as_str()]);
        let _round = RoundTimer(&round_seconds, sent_at);
        let mut stream = response.bytes_stream();
        let mut lines = SseLines::default();
        let mut first_text = true;
        let mut generated_base = None::<usize>;
        let longest_stop = params.stop.iter().map(String::len).max().unwrap_or(0);
        loop {
            let next = tokio::select! {
                () = tx.closed() => return StreamEnd::Cancelled,
                next = tokio::time::timeout(self.read_timeout, stream.next()) => next,
            };
            let bytes = match next {
                Err(_) => {
                    return StreamEnd::Failed {
                        kind: FailureKind::Timeout,
                        message: format!("silent for {:?}", self.read_timeout),
                    }
                }
                Ok(None) => {
                    return StreamEnd::Failed {
                        kind: FailureKind::Stream,
                        message: "the stream ended without a finish reason".into(),
                    }
                }
                Ok(Some(Err(e))) => {
                    return StreamEnd::Failed {
                        kind: FailureKind::Stream,
                        message: e.to_string(),
                    }
                }
                Ok(Some(Ok(bytes))) => bytes,
            };
            let payloads = match lines.push(&bytes) {
                Ok(p) => p,
                Err(message) => {
                    return StreamEnd::Failed {
                        kind: FailureKind::Stream,
                        message,
                    }
                }
            };
            for data in payloads {
                if data.trim() == "[DONE]" {
                    // A stream that ends without a finish reason ended badly.
                    return StreamEnd::Failed {
                        kind: FailureKind::Stream,
                        message: "[DONE] without a finish reason".into(),
                    };
                }
                let chunk = match parse_chunk(&data) {
                    Ok(c) => c,
                    Err(message) => {
                        return StreamEnd::Failed {
                            kind: FailureKind::Stream,
                            message,
                        }
                    }
                };
                if let Some((tokens, cached)) = chunk.prompt {
                    if !progress.prompt_reported {
                        progress.prompt_reported = true;
                        if let Some(c) = cached {
                            self.metrics.prompt_tokens_cached.inc_by(c as u64);
                        }
                        if tx
                            .send(Ok(EngineEvent::Prompt { tokens, cached }))
                            .await
                            .is_err()
                        {
                            return StreamEnd::Cancelled;
                        }
                    }
                }
                if !chunk.text.is_empty() {
                    if first_text {
                        first_text = false;
                        let seconds = sent_at.elapsed().as_secs_f64();
                        self.metrics
                            .engine_time_to_first_token
                            .with_label_values(&[replica.url.as_str()])
                            .observe(seconds);
                        self.first_token(i, seconds);
                    }
                    // Tokens: the server's running count where it gives one.
                    let tokens = match (chunk.generated, generated_base) {
                        (Some(n), Some(base)) => n.saturating_sub(base).max(1),
                        _ => 1,
                    };
                    if let Some(n) = chunk.generated {
                        generated_base = Some(n);
                    }
                    // Cut at the first stop string, looked for only where the
                    // new text can complete one (no copy of the round's text).
                    let before = progress.text.len();
                    let mut from = before.saturating_sub(longest_stop);
                    while !progress.text.is_char_boundary(from) {
                        from -= 1;
                    }
                    let mut text = chunk.text;
                    progress.text.push_str(&text);
                    if self.rounds.is_some() {
                        progress.chunks.push((text.clone(), chunk.ids));
                    }
                    let window = &progress.text[from..];
                    let cut = params
                        .stop
                        .iter()
                        .filter(|s| !s.is_empty())
                        .filter_map(|s| window.find(s.as_str()).map(|at| from + at + s.len()))
                        .filter(|&end| end > before)
                        .min();
                    if let Some(end) = cut {
                        progress.text.truncate(end);
                        text.truncate(end - before);
                    }
                    let stopped = cut.is_some();
                    progress.tokens += tokens;
                    if tx
                        .send(Ok(EngineEvent::Text { text, tokens }))
                        .await
                        .is_err()
                    {
                        return StreamEnd::Cancelled;
                    }
                    if stopped {
                        let _ = tx.send(Ok(EngineEvent::Done(EngineFinish::Stop))).await;
                        return StreamEnd::Done;
                    }
                } else if let Some(n) = chunk.generated {
                    generated_base = Some(n);
                }
                if let Some(finish) = chunk.finish {
                    self.mark_up(i);
                    let _ = tx.send(Ok(EngineEvent::Done(finish))).await;
                    return StreamEnd::Done;
                }
            }
        }
    }
}

#[async_trait]
impl Engine for RemoteEngine {
    fn special_tokens(&self) -> &[String] {
        &self.inner.special_tokens
    }

    /// False while every replica is marked down (until one passes its
    /// readiness probe).
    fn healthy(&self) -> bool {
        self.inner.up_count() > 0
    }

    async fn render_chat(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        self.inner.template.render(messages)
    }

    async fn render_chat_with_tools(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        self.inner.template.render_with_tools(messages, tools)
    }

    /// The length of `text` from a replica's `POST /tokenize` (llama-server:
    /// `{"content"}` → `{"tokens"}`; vLLM: `{"prompt"}` → `{"count",
    /// "tokens"}`; both fields are sent).
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        let inner = &self.inner;
        let Some(i) = inner.pick(None, &[]).await else {
            return Err(EngineError::Internal(
                "no remote engine replica is up to count tokens".into(),
            ));
        };
        inner.done(i);
        inner
            .tokenize(i, text)
            .await
            .map(|ids| ids.len())
            .map_err(|e| EngineError::Internal(format!("tokenize: {e}")))
    }

    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let inner = Arc::clone(&self.inner);
        let mut tried = Vec::new();
        let mut ids = inner.continued_ids(prompt, params.session).await;
        let sent_at = Instant::now();
        let sent = match &ids {
            Some(ids) => json!(ids.as_slice()),
            None => Value::String(prompt.to_string()),
        };
        let (first, response, as_sent) = inner
            .start_anywhere(sent, Some(prompt), params.max_tokens, params, &mut tried)
            .await?;
        if !as_sent {
            // A server refused the token prompt; the round went as text.
            ids = None;
        }
        let (tx, rx) = mpsc::channel(64);
        let (prompt, params) = (prompt.to_string(), params.clone());
        tokio::spawn(async move {
            let mut progress = Progress {
                text: String::new(),
                chunks: Vec::new(),
                tokens: 0,
                prompt_reported: false,
            };
            let (mut replica, mut response, mut sent_at) = (first, response, sent_at);
            let mut ids = ids;
            loop {
                match inner
                    .forward(replica, response, &params, &mut progress, &tx, sent_at)
                    .await
                {
                    StreamEnd::Done | StreamEnd::Cancelled => {
                        let round = tokens::Round {
                            prompt,
                            ids,
                            generated: progress.chunks,
                        };
                        inner.keep_round(params.session, round).await;
                        return;
                    }
                    StreamEnd::Failed { kind, message } => {
                        tried.push(replica);
                        inner.mark_down(replica, kind, &message);
                        // The round goes on elsewhere from what it produced.
                        let left = params.max_tokens.saturating_sub(progress.tokens);
                        if left == 0 {
                            let _ = tx.send(Ok(EngineEvent::Done(EngineFinish::Length))).await;
                            return;
                        }
                        // Resumed as text: the ids kept for the next round are
                        // then the prompt's own tokenization.
                        let resumed = format!("{prompt}{}", progress.text);
                        ids = None;
                        sent_at = Instant::now();
                        match inner
                            .start_anywhere(Value::String(resumed), None, left, &params, &mut tried)
                            .await
                        {
                            Ok((next, next_response, _)) => {
                                tracing::info!(
                                    from = %inner.replica(replica).url,
                                    to = %inner.replica(next).url,
                                    tokens_so_far = progress.tokens,
                                    "round moved to another engine replica"
                                );
                                (replica, response) = (next, next_response);
                            }
                            Err(e) => {
                                let _ = tx.send(Err(e)).await;
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(Generation {
            prompt_tokens: 0,
            events: rx,
        })
    }
}
