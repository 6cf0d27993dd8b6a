//! The search loop: one request's rollout, round by round.
//!
//! generate → scan → search → splice → continue, within the profile's limits:
//! 1. The prompt is built by the profile ([`Profile::prompt`]) and rendered
//!    through the model's chat template (or used raw), then the profile's
//!    assistant prefix. With `search_question_first` the question is searched
//!    first and its documents spliced after the prompt or into the user message.
//!    With `continue_final_message` the client's last assistant message is
//!    continued. The calls it answers itself (with the documents after them)
//!    are a trusted prefix that enters the transcript as written and counts
//!    against `max_searches` ([`Resumed`], see `resume`); the rest is scanned
//!    like generated text, so a message that ends with a closing search tag
//!    is searched before any token is generated.
//! 2. Each round the engine continues the whole transcript. The
//!    [`TagScanner`] ends the round at the first closing tag; the text after it
//!    is discarded and the engine is cancelled.
//! 3. A search call is cleaned into queries ([`Profile::clean_queries`]); all
//!    of them are searched at once (identical queries within a request come
//!    from the request's cache) and the documents are spliced right after the
//!    closing tag in the profile's format. A call without a usable query, or an
//!    invalid action, splices the profile's text for that case (or ends the
//!    rollout when the profile has none). After `max_searches` calls the
//!    profile's round cap applies.
//! 4. The answer is the closed answer tag's content (stripped); an answer tag
//!    left open at EOS or at the budget counts as far as it got; otherwise the
//!    profile's fallback applies.
//!
//! Events go out on a channel as they happen: reasoning (the model's text and
//! its search calls) and splices (what seeker inserted) — together everything
//! after the prompt besides the answer, byte for byte — search calls, their
//! results, and answer deltas. When the receiver is dropped the rollout stops, which drops the
//! engine stream and cancels generation.

mod answer;
mod resume;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::engine::{
    ChatTurn, Engine, EngineError, EngineEvent, EngineFinish, GenerationParams, Role,
};
use crate::profile::{
    defuse, AnswerFallback, CallPlan, PageChunk, Profile, PromptText, QueryOutcome, QuestionSearch,
    RoundCap, ToolResult,
};
use crate::scanner::{Region, RoundEnd, ScanEvent, TagKind, TagScanner};
use crate::search::dispatch::{Dispatcher, QueryResult};
use crate::search::Document;
use crate::toolcall::{parse_turn, ToolCall};
use answer::{AnswerStripper, StopFilter};
pub use resume::{Resumed, Unresumable};

/// What a rollout needs: the engine, the search dispatcher and the policy profile.
#[derive(Clone)]
pub struct RolloutContext {
    pub engine: Arc<dyn Engine>,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    /// Why the search failed, as a bounded label (`timeout`, `rate_limited`,
    /// `http_status`, `connection`, `malformed`, `backend`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
    /// Answered from a cache: this request's (the same query earlier in the
    /// rollout) or the server's shared one (another request searched it).
    pub cached: bool,
}

impl QueryRecord {
    /// The outcome as a splice renders it.
    fn outcome(&self) -> QueryOutcome<'_> {
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
    Continuation(#[from] resume::Unresumable),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The event receiver was dropped (the client left).
    #[error("cancelled")]
    Cancelled,
}

/// How a round ended, for [`Rollout::end_round`].
struct RoundEnded {
    /// From 1.
    number: usize,
    /// The closing tag (or open answer) the scanner ended the round at;
    /// `None` when the engine stopped by itself.
    end: Option<RoundEnd>,
    /// Why the engine stopped, when it did.
    engine_finish: Option<EngineFinish>,
    /// Tokens the engine generated this round.
    tokens: usize,
}

/// Whether `text`, a continued assistant message, can be resumed by
/// `profile`'s rollouts (the HTTP layer checks before it answers 200).
///
/// # Errors
/// [`Unresumable`] for a call nothing answers with more text after it, or a
/// tool response inline in a tool-calling policy's message.
pub fn check_continuation(profile: &Profile, text: &str) -> Result<(), Unresumable> {
    resume::split(profile, text).map(|_| ())
}

/// Runs one rollout to the end, sending events on `events`.
///
/// # Errors
/// [`RolloutError::NoQuestion`] without a user message,
/// [`RolloutError::NothingToContinue`] when asked to continue a message that
/// is not the assistant's, [`RolloutError::Engine`] on engine failure,
/// [`RolloutError::Cancelled`] when `events` is closed.
pub async fn run(
    ctx: &RolloutContext,
    request: &RolloutRequest,
    events: &mpsc::Sender<RolloutEvent>,
) -> Result<RolloutOutcome, RolloutError> {
    Rollout::new(ctx, request, events).run().await
}

struct Rollout<'a> {
    ctx: &'a RolloutContext,
    request: &'a RolloutRequest,
    events: &'a mpsc::Sender<RolloutEvent>,
    /// Prompt and everything after it: what the next round continues.
    transcript: String,
    /// Byte length of the prompt within `transcript`.
    prompt_len: usize,
    usage: RolloutUsage,
    /// Tokens generated before the current round (now part of its prompt).
    generated_before_round: usize,
    documents: Vec<Document>,
    rounds: Vec<RoundRecord>,
    /// Search calls and invalid actions so far: what the round cap counts.
    calls: usize,
    /// Search calls that ran a query.
    searches: usize,
    /// This request's cache: cleaned query → its documents. Failures are not
    /// kept: the same query later in the rollout tries the backend again.
    cache: HashMap<String, Vec<Document>>,
    /// Reasoning-region text generated since the last splice (the fallback answer).
    since_splice: String,
    answer: AnswerStripper,
    /// The request's stop strings, applied to the stripped answer.
    stop: StopFilter,
    /// Answer text sent so far: the answer.
    answer_sent: String,
    /// The answer region was opened in the current round.
    answer_open: bool,
    /// The prompt without the question search's documents (prefetch
    /// profiles only), before the assistant prefix: tells documents that
    /// overflow the context from a conversation that does.
    bare_prompt: Option<PromptText>,
    /// The engine ran at least one round (otherwise usage is counted apart).
    engine_ran: bool,
    /// This rollout's id for the engine ([`GenerationParams::session`]).
    session: u64,
    /// Cached prompt tokens the engine reported for the current round.
    round_cached: Option<usize>,
    /// The current round's whole prompt, in tokens, once the engine took it.
    round_prompt: Option<usize>,
    /// Chunks of the open page still to splice, one per round.
    chunks: VecDeque<PageChunk>,
    /// The chunk spliced last and not yet read: its byte range in the
    /// transcript and its short form, put in its place once the next round
    /// has ended.
    unread_chunk: Option<(std::ops::Range<usize>, String)>,
    /// The functions the chat template is given: the profile's, then the
    /// client's (unless its `tool_choice` is `none`).
    template_tools: Vec<serde_json::Value>,
    /// The client calls that ended the rollout.
    client_calls: Vec<ClientCall>,
    /// The continued message's trusted prefix, if it had one.
    resumed: Option<Resumed>,
}

/// Rollout ids, unique in this process.
static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl<'a> Rollout<'a> {
    fn new(
        ctx: &'a RolloutContext,
        request: &'a RolloutRequest,
        events: &'a mpsc::Sender<RolloutEvent>,
    ) -> Self {
        Self {
            ctx,
            request,
            events,
            transcript: String::new(),
            prompt_len: 0,
            usage: RolloutUsage::default(),
            generated_before_round: 0,
            documents: Vec::new(),
            rounds: Vec::new(),
            calls: 0,
            searches: 0,
            cache: HashMap::new(),
            since_splice: String::new(),
            answer: AnswerStripper::default(),
            stop: StopFilter::new(&request.stop),
            answer_sent: String::new(),
            answer_open: false,
            bare_prompt: None,
            engine_ran: false,
            session: NEXT_SESSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            round_cached: None,
            round_prompt: None,
            chunks: VecDeque::new(),
            unread_chunk: None,
            template_tools: Vec::new(),
            client_calls: Vec::new(),
            resumed: None,
        }
    }

    /// Sends answer text through the stop filter.
    async fn emit_answer(&mut self, text: &str) -> Result<(), RolloutError> {
        let out = self.stop.push(text);
        if out.is_empty() {
            return Ok(());
        }
        self.answer_sent.push_str(&out);
        self.emit(RolloutEvent::Answer(out)).await
    }

    async fn emit(&self, event: RolloutEvent) -> Result<(), RolloutError> {
        self.events
            .send(event)
            .await
            .map_err(|_| RolloutError::Cancelled)
    }

    /// Builds the prompt (running the question search if the profile asks for
    /// one); returns the assistant text to continue, if any.
    async fn start(&mut self) -> Result<Option<String>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let (ctx, request) = (self.ctx, self.request);
        // Control tokens come from the chat template only: in the messages'
        // text they are defused (`<|im_start|>` → `‹|im_start|›`).
        let specials = ctx.engine.special_tokens();
        let messages: Vec<ChatTurn> = request
            .messages
            .iter()
            .map(|m| ChatTurn {
                role: m.role,
                content: defuse(&m.content, specials).into_owned(),
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|call| defuse_json(call, specials))
                    .collect(),
                tool_call_id: m
                    .tool_call_id
                    .as_ref()
                    .map(|id| defuse(id, specials).into_owned()),
            })
            .collect();
        let messages = &messages;
        let continuation = if self.request.continue_final_message {
            match messages.last() {
                Some(m) if m.role == Role::Assistant => Some(m.content.clone()),
                _ => return Err(RolloutError::NothingToContinue),
            }
        } else {
            None
        };
        let question_at = messages
            .iter()
            .rposition(|m| m.role == Role::User && !m.content.trim().is_empty())
            .ok_or(RolloutError::NoQuestion)?;
        // The question searched is the user's own text.
        let question = profile.normalize_question(&request.messages[question_at].content);

        let mut documents_first = None;
        let mut after_prompt = None;
        match profile.search_question_first {
            QuestionSearch::Off => {}
            QuestionSearch::Assistant => {
                after_prompt = Some(self.search(0, vec![question], Vec::new()).await?);
            }
            QuestionSearch::User => {
                let splice = self.search(0, vec![question], Vec::new()).await?;
                let block = format!("{}\n", splice.trim());
                self.emit(RolloutEvent::Splice(block.clone())).await?;
                documents_first = Some(block);
            }
        }
        self.template_tools = profile.template_tools().to_vec();
        let client = &request.client_tools;
        if client.choice != ToolChoice::None {
            // The client's descriptions and schemas are text like its
            // messages: control tokens in them are defused.
            self.template_tools
                .extend(client.functions.iter().map(|f| defuse_json(f, specials)));
        }
        let mut prompt = match profile.prompt(messages, question_at, documents_first.as_deref()) {
            PromptText::Chat(turns) => {
                self.ctx
                    .engine
                    .render_chat_with_tools(&turns, &self.template_tools)
                    .await?
            }
            PromptText::Raw(text) => text,
        };
        if documents_first.is_some() {
            self.bare_prompt = Some(profile.prompt(messages, question_at, None));
        } else if after_prompt.is_some() {
            self.bare_prompt = Some(PromptText::Raw(prompt.clone()));
        }
        prompt.push_str(&profile.assistant_prefix);
        // After the client's function results the turn starts as it does
        // after seeker's own tool responses (`tools.turn_prefix`).
        if messages.last().is_some_and(|m| m.role == Role::Tool) && continuation.is_none() {
            if let Some(tools) = &profile.tools {
                prompt.push_str(&tools.turn_prefix);
            }
        }
        self.prompt_len = prompt.len();
        self.transcript = prompt;
        if let Some(splice) = after_prompt {
            self.splice(splice).await?;
        }
        // A resumed rollout: the calls the client's message answers itself
        // are kept as written; only its tail is scanned.
        let continuation = match continuation {
            Some(text) => {
                let split = resume::split(&profile, &text)?;
                if !split.trusted.is_empty() {
                    self.transcript.push_str(split.trusted);
                    self.calls += split.calls;
                    self.resumed = Some(Resumed {
                        bytes: split.trusted.len(),
                        calls: split.calls,
                    });
                    self.emit(RolloutEvent::Reasoning(split.trusted.to_string()))
                        .await?;
                }
                Some(split.tail.to_string()).filter(|tail| !tail.is_empty())
            }
            None => None,
        };
        // A forced call: seeker writes its opening, the policy the rest.
        let forced = match (&client.choice, client.functions.is_empty()) {
            (_, true) | (ToolChoice::Auto | ToolChoice::None, _) => None,
            (ToolChoice::Required, _) => Some(format!("{}\n{{\"name\": \"", profile.query_open)),
            (ToolChoice::Named(name), _) => Some(format!(
                "{}\n{{\"name\": {}, \"arguments\":",
                profile.query_open,
                serde_json::Value::String(name.clone())
            )),
        };
        Ok(match (continuation, forced) {
            (Some(text), Some(opening)) => Some(text + &opening),
            (text, opening) => text.or(opening),
        })
    }

    async fn run(mut self) -> Result<RolloutOutcome, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let mut continuation = self.start().await?;
        let mut scanner;
        let mut scanned = Vec::new();
        loop {
            let round_number = self.rounds.iter().filter(|r| r.round > 0).count() + 1;
            // While page chunks wait, the round also ends at the pause string.
            scanner = TagScanner::new(if self.chunks.is_empty() {
                profile.tag_set()
            } else {
                profile.reading_tag_set()
            });
            self.answer_open = false;
            let mut round_tokens = 0;
            let mut end = None;
            let mut engine_finish = None;

            // The client's assistant message is scanned as if generated.
            if let Some(text) = continuation.take() {
                scanner.push(&text, &mut scanned);
                end = self.on_scan_events(&mut scanned).await?;
                // A tool-calling turn that ends with a closed call has ended:
                // its calls run before any token is generated.
                if end.is_none()
                    && profile.tools.is_some()
                    && text.trim_end().ends_with(profile.query_close.as_str())
                {
                    scanner.finish(&mut scanned);
                    end = self.on_scan_events(&mut scanned).await?;
                    engine_finish = Some(EngineFinish::Stop);
                }
            }
            if end.is_none() && engine_finish.is_none() && !self.stop.stopped {
                let remaining = self
                    .request
                    .max_tokens
                    .saturating_sub(self.usage.completion_tokens);
                if remaining == 0 {
                    scanner.finish(&mut scanned);
                    self.on_scan_events(&mut scanned).await?;
                    self.transcript.push_str(scanner.kept_text());
                    self.record(round_number, RoundOutcome::Length, round_tokens);
                    self.announce_round(round_number).await?;
                    return self.finish(FinishReason::Length).await;
                }
                let round_cap = match profile.max_round_tokens {
                    0 => usize::MAX,
                    n => n,
                };
                let mut stop = profile.stop_strings();
                if let Some(pages) = profile.pages.as_ref().filter(|_| !self.chunks.is_empty()) {
                    if !pages.pause.is_empty() {
                        stop.push(pages.pause.clone());
                    }
                }
                let params = GenerationParams {
                    max_tokens: remaining.min(round_cap),
                    temperature: self.request.temperature,
                    top_p: self.request.top_p,
                    stop,
                    session: Some(self.session),
                };
                let prompt = format!("{}{}", self.transcript, scanner.kept_text());
                let generation = tokio::select! {
                    // The client left while the round waited for the engine
                    // (a gated engine queues it): it never reaches the engine.
                    () = self.events.closed() => return Err(RolloutError::Cancelled),
                    generation = self.ctx.engine.generate(&prompt, &params) => generation,
                };
                let mut generation = match generation {
                    Ok(g) => g,
                    // Spliced documents filled the context: the answer ends here, as
                    // at the token budget. A conversation too long to start is an error.
                    Err(EngineError::ContextLength {
                        prompt_tokens,
                        limit,
                    }) => {
                        if !self.documents_overflowed(limit).await? {
                            return Err(EngineError::ContextLength {
                                prompt_tokens,
                                limit,
                            }
                            .into());
                        }
                        self.usage.prompt_tokens =
                            prompt_tokens.saturating_sub(self.generated_before_round);
                        self.engine_ran = true;
                        self.transcript.push_str(scanner.kept_text());
                        self.record(round_number, RoundOutcome::Length, 0);
                        self.announce_round(round_number).await?;
                        return self.finish(FinishReason::Length).await;
                    }
                    Err(e) => return Err(e.into()),
                };
                self.engine_ran = true;
                self.round_prompt = Some(generation.prompt_tokens);
                self.usage.prompt_tokens = generation
                    .prompt_tokens
                    .saturating_sub(self.generated_before_round);
                while end.is_none() && engine_finish.is_none() && !self.stop.stopped {
                    let next = tokio::select! {
                        // The client left: stop now, not at the next token (a long
                        // prefill emits nothing for a while). Dropping the stream
                        // cancels the engine.
                        () = self.events.closed() => return Err(RolloutError::Cancelled),
                        next = generation.events.recv() => next,
                    };
                    match next {
                        Some(Ok(EngineEvent::Text { text, tokens })) => {
                            self.usage.completion_tokens += tokens;
                            round_tokens += tokens;
                            scanner.push(&text, &mut scanned);
                        }
                        Some(Ok(EngineEvent::Prompt { tokens, cached })) => {
                            self.usage.prompt_tokens =
                                tokens.saturating_sub(self.generated_before_round);
                            self.round_prompt = Some(tokens);
                            self.round_cached = cached;
                        }
                        Some(Ok(EngineEvent::Done(finish))) => {
                            scanner.finish(&mut scanned);
                            engine_finish = Some(finish);
                        }
                        Some(Err(e)) => return Err(e.into()),
                        None => {
                            return Err(EngineError::Internal(
                                "generation ended without finishing".into(),
                            )
                            .into())
                        }
                    }
                    end = self.on_scan_events(&mut scanned).await?;
                }
                // Cancels the engine: nothing after the closing tag is kept.
                drop(generation);
                self.generated_before_round = self.usage.completion_tokens;
            }

            let kept = scanner.kept_text().to_string();
            let ended = RoundEnded {
                number: round_number,
                end,
                engine_finish,
                tokens: round_tokens,
            };
            let finished = self.end_round(ended, &kept).await?;
            self.announce_round(round_number).await?;
            if let Some(reason) = finished {
                return self.finish(reason).await;
            }
        }
    }

    /// Sends [`RolloutEvent::RoundEnd`] for round `number`, from its record.
    async fn announce_round(&self, number: usize) -> Result<(), RolloutError> {
        let Some(record) = self.rounds.iter().rev().find(|r| r.round == number) else {
            return Ok(());
        };
        let event = RolloutEvent::RoundEnd {
            round: number,
            outcome: record.outcome,
            tokens_generated: record.tokens_generated,
            prompt_tokens_cached: record.prompt_tokens_cached,
        };
        self.emit(event).await
    }

    /// What the round's end means: records the round, keeps its text in the
    /// transcript, runs its search call and splices the documents (or the
    /// profile's text for no query or an invalid action). `Some(reason)`
    /// ends the rollout; `None` continues with the next round.
    async fn end_round(
        &mut self,
        round: RoundEnded,
        kept: &str,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let RoundEnded {
            number,
            end,
            engine_finish,
            tokens,
        } = round;
        // The chunk spliced before this round has been read: later prompts
        // carry its short form (ASearcher's `short_text`).
        if let Some((range, short)) = self.unread_chunk.take() {
            self.transcript.replace_range(range, &short);
        }
        match &end {
            Some(RoundEnd::Pause) => {
                self.transcript.push_str(kept);
                self.record(number, RoundOutcome::Read, tokens);
                if let Some(chunk) = self.chunks.pop_front() {
                    self.splice_chunk(chunk).await?;
                }
                return Ok(None);
            }
            // The model acted before reading the rest of the page.
            _ => self.chunks.clear(),
        }
        if self.stop.stopped {
            // A stop string ended the answer.
            self.transcript.push_str(kept);
            self.record(number, RoundOutcome::Answer, tokens);
            return Ok(Some(FinishReason::Stop));
        }
        // A tool-calling policy's turn ended (end of sequence, or it started
        // writing the tool response itself): its calls, if any, are the action.
        let turn_ended = match &end {
            None => engine_finish != Some(EngineFinish::Length),
            Some(RoundEnd::DocumentsOpened) => true,
            Some(_) => false,
        };
        if profile.tools.is_some() && turn_ended && !self.answer.started {
            let mut calls = parse_turn(kept, &profile.query_open, &profile.query_close);
            if let Some(tools) = profile.tools.as_ref().filter(|t| t.calls_per_turn > 0) {
                calls.truncate(tools.calls_per_turn);
            }
            let client = &self.request.client_tools;
            let for_client: Vec<&ToolCall> = calls
                .iter()
                .filter(|c| matches!(&c.parsed, Ok(call) if client.has(&call.name)))
                .collect();
            if !for_client.is_empty() {
                // The client runs these: the rollout ends here. Calls of
                // seeker's own functions in the same turn are not run.
                let take = if client.parallel { for_client.len() } else { 1 };
                self.client_calls = for_client
                    .into_iter()
                    .take(take)
                    .filter_map(|c| c.parsed.as_ref().ok())
                    .map(|call| ClientCall {
                        id: format!("call_{}", uuid::Uuid::new_v4().simple()),
                        name: call.name.clone(),
                        arguments: serde_json::Value::Object(call.arguments.clone()).to_string(),
                    })
                    .collect();
                self.transcript.push_str(kept);
                self.record(number, RoundOutcome::ToolCalls, tokens);
                return Ok(Some(FinishReason::ToolCalls));
            }
            if !calls.is_empty() {
                return self.tool_round(number, kept, &calls, tokens).await;
            }
        }
        match end {
            Some(RoundEnd::Query(raw)) if !self.answer.started => {
                self.transcript
                    .push_str(&profile.round_text(kept, &profile.query_close));
                if self.calls >= profile.max_searches {
                    // The round cap: this final round's search call is not run.
                    self.record(number, RoundOutcome::Search, tokens);
                    return Ok(Some(FinishReason::Length));
                }
                self.calls += 1;
                let cleaned = profile.clean_queries(&raw);
                if cleaned.queries.is_empty() {
                    self.record(number, RoundOutcome::NoQuery, tokens);
                    if profile.no_query.is_empty() {
                        return Ok(Some(FinishReason::Stop));
                    }
                    self.splice(profile.no_query.clone()).await?;
                } else {
                    let splice = self.search(number, cleaned.queries, cleaned.notes).await?;
                    self.searches += 1;
                    if let Some(last) = self.rounds.last_mut() {
                        last.tokens_generated = tokens;
                    }
                    self.splice(splice).await?;
                }
                if self.calls >= profile.max_searches && profile.on_round_cap == RoundCap::Stop {
                    return Ok(Some(FinishReason::Length));
                }
                Ok(None)
            }
            Some(RoundEnd::Page(raw)) if !self.answer.started => {
                let close = profile.pages.as_ref().map_or("", |p| p.close.as_str());
                self.transcript.push_str(&profile.round_text(kept, close));
                if self.calls >= profile.max_searches {
                    // The round cap: this final round's page action is not run.
                    self.record(number, RoundOutcome::Page, tokens);
                    return Ok(Some(FinishReason::Length));
                }
                self.calls += 1;
                let target = raw.trim();
                if target.is_empty() {
                    // Nothing to open: the policy's text for a page it cannot
                    // read, as ASearcher answers an empty page.
                    self.record(number, RoundOutcome::NoQuery, tokens);
                    let specials = self.ctx.engine.special_tokens();
                    let text = profile.page_failed("", "the page action names no page", specials);
                    self.splice(text).await?;
                } else {
                    self.open_page(number, target, tokens).await?;
                }
                if self.calls >= profile.max_searches && profile.on_round_cap == RoundCap::Stop {
                    return Ok(Some(FinishReason::Length));
                }
                Ok(None)
            }
            Some(RoundEnd::Answer(_)) | Some(RoundEnd::Query(_)) | Some(RoundEnd::Page(_)) => {
                // An answer, or a search call after answer text was already
                // streamed: the answer stands.
                self.transcript.push_str(kept);
                self.record(number, RoundOutcome::Answer, tokens);
                Ok(Some(FinishReason::Stop))
            }
            Some(RoundEnd::Pause) => Ok(None),
            Some(RoundEnd::Unmatched(_)) | Some(RoundEnd::DocumentsOpened) => {
                self.transcript.push_str(kept);
                self.record(number, RoundOutcome::InvalidAction, tokens);
                if profile.invalid_action.is_empty()
                    || self.answer.started
                    || self.calls >= profile.max_searches
                {
                    return Ok(Some(FinishReason::Stop));
                }
                self.calls += 1;
                self.splice(profile.invalid_action.clone()).await?;
                Ok(None)
            }
            None => {
                self.transcript.push_str(kept);
                let (outcome, reason) = match engine_finish {
                    Some(EngineFinish::Length) => (RoundOutcome::Length, FinishReason::Length),
                    _ => (RoundOutcome::Eos, FinishReason::Stop),
                };
                self.record(number, outcome, tokens);
                Ok(Some(reason))
            }
        }
    }

    /// A turn of tool calls: every search call's queries are searched at once
    /// (with the request's cache), the other calls get the profile's error or
    /// `unavailable` text, and the tool-response turn is spliced after the
    /// turn, which stays in the transcript as the model wrote it.
    async fn tool_round(
        &mut self,
        number: usize,
        kept: &str,
        calls: &[ToolCall],
        tokens: usize,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        // Tongyi DeepResearch keeps the turn stripped (`content.strip()`).
        self.transcript.push_str(if profile.strip_round {
            kept.trim()
        } else {
            kept
        });
        if self.calls >= profile.max_searches {
            // The round cap: the final round's calls are not run, and a call
            // is no answer.
            self.since_splice.clear();
            self.record(number, RoundOutcome::Search, tokens);
            return Ok(Some(FinishReason::Length));
        }
        self.calls += 1;
        let plans: Vec<CallPlan> = calls.iter().map(|c| profile.plan_call(c)).collect();
        let (mut queries, mut notes, mut targets) = (Vec::new(), Vec::new(), Vec::new());
        for (i, plan) in plans.iter().enumerate() {
            match plan {
                CallPlan::Search(cleaned) => {
                    queries.extend(cleaned.queries.iter().cloned());
                    notes.extend(cleaned.notes.iter().cloned());
                }
                // Why a call did not run, for the trace (the policy reads its
                // own error text in the response).
                CallPlan::Reply { reason, .. } => {
                    notes.push(format!("tool call {}: {reason}", i + 1));
                }
                CallPlan::Visit { urls, .. } => targets.extend(urls.iter().cloned()),
            }
        }
        // Every page of every visit call at once.
        let opened = self.open_pages(number, &targets).await?;
        let records = if queries.is_empty() {
            let outcome = if targets.is_empty() {
                RoundOutcome::NoQuery
            } else {
                RoundOutcome::Page
            };
            self.record(number, outcome, tokens);
            if let Some(last) = self.rounds.last_mut() {
                last.notes = notes;
            }
            Vec::new()
        } else {
            let records = self.run_queries(number, queries, notes).await?;
            self.searches += 1;
            if let Some(last) = self.rounds.last_mut() {
                last.tokens_generated = tokens;
            }
            records
        };
        if let Some(last) = self.rounds.last_mut() {
            last.pages = opened.iter().map(|(record, _)| record.clone()).collect();
        }
        // Each search call's records, in call order.
        let mut records = records.iter();
        let mut pages = targets.iter().zip(&opened);
        let results: Vec<ToolResult<'_>> = plans
            .iter()
            .map(|plan| match plan {
                CallPlan::Search(cleaned) => ToolResult::Search(
                    records
                        .by_ref()
                        .take(cleaned.queries.len())
                        .map(|r| (r.query.as_str(), r.outcome()))
                        .collect(),
                ),
                CallPlan::Reply { text, .. } => ToolResult::Reply(text),
                CallPlan::Visit { urls, goal } => ToolResult::Visit(
                    pages
                        .by_ref()
                        .take(urls.len())
                        .map(|(target, (record, page))| {
                            let page = match page {
                                Some(page) => Ok(page),
                                None => Err(record.error.as_deref().unwrap_or_default()),
                            };
                            (target.as_str(), page)
                        })
                        .collect(),
                    goal,
                ),
            })
            .collect();
        let refs: Vec<&ToolCall> = calls.iter().collect();
        let splice = profile.render_tool_splice(&refs, &results, self.ctx.engine.special_tokens());
        self.splice(splice).await?;
        if self.calls >= profile.max_searches && profile.on_round_cap == RoundCap::Stop {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    /// Whether a prompt over the context `limit` (in tokens) is so because of
    /// spliced documents rather than the client's conversation: after a round
    /// generated tokens (its search results came next), or when the
    /// conversation without the question search's documents fits.
    async fn documents_overflowed(&self, limit: usize) -> Result<bool, RolloutError> {
        if self.usage.completion_tokens > 0 {
            return Ok(true);
        }
        let Some(bare) = &self.bare_prompt else {
            return Ok(false);
        };
        let mut text = match bare {
            PromptText::Chat(turns) => {
                self.ctx
                    .engine
                    .render_chat_with_tools(turns, &self.template_tools)
                    .await?
            }
            PromptText::Raw(text) => text.clone(),
        };
        text.push_str(&self.ctx.profile.assistant_prefix);
        Ok(self.ctx.engine.count_tokens(&text).await? < limit)
    }

    /// Adds a record for a round that ran no search.
    fn record(&mut self, round: usize, outcome: RoundOutcome, tokens_generated: usize) {
        self.rounds.push(RoundRecord {
            round,
            outcome,
            queries: Vec::new(),
            notes: Vec::new(),
            results: Vec::new(),
            pages: Vec::new(),
            tokens_generated,
            prompt_tokens: if round > 0 {
                self.round_prompt.take()
            } else {
                None
            },
            prompt_tokens_cached: if round > 0 {
                self.round_cached.take()
            } else {
                None
            },
        });
    }

    /// Renders scanner events; returns the round's end, if it came.
    async fn on_scan_events(
        &mut self,
        scanned: &mut Vec<ScanEvent>,
    ) -> Result<Option<RoundEnd>, RolloutError> {
        let mut round_end = None;
        // Taken out and put back, so the buffer is reused token after token.
        let mut events = std::mem::take(scanned);
        for event in events.drain(..) {
            if let Some(end) = self.on_scan_event(event).await? {
                round_end = Some(end);
            }
        }
        *scanned = events;
        Ok(round_end)
    }

    /// Renders one scanner event; returns the round's end, if this is it.
    async fn on_scan_event(&mut self, event: ScanEvent) -> Result<Option<RoundEnd>, RolloutError> {
        let profile = &self.ctx.profile;
        match event {
            ScanEvent::Text {
                region: Region::Reasoning,
                text,
            } => {
                self.since_splice.push_str(&text);
                self.emit(RolloutEvent::Reasoning(text)).await?;
            }
            ScanEvent::Text {
                region: Region::Query | Region::Page,
                text,
            } => self.emit(RolloutEvent::Reasoning(text)).await?,
            ScanEvent::Text {
                region: Region::Answer,
                text,
            } => {
                if let Some(delta) = self.answer.push(&text) {
                    self.emit_answer(&delta).await?;
                }
            }
            ScanEvent::Open(Region::Query) => {
                let tag = profile.query_open.clone();
                self.emit(RolloutEvent::Reasoning(tag)).await?;
            }
            ScanEvent::Open(Region::Page) => {
                let tag = profile.pages.as_ref().map(|p| p.open.clone());
                self.emit(RolloutEvent::Reasoning(tag.unwrap_or_default()))
                    .await?;
            }
            ScanEvent::Open(_) => self.answer_open = true,
            ScanEvent::End(end) => {
                let tag = match &end {
                    RoundEnd::Query(_) => Some(profile.query_close.clone()),
                    RoundEnd::Page(_) => profile.pages.as_ref().map(|p| p.close.clone()),
                    RoundEnd::Pause => profile.pages.as_ref().map(|p| p.pause.clone()),
                    // A closing tag without its opening stays in the transcript
                    // (an invalid action), so the reasoning shows it too; inside
                    // an open answer it is the answer's business.
                    RoundEnd::Unmatched(kind) if !self.answer_open => match kind {
                        TagKind::QueryClose => Some(profile.query_close.clone()),
                        TagKind::AnswerClose => Some(profile.answer_close.clone()),
                        TagKind::PageClose => profile.pages.as_ref().map(|p| p.close.clone()),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(tag) = tag {
                    self.emit(RolloutEvent::Reasoning(tag)).await?;
                }
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Searches `queries` at once ([`Rollout::run_queries`]) and returns the
    /// text to splice in the profile's format.
    async fn search(
        &mut self,
        round: usize,
        queries: Vec<String>,
        notes: Vec<String>,
    ) -> Result<String, RolloutError> {
        let records = self.run_queries(round, queries, notes).await?;
        let outcomes: Vec<(&str, QueryOutcome<'_>)> = records
            .iter()
            .map(|r| (r.query.as_str(), r.outcome()))
            .collect();
        // What enters the context carries no control token of the model's
        // tokenizer (a web page could otherwise forge chat turns); the
        // events and citations keep the documents as the backend gave them.
        Ok(self
            .ctx
            .profile
            .render_splice_defusing(&outcomes, self.ctx.engine.special_tokens()))
    }

    /// Searches `queries` at once (repeats of this request come from its
    /// cache), reports the call and each query's documents, records the round
    /// and its documents, and returns one record per query, in order.
    async fn run_queries(
        &mut self,
        round: usize,
        queries: Vec<String>,
        notes: Vec<String>,
    ) -> Result<Vec<QueryRecord>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        self.emit(RolloutEvent::Search {
            round,
            queries: queries.clone(),
            notes: notes.clone(),
        })
        .await?;
        let mut missing: Vec<String> = Vec::new();
        for q in &queries {
            if !self.cache.contains_key(q) && !missing.contains(q) {
                missing.push(q.clone());
            }
        }
        let k = self.request.top_k.unwrap_or(profile.top_k);
        let backend = self
            .request
            .backend
            .clone()
            .unwrap_or_else(|| self.ctx.search.default_backend().to_string());
        let fresh = if missing.is_empty() {
            Vec::new()
        } else {
            // The client left: stop now, dropping every in-flight backend call
            // (their connections close), rather than wait out the deadline.
            tokio::select! {
                () = self.events.closed() => return Err(RolloutError::Cancelled),
                results = self.ctx.search.search_round(Some(&backend), &missing, k) => results,
            }
        };
        let mut fresh: HashMap<String, QueryResult> = missing.into_iter().zip(fresh).collect();
        let mut records = Vec::with_capacity(queries.len());
        for q in queries.iter() {
            let (result, cached) = match fresh.remove(q) {
                Some(r) => {
                    if let Ok(docs) = &r.result {
                        self.cache.insert(q.clone(), docs.clone());
                    }
                    (r.result, r.cached)
                }
                None => (Ok(self.cache.get(q).cloned().unwrap_or_default()), true),
            };
            let (documents, error, error_kind) = match result {
                Ok(docs) => (docs, None, None),
                Err(e) => (Vec::new(), Some(e.to_string()), Some(e.kind())),
            };
            let record = QueryRecord {
                round,
                query: q.clone(),
                backend: backend.clone(),
                documents,
                error,
                error_kind,
                cached,
            };
            self.emit(RolloutEvent::Results(record.clone())).await?;
            records.push(record);
        }
        for r in &records {
            self.documents.extend(r.documents.iter().cloned());
        }
        self.rounds.push(RoundRecord {
            round,
            outcome: RoundOutcome::Search,
            queries,
            notes,
            results: records.clone(),
            pages: Vec::new(),
            tokens_generated: 0,
            prompt_tokens: if round > 0 {
                self.round_prompt.take()
            } else {
                None
            },
            prompt_tokens_cached: if round > 0 {
                self.round_cached.take()
            } else {
                None
            },
        });
        Ok(records)
    }

    /// Opens a page action's target with the dispatcher's page reader,
    /// reports it, records the round, and splices its first chunk (the rest
    /// wait, one per round) or the profile's failure text.
    async fn open_page(
        &mut self,
        round: usize,
        target: &str,
        tokens: usize,
    ) -> Result<(), RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let specials = self.ctx.engine.special_tokens();
        let targets = [target.to_string()];
        let opened = self.open_pages_with(round, &targets, |page| {
            profile
                .page_chunks(&page.url, &page.title, &page.text, specials)
                .len()
        });
        let (record, page) = opened.await?.pop().expect("one target, one page");
        let mut chunks: VecDeque<PageChunk> = match &page {
            Some(page) => profile
                .page_chunks(&page.url, &page.title, &page.text, specials)
                .into(),
            None => VecDeque::new(),
        };
        self.rounds.push(RoundRecord {
            round,
            outcome: RoundOutcome::Page,
            queries: Vec::new(),
            notes: Vec::new(),
            results: Vec::new(),
            pages: vec![record.clone()],
            tokens_generated: tokens,
            prompt_tokens: self.round_prompt.take(),
            prompt_tokens_cached: self.round_cached.take(),
        });
        match chunks.pop_front() {
            Some(first) => {
                self.chunks = chunks;
                self.splice_chunk(first).await
            }
            None => {
                let reason = record.error.as_deref().unwrap_or_default();
                let text = profile.page_failed(target, reason, specials);
                self.splice(text).await
            }
        }
    }

    /// Opens `targets` at once (a `visit` call's pages) and reports each.
    async fn open_pages(
        &mut self,
        round: usize,
        targets: &[String],
    ) -> Result<Vec<(PageRecord, Option<crate::pages::Page>)>, RolloutError> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        self.open_pages_with(round, targets, |_| 1).await
    }

    /// Opens `targets` at once with the dispatcher's page reader (a page
    /// action without one fails as disabled), emits an
    /// [`RolloutEvent::OpenPage`] for each, adds each page read to the
    /// rollout's documents, and returns each record with its page.
    /// `chunks` says in how many chunks a page will be spliced (0: it has no
    /// readable text, which counts as a failure).
    async fn open_pages_with(
        &mut self,
        round: usize,
        targets: &[String],
        chunks: impl Fn(&crate::pages::Page) -> usize,
    ) -> Result<Vec<(PageRecord, Option<crate::pages::Page>)>, RolloutError> {
        let opened = match self.ctx.search.pages() {
            None => targets
                .iter()
                .map(|_| Err(crate::pages::PageError::Disabled))
                .collect(),
            Some(reader) => tokio::select! {
                () = self.events.closed() => return Err(RolloutError::Cancelled),
                pages = reader.open_all(targets) => pages,
            },
        };
        let mut out = Vec::with_capacity(targets.len());
        for (target, opened) in targets.iter().zip(opened) {
            let mut record = PageRecord {
                round,
                target: target.clone(),
                url: None,
                title: String::new(),
                source: String::new(),
                chars: 0,
                chunks: 0,
                error: None,
                error_kind: None,
            };
            let page = match opened {
                Ok(page) => {
                    record.url = Some(page.url.clone());
                    record.title = page.title.clone();
                    record.source = page.source.clone();
                    record.chars = page.text.chars().count();
                    record.chunks = chunks(&page);
                    if record.chunks == 0 || page.text.trim().is_empty() {
                        record.chunks = 0;
                        record.error = Some("the page has no readable text".into());
                        record.error_kind = Some("empty");
                        None
                    } else {
                        // A page opened again is one document.
                        let known = self
                            .documents
                            .iter()
                            .any(|d| d.id == page.url && d.backend == page.source);
                        if !known {
                            self.documents.push(Document {
                                id: page.url.clone(),
                                title: page.title.clone(),
                                text: crate::search::clean::truncate_chars(&page.text, 2000)
                                    .to_string(),
                                url: (page.source == "web").then(|| page.url.clone()),
                                score: 0.0,
                                backend: page.source.clone(),
                            });
                        }
                        Some(page)
                    }
                }
                Err(e) => {
                    record.error = Some(e.to_string());
                    record.error_kind = Some(e.kind());
                    None
                }
            };
            self.emit(RolloutEvent::OpenPage(record.clone())).await?;
            out.push((record, page));
        }
        Ok(out)
    }

    /// Splices one page chunk, remembering where it is for its short form.
    async fn splice_chunk(&mut self, chunk: PageChunk) -> Result<(), RolloutError> {
        let start = self.transcript.len();
        if let Some(short) = chunk.short {
            self.unread_chunk = Some((start..start + chunk.full.len(), short));
        }
        self.splice(chunk.full).await
    }

    /// Appends `splice` to the transcript and shows it in the trace.
    async fn splice(&mut self, splice: String) -> Result<(), RolloutError> {
        self.transcript.push_str(&splice);
        self.since_splice.clear();
        self.emit(RolloutEvent::Splice(splice)).await
    }

    async fn finish(mut self, finish_reason: FinishReason) -> Result<RolloutOutcome, RolloutError> {
        // A turn of calls for the client is no answer.
        let calls = finish_reason == FinishReason::ToolCalls;
        if !(self.answer.started || self.answer_open || calls) {
            let after = self.since_splice.trim();
            let text = match self.ctx.profile.answer_fallback {
                AnswerFallback::None => None,
                AnswerFallback::AfterLastSplice => Some(after.to_string()),
                AnswerFallback::LastBoxed => Some(
                    crate::profile::last_boxed(after)
                        .map_or(after, str::trim)
                        .to_string(),
                ),
            };
            if let Some(text) = text {
                self.emit_answer(&text).await?;
            }
        }
        // A partial stop string that never completed is answer text after all.
        let rest = self.stop.flush();
        if !rest.is_empty() {
            self.answer_sent.push_str(&rest);
            self.emit(RolloutEvent::Answer(rest)).await?;
        }
        // No round reached the engine (the client's own assistant message
        // already held the answer): the prompt is still counted.
        if !self.engine_ran {
            match self.ctx.engine.count_tokens(&self.transcript).await {
                Ok(n) => self.usage.prompt_tokens = n,
                Err(e) => tracing::warn!("usage: counting the prompt's tokens failed: {e}"),
            }
        }
        // What was sent is the answer.
        let answer = std::mem::take(&mut self.answer_sent);
        let transcript = self.transcript.split_off(self.prompt_len);
        Ok(RolloutOutcome {
            answer,
            finish_reason,
            usage: self.usage,
            searches: self.searches,
            documents: std::mem::take(&mut self.documents),
            tool_calls: std::mem::take(&mut self.client_calls),
            prompt: std::mem::take(&mut self.transcript),
            transcript,
            rounds: std::mem::take(&mut self.rounds),
            resumed: self.resumed,
        })
    }
}

/// `value` with the control-token strings inside its strings (keys and
/// values) defused, as message text is ([`defuse`]).
fn defuse_json(value: &serde_json::Value, specials: &[String]) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(defuse(s, specials).into_owned()),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| defuse_json(v, specials)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (defuse(k, specials).into_owned(), defuse_json(v, specials)))
                .collect(),
        ),
        other => other.clone(),
    }
}
