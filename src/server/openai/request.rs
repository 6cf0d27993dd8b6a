//! What a client sends to `/v1/chat/completions`: the request, its messages,
//! tools and options.

use serde::{Deserialize, Serialize};

use crate::chat::Role;

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
    /// A configured backend's name (`tantivy`, `dense`, `hybrid`, a
    /// `[search.backends.NAME]`; `/v1/models` lists them with their kinds)
    /// instead of the server's default backend.
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

/// Why a message's content is not plain text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContentError {
    /// A `text` part without its `text` string.
    #[error("a text part needs a `text` string")]
    TextMissing,
    /// A part of another type (`image_url`, `input_audio`, …), named.
    #[error("content parts of type `{0}` are not supported; send text")]
    NotText(String),
}

impl MessageContent {
    /// The text of the content, parts joined with nothing between them.
    ///
    /// # Errors
    /// The first part that is not text, or a text part without text.
    pub fn text(&self) -> Result<String, ContentError> {
        match self {
            Self::Text(s) => Ok(s.clone()),
            Self::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        ("text", None) => return Err(ContentError::TextMissing),
                        (kind, _) => return Err(ContentError::NotText(kind.to_string())),
                    }
                }
                Ok(out)
            }
        }
    }
}
