//! The search loop: one request's rollout, round by round.
//!
//! generate → scan → search → splice → continue, within the profile's limits:
//! 1. The prompt is the client's conversation with the last user message
//!    replaced by the profile's instruction for that question, rendered through
//!    the model's chat template. With `search_question_first` the question is
//!    searched before the first token and its documents spliced after the
//!    generation prompt or at the start of the user message.
//! 2. Each round the engine continues the whole transcript. The
//!    [`TagScanner`] ends the round at the first closing tag; the text after it
//!    is discarded and the engine is cancelled.
//! 3. A closed search call is searched (top-k from the profile) and the
//!    documents are spliced right after the closing tag in the profile's format.
//!    After `max_searches` searches, one final round runs in which a search call
//!    is not executed.
//! 4. The answer is the closed answer tag's content (stripped); an answer tag
//!    left open at EOS or at the budget counts as far as it got; otherwise the
//!    profile's fallback applies.
//!
//! Events go out on a channel as they happen: reasoning (everything the model
//! sees besides the answer: its own text, its search calls and the spliced
//! documents, byte for byte) and answer deltas. When the receiver is dropped the
//! rollout stops, which drops the engine stream and cancels generation.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::{
    ChatTurn, Engine, EngineError, EngineEvent, EngineFinish, GenerationParams, Role,
};
use crate::profile::{AnswerFallback, Profile, QuestionSearch};
use crate::scanner::{Region, RoundEnd, ScanEvent, TagScanner};
use crate::search::{Document, SearchBackend};

/// What a rollout needs: the engine, the search backend and the policy profile.
#[derive(Clone)]
pub struct RolloutContext {
    pub engine: Arc<dyn Engine>,
    pub backend: Arc<dyn SearchBackend>,
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
}

/// Something that happened during a rollout, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum RolloutEvent {
    /// Trace text: the model's reasoning, its search calls and the spliced
    /// documents, exactly as they enter the transcript.
    Reasoning(String),
    /// A search round starts. `round` counts from 1; 0 is the search of the
    /// question before the first token.
    Search { round: usize, queries: Vec<String> },
    /// Documents for one query of a round (empty on failure, with `error`).
    Results {
        round: usize,
        query: String,
        documents: Vec<Document>,
        error: Option<String>,
    },
    /// The next piece of the answer.
    Answer(String),
}

/// Why the rollout ended, in OpenAI's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The policy answered (or stopped by itself).
    Stop,
    /// The token budget, the context length or the round cap ended the answer.
    Length,
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

/// The result of a finished rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutOutcome {
    /// The final answer, equal to the concatenated [`RolloutEvent::Answer`] deltas.
    pub answer: String,
    pub finish_reason: FinishReason,
    pub usage: RolloutUsage,
    /// Search rounds run by the model (the question search is not counted).
    pub searches: usize,
    /// Every document spliced, in order.
    pub documents: Vec<Document>,
    /// The full transcript the model saw at the end (prompt, rounds, splices).
    pub transcript: String,
}

/// Why a rollout could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("the request has no user message to answer")]
    NoQuestion,
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The event receiver was dropped (the client left).
    #[error("cancelled")]
    Cancelled,
}

/// Strips the answer while streaming it: leading whitespace is dropped and
/// trailing whitespace is held until more text follows, so the concatenated
/// output equals `content.trim()`.
#[derive(Default)]
struct AnswerStripper {
    started: bool,
    held: String,
    emitted: String,
}

impl AnswerStripper {
    fn push(&mut self, text: &str) -> Option<String> {
        let text = if self.started {
            text
        } else {
            text.trim_start()
        };
        if text.is_empty() {
            return None;
        }
        self.started = true;
        self.held.push_str(text);
        let keep = self.held.trim_end().len();
        if keep == 0 {
            return None;
        }
        let out: String = self.held.drain(..keep).collect();
        self.emitted.push_str(&out);
        Some(out)
    }
}

/// Runs one rollout to the end, sending events on `events`.
///
/// # Errors
/// [`RolloutError::NoQuestion`] without a user message,
/// [`RolloutError::Engine`] on engine failure, [`RolloutError::Cancelled`]
/// when `events` is closed.
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
    transcript: String,
    usage: RolloutUsage,
    /// Tokens generated before the current round (now part of its prompt).
    generated_in_transcript: usize,
    documents: Vec<Document>,
    /// Reasoning-region text generated since the last splice (the fallback answer).
    since_splice: String,
    answer: AnswerStripper,
    /// The answer region was opened in the current round.
    answer_open: bool,
}

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
            usage: RolloutUsage::default(),
            generated_in_transcript: 0,
            documents: Vec::new(),
            since_splice: String::new(),
            answer: AnswerStripper::default(),
            answer_open: false,
        }
    }

    async fn emit(&self, event: RolloutEvent) -> Result<(), RolloutError> {
        self.events
            .send(event)
            .await
            .map_err(|_| RolloutError::Cancelled)
    }

    async fn run(mut self) -> Result<RolloutOutcome, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let question_at = self
            .request
            .messages
            .iter()
            .rposition(|m| m.role == Role::User && !m.content.trim().is_empty())
            .ok_or(RolloutError::NoQuestion)?;
        let question = self.request.messages[question_at].content.clone();
        let mut messages = self.request.messages[..=question_at].to_vec();
        messages[question_at].content = profile.user_message(&question);
        match profile.search_question_first {
            QuestionSearch::Off => {
                self.transcript = self.ctx.engine.render_chat(&messages).await?;
            }
            QuestionSearch::Assistant => {
                self.transcript = self.ctx.engine.render_chat(&messages).await?;
                let query = profile.normalize_question(&question);
                let splice = self.search(0, query).await?;
                self.splice(splice).await?;
            }
            QuestionSearch::User => {
                let query = profile.normalize_question(&question);
                let splice = self.search(0, query).await?;
                let block = format!("{}\n", splice.trim());
                messages[question_at].content.insert_str(0, &block);
                self.transcript = self.ctx.engine.render_chat(&messages).await?;
                self.emit(RolloutEvent::Reasoning(block)).await?;
            }
        }

        let mut scanner = TagScanner::new(profile.tag_set());
        let mut searches = 0;
        let mut scanned = Vec::new();
        loop {
            let remaining = self
                .request
                .max_tokens
                .saturating_sub(self.usage.completion_tokens);
            if remaining == 0 {
                return self.finish(FinishReason::Length, searches).await;
            }
            let params = GenerationParams {
                max_tokens: remaining,
                temperature: self.request.temperature,
                top_p: self.request.top_p,
                stop: profile.stop_strings(),
            };
            let mut generation = match self.ctx.engine.generate(&self.transcript, &params).await {
                Ok(g) => g,
                // Spliced documents filled the context: the answer ends here, as
                // at the token budget. A prompt too long to start is an error.
                Err(EngineError::ContextLength { .. }) if self.usage.completion_tokens > 0 => {
                    return self.finish(FinishReason::Length, searches).await;
                }
                Err(e) => return Err(e.into()),
            };
            self.usage.prompt_tokens = generation
                .prompt_tokens
                .saturating_sub(self.generated_in_transcript);
            scanner.reset();
            self.answer_open = false;
            let mut engine_finish = None;
            while !scanner.is_done() {
                match generation.events.recv().await {
                    Some(Ok(EngineEvent::Text { text, tokens })) => {
                        self.usage.completion_tokens += tokens;
                        scanner.push(&text, &mut scanned);
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
                let mut round_end = None;
                for event in scanned.drain(..) {
                    if let Some(end) = self.on_scan_event(event).await? {
                        round_end = Some(end);
                    }
                }
                if let Some(end) = round_end {
                    // Cancel the engine: nothing after the closing tag is kept.
                    drop(generation);
                    self.transcript.push_str(scanner.kept_text());
                    self.generated_in_transcript = self.usage.completion_tokens;
                    match end {
                        RoundEnd::Query(query)
                            if searches < profile.max_searches && !self.answer.started =>
                        {
                            searches += 1;
                            let query = query.trim().to_string();
                            let splice = self.search(searches, query).await?;
                            self.splice(splice).await?;
                            break;
                        }
                        // The round cap: the final round's search is not run.
                        RoundEnd::Query(_) if !self.answer.started => {
                            return self.finish(FinishReason::Length, searches).await;
                        }
                        _ => return self.finish(FinishReason::Stop, searches).await,
                    }
                }
                if let Some(finish) = engine_finish {
                    self.transcript.push_str(scanner.kept_text());
                    let reason = match finish {
                        EngineFinish::Stop => FinishReason::Stop,
                        EngineFinish::Length => FinishReason::Length,
                    };
                    return self.finish(reason, searches).await;
                }
            }
        }
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
                region: Region::Query,
                text,
            } => self.emit(RolloutEvent::Reasoning(text)).await?,
            ScanEvent::Text {
                region: Region::Answer,
                text,
            } => {
                if let Some(delta) = self.answer.push(&text) {
                    self.emit(RolloutEvent::Answer(delta)).await?;
                }
            }
            ScanEvent::Open(Region::Query) => {
                let tag = profile.query_open.clone();
                self.emit(RolloutEvent::Reasoning(tag)).await?;
            }
            ScanEvent::Open(_) => self.answer_open = true,
            ScanEvent::End(end) => {
                if let RoundEnd::Query(_) = &end {
                    let tag = profile.query_close.clone();
                    self.emit(RolloutEvent::Reasoning(tag)).await?;
                }
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Searches `query`, reports the call and its documents, and returns the
    /// text to splice for them.
    async fn search(&mut self, round: usize, query: String) -> Result<String, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        self.emit(RolloutEvent::Search {
            round,
            queries: vec![query.clone()],
        })
        .await?;
        let mut results = self
            .ctx
            .backend
            .search(std::slice::from_ref(&query), profile.top_k)
            .await;
        let (documents, error) = match results.pop() {
            Some(Ok(docs)) => (docs, None),
            Some(Err(e)) => (Vec::new(), Some(e.to_string())),
            None => (Vec::new(), Some("the backend returned no result".into())),
        };
        if let Some(e) = &error {
            tracing::warn!(round, error = %e, "search failed; splicing no documents");
        }
        let splice = profile.render_splice(&documents);
        self.documents.extend(documents.iter().cloned());
        self.emit(RolloutEvent::Results {
            round,
            query,
            documents,
            error,
        })
        .await?;
        Ok(splice)
    }

    /// Appends `splice` to the transcript and shows it in the trace.
    async fn splice(&mut self, splice: String) -> Result<(), RolloutError> {
        self.transcript.push_str(&splice);
        self.since_splice.clear();
        self.emit(RolloutEvent::Reasoning(splice)).await
    }

    async fn finish(
        mut self,
        finish_reason: FinishReason,
        searches: usize,
    ) -> Result<RolloutOutcome, RolloutError> {
        let answer = if self.answer.started || self.answer_open {
            // The answer was (being) streamed: what was sent is the answer.
            self.answer.emitted.clone()
        } else {
            match self.ctx.profile.answer_fallback {
                AnswerFallback::None => String::new(),
                AnswerFallback::AfterLastSplice => {
                    let text = self.since_splice.trim().to_string();
                    if !text.is_empty() {
                        self.emit(RolloutEvent::Answer(text.clone())).await?;
                    }
                    text
                }
            }
        };
        Ok(RolloutOutcome {
            answer,
            finish_reason,
            usage: self.usage,
            searches,
            documents: std::mem::take(&mut self.documents),
            transcript: std::mem::take(&mut self.transcript),
        })
    }
}
