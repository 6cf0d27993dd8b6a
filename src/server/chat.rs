//! `POST /v1/chat/completions`: parse and validate, run a rollout, render it as
//! SSE chunks or one JSON response.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use tokio::sync::mpsc;

use super::error::{ApiError, ErrorBody, ErrorCode};
use super::openai::{
    ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice, ChunkChoice, ChunkEvent,
    Citation, Delta, ResponseMessage, SeekerChunk, SeekerEvent, SeekerInfo, Usage,
};
use super::AppState;
use crate::engine::{ChatTurn, EngineError, Role};
use crate::metrics::Metrics;
use crate::profile::Profile;
use crate::rollout::{
    self, RolloutContext, RolloutError, RolloutEvent, RolloutOutcome, RolloutRequest,
};

/// Stop strings one request may give (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Largest `search.top_k` a request may ask for.
pub const MAX_TOP_K: u32 = 50;

/// A request that passed validation.
struct Validated {
    rollout: RolloutRequest,
    profile: Arc<Profile>,
    stream: bool,
    include_usage: bool,
    return_transcript: bool,
}

/// Parses a JSON object body into `T`, naming the field at fault in the error.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // serde would also accept a struct written as an array.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            ErrorCode::InvalidJson,
            "the request body must be a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let request = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // serde names a missing top-level field only in its message.
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            let param = if path == "." {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            return ApiError::invalid_field(&param, format!("{param} is required"));
        }
        let malformed = inner.is_syntax() || inner.is_eof();
        if path == "." || malformed && !is_json(body) {
            ApiError::new(
                ErrorCode::InvalidJson,
                format!("the request body is not a valid JSON object: {inner}"),
            )
        } else if malformed {
            // serde_json reports a number or array where an enum's string
            // belongs (`"role": 5`) as a syntax error ("expected value").
            ApiError::invalid_field(&path, format!("{path}: has the wrong type"))
        } else {
            ApiError::invalid_field(
                &path,
                format!("{path}: {}", plain_serde_message(&path, &message)),
            )
        }
    })?;
    // Nothing but whitespace may follow the object.
    de.end().map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("the request body has text after the JSON object: {e}"),
        )
    })?;
    Ok(request)
}

/// Whether `body` is well-formed JSON, whatever its shape.
fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// serde's message with Rust type names put in JSON terms.
fn plain_serde_message(path: &str, message: &str) -> String {
    if path.ends_with(".content") && message.contains("untagged enum MessageContent") {
        return "must be a string or an array of {\"type\": \"text\", \"text\": ...} parts"
            .to_string();
    }
    let message = message.split(" at line ").next().unwrap_or(message);
    let mut out = message.to_string();
    for (rust, json) in [
        ("expected u32", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("a sequence", "an array"),
        ("map", "object"),
    ] {
        out = out.replace(rust, json);
    }
    if let Some(i) = out.find("expected struct ") {
        out.truncate(i);
        out.push_str("expected an object");
    }
    out
}

/// serde's derived structs also accept arrays (`"search": [null, null]` would
/// read as an empty object); an OpenAI object must be a JSON object. Checks
/// every place the request holds an object and names the first that is not.
fn objects_are_objects(body: &[u8]) -> Result<(), ApiError> {
    use serde_json::Value;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Ok(()); // `parse` reports what is wrong with it
    };
    let wrong = |param: String| {
        Err(ApiError::invalid_field(
            &param,
            format!("{param}: invalid type: expected an object"),
        ))
    };
    for key in ["search", "stream_options"] {
        if body
            .get(key)
            .is_some_and(|v| !(v.is_object() || v.is_null()))
        {
            return wrong(key.to_string());
        }
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            if !m.is_object() {
                return wrong(format!("messages[{i}]"));
            }
            if let Some(Value::Array(parts)) = m.get("content") {
                if let Some(j) = parts.iter().position(|p| !p.is_object()) {
                    return wrong(format!("messages[{i}].content[{j}]"));
                }
            }
        }
    }
    Ok(())
}

fn validate(state: &AppState, req: ChatCompletionRequest) -> Result<Validated, ApiError> {
    if let Some(model) = req.model.as_deref() {
        if model != state.model_id && model != "default" {
            return Err(ApiError {
                code: ErrorCode::ModelNotFound,
                message: format!(
                    "the model `{model}` does not exist; this server serves `{}` (alias `default`)",
                    state.model_id
                ),
                param: Some("model".into()),
            });
        }
    }
    if let Some(n) = req.n {
        if n != 1 {
            return Err(ApiError::invalid_field(
                "n",
                "only n = 1 is supported: one rollout per request",
            ));
        }
    }
    if let Some(t) = req.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid_field(
                "temperature",
                "temperature must be between 0 and 2",
            ));
        }
    }
    if let Some(p) = req.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_field("top_p", "top_p must be in (0, 1]"));
        }
    }
    let stop = req.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_field(
            "stop",
            format!("stop takes at most {MAX_STOP_SEQUENCES} strings"),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_field(
            "stop",
            "stop strings must not be empty",
        ));
    }
    let (param, requested) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, Some(n)) => ("max_tokens", Some(n)),
        (None, None) => ("max_tokens", None),
    };
    let limit = state.generation.max_tokens_limit;
    let max_tokens = match requested {
        None => state.generation.max_tokens,
        Some(0) => {
            return Err(ApiError::invalid_field(
                param,
                format!("{param} must be at least 1"),
            ))
        }
        Some(n) if n as usize > limit => {
            return Err(ApiError::invalid_field(
                param,
                format!("{param} must be at most {limit} on this server"),
            ))
        }
        Some(n) => n as usize,
    };
    if req.messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(c) => c.text().map_err(|kind| {
                let message = if kind == "text" {
                    "a text part needs a `text` string".to_string()
                } else {
                    format!("content parts of type `{kind}` are not supported; send text")
                };
                ApiError::invalid_field(&format!("messages[{i}].content"), message)
            })?,
        };
        messages.push(ChatTurn {
            role: m.role.into(),
            content,
        });
    }
    if !messages
        .iter()
        .any(|m| m.role == Role::User && !m.content.trim().is_empty())
    {
        return Err(ApiError::invalid_field(
            "messages",
            "messages must contain a user message with the question",
        ));
    }
    let continue_final_message = req.continue_final_message.unwrap_or(false);
    if continue_final_message && messages.last().map(|m| m.role) != Some(Role::Assistant) {
        return Err(ApiError::invalid_field(
            "continue_final_message",
            "continue_final_message needs the last message to be an assistant message",
        ));
    }
    let profile = state.profile(req.policy.as_deref()).ok_or_else(|| {
        ApiError::invalid_field(
            "policy",
            format!(
                "unknown policy `{}`; this server has: {}",
                req.policy.as_deref().unwrap_or(""),
                state
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    let mut top_k = None;
    let mut backend_choice = None;
    if let Some(search) = &req.search {
        if let Some(backend) = &search.backend {
            if !state.search.has_backend(backend) {
                return Err(ApiError::invalid_field(
                    "search.backend",
                    format!(
                        "unknown search backend `{backend}`; this server has: {}",
                        state.search.backend_names().join(", ")
                    ),
                ));
            }
            backend_choice = Some(backend.clone());
        }
        if let Some(k) = search.top_k {
            if !(1..=MAX_TOP_K).contains(&k) {
                return Err(ApiError::invalid_field(
                    "search.top_k",
                    format!("search.top_k must be between 1 and {MAX_TOP_K}"),
                ));
            }
            top_k = Some(k as usize);
        }
    }
    Ok(Validated {
        rollout: RolloutRequest {
            messages,
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            continue_final_message,
            top_k,
            backend: backend_choice,
            stop,
        },
        profile,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        return_transcript: req.return_transcript.unwrap_or(false),
    })
}

fn engine_error(e: RolloutError) -> ApiError {
    match e {
        RolloutError::Engine(EngineError::ContextLength { .. }) => ApiError {
            code: ErrorCode::ContextLengthExceeded,
            message: format!("{e}; shorten the messages"),
            param: Some("messages".into()),
        },
        RolloutError::NoQuestion => ApiError::invalid_field("messages", e.to_string()),
        RolloutError::NothingToContinue => {
            ApiError::invalid_field("continue_final_message", e.to_string())
        }
        other => {
            tracing::error!(error = %other, "rollout failed");
            ApiError::new(
                ErrorCode::EngineFailure,
                "the engine failed while generating; see the server log",
            )
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn seeker_info(profile: &Profile, outcome: &RolloutOutcome, return_transcript: bool) -> SeekerInfo {
    SeekerInfo {
        policy: profile.name.clone(),
        searches: outcome.searches,
        documents: outcome.documents.iter().map(Citation::from).collect(),
        transcript: return_transcript.then(|| outcome.transcript.clone()),
        rounds: return_transcript.then(|| outcome.rounds.clone()),
    }
}

/// A rollout event as a chunk's `seeker.event`, for the events that are not text.
fn seeker_event(event: &RolloutEvent) -> Option<SeekerEvent> {
    match event {
        RolloutEvent::Search {
            round,
            queries,
            notes,
        } => Some(SeekerEvent::Search {
            round: *round,
            queries: queries.clone(),
            notes: notes.clone(),
        }),
        RolloutEvent::Results(r) => Some(SeekerEvent::Results {
            round: r.round,
            query: r.query.clone(),
            documents: r.documents.iter().map(Citation::from).collect(),
            error: r.error.clone(),
            error_kind: r.error_kind,
            cached: r.cached,
        }),
        RolloutEvent::Reasoning(_) | RolloutEvent::Splice(_) | RolloutEvent::Answer(_) => None,
    }
}

fn usage(outcome: &RolloutOutcome) -> Usage {
    Usage {
        prompt_tokens: outcome.usage.prompt_tokens,
        completion_tokens: outcome.usage.completion_tokens,
        total_tokens: outcome.usage.prompt_tokens + outcome.usage.completion_tokens,
    }
}

/// The body, or the error for one over `limit` bytes or unreadable.
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the request body is larger than {limit} bytes"),
            )
        } else {
            ApiError::new(ErrorCode::InvalidJson, format!("cannot read the body: {e}"))
        }
    })
}

/// A 415 unless the body is declared `application/json` (parameters such as
/// `charset` allowed).
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match declared.as_deref() {
        Some("application/json") => Ok(()),
        Some(other) => Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("the body must be sent as application/json, not {other}"),
        )),
        None => Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be sent with Content-Type: application/json",
        )),
    }
}

/// How a bounded rollout ended.
enum Ended {
    Done(Result<RolloutOutcome, RolloutError>),
    /// The per-request deadline passed.
    Timeout,
    /// The shutdown grace period ended.
    Shutdown,
}

impl Ended {
    /// The outcome, or the error to send.
    fn into_result(self, state: &AppState) -> Result<RolloutOutcome, ApiError> {
        match self {
            Ended::Done(r) => r.map_err(engine_error),
            Ended::Timeout => {
                state.metrics.request_timeouts.inc();
                Err(ApiError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "the request ran past this server's deadline of {} s \
                         (server.request_timeout_s); ask for fewer tokens",
                        state.ops.request_timeout.unwrap_or_default().as_secs()
                    ),
                ))
            }
            Ended::Shutdown => Err(shutting_down()),
        }
    }
}

fn shutting_down() -> ApiError {
    ApiError::new(
        ErrorCode::ShuttingDown,
        "the server is shutting down; retry the request on a running instance",
    )
}

/// Runs `rollout` until it ends, the request's deadline (from `started`)
/// passes, or the server's shutdown grace period ends; the rollout is dropped
/// (and so cancelled) in the last two cases.
async fn bounded(
    state: &AppState,
    started: Instant,
    rollout: impl Future<Output = Result<RolloutOutcome, RolloutError>>,
) -> Ended {
    let deadline = async {
        match state.ops.request_timeout {
            Some(limit) => tokio::time::sleep_until((started + limit).into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = rollout => Ended::Done(result),
        () = deadline => Ended::Timeout,
        () = state.ops.ending() => Ended::Shutdown,
    }
}

/// One request's latency and token metrics, from its rollout events; if it
/// is dropped before [`Observer::finish`] or [`Observer::fail`], the client
/// left, and that is counted with the phase it left in.
struct Observer {
    metrics: Arc<Metrics>,
    started: Instant,
    first_token: bool,
    first_answer_token: bool,
    /// `before_first_token`, `decode` or `search`.
    phase: &'static str,
    done: bool,
}

impl Observer {
    fn new(metrics: Arc<Metrics>, started: Instant) -> Self {
        Self {
            metrics,
            started,
            first_token: false,
            first_answer_token: false,
            phase: "before_first_token",
            done: false,
        }
    }

    fn on_event(&mut self, event: &RolloutEvent) {
        let seconds = self.started.elapsed().as_secs_f64();
        match event {
            RolloutEvent::Reasoning(_) | RolloutEvent::Answer(_) => {
                if !self.first_token {
                    self.first_token = true;
                    self.metrics.time_to_first_token.observe(seconds);
                }
                if matches!(event, RolloutEvent::Answer(_)) && !self.first_answer_token {
                    self.first_answer_token = true;
                    self.metrics.time_to_first_answer_token.observe(seconds);
                }
                self.phase = "decode";
            }
            RolloutEvent::Search { .. } => self.phase = "search",
            // After a splice the engine runs again; the question search's
            // splice comes before any token (its prefill is still ahead).
            RolloutEvent::Splice(_) if self.first_token => self.phase = "decode",
            RolloutEvent::Splice(_) => self.phase = "before_first_token",
            RolloutEvent::Results(_) => {}
        }
    }

    fn finish(&mut self, outcome: &RolloutOutcome) {
        self.done = true;
        let m = &self.metrics;
        m.rollout_duration
            .observe(self.started.elapsed().as_secs_f64());
        m.prompt_tokens.inc_by(outcome.usage.prompt_tokens as u64);
        m.generated_tokens
            .inc_by(outcome.usage.completion_tokens as u64);
        let rounds = outcome.rounds.iter().filter(|r| r.round > 0).count();
        m.rollout_rounds.observe(rounds as f64);
    }

    fn fail(&mut self) {
        self.done = true;
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .client_disconnects
                .with_label_values(&[self.phase])
                .inc();
            tracing::info!(phase = self.phase, "client left; request cancelled");
        }
    }
}

/// Runs a search-augmented chat completion: the policy reasons, searches
/// (every query of a round at once), reads the spliced documents and answers.
/// With `stream: true` the response is `text/event-stream`: `data:` lines of
/// `chat.completion.chunk` JSON, `reasoning_content` for the trace and
/// `content` for the answer, search events in `seeker.event`, then
/// `data: [DONE]`. An error after the stream started is sent as a `data:`
/// event in the error shape, then `[DONE]`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai", security(("bearer" = [])),
    request_body(content = ChatCompletionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion (`stream: false`) or an SSE stream of chunks (`stream: true`)",
            content((ChatCompletion = "application/json"), (ChunkEvent = "text/event-stream"))),
        (status = 400, description = "Invalid JSON or field (`param` names it), or context length exceeded", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 408, description = "Body not received within `server.body_timeout_s`", body = ErrorBody),
        (status = 413, description = "Body over `server.max_body_bytes`", body = ErrorBody),
        (status = 415, description = "Body not sent as application/json", body = ErrorBody),
        (status = 429, description = "`server.max_concurrent_requests` running",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
        (status = 500, description = "The engine failed", body = ErrorBody),
        (status = 503, description = "The model is loading, or the server is shutting down", body = ErrorBody),
        (status = 504, description = "`server.request_timeout_s` passed", body = ErrorBody),
    ))]
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let body =
        match require_json(&headers).and_then(|()| body_bytes(body, state.ops.max_body_bytes)) {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
    let validated = match objects_are_objects(&body)
        .and_then(|()| parse::<ChatCompletionRequest>(&body))
        .and_then(|req| validate(&state, req))
    {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(engine) = state.engine() else {
        return ApiError::new(
            ErrorCode::ModelLoading,
            "the model is still loading; retry shortly",
        )
        .into_response();
    };
    if state.ops.is_ending() {
        return shutting_down().into_response();
    }
    let ctx = RolloutContext {
        engine,
        search: Arc::clone(&state.search),
        profile: Arc::clone(&validated.profile),
    };
    if validated.stream {
        stream(state, ctx, validated, started).into_response()
    } else {
        complete(state, ctx, validated, started).await
    }
}

async fn complete(
    state: Arc<AppState>,
    ctx: RolloutContext,
    validated: Validated,
    started: Instant,
) -> Response {
    let request = validated.rollout;
    let mut observer = Observer::new(Arc::clone(&state.metrics), started);
    let (tx, mut rx) = mpsc::channel(64);
    let run = async {
        let ended = bounded(&state, started, rollout::run(&ctx, &request, &tx)).await;
        drop(tx);
        ended
    };
    let collect = async {
        let mut reasoning = String::new();
        while let Some(event) = rx.recv().await {
            observer.on_event(&event);
            if let RolloutEvent::Reasoning(text) | RolloutEvent::Splice(text) = event {
                reasoning.push_str(&text);
            }
        }
        reasoning
    };
    let (ended, reasoning) = tokio::join!(run, collect);
    let outcome = match ended.into_result(&state) {
        Ok(o) => o,
        Err(e) => {
            observer.fail();
            return e.into_response();
        }
    };
    observer.finish(&outcome);
    Json(ChatCompletion {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        object: "chat.completion".into(),
        created: now(),
        model: state.model_id.clone(),
        choices: vec![Choice {
            index: 0,
            message: ResponseMessage {
                role: "assistant".into(),
                content: outcome.answer.clone(),
                reasoning_content: reasoning,
            },
            finish_reason: finish_reason(&outcome),
        }],
        usage: usage(&outcome),
        seeker: seeker_info(&validated.profile, &outcome, validated.return_transcript),
    })
    .into_response()
}

fn finish_reason(outcome: &RolloutOutcome) -> String {
    serde_json::to_value(outcome.finish_reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "stop".into())
}

/// Writes the `chat.completion.chunk` events of one response.
struct ChunkWriter {
    id: String,
    created: u64,
    model: String,
}

impl ChunkWriter {
    fn frame(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Usage>,
        seeker: Option<SeekerChunk>,
    ) -> Event {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            seeker,
        };
        Event::default().data(serde_json::to_string(&chunk).expect("chunk serialises"))
    }

    fn delta(
        &self,
        delta: Delta,
        finish_reason: Option<String>,
        seeker: Option<SeekerChunk>,
    ) -> Event {
        let choice = ChunkChoice {
            index: 0,
            delta,
            finish_reason,
        };
        self.frame(vec![choice], None, seeker)
    }
}

/// Renders the rollout as `chat.completion.chunk` events, then `[DONE]`.
fn stream(
    state: Arc<AppState>,
    ctx: RolloutContext,
    validated: Validated,
    started: Instant,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let request = validated.rollout;
    let (profile, return_transcript) = (validated.profile, validated.return_transcript);
    let include_usage = validated.include_usage;
    let (tx, mut rx) = mpsc::channel(64);
    // The rollout stops at once when this stream (and so `rx`) is dropped.
    let task = {
        let state = Arc::clone(&state);
        tokio::spawn(
            async move { bounded(&state, started, rollout::run(&ctx, &request, &tx)).await },
        )
    };
    let mut observer = Observer::new(Arc::clone(&state.metrics), started);
    let writer = ChunkWriter {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: now(),
        model: state.model_id.clone(),
    };
    let events = async_stream::stream! {
        yield Ok(writer.delta(Delta { role: Some("assistant".into()), ..Delta::default() }, None, None));
        while let Some(event) = rx.recv().await {
            observer.on_event(&event);
            if let Some(event) = seeker_event(&event) {
                yield Ok(writer.delta(Delta::default(), None, Some(SeekerChunk::Event { event })));
                continue;
            }
            let delta = match event {
                RolloutEvent::Splice(text) => {
                    // Spliced text is trace too, marked so clients can tell it from
                    // generated text.
                    let delta = Delta { reasoning_content: Some(text), ..Delta::default() };
                    let event = SeekerEvent::Splice;
                    yield Ok(writer.delta(delta, None, Some(SeekerChunk::Event { event })));
                    continue;
                }
                RolloutEvent::Reasoning(text) => Delta { reasoning_content: Some(text), ..Delta::default() },
                RolloutEvent::Answer(text) => Delta { content: Some(text), ..Delta::default() },
                RolloutEvent::Search { .. } | RolloutEvent::Results(_) => continue,
            };
            yield Ok(writer.delta(delta, None, None));
        }
        match task.await.map(|ended| ended.into_result(&state)) {
            Ok(Ok(outcome)) => {
                observer.finish(&outcome);
                let info = seeker_info(&profile, &outcome, return_transcript);
                yield Ok(writer.delta(Delta::default(), Some(finish_reason(&outcome)), Some(SeekerChunk::Final(info))));
                if include_usage {
                    yield Ok(writer.frame(Vec::new(), Some(usage(&outcome)), None));
                }
            }
            Ok(Err(e)) => {
                observer.fail();
                yield Ok(Event::default().data(e.to_json()));
            }
            Err(e) => {
                observer.fail();
                tracing::error!(error = %e, "rollout task failed");
                let err = ApiError::new(ErrorCode::EngineFailure, "the rollout failed; see the server log");
                yield Ok(Event::default().data(err.to_json()));
            }
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}
