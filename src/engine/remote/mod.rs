//! A remote engine: the policy runs on existing inference servers (vLLM,
//! SGLang, llama.cpp's `llama-server`), one or more replicas, driven through
//! the text completions API they all speak. seeker keeps the search loop:
//! the chat template is rendered above the engine
//! ([`crate::engine::text::PolicyText`], so a transcript is the same text
//! whichever engine runs it), it sends the whole transcript each
//! round (the server's own prefix cache reuses what it has already seen) and
//! cuts the round at the closing tag itself.
//!
//! This file holds the public face: [`RemoteConfig`], [`RemoteEngine`],
//! connecting to the replicas (discovery of the model at `GET /v1/models`)
//! and the [`Engine`] impl that the server and the search loop call, and the
//! replicas' tokenizer as a [`TokenCount`]. The
//! rest, each file one job:
//! - `pool.rs`: the replicas, their health and readiness probes, times to
//!   first token and slow replicas, and which replica takes a request (a
//!   rollout stays on its replica while that one is healthy and not slow;
//!   a failed one is marked down, 1 s doubling to 30 s, until a readiness
//!   probe passes);
//! - `request.rs`: the `/v1/completions` request (OpenAI's legacy
//!   completions, `docs/protocols.md` §6), its refusals, and failover (a
//!   round whose replica fails goes on on another from the transcript plus
//!   the text already received, so the client sees one uninterrupted
//!   stream);
//! - `stream.rs`: forwarding a replica's SSE stream, cut at the round's
//!   first stop string (which the server, sent the stop strings with token
//!   continuation, may have dropped: it is read back);
//! - `wire.rs`: the wire format (SSE lines, chunks, context errors);
//! - `tokens.rs`: rounds sent as token ids (`model.token_continuation`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod pool;
mod request;
mod stream;
mod tokens;
mod wire;

use self::pool::{probe_loop, FailureKind, Replica, PROBE_TIMEOUT};
use self::request::{Asked, Started};
use super::text::TokenCount;
use super::{Engine, EngineError, Generation, GenerationParams};
use crate::metrics::Metrics;
use crate::secret::Secret;

/// The `tracing` target of the events of `pool.rs` and `request.rs`: this
/// module's path, as before they were split out of it, so log lines and
/// filters stay the same.
const LOG_TARGET: &str = module_path!();

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

/// What [`RemoteEngine`] shares with its background probe task and its
/// rounds' stream tasks.
struct Inner {
    client: reqwest::Client,
    replicas: Vec<Replica>,
    model: String,
    api_key: Option<Secret>,
    /// Rollout id → the replica its rounds go to.
    sessions: moka::future::Cache<u64, usize>,
    /// New placements so far: stamps each replica's last one, so that
    /// replicas with as many generations in flight take turns.
    placements: std::sync::atomic::AtomicU64,
    read_timeout: Duration,
    metrics: Arc<Metrics>,
    /// Each rollout's last round, for token prompts; `None` with
    /// `token_continuation` off.
    rounds: Option<tokens::Rounds>,
    /// Set once a server refused a token prompt: rounds go out as text.
    text_only: std::sync::atomic::AtomicBool,
    /// Set once a server could not read back the tokens it held back at a
    /// stop string: stop strings are no longer sent (seeker cuts at them).
    client_stops: std::sync::atomic::AtomicBool,
}

impl RemoteEngine {
    /// Connects to the replicas: waits until one of them answers
    /// `GET /v1/models` (retrying every second, with a warning every 10 s:
    /// a server may still be loading its model), taking the model name from
    /// it when `config.model` is `None`. Replicas that do not answer yet are
    /// marked down and probed later. While none answers, each try hands
    /// `waiting` a line that says how long it has waited and what each
    /// replica answered (for the server's 503s).
    ///
    /// # Errors
    /// [`EngineError::Load`] when no URL is configured or a URL is not http(s).
    pub async fn connect(
        config: &RemoteConfig,
        metrics: Arc<Metrics>,
        waiting: impl Fn(String),
    ) -> Result<Self, EngineError> {
        if config.urls.is_empty() {
            return Err(EngineError::Load(
                "model.remote_urls is empty: give the base URL of at least one server".into(),
            ));
        }
        let replicas = config
            .urls
            .iter()
            .map(|url| replica_at(url))
            .collect::<Result<Vec<_>, _>>()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| EngineError::Load(format!("HTTP client: {e}")))?;
        let (model, answering) = discover(&client, &replicas, config, waiting).await?;
        let inner = Arc::new(Inner {
            client,
            replicas,
            model,
            api_key: config.api_key.clone(),
            sessions: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_idle(Duration::from_secs(600))
                .build(),
            placements: std::sync::atomic::AtomicU64::new(0),
            read_timeout: config.read_timeout,
            metrics,
            rounds: config.token_continuation.then(tokens::rounds),
            text_only: std::sync::atomic::AtomicBool::new(false),
            client_stops: std::sync::atomic::AtomicBool::new(false),
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

    /// The replicas' tokenizer as a [`TokenCount`], for the policy's
    /// [`crate::engine::text::PolicyText`].
    pub fn token_count(&self) -> Arc<dyn TokenCount> {
        Arc::new(Tokens(Arc::clone(&self.inner)))
    }
}

/// The replica at `url` (a `model.remote_urls` entry), checked to be an
/// http(s) URL.
fn replica_at(url: &str) -> Result<Replica, EngineError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        EngineError::Load(format!(
            "model.remote_urls: {url}: {e} (a base URL such as http://host:8000)"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(EngineError::Load(format!(
            "model.remote_urls: {url}: not an http(s) URL"
        )));
    }
    // An OpenAI-style base URL (`http://host:8000/v1`) names the
    // same server: seeker appends `/v1/...` itself.
    let base = url.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    Ok(Replica::new(base.to_string()))
}

/// Asks every replica for its models, again every second until one
/// answers (warning every 10 s); returns the model name ([`model_name`])
/// and the replicas that answered. Those that do not answer start marked
/// down (probed again before use).
async fn discover(
    client: &reqwest::Client,
    replicas: &[Replica],
    config: &RemoteConfig,
    waiting: impl Fn(String),
) -> Result<(String, Vec<usize>), EngineError> {
    let started = Instant::now();
    let mut warned = Instant::now();
    let key = config.api_key.as_ref().map(Secret::expose);
    loop {
        let answers = ask_models(client, replicas, key, config.model.is_some()).await;
        if let Some(ids) = answers.ids {
            for failure in &answers.failures {
                tracing::warn!(error = %failure, "engine replica not answering at start; marked down");
            }
            let model = model_name(config.model.as_ref(), ids)?;
            return Ok((model, answers.answering));
        }
        waiting(format!(
            "no remote engine replica answers GET /v1/models yet (waited {} s; {})",
            started.elapsed().as_secs(),
            answers.failures.join("; ")
        ));
        if warned.elapsed() >= Duration::from_secs(10) {
            warned = Instant::now();
            tracing::warn!(
                waited_s = started.elapsed().as_secs(),
                errors = %answers.failures.join("; "),
                "no remote engine replica answers GET /v1/models yet; still trying"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What the replicas answered at `GET /v1/models`, asked once each.
struct Answers {
    /// The ids the first replica that answered lists.
    ids: Option<Vec<String>>,
    /// The replicas that answered, by index.
    answering: Vec<usize>,
    /// `url: error` for each replica that did not.
    failures: Vec<String>,
}

/// Asks each replica in turn for its models ([`list_models`]). When no model
/// name is configured (`named` false), a replica that lists none has not
/// answered: it may still be loading one, and the name is needed.
async fn ask_models(
    client: &reqwest::Client,
    replicas: &[Replica],
    key: Option<&str>,
    named: bool,
) -> Answers {
    let mut answers = Answers {
        ids: None,
        answering: Vec::new(),
        failures: Vec::new(),
    };
    for (i, replica) in replicas.iter().enumerate() {
        match list_models(client, &replica.url, key).await {
            Ok(ids) if ids.is_empty() && !named => answers.failures.push(format!(
                "{}: lists no model at GET /v1/models (set model.remote_model to name it)",
                replica.url
            )),
            Ok(ids) => {
                answers.answering.push(i);
                answers.ids.get_or_insert(ids);
            }
            Err(e) => answers.failures.push(format!("{}: {e}", replica.url)),
        }
    }
    answers
}

/// The model name to send: the configured one (with a warning when the
/// server lists others but not it), else the first of `ids`, the models a
/// server lists.
///
/// # Errors
/// [`EngineError::Load`] when none is configured and the server lists none.
fn model_name(configured: Option<&String>, ids: Vec<String>) -> Result<String, EngineError> {
    match configured {
        Some(name) => {
            if !ids.is_empty() && !ids.contains(name) {
                tracing::warn!(
                    remote_model = %name,
                    listed = %ids.join(", "),
                    "model.remote_model is not among the models the server \
                     lists; servers that check the name will refuse requests"
                );
            }
            Ok(name.clone())
        }
        None => ids.into_iter().next().ok_or_else(|| {
            EngineError::Load("the remote server lists no model; set model.remote_model".into())
        }),
    }
}

/// A reqwest error with its root cause (its Display hides it): "error
/// sending request for url (…): Connection refused (os error 111)".
fn with_cause(e: &reqwest::Error) -> String {
    let mut cause = None;
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = Some(s.to_string());
        source = s.source();
    }
    match cause {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
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
    let response = request.send().await.map_err(|e| with_cause(&e))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let body: Value = response.json().await.map_err(|e| with_cause(&e))?;
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

/// A remote engine's tokenizer: its replicas' `POST /tokenize` (see
/// [`RemoteEngine::token_count`]).
struct Tokens(Arc<Inner>);

#[async_trait]
impl TokenCount for Tokens {
    /// The length of `text` from a replica's `POST /tokenize` (llama-server:
    /// `{"content"}` → `{"tokens"}`; vLLM: `{"prompt"}` → `{"count",
    /// "tokens"}`; both fields are sent).
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        let inner = &self.0;
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
}

#[async_trait]
impl Engine for RemoteEngine {
    /// False while every replica is marked down (until one passes its
    /// readiness probe).
    fn healthy(&self) -> bool {
        self.inner.up_count() > 0
    }

    /// Starts the round on a replica (the choice: `pool.rs`), then streams it
    /// from a task that moves it to another replica when that one fails.
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
        let (replica, response, as_sent) = inner
            .start_anywhere(sent, Some(prompt), params.max_tokens, params, &mut tried)
            .await?;
        if !as_sent {
            // A server refused the token prompt; the round went as text.
            ids = None;
        }
        let (tx, rx) = mpsc::channel(64);
        let asked = Asked {
            prompt: prompt.to_string(),
            ids,
            params: params.clone(),
            keeper: inner.begin_round(params.session).await,
        };
        let started = Started {
            replica,
            response,
            sent_at,
        };
        tokio::spawn(async move { inner.relay(asked, started, tried, tx).await });
        Ok(Generation {
            prompt_tokens: 0,
            events: rx,
        })
    }
}
