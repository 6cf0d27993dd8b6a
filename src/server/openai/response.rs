//! What seeker answers on `/v1/chat/completions`: the completion, its stream
//! chunks, and the one-value types of their `object` fields.

use serde::{Deserialize, Serialize};

use super::{DeltaToolCall, SeekerChunk, SeekerInfo, ToolCallObject, Usage};
use crate::rollout::FinishReason;
use crate::server::citations::UrlCitation;

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
