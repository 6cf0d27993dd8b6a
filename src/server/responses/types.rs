//! Wire types of `POST /v1/responses`, in the shapes of OpenAI's Responses
//! API as its official SDKs type them (openai-python 3.57
//! `openai.types.responses`: `Response`, `ResponseFunctionWebSearch`,
//! `ResponseReasoningItem`, `ResponseOutputMessage`, `ResponseUsage`).
//! Beside them, `Params`: where each chat message of a converted request
//! came from, read by `convert` and `input` alike.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::citations::UrlCitation;
use super::super::error::ApiError;
use super::super::openai::{SearchOptions, SeekerInfo};

/// `POST /v1/responses` body. Unknown fields are ignored, as OpenAI does.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({
    "model": "default",
    "input": "When was the Taj Mahal built?",
    "tools": [{"type": "web_search"}],
    "include": ["web_search_call.action.sources"]
}))]
pub struct ResponsesRequest {
    /// Served model id or `default`; absent means `default`.
    #[serde(default)]
    pub model: Option<String>,
    /// The question as a string, or the conversation as items: messages
    /// (`{"role", "content"}` with `type` `message` or absent; content a
    /// string or `input_text` / `output_text` parts) and, ignored, the
    /// `reasoning` and `web_search_call` items of an earlier response.
    #[schema(value_type = Value)]
    pub input: Value,
    /// A system message put before the input.
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Budget for all generated tokens across all search rounds.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<u32>,
    /// 0 to 2; 0 (the default) is greedy decoding.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    /// (0, 1].
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    /// `{"type": "web_search"}` (or `web_search_preview`): seeker's policies
    /// search by themselves, so this is what they do with or without it.
    /// `{"type": "function", "name", "description", "parameters"}`: a
    /// function the client runs (as `tools` of chat completions); a call of
    /// it ends the response with `function_call` items. Other tool types are
    /// a 400 naming `tools[i]`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `auto`, `required`, `none` (these two apply to function tools; with
    /// web search alone they are a 400: the policy decides when to
    /// search), a `web_search` tool, or `{"type": "function", "name"}`.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub tool_choice: Option<Value>,
    /// `web_search_call.action.sources` adds each search's sources; the other
    /// values OpenAI defines are accepted and have no effect.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Return every function call of a turn (default) or only the first.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Accepted; nothing is stored either way (the response says `store:
    /// false`): send the whole conversation as `input` each time.
    #[serde(default)]
    pub store: Option<bool>,
    /// Not supported (nothing is stored): a 400.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Echoed in the response.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Accepted for compatibility; not used.
    #[serde(default)]
    pub user: Option<String>,
    /// Extension: the policy profile for this request.
    #[serde(default)]
    pub policy: Option<String>,
    /// Extension: search settings for this request.
    #[serde(default)]
    pub search: Option<SearchOptions>,
    /// Extension: add `seeker.transcript` and `seeker.rounds`.
    #[serde(default)]
    pub return_transcript: Option<bool>,
}

/// The `response` object (non-streamed body; `response` of the stream's
/// `response.created`, `response.in_progress`, `response.completed`,
/// `response.incomplete` and `response.failed` events).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    pub object: crate::server::openai::ResponseTag,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` (the token budget, context or
    /// round cap ended the answer) or `failed`.
    pub status: String,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    /// In order: per round, a `reasoning` item (what the policy wrote) and a
    /// `web_search_call` (its queries) or one per page read; last, the
    /// answer as a `message`.
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    /// Always false: nothing is stored.
    pub store: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `{"format": {"type": "text"}}`.
    #[schema(value_type = Object)]
    pub text: Value,
    /// `auto`, or as the request gave it.
    #[schema(value_type = Value)]
    pub tool_choice: Value,
    /// As the request gave them.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// `disabled`.
    pub truncation: String,
    /// Set once the rollout finished.
    pub usage: Option<ResponseUsage>,
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// seeker's extension, as on chat completions; set once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeker: Option<SeekerInfo>,
}

/// Why a response failed.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseError {
    /// seeker's error code (`request_timeout`, `engine_failure`, …).
    pub code: String,
    pub message: String,
}

/// Why a response is incomplete.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// One output item.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// What the policy wrote in one stretch of its trace (spliced documents
    /// are not repeated here: they are the search call's sources).
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Always empty: no summaries are made.
        #[schema(value_type = Vec<Object>)]
        summary: Vec<Value>,
        /// One `reasoning_text` part.
        content: Vec<ReasoningText>,
        /// `in_progress` or `completed`.
        status: String,
    },
    /// One search round (all its queries) or one page read.
    WebSearchCall {
        /// `ws_…`.
        id: String,
        /// `in_progress`, `searching`, `completed`, or `failed` (every query
        /// of the round failed, or the page could not be read).
        status: String,
        action: WebSearchAction,
    },
    /// A call of a client function: the response ends with these (no
    /// message); the client sends `function_call_output` items back.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// `call_…`: what the output names.
        call_id: String,
        name: String,
        /// A JSON object's text.
        arguments: String,
        /// `completed`.
        status: String,
    },
    /// The answer.
    Message {
        /// `msg_…`.
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
        /// `assistant`.
        role: String,
        /// One `output_text` part (none while the item is only announced).
        content: Vec<OutputText>,
    },
}

/// A web search call's action.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WebSearchAction {
    /// A search round.
    Search {
        /// The round's first query (OpenAI's older single-query field).
        query: String,
        /// Every query of the round, searched at once.
        queries: Vec<String>,
        /// With `include: ["web_search_call.action.sources"]`: the distinct
        /// documents the round returned (`{"type": "url", "url"}`;
        /// `seeker://BACKEND/ID` for corpus passages).
        #[serde(skip_serializing_if = "Option::is_none")]
        sources: Option<Vec<Source>>,
    },
    /// A page read: the URL (or corpus document) opened.
    OpenPage { url: String },
}

/// A search source.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Source {
    /// `url`.
    #[serde(rename = "type")]
    pub kind: String,
    pub url: String,
}

/// `{"type": "reasoning_text", "text"}`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

/// `{"type": "output_text", "text", "annotations"}`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    pub annotations: Vec<Annotation>,
    /// Always empty.
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Vec<Value>,
}

/// The Responses API's flat citation: `{"type": "url_citation",
/// "start_index", "end_index", "title", "url"}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Annotation {
    /// `url_citation`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub citation: UrlCitation,
}

/// Token counts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ResponseUsage {
    /// The prompt and every spliced block.
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    /// Every token generated in every round.
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

/// `input_tokens_details`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens the engine reported taking from its prefix cache
    /// (remote engines report it per round; 0 where the engine does not).
    pub cached_tokens: usize,
    /// Not counted by seeker: always 0.
    pub cache_write_tokens: usize,
}

/// `output_tokens_details`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct OutputTokensDetails {
    /// Tokens of every round before the last: the trace that led to the
    /// answer. The last round's tokens (thinking, then the answer) are not
    /// split and count as output only.
    pub reasoning_tokens: usize,
}

/// One server-sent event of a streamed response: `event:` is the type and
/// `data:` the event as JSON, with `type` and a `sequence_number` from 0.
/// Types, in order: `response.created`, `response.in_progress`; per item
/// `response.output_item.added`, its own events (reasoning:
/// `response.content_part.added`, `response.reasoning_text.delta`…,
/// `response.reasoning_text.done`, `response.content_part.done`; a search:
/// `response.web_search_call.in_progress`, `…searching`, `…completed`;
/// the message: `response.content_part.added`,
/// `response.output_text.delta`…, `response.output_text.annotation.added`…,
/// `response.output_text.done`, `response.content_part.done`), then
/// `response.output_item.done`; last `response.completed`,
/// `response.incomplete` or `response.failed`. No `[DONE]` follows.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseStreamEvent {
    /// The event's type.
    pub event: String,
    /// The event as JSON.
    pub data: String,
}

/// Where each chat message came from in the Responses request, to name the
/// right field when chat validation refuses one.
pub(super) struct Params {
    /// Per chat message: the field it came from (`instructions`, `input`,
    /// `input[i]`) and the field of its text (`instructions`, `input`,
    /// `input[i].content`).
    pub(super) messages: Vec<(String, String)>,
    /// Per chat tool (the function tools), its index in the request's `tools`.
    pub(super) tools: Vec<usize>,
}

impl Params {
    /// Records where the next chat message came from: its `field` and the
    /// field of its `text`.
    pub(super) fn push(&mut self, field: impl Into<String>, text: impl Into<String>) {
        self.messages.push((field.into(), text.into()));
    }

    /// `error` with its `param` and message in the Responses request's terms.
    pub(super) fn rename(&self, mut error: ApiError) -> ApiError {
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
