//! `POST /v1/responses`: OpenAI's Responses API over the same rollout as
//! chat completions. The request becomes a chat request ([`to_chat`], in
//! `convert`; its input items are read in `input`) and goes through the
//! same validation, deadline and shutdown handling ([`super::chat`]);
//! [`render::ResponseWriter`] turns the rollout's events
//! into output items (`reasoning`, one `web_search_call` per search round or
//! page read, the answer's `message` with `url_citation` annotations) and,
//! streamed, into the documented event sequence.
//!
//! Nothing is stored (`store: false` semantics): `previous_response_id` is a
//! 400, and a client continues a conversation by sending it whole as `input`
//! (the `reasoning` and `web_search_call` items of earlier responses may be
//! sent back; they are skipped).

mod convert;
mod input;
pub(crate) mod render;
pub mod types;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::chat::{context, run_collecting, spawn_rollout};
use super::error::{ApiError, ErrorBody};
use super::json::{ApiJson, RequestBody};
use super::observe::Observer;
use super::render::ResponseMeta;
use super::validate::validate;
use super::AppState;
use convert::to_chat;
use render::{ResponseWriter, StreamEvent};
use types::{ResponseObject, ResponseStreamEvent, ResponsesRequest};

impl RequestBody for ResponsesRequest {
    fn check_shape(body: &[u8]) -> Result<(), ApiError> {
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
            return Ok(()); // `parse` reports what is wrong with it
        };
        for key in ["search", "metadata"] {
            if body
                .get(key)
                .is_some_and(|v| !(v.is_object() || v.is_null()))
            {
                return Err(ApiError::invalid_field(
                    key,
                    format!("{key}: invalid type: expected an object"),
                ));
            }
        }
        Ok(())
    }
}

/// Runs a search-augmented response: the policy reasons, searches (every
/// query of a round at once, one `web_search_call` item per round), reads
/// and answers; the answer's `message` carries `url_citation` annotations.
/// With `stream: true` the body is `text/event-stream`: `event: TYPE` and
/// `data: JSON` per event, `sequence_number` from 0, ending with
/// `response.completed`, `response.incomplete` or `response.failed` (no
/// `[DONE]`).
#[utoipa::path(post, path = "/v1/responses", tag = "openai", security(("bearer" = [])),
    request_body(content = ResponsesRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The response (`stream: false`) or an SSE stream of events (`stream: true`)",
            content((ResponseObject = "application/json"), (ResponseStreamEvent = "text/event-stream"))),
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
pub(crate) async fn create_response(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<ResponsesRequest>,
) -> Response {
    let started = Instant::now();
    let include_sources = request
        .include
        .as_ref()
        .is_some_and(|i| i.iter().any(|v| v == "web_search_call.action.sources"));
    let echo = Echo::of(&request);
    let (chat, params) = match to_chat(request) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let validated = match validate(&state, chat) {
        Ok(v) => v,
        Err(e) => return params.rename(e).into_response(),
    };
    let ctx = match context(&state, &validated) {
        Ok(ctx) => ctx,
        Err(e) => return e.into_response(),
    };
    let mut meta = ResponseMeta::new(
        state.model_id.clone(),
        validated.profile.name.clone(),
        validated.return_transcript,
    );
    meta.id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let created = echo.object(&meta);
    let mut writer = ResponseWriter::new(created, meta, include_sources);
    let mut observer = Observer::new(Arc::clone(&state.metrics), started);

    if !validated.stream {
        let ended = run_collecting(&state, started, &ctx, &validated.rollout, |event| {
            observer.on_event(&event);
            writer.event(event);
        })
        .await;
        return match ended {
            Ok(outcome) => {
                observer.finish(&outcome);
                writer.finish(&outcome);
                Json(writer.response()).into_response()
            }
            Err(e) => {
                observer.fail();
                e.into_response()
            }
        };
    }

    // The rollout stops at once when this stream (and so `rx`) is dropped.
    let (mut rx, ended) = spawn_rollout(&state, started, ctx, validated.rollout);
    let events = async_stream::stream! {
        for e in writer.start() {
            yield Ok::<_, Infallible>(sse(&e));
        }
        while let Some(event) = rx.recv().await {
            observer.on_event(&event);
            for e in writer.event(event) {
                yield Ok(sse(&e));
            }
        }
        let last = match ended.await {
            Ok(outcome) => {
                observer.finish(&outcome);
                writer.finish(&outcome)
            }
            Err(e) => {
                observer.fail();
                writer.fail(&e)
            }
        };
        for e in last {
            yield Ok(sse(&e));
        }
    };
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
        .into_response()
}

fn sse(event: &StreamEvent) -> Event {
    Event::default()
        .event(event.kind)
        .data(serde_json::to_string(&event.data).expect("event serialises"))
}

/// What the response object repeats from the request.
struct Echo {
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    metadata: Value,
}

impl Echo {
    fn of(request: &ResponsesRequest) -> Self {
        Self {
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            tools: request.tools.clone().unwrap_or_default(),
            tool_choice: request.tool_choice.clone().unwrap_or(json!("auto")),
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            metadata: request
                .metadata
                .clone()
                .filter(Value::is_object)
                .unwrap_or(json!({})),
        }
    }

    /// The response as created: `in_progress`, no output yet.
    fn object(self, meta: &ResponseMeta) -> ResponseObject {
        ResponseObject {
            id: meta.id.clone(),
            object: crate::server::openai::ResponseTag::Tag,
            created_at: meta.created,
            status: "in_progress".into(),
            error: None,
            incomplete_details: None,
            instructions: self.instructions,
            max_output_tokens: self.max_output_tokens,
            model: meta.model.clone(),
            output: Vec::new(),
            parallel_tool_calls: self.parallel_tool_calls,
            previous_response_id: None,
            store: false,
            temperature: self.temperature,
            top_p: self.top_p,
            text: json!({"format": {"type": "text"}}),
            tool_choice: self.tool_choice,
            tools: self.tools,
            truncation: "disabled".into(),
            usage: None,
            metadata: self.metadata,
            seeker: None,
        }
    }
}
