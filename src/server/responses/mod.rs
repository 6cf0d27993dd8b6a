//! `POST /v1/responses`: OpenAI's Responses API over the same rollout as
//! chat completions. The request becomes a chat request ([`to_chat`]) and
//! goes through the same validation, deadline and shutdown handling
//! ([`super::chat`]); [`render::ResponseWriter`] turns the rollout's events
//! into output items (`reasoning`, one `web_search_call` per search round or
//! page read, the answer's `message` with `url_citation` annotations) and,
//! streamed, into the documented event sequence.
//!
//! Nothing is stored (`store: false` semantics): `previous_response_id` is a
//! 400, and a client continues a conversation by sending it whole as `input`
//! (the `reasoning` and `web_search_call` items of earlier responses may be
//! sent back; they are skipped).

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
use super::openai::{
    ChatCompletionRequest, ChatMessage, FunctionCall, FunctionSpec, MessageContent, MessageRole,
    ToolCallObject, ToolSpec,
};
use super::render::ResponseMeta;
use super::validate::validate;
use super::AppState;
use render::{ResponseWriter, StreamEvent};
use types::{ResponseObject, ResponseStreamEvent, ResponsesRequest};

/// `include` values OpenAI defines (openai-python 3.57 `ResponseIncludable`).
const INCLUDABLE: &[&str] = &[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
];

/// Tool types that name web search (OpenAI's current and dated names).
const WEB_SEARCH_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
];

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
            object: "response".into(),
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

/// Where each chat message came from in the Responses request, to name the
/// right field when chat validation refuses one.
struct Params {
    /// Per chat message: the field it came from (`instructions`, `input`,
    /// `input[i]`) and the field of its text (`instructions`, `input`,
    /// `input[i].content`).
    messages: Vec<(String, String)>,
    /// Per chat tool (the function tools), its index in the request's `tools`.
    tools: Vec<usize>,
}

impl Params {
    fn push(&mut self, field: impl Into<String>, text: impl Into<String>) {
        self.messages.push((field.into(), text.into()));
    }

    /// `error` with its `param` and message in the Responses request's terms.
    fn rename(&self, mut error: ApiError) -> ApiError {
        let mut names: Vec<(String, String)> = Vec::new();
        for (k, (field, text)) in self.messages.iter().enumerate() {
            names.push((format!("messages[{k}].content"), text.clone()));
            names.push((format!("messages[{k}]"), field.clone()));
        }
        // Longest first: `messages[1]` must not rewrite `messages[12]`.
        names.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        names.push(("messages".into(), "input".into()));
        names.push(("max_completion_tokens".into(), "max_output_tokens".into()));
        // `tools[k].function.name` of the chat request is `tools[i].name`
        // here (web search tools are not passed on), rewritten in one pass.
        let tools = regex::Regex::new(r"tools\[(\d+)\](\.function)?").expect("regex");
        let rewrite = |text: &str| {
            let mut out = text.to_string();
            for (from, to) in &names {
                out = out.replace(from.as_str(), to);
            }
            tools
                .replace_all(&out, |c: &regex::Captures<'_>| {
                    let k: usize = c[1].parse().unwrap_or(usize::MAX);
                    let i = self.tools.get(k).copied().unwrap_or(k);
                    format!("tools[{i}]")
                })
                .into_owned()
        };
        error.param = error.param.as_deref().map(rewrite);
        error.message = rewrite(&error.message);
        error
    }
}

/// The chat request a Responses request runs as.
///
/// # Errors
/// 400 naming the field: an input that is neither a string nor an array of
/// items, an item or content part seeker cannot run (files, images, function
/// calls), a tool other than web search, `tool_choice: "none"`, an unknown
/// `include` value, or `previous_response_id`.
fn to_chat(request: ResponsesRequest) -> Result<(ChatCompletionRequest, Params), ApiError> {
    if request.previous_response_id.is_some() {
        return Err(ApiError::invalid_field(
            "previous_response_id",
            "this server stores no responses; send the whole conversation as `input`",
        ));
    }
    // Web search is what the policy does; function tools are the client's.
    let mut functions = Vec::new();
    let mut function_at = Vec::new();
    for (i, tool) in request.tools.iter().flatten().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if WEB_SEARCH_TOOLS.contains(&kind) {
            continue;
        }
        if kind != "function" {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}]"),
                format!(
                    "tools of type `{}` are not supported here; give web search \
                     (`{{\"type\": \"web_search\"}}`, run by the policy) or functions",
                    super::error::clip(kind)
                ),
            ));
        }
        functions.push(function_tool(i, tool)?);
        function_at.push(i);
    }
    let tool_choice =
        match &request.tool_choice {
            None => None,
            Some(Value::String(s)) if s == "auto" || s == "required" || s == "none" => {
                if functions.is_empty() {
                    // Only web search: the policy decides when to search.
                    if s != "auto" {
                        return Err(ApiError::invalid_field(
                            "tool_choice",
                            format!(
                                "tool_choice `{s}` needs function tools: with web search \
                                 alone the policy decides when to search"
                            ),
                        ));
                    }
                    None
                } else {
                    Some(Value::String(s.clone()))
                }
            }
            Some(Value::Object(o))
                if o.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| WEB_SEARCH_TOOLS.contains(&t)) =>
            {
                None
            }
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                match o.get("name").and_then(Value::as_str) {
                    Some(name) => Some(json!({"type": "function", "function": {"name": name}})),
                    None => {
                        return Err(ApiError::invalid_field(
                            "tool_choice",
                            "a function tool_choice needs `name`",
                        ))
                    }
                }
            }
            Some(_) => return Err(ApiError::invalid_field(
                "tool_choice",
                "tool_choice must be `auto`, `required`, `none` (functions only), a web_search \
                 tool or {\"type\": \"function\", \"name\"}",
            )),
        };
    for (i, value) in request.include.iter().flatten().enumerate() {
        if !INCLUDABLE.contains(&value.as_str()) {
            return Err(ApiError::invalid_field(
                &format!("include[{i}]"),
                format!(
                    "unknown include value `{}`; known: {}",
                    super::error::clip(value),
                    INCLUDABLE.join(", ")
                ),
            ));
        }
    }
    let mut messages = Vec::new();
    let mut params = Params {
        messages: Vec::new(),
        tools: function_at,
    };
    if let Some(instructions) = request.instructions {
        messages.push(text_message(MessageRole::System, instructions));
        params.push("instructions", "instructions");
    }
    match request.input {
        Value::String(question) => {
            messages.push(text_message(MessageRole::User, question));
            params.push("input", "input");
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match input_item(i, item)? {
                    Some(Input::Message(m)) => {
                        messages.push(m);
                        params.push(format!("input[{i}]"), format!("input[{i}].content"));
                    }
                    // Calls the model made in a row are one assistant turn.
                    Some(Input::Call(call)) => match messages.last_mut() {
                        Some(ChatMessage {
                            role: MessageRole::Assistant,
                            tool_calls: Some(calls),
                            ..
                        }) => calls.push(call),
                        _ => {
                            messages.push(ChatMessage {
                                role: MessageRole::Assistant,
                                tool_calls: Some(vec![call]),
                                ..ChatMessage::default()
                            });
                            params.push(format!("input[{i}]"), format!("input[{i}]"));
                        }
                    },
                    None => {}
                }
            }
        }
        _ => {
            return Err(ApiError::invalid_field(
                "input",
                "input must be a string or an array of input items",
            ))
        }
    }
    let chat = ChatCompletionRequest {
        model: request.model,
        messages,
        stream: request.stream,
        stream_options: None,
        max_tokens: None,
        max_completion_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        n: None,
        stop: None,
        seed: None,
        user: request.user,
        policy: request.policy,
        continue_final_message: None,
        return_transcript: request.return_transcript,
        search: request.search,
        tools: (!functions.is_empty()).then_some(functions),
        tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
    };
    Ok((chat, params))
}

fn text_message(role: MessageRole, text: String) -> ChatMessage {
    ChatMessage {
        role,
        content: Some(MessageContent::Text(text)),
        ..ChatMessage::default()
    }
}

/// A Responses `function` tool (`{"type": "function", "name",
/// "description", "parameters", "strict"}`) as a chat tool.
///
/// # Errors
/// A 400 naming `tools[i].name` when it has no name.
fn function_tool(i: usize, tool: &Value) -> Result<ToolSpec, ApiError> {
    let Some(name) = tool.get("name").and_then(Value::as_str) else {
        return Err(ApiError::invalid_field(
            &format!("tools[{i}].name"),
            "a function tool needs a `name`",
        ));
    };
    Ok(ToolSpec {
        kind: "function".into(),
        function: Some(FunctionSpec {
            name: name.to_string(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters: tool.get("parameters").cloned(),
            strict: tool.get("strict").and_then(Value::as_bool),
        }),
    })
}

/// An input item, as the chat conversation holds it.
enum Input {
    /// A message, or a function's output (a `tool` message).
    Message(ChatMessage),
    /// A function call the model made (part of an assistant turn).
    Call(ToolCallObject),
}

/// One input item; `None` for the items of an earlier response that are
/// skipped (`reasoning`, `web_search_call`).
fn input_item(i: usize, item: &Value) -> Result<Option<Input>, ApiError> {
    let field = |name: &str| format!("input[{i}]{name}");
    let Value::Object(item) = item else {
        return Err(ApiError::invalid_field(
            &field(""),
            format!("input[{i}] must be an object (an input item)"),
        ));
    };
    let kind = match item.get("type") {
        None => "message",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                &field(".type"),
                format!("input[{i}].type must be a string"),
            ))
        }
    };
    let text_of = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_string);
    match kind {
        "message" => {}
        "reasoning" | "web_search_call" => return Ok(None),
        "function_call" => {
            let (Some(call_id), Some(name)) = (text_of("call_id"), text_of("name")) else {
                return Err(ApiError::invalid_field(
                    &field(""),
                    format!("input[{i}] is a function_call: it needs `call_id` and `name`"),
                ));
            };
            return Ok(Some(Input::Call(ToolCallObject {
                id: call_id,
                kind: "function".into(),
                function: FunctionCall {
                    name,
                    arguments: text_of("arguments").unwrap_or_else(|| "{}".into()),
                },
            })));
        }
        "function_call_output" => {
            let Some(call_id) = text_of("call_id") else {
                return Err(ApiError::invalid_field(
                    &field(".call_id"),
                    format!(
                        "input[{i}] is a function_call_output: it needs the `call_id` it answers"
                    ),
                ));
            };
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect(),
                _ => {
                    return Err(ApiError::invalid_field(
                        &field(".output"),
                        format!("input[{i}].output must be a string or text parts"),
                    ))
                }
            };
            return Ok(Some(Input::Message(ChatMessage {
                role: MessageRole::Tool,
                content: Some(MessageContent::Text(output)),
                tool_call_id: Some(call_id),
                ..ChatMessage::default()
            })));
        }
        other => {
            return Err(ApiError::invalid_field(
                &field(".type"),
                format!(
                    "input items of type `{}` are not supported; send `message` items",
                    super::error::clip(other)
                ),
            ))
        }
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some("user") => MessageRole::User,
        Some("assistant") => MessageRole::Assistant,
        Some("system") => MessageRole::System,
        Some("developer") => MessageRole::Developer,
        _ => {
            return Err(ApiError::invalid_field(
                &field(".role"),
                format!("input[{i}].role must be user, assistant, system or developer"),
            ))
        }
    };
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let body = part.get("text").and_then(Value::as_str);
                match (kind, body) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push_str(t),
                    ("input_text" | "output_text" | "text", None) => {
                        return Err(ApiError::invalid_field(
                            &field(&format!(".content[{j}].text")),
                            "a text part needs a `text` string",
                        ))
                    }
                    (other, _) => {
                        return Err(ApiError::invalid_field(
                            &field(&format!(".content[{j}]")),
                            format!(
                                "content parts of type `{}` are not supported; send text",
                                super::error::clip(other)
                            ),
                        ))
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::invalid_field(
                &field(".content"),
                format!("input[{i}].content must be a string or an array of text parts"),
            ))
        }
    };
    Ok(Some(Input::Message(text_message(role, text))))
}
