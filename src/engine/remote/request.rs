//! Requests to the replicas: the `/v1/completions` body, one request to one
//! replica and how its refusal is read, the choice of another replica when
//! one fails before its stream starts ([`Inner::start_anywhere`]), and the
//! failover of a round whose stream broke ([`Inner::relay`]).
//!
//! Seam: the `Engine` impl in `mod.rs` starts each round with
//! [`Inner::start_anywhere`] and hands the started stream to
//! [`Inner::relay`], which forwards it with `stream.rs` and, when the
//! replica fails mid-stream, starts the rest of the round here again.
//! Replicas come from, and failures go to, `pool.rs`.
//!
//! Protocol (OpenAI's legacy completions, `docs/protocols.md` §6):
//! `POST {url}/v1/completions` with `{"model", "prompt", "max_tokens",
//! "temperature", "top_p", "stream": true, "stream_options":
//! {"include_usage": true, "continuous_usage_stats": true},
//! "timings_per_token": true}`, and with token continuation
//! `"return_token_ids": true, "logprobs": 1, "post_sampling_probs": true,
//! "stop": [the round's stop strings], "include_stop_str_in_output": true`
//! (seeker also cuts the stream at them itself, and reads back a stop
//! string the server dropped: `stream.rs`). A replica that refuses a
//! connection, answers 5xx/408/429 or stays silent past the read timeout
//! is marked down and the request goes to another; a 4xx is the request's
//! own fault (a context overflow, or a refused token prompt: then the
//! round goes as text) and the same on every replica. A replica whose
//! stream breaks mid-round is marked down too, and the round goes on on
//! another replica from the transcript plus the text already received, so
//! the client sees one uninterrupted stream.

use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::pool::FailureKind;
use super::stream::{Events, Progress, StreamEnd};
use super::tokens;
use super::wire::context_overflow;
use super::{Inner, LOG_TARGET};
use crate::engine::{EngineError, EngineEvent, EngineFinish, GenerationParams};

/// Error bodies read at most (they go to the log).
const MAX_ERROR_BODY: usize = 4096;

/// Why one request to one replica did not start a stream.
enum Refusal {
    /// The replica failed: try another.
    Replica { kind: FailureKind, message: String },
    /// The request itself is refused (the same on every replica).
    Request(EngineError),
}

/// A round the engine was asked for, as it first went out.
pub(super) struct Asked {
    /// The transcript (the rendered prompt), as text.
    pub(super) prompt: String,
    /// The token ids it went out as; `None` when it went out as text.
    pub(super) ids: Option<Arc<Vec<u32>>>,
    /// The round's sampling settings, stop strings and session.
    pub(super) params: GenerationParams,
    /// Keeps the round for the next one's token prompt.
    pub(super) keeper: tokens::Keeper,
}

/// A round's stream as it started: the replica, its response (headers read,
/// status 200) and when the request was sent.
pub(super) struct Started {
    pub(super) replica: usize,
    pub(super) response: reqwest::Response,
    pub(super) sent_at: Instant,
}

impl Inner {
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
            // `post_sampling_probs` has llama-server take the sampled
            // token's probability from the candidates left after sampling
            // instead of a softmax over the whole vocabulary: the same ids,
            // 1.4 % less time a token on the default model
            // (`bench/stream_cost.py`, bench/README.md).
            body["return_token_ids"] = json!(true);
            body["logprobs"] = json!(1);
            body["post_sampling_probs"] = json!(true);
            // The server stops at the round's stop strings itself: cut by
            // seeker alone, it had already begun the next token when the
            // connection closed, and finished it before taking the next
            // round (bench/README.md, "Per-question cost"). The ids above
            // are how seeker reads back a stop string llama-server drops;
            // vLLM keeps it in the text when asked.
            if !params.stop.is_empty() && !self.client_stops.load(Ordering::Relaxed) {
                body["stop"] = json!(params.stop);
                body["include_stop_str_in_output"] = json!(true);
            }
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
    pub(super) async fn start_anywhere(
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

    /// Streams a started round to `tx` until it ends. A replica that fails
    /// mid-stream is marked down and the round goes on on another replica
    /// (not one of `tried`) from the transcript plus the text already
    /// received, sent as text, for the tokens left (none left ends it with
    /// [`EngineFinish::Length`]; no replica left sends the error). However
    /// it ends, a finished or abandoned round is kept for the next round's
    /// token prompt ([`Inner::keep_round`]).
    pub(super) async fn relay(
        &self,
        asked: Asked,
        started: Started,
        mut tried: Vec<usize>,
        tx: Events,
    ) {
        let Asked {
            prompt,
            mut ids,
            params,
            keeper,
        } = asked;
        let mut progress = Progress::default();
        let Started {
            mut replica,
            mut response,
            mut sent_at,
        } = started;
        loop {
            match self
                .forward(replica, response, &params, &mut progress, &tx, sent_at)
                .await
            {
                end @ (StreamEnd::Done(_) | StreamEnd::Cancelled) => {
                    let round = tokens::Round {
                        prompt,
                        ids,
                        generated: progress.chunks,
                    };
                    Self::keep_round(keeper, round);
                    if let StreamEnd::Done(finish) = end {
                        let _ = tx.send(Ok(EngineEvent::Done(finish))).await;
                    }
                    return;
                }
                StreamEnd::Failed { kind, message } => {
                    tried.push(replica);
                    self.mark_down(replica, kind, &message);
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
                    match self
                        .start_anywhere(Value::String(resumed), None, left, &params, &mut tried)
                        .await
                    {
                        Ok((next, next_response, _)) => {
                            tracing::info!(
                                target: LOG_TARGET,
                                from = %self.replica(replica).url,
                                to = %self.replica(next).url,
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
