//! The rollout's API: what a request asks for, the events it streams and
//! the outcome it ends in.

use std::sync::Arc;

use serde::Serialize;

use super::{Resumed, Unresumable};
use crate::chat::ChatTurn;
use crate::engine::text::PolicyText;
use crate::engine::{Engine, EngineError};
use crate::profile::{Profile, QueryOutcome};
use crate::search::dispatch::Dispatcher;
use crate::search::Document;

/// What a rollout needs: the engine, the policy's text side (chat template,
/// control tokens, token count), the search dispatcher and the policy profile.
#[derive(Clone)]
pub struct RolloutContext {
    pub engine: Arc<dyn Engine>,
    pub text: Arc<PolicyText>,
    pub search: Arc<Dispatcher>,
    pub profile: Arc<Profile>,
}

/// One request, already validated.
#[derive(Clone, Debug)]
pub struct RolloutRequest {
    /// The conversation; the last `User` turn holds the question.
    pub messages: Vec<ChatTurn>,
    /// Budget of generated tokens across all rounds.
    pub max_tokens: usize,
    /// `None` or 0: greedy.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Continue the last message, an assistant message, instead of starting a
    /// new turn (vLLM's `continue_final_message`).
    pub continue_final_message: bool,
    /// Documents per query instead of the profile's top-k.
    pub top_k: Option<usize>,
    /// Search backend by configured name instead of the server's default.
    pub backend: Option<String>,
    /// Strings that end the visible answer where they first appear (OpenAI's
    /// `stop`); the string itself is not sent. Only answer text is matched:
    /// reasoning, search calls and splices are never cut.
    pub stop: Vec<String>,
    /// Functions the client runs itself (OpenAI `tools`), offered beside the
    /// profile's own; none by default.
    pub client_tools: ClientTools,
}

/// Functions the client runs (OpenAI Chat Completions `tools`): offered to
/// the policy through its chat template beside the profile's own; a turn
/// that calls one ends the rollout with [`FinishReason::ToolCalls`] and the
/// calls in [`RolloutOutcome::tool_calls`], for the client to run and send
/// back as `tool` messages.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientTools {
    /// In OpenAI's shape, `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`, as the chat template receives them.
    pub functions: Vec<serde_json::Value>,
    pub choice: ToolChoice,
    /// Return every client call of a turn (`parallel_tool_calls`, OpenAI's
    /// default) or only the first.
    pub parallel: bool,
}

impl ClientTools {
    /// Whether `name` is one of the client's functions.
    pub fn has(&self, name: &str) -> bool {
        self.functions
            .iter()
            .any(|f| f["function"]["name"].as_str() == Some(name))
    }
}

/// OpenAI's `tool_choice` for the client's functions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The policy decides.
    #[default]
    Auto,
    /// The client's functions are not offered.
    None,
    /// The first turn is a call: seeker writes the call's opening
    /// (`<tool_call>\n{"name": "`) and the policy names the function.
    Required,
    /// The first turn calls this function: seeker writes the call up to its
    /// arguments (`<tool_call>\n{"name": "NAME", "arguments":`, no space: the
    /// tokenizer writes ` {` as one token, in the reply and in the template's
    /// rendering of the call alike).
    Named(String),
}

/// A call of a client function, as the response returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClientCall {
    /// `call_…`, unique per call.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object's text (OpenAI's wire form).
    pub arguments: String,
}

/// Something that happened during a rollout, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum RolloutEvent {
    /// Trace text the model generated: its reasoning and its search calls,
    /// exactly as they enter the transcript.
    Reasoning(String),
    /// Text seeker spliced into the transcript: a document block (or the
    /// profile's text for no query, an invalid action, a failed search).
    Splice(String),
    /// A search call: the cleaned queries and what cleaning changed. `round`
    /// counts generation rounds from 1; 0 is the search of the question before
    /// the first token.
    Search {
        round: usize,
        queries: Vec<String>,
        notes: Vec<String>,
    },
    /// Documents for one query (empty on failure, with `error`).
    Results(QueryRecord),
    /// A page action opened a page (or could not).
    OpenPage(PageRecord),
    /// A generation round (from 1) ended: how, and what it cost. Comes after
    /// the round's search results and splice, before the next round's text.
    RoundEnd {
        round: usize,
        outcome: RoundOutcome,
        tokens_generated: usize,
        prompt_tokens_cached: Option<usize>,
    },
    /// The next piece of the answer.
    Answer(String),
}

/// Why the rollout ended, in OpenAI's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The policy answered (or stopped by itself).
    Stop,
    /// The token budget, the context length or the round cap ended the answer.
    Length,
    /// The policy called functions the client runs ([`ClientTools`]).
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl FinishReason {
    /// OpenAI's `finish_reason` string: `stop`, `length` or `tool_calls`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Token counts of a rollout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RolloutUsage {
    /// Tokens of the last round's prompt that the model did not generate: the
    /// prompt plus every splice.
    pub prompt_tokens: usize,
    /// Tokens generated in all rounds, including text discarded after a
    /// round's closing tag.
    pub completion_tokens: usize,
}

/// One query of a search call and what it returned.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueryRecord {
    /// Generation round (0: the question search).
    pub round: usize,
    pub query: String,
    /// Backend that answered.
    pub backend: String,
    pub documents: Vec<Document>,
    /// Why the search failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the search failed, as a bounded label (`timeout`, `rate_limited`, `auth`,
    /// `http_status`, `connection`, `malformed`, `backend`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
    /// Answered from a cache: this request's (the same query earlier in the
    /// rollout) or the server's shared one (another request searched it).
    pub cached: bool,
    /// Members of a `fallback` or `merge` backend that failed this query
    /// (whether or not another answered).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_backends: Vec<crate::search::dispatch::BackendFailure>,
}

impl QueryRecord {
    /// The outcome as a splice renders it.
    pub(super) fn outcome(&self) -> QueryOutcome<'_> {
        match &self.error {
            Some(e) => QueryOutcome::Failed(e),
            None => QueryOutcome::Documents(&self.documents),
        }
    }
}

/// A page action and what it opened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PageRecord {
    /// Generation round.
    pub round: usize,
    /// The target as the model wrote it (stripped): a URL or a corpus
    /// document's id or title.
    pub target: String,
    /// The URL read (after redirects) or the corpus document's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The page's title.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub title: String,
    /// `web`, or the corpus backend's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Characters of readable text the page had.
    pub chars: usize,
    /// Chunks spliced (the profile's `pages.max_chunks` at most).
    pub chunks: usize,
    /// Why the page was not opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The same as a bounded label ([`crate::pages::PageError::kind`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
}

/// How a round ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundOutcome {
    /// A search call (run, or not run past the round cap).
    Search,
    /// A search call with no usable query.
    NoQuery,
    /// The answer tag closed.
    Answer,
    /// A closing tag without its opening tag, or a model-written document block.
    InvalidAction,
    /// End of sequence without a closing tag.
    Eos,
    /// The token budget or the context ran out.
    Length,
    /// A page action (run, or not run past the round cap).
    Page,
    /// The model read a page chunk and paused (the profile's `pages.pause`);
    /// the next chunk followed.
    Read,
    /// The turn called the client's functions: the rollout ended for the
    /// client to run them.
    ToolCalls,
}

/// One generation round, for `return_transcript`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundRecord {
    /// From 1; 0 is the question search before the first token.
    pub round: usize,
    pub outcome: RoundOutcome,
    /// Cleaned queries of the round's search call.
    pub queries: Vec<String>,
    /// What cleaning changed (truncation, the per-call cap).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Per query, in order.
    pub results: Vec<QueryRecord>,
    /// The pages the round's page action (or `visit` calls) opened, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<PageRecord>,
    /// Tokens of the round's whole prompt (the conversation, every splice
    /// and the text generated in earlier rounds), when the engine ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<usize>,
    /// Prompt tokens the engine took from its prefix cache for this round
    /// instead of prefilling them, when it reports that (the embedded engine
    /// with `model.prefix_cache`, remote engines that report it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_cached: Option<usize>,
    /// Tokens the engine generated this round.
    pub tokens_generated: usize,
}

/// The result of a finished rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutOutcome {
    /// The final answer, equal to the concatenated [`RolloutEvent::Answer`] deltas.
    pub answer: String,
    pub finish_reason: FinishReason,
    pub usage: RolloutUsage,
    /// Search calls that ran at least one query (the question search is not counted).
    pub searches: usize,
    /// Every document spliced, in order.
    pub documents: Vec<Document>,
    /// With [`FinishReason::ToolCalls`]: the client functions the last turn
    /// called, in order.
    pub tool_calls: Vec<ClientCall>,
    /// The rendered prompt, assistant prefix included.
    pub prompt: String,
    /// The text after the prompt that the model saw: the continued message,
    /// every round's kept text and every splice.
    pub transcript: String,
    /// Every round, the question search first when there is one.
    pub rounds: Vec<RoundRecord>,
    /// What the rollout resumed from: the trusted prefix of the continued
    /// message, when it held calls it answered itself.
    pub resumed: Option<Resumed>,
}

/// Why a rollout could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("the request has no user message to answer")]
    NoQuestion,
    #[error("continue_final_message needs the last message to be an assistant message")]
    NothingToContinue,
    /// The continued message cannot be resumed (validation refuses it first).
    #[error(transparent)]
    Continuation(#[from] Unresumable),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The event receiver was dropped (the client left).
    #[error("cancelled")]
    Cancelled,
}
