//! `POST /v1/chat/completions`: a validated request ([`super::validate`])
//! runs as a rollout, bounded by the request deadline and the shutdown grace
//! period, observed for metrics (`observe`) and rendered
//! (`render`) as SSE chunks or one JSON response.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use tokio::sync::mpsc;

use super::error::{ApiError, ErrorBody, ErrorCode};
use super::json::ApiJson;
use super::observe::Observer;
use super::openai::{ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChunkEvent};
use super::render::{self, ChunkWriter, ResponseMeta};
use super::validate::{validate, Validated};
use super::AppState;
use crate::rollout::{
    self, RolloutContext, RolloutError, RolloutEvent, RolloutOutcome, RolloutRequest,
};

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
pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<ChatCompletionRequest>,
) -> Response {
    let started = Instant::now();
    let validated = match validate(&state, request) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let ctx = match context(&state, &validated) {
        Ok(ctx) => ctx,
        Err(e) => return e.into_response(),
    };
    let meta = ResponseMeta::new(
        state.model_id.clone(),
        validated.profile.name.clone(),
        validated.return_transcript,
    );
    if validated.stream {
        stream(state, ctx, validated, meta, started).into_response()
    } else {
        complete(state, ctx, validated, meta, started).await
    }
}

/// What a validated request's rollout runs with.
///
/// # Errors
/// 503 while the model loads or once the server is shutting down.
pub(super) fn context(state: &AppState, validated: &Validated) -> Result<RolloutContext, ApiError> {
    let Some((engine, text)) = state.loaded() else {
        return Err(ApiError::new(
            ErrorCode::ModelLoading,
            state.loading_message(),
        ));
    };
    if state.ops.is_ending() {
        return Err(shutting_down());
    }
    Ok(RolloutContext {
        engine,
        text,
        search: Arc::clone(&state.search),
        profile: Arc::clone(&validated.profile),
    })
}

async fn complete(
    state: Arc<AppState>,
    ctx: RolloutContext,
    validated: Validated,
    meta: ResponseMeta,
    started: Instant,
) -> Response {
    let mut observer = Observer::new(Arc::clone(&state.metrics), started);
    let mut reasoning = String::new();
    let ended = run_collecting(&state, started, &ctx, &validated.rollout, |event| {
        observer.on_event(&event);
        if let Some(text) = render::trace_text(&event) {
            reasoning.push_str(text);
        }
    })
    .await;
    let outcome = match ended {
        Ok(o) => o,
        Err(e) => {
            observer.fail();
            return e.into_response();
        }
    };
    observer.finish(&outcome);
    let response: ChatCompletion = render::completion(&meta, &outcome, reasoning);
    Json(response).into_response()
}

/// One chunk as an SSE `data:` event.
fn sse(chunk: &ChatCompletionChunk) -> Event {
    Event::default().data(serde_json::to_string(chunk).expect("chunk serialises"))
}

/// Renders the rollout as `chat.completion.chunk` events, then `[DONE]`.
fn stream(
    state: Arc<AppState>,
    ctx: RolloutContext,
    validated: Validated,
    meta: ResponseMeta,
    started: Instant,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let include_usage = validated.include_usage;
    let (mut rx, ended) = spawn_rollout(&state, started, ctx, validated.rollout);
    let mut observer = Observer::new(Arc::clone(&state.metrics), started);
    let writer = ChunkWriter::new(meta);
    let events = async_stream::stream! {
        yield Ok(sse(&writer.role()));
        while let Some(event) = rx.recv().await {
            observer.on_event(&event);
            yield Ok(sse(&writer.event(event)));
        }
        match ended.await {
            Ok(outcome) => {
                observer.finish(&outcome);
                if let Some(calls) = writer.tool_calls(&outcome) {
                    yield Ok(sse(&calls));
                }
                yield Ok(sse(&writer.finish(&outcome)));
                if include_usage {
                    yield Ok(sse(&writer.usage(&outcome)));
                }
            }
            Err(e) => {
                observer.fail();
                yield Ok(Event::default().data(e.to_json()));
            }
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}

/// Runs one rollout to its end within the request's bounds ([`bounded`]),
/// giving each event to `on_event` as it comes (the non-streamed routes:
/// chat, Responses, MCP `research`).
pub(super) async fn run_collecting(
    state: &AppState,
    started: Instant,
    ctx: &RolloutContext,
    request: &RolloutRequest,
    mut on_event: impl FnMut(RolloutEvent),
) -> Result<RolloutOutcome, ApiError> {
    let (tx, mut rx) = mpsc::channel(64);
    let run = async {
        let ended = bounded(state, started, rollout::run(ctx, request, &tx)).await;
        drop(tx);
        ended
    };
    let collect = async {
        while let Some(event) = rx.recv().await {
            on_event(event);
        }
    };
    let (ended, ()) = tokio::join!(run, collect);
    ended.into_result(state)
}

/// Starts one rollout on its own task within the request's bounds (the
/// streamed routes): its events, and its end (an engine task that panicked
/// is an `engine_error`). Dropping the receiver stops the rollout at once.
pub(super) fn spawn_rollout(
    state: &Arc<AppState>,
    started: Instant,
    ctx: RolloutContext,
    request: RolloutRequest,
) -> (
    mpsc::Receiver<RolloutEvent>,
    impl Future<Output = Result<RolloutOutcome, ApiError>>,
) {
    let (tx, rx) = mpsc::channel(64);
    let task = {
        let state = Arc::clone(state);
        tokio::spawn(
            async move { bounded(&state, started, rollout::run(&ctx, &request, &tx)).await },
        )
    };
    let state = Arc::clone(state);
    let ended = async move {
        match task.await {
            Ok(ended) => ended.into_result(&state),
            Err(e) => {
                tracing::error!(error = %e, "rollout task failed");
                Err(ApiError::new(
                    ErrorCode::EngineFailure,
                    "the rollout failed; see the server log",
                ))
            }
        }
    };
    (rx, ended)
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
            Ended::Done(r) => r.map_err(ApiError::from),
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
