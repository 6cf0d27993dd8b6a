//! OpenAI wire types for `/v1/chat/completions` and `/v1/models`, with seeker's
//! one extension: a `seeker` object on the final message and the last chunk
//! that names the policy, counts the searches and lists the spliced documents.

use serde::{Deserialize, Serialize};

use super::citations::UrlCitation;
use crate::engine::Role;
use crate::rollout::{FinishReason, RoundRecord};
use crate::search::Document;

/// `POST /v1/chat/completions` body. Unknown fields are ignored, as OpenAI does.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({
    "model": "default",
    "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}],
    "max_tokens": 64,
    "stream": false
}))]
pub struct ChatCompletionRequest {
    /// Served model id or `default`; absent means `default`.
    #[serde(default)]
    pub model: Option<String>,
    /// At least one, with a user message holding the question.
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `{"include_usage": true}`: one last chunk with `choices: []` and `usage`
    /// just before `[DONE]`.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Budget for all generated tokens across all search rounds.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    /// Newer name of `max_tokens`; wins when both are given.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<u32>,
    /// 0 to 2; 0 (the default) is greedy decoding, the reproducible mode.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    /// (0, 1].
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    /// Only 1 is supported; other values are a 400 naming `n`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u32>,
    /// Up to 4 strings that end the visible answer (`content`) where they
    /// first appear; the stop string itself is not returned. They never cut a
    /// search round or the reasoning trace.
    #[serde(default)]
    pub stop: Option<StopSequences>,
    /// Accepted for compatibility, not honoured: the engine has one random
    /// generator for all requests (mistral.rs 0.8.1). Greedy decoding
    /// (`temperature` 0, the default) is the reproducible mode.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Accepted for compatibility; not used.
    #[serde(default)]
    pub user: Option<String>,
    /// Extension: the policy profile for this request (default from the config).
    #[serde(default)]
    pub policy: Option<String>,
    /// Extension (as in vLLM): continue the last message, an assistant message,
    /// instead of starting a new turn. If it ends with a closing search tag the
    /// search runs and is spliced before any token is generated.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// Extension: return `seeker.transcript` and `seeker.rounds`.
    #[serde(default)]
    pub return_transcript: Option<bool>,
    /// Extension: search settings for this request.
    #[serde(default)]
    pub search: Option<SearchOptions>,
    /// Functions the client runs (`{"type": "function", "function":
    /// {"name", "description", "parameters"}}`, at most 64), offered to the
    /// policy beside its own search. A call of one ends the response with
    /// `finish_reason: "tool_calls"` and `message.tool_calls`; the client
    /// sends the results back as `tool` messages. Needs a tool-calling
    /// policy: without `policy`, a request with tools runs the server's
    /// `policy.tools` (`tool-search`) when the default policy cannot call
    /// functions.
    #[serde(default)]
    pub tools: Option<Vec<ToolSpec>>,
    /// `none` (the client's functions are not offered), `auto` (default),
    /// `required` (the first turn is a call) or `{"type": "function",
    /// "function": {"name"}}` (the first turn calls it: seeker writes the
    /// call's opening and the policy its arguments).
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub tool_choice: Option<serde_json::Value>,
    /// Return every client call of a turn (default true) or only the first.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// A client function, OpenAI's shape.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ToolSpec {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Required for `function` tools.
    #[serde(default)]
    pub function: Option<FunctionSpec>,
}

/// A client function's name, description and JSON-schema parameters.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct FunctionSpec {
    /// 1 to 64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON schema object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
    /// Accepted; the schema is not enforced on the policy's arguments.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// A function call in a request's assistant message or a response's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ToolCallObject {
    /// `call_…`.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function called and its arguments (a JSON object's text).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// One call in a streamed chunk's `delta.tool_calls` (each call whole, in
/// one chunk).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DeltaToolCall {
    /// The call's position in `message.tool_calls`.
    pub index: usize,
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopSequences {
    One(String),
    Many(Vec<String>),
}

impl StopSequences {
    /// The strings, in order.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `GET /health` when ready.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}

/// OpenAI's `stream_options`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The `search` request extension.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchOptions {
    /// A configured backend's name (`tantivy`, `[search.backends.NAME]`;
    /// `/v1/models` does not list them: see the server's config) instead of
    /// the server's default backend.
    #[serde(default)]
    pub backend: Option<String>,
    /// Documents per query, 1 to 50, instead of the profile's top-k.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub top_k: Option<u32>,
}

/// One message. `content` is a string or an array of `{"type": "text", "text"}` parts.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct ChatMessage {
    pub role: MessageRole,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's function calls (returned earlier by seeker).
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallObject>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// Roles seeker accepts; `developer` is treated as `system`; `tool`
/// carries a client function's result.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    System,
    Developer,
    #[default]
    User,
    Assistant,
    Tool,
}

impl From<MessageRole> for Role {
    fn from(r: MessageRole) -> Self {
        match r {
            MessageRole::System | MessageRole::Developer => Role::System,
            MessageRole::User => Role::User,
            MessageRole::Assistant => Role::Assistant,
            MessageRole::Tool => Role::Tool,
        }
    }
}

/// Message content in either of OpenAI's shapes.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part; only `text` parts carry text.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl MessageContent {
    /// The text of the content, parts joined with nothing between them;
    /// `Err(kind)` names the first non-text part.
    pub fn text(&self) -> Result<String, String> {
        match self {
            Self::Text(s) => Ok(s.clone()),
            Self::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => return Err(kind.to_string()),
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Token counts: `prompt_tokens` covers the prompt and every spliced document
/// block; `completion_tokens` every token generated in every round.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// A document the answer was grounded on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Citation {
    pub id: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Search backend that returned it (`tantivy`).
    pub backend: String,
}

/// A document of a `results` event: a [`Citation`] with the passage and
/// the backend's score.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SearchHit {
    pub id: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Search backend that returned it (`tantivy`).
    pub backend: String,
    /// The backend's score (BM25 for `tantivy`, 0 where a web API gives
    /// none); higher is better.
    pub score: f32,
    /// The passage (a snippet for web backends), as spliced before the
    /// profile's formatting.
    pub text: String,
}

impl From<&Document> for SearchHit {
    fn from(doc: &Document) -> Self {
        Self {
            id: doc.id.clone(),
            title: doc.title.clone(),
            url: doc.url.clone(),
            backend: doc.backend.clone(),
            score: doc.score,
            text: doc.text.clone(),
        }
    }
}

/// seeker's extension object on the final message / last chunk.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct SeekerInfo {
    /// Policy profile that served the request.
    pub policy: String,
    /// Search calls the model made that ran a query (the question search of
    /// prefetch profiles is not counted).
    pub searches: usize,
    /// Every spliced document, in splice order.
    pub documents: Vec<Citation>,
    /// With `return_transcript`: the exact text after the prompt that the model
    /// saw, splices included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    /// With `return_transcript`: every round with its queries, documents and
    /// generated token count.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub rounds: Option<Vec<RoundRecord>>,
    /// With `continue_final_message`: the part of the continued message taken
    /// as written (its calls answered by the client's own documents, counted
    /// against the policy's `max_searches`); absent when it held none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<crate::rollout::Resumed>,
}

/// A search event, sent in a chunk of its own (`seeker.event`) with an empty
/// delta, as it happens.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SeekerEvent {
    /// A search call with its cleaned queries and what cleaning changed.
    Search {
        round: usize,
        queries: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        notes: Vec<String>,
    },
    /// The chunk's `reasoning_content` was spliced by seeker (documents, or the
    /// profile's text for no query, an invalid action or a failed search), not
    /// generated.
    Splice,
    /// A generation round (from 1) ended: its outcome (`search`, `no_query`,
    /// `answer`, `invalid_action`, `eos`, `length`, `page`, `read`), the tokens it
    /// generated, and the prompt tokens a remote engine took from its cache.
    Round {
        round: usize,
        #[schema(value_type = String)]
        outcome: crate::rollout::RoundOutcome,
        tokens_generated: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        prompt_tokens_cached: Option<usize>,
    },
    /// One query's documents, as the backend returned them (before the
    /// profile's splice format).
    Results {
        round: usize,
        query: String,
        /// The backend that answered (or failed).
        backend: String,
        documents: Vec<SearchHit>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Bounded failure label: `timeout`, `rate_limited`, `http_status`,
        /// `connection`, `malformed`, `backend`.
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<&'static str>,
        /// Answered from this request's cache or the server's shared cache.
        cached: bool,
    },
    /// A page action: what the model asked to open and what was read
    /// (`url` after redirects, or the corpus document's id), in how many
    /// chunks; or why it was not (`error_kind`: `refused`, `disabled`,
    /// `not_found`, `unsupported`, `http_status`, `timeout`, `redirect`,
    /// `connection`, `empty`). OpenAI's Responses API calls this action
    /// `open_page`.
    OpenPage {
        round: usize,
        target: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        #[serde(skip_serializing_if = "String::is_empty")]
        title: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        source: String,
        chars: usize,
        chunks: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<&'static str>,
    },
}

/// The `seeker` field of a chunk: a search event, or the final information.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SeekerChunk {
    Event { event: SeekerEvent },
    Final(SeekerInfo),
}

impl From<&Document> for Citation {
    fn from(doc: &Document) -> Self {
        Self {
            id: doc.id.clone(),
            title: doc.title.clone(),
            url: doc.url.clone(),
            backend: doc.backend.clone(),
        }
    }
}

/// Non-streamed response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: ChatCompletionTag,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
    pub seeker: SeekerInfo,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Choice {
    pub index: u32,
    pub message: ResponseMessage,
    pub finish_reason: FinishReason,
}

/// One-value types for the `object` field each response carries (OpenAI's
/// API reference): the OpenAPI spec gives the exact string, and a response
/// cannot carry another.
macro_rules! object_tag {
    ($(#[$doc:meta])* $name:ident = $tag:tt) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema,
        )]
        pub enum $name {
            #[default]
            #[serde(rename = $tag)]
            Tag,
        }
    };
}

object_tag!(
    /// `chat.completion`: a non-streamed chat completion.
    ChatCompletionTag = "chat.completion"
);
object_tag!(
    /// `chat.completion.chunk`: one chunk of a streamed chat completion.
    ChunkTag = "chat.completion.chunk"
);
object_tag!(
    /// `list`: the list of models.
    ListTag = "list"
);
object_tag!(
    /// `model`: one model.
    ModelTag = "model"
);
object_tag!(
    /// `response`: a Responses API response.
    ResponseTag = "response"
);

/// The role of every message seeker returns: `assistant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AssistantRole {
    Assistant,
}

/// The assistant message: the answer in `content`, the trace (reasoning,
/// search calls and spliced documents) in `reasoning_content`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseMessage {
    pub role: AssistantRole,
    /// The answer; `null` when the message is a turn of function calls.
    pub content: Option<String>,
    pub reasoning_content: String,
    /// With `finish_reason: "tool_calls"`: the client functions called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallObject>>,
    /// The answer's citations (`[n]` markers, or the documents that hold the
    /// answer: [`super::citations`]); empty when nothing is cited.
    pub annotations: Vec<ChatAnnotation>,
}

/// OpenAI's Chat Completions citation: `{"type": "url_citation",
/// "url_citation": {"start_index", "end_index", "title", "url"}}` (as its
/// search models return it; typed by the official SDKs).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ChatAnnotation {
    /// `url_citation`.
    #[serde(rename = "type")]
    pub kind: String,
    pub url_citation: UrlCitation,
}

impl From<UrlCitation> for ChatAnnotation {
    fn from(url_citation: UrlCitation) -> Self {
        Self {
            kind: "url_citation".into(),
            url_citation,
        }
    }
}

/// One server-sent event of a streamed completion (`text/event-stream`), as
/// a client parses it. `data` holds a [`ChatCompletionChunk`] as JSON; when
/// the request fails after the stream started, an error in the
/// `ErrorResponse` shape; and last, the literal `[DONE]`. Comment lines
/// (`: keep-alive`) come every 5 s while nothing else is sent.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChunkEvent {
    /// JSON of a `ChatCompletionChunk` or an `ErrorResponse`, or `[DONE]`.
    pub data: String,
}

/// One SSE chunk (the JSON in a [`ChunkEvent`]'s `data`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: ChunkTag,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Only on the usage chunk of `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeker: Option<SeekerChunk>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delta {
    /// In the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<AssistantRole>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The answer's citations, once, in the last chunk (with
    /// `finish_reason`), when there are any; indices count characters of the
    /// whole streamed `content`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Vec<ChatAnnotation>>,
    /// Client function calls, before the last chunk (`finish_reason:
    /// "tool_calls"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    pub object: ListTag,
    pub data: Vec<ModelObject>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelObject {
    pub id: String,
    pub object: ModelTag,
    pub created: u64,
    pub owned_by: String,
    /// Policy profile used when a request names none.
    pub policy: String,
    /// Every profile a request may name in `policy`.
    pub policies: Vec<String>,
    /// Every search backend a request may name in `search.backend`.
    pub search_backends: Vec<String>,
    /// The backend of requests that name none.
    pub default_search_backend: String,
    /// `max_tokens` of a request that sets none.
    pub max_tokens: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
}
