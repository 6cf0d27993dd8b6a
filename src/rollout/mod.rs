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
mod decide;
mod prompt;
mod resume;
mod round;
mod search;
mod types;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::{EngineError, EngineEvent, EngineFinish, GenerationParams};
use crate::profile::{AnswerFallback, PageChunk, Profile, PromptText};
use crate::scanner::{RoundEnd, ScanEvent, TagScanner};
use crate::search::Document;
use answer::{AnswerStripper, StopFilter};
pub use resume::{Resumed, Unresumable};
pub use types::{
    ClientCall, ClientTools, FinishReason, PageRecord, QueryRecord, RolloutContext, RolloutError,
    RolloutEvent, RolloutOutcome, RolloutRequest, RolloutUsage, RoundOutcome, RoundRecord,
    ToolChoice,
};

/// How a round ended, for [`Rollout::end_round`] and `decide`.
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
    /// This rollout's id for the engine ([`GenerationParams::session`]).
    session: u64,
    /// Prompt and everything after it: what the next round continues.
    transcript: String,
    prompt: PromptState,
    ledger: Ledger,
    meter: Meter,
    answer: AnswerState,
    reading: Reading,
    /// The continued message's trusted prefix, if it had one.
    resumed: Option<Resumed>,
}

/// How the prompt was built, for what later rounds need of it.
#[derive(Default)]
struct PromptState {
    /// Byte length of the prompt within the transcript.
    len: usize,
    /// The prompt without the question search's documents (prefetch
    /// profiles only), before the assistant prefix: tells documents that
    /// overflow the context from a conversation that does.
    bare: Option<PromptText>,
    /// The functions the chat template is given: the profile's, then the
    /// client's (unless its `tool_choice` is `none`).
    tools: Vec<serde_json::Value>,
}

/// What the rollout did: its rounds, calls and documents, as its outcome
/// reports them.
#[derive(Default)]
struct Ledger {
    rounds: Vec<RoundRecord>,
    /// Search calls, page actions, tool-call turns and invalid actions so
    /// far: what the round cap counts.
    calls: usize,
    /// Search calls that ran a query.
    searches: usize,
    documents: Vec<Document>,
    /// This request's cache: cleaned query → its documents. Failures are not
    /// kept: the same query later in the rollout tries the backend again.
    cache: HashMap<String, Vec<Document>>,
    /// The client calls that ended the rollout.
    client_calls: Vec<ClientCall>,
}

/// Tokens, as the engine reported them round by round.
#[derive(Default)]
struct Meter {
    usage: RolloutUsage,
    /// Tokens generated before the current round (now part of its prompt).
    generated_before_round: usize,
    /// The engine ran at least one round (otherwise usage is counted apart).
    engine_ran: bool,
    /// Cached prompt tokens the engine reported for the current round.
    round_cached: Option<usize>,
    /// The current round's whole prompt, in tokens, once the engine took it.
    round_prompt: Option<usize>,
}

/// The answer as it streams, and the text it falls back to.
struct AnswerState {
    /// Reasoning-region text generated since the last splice (the fallback
    /// answer).
    since_splice: String,
    stripper: AnswerStripper,
    /// The request's stop strings, applied to the stripped answer.
    stop: StopFilter,
    /// Answer text sent so far: the answer.
    sent: String,
    /// The answer region was opened in the current round.
    open: bool,
}

/// The page being read, chunk by chunk (ASearcher's pauses).
#[derive(Default)]
struct Reading {
    /// Chunks of the open page still to splice, one per round.
    chunks: VecDeque<PageChunk>,
    /// The chunk spliced last and not yet read: its byte range in the
    /// transcript and its short form, put in its place once the next round
    /// has ended.
    unread: Option<(std::ops::Range<usize>, String)>,
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
            session: NEXT_SESSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            transcript: String::new(),
            prompt: PromptState::default(),
            ledger: Ledger::default(),
            meter: Meter::default(),
            answer: AnswerState {
                since_splice: String::new(),
                stripper: AnswerStripper::default(),
                stop: StopFilter::new(&request.stop),
                sent: String::new(),
                open: false,
            },
            reading: Reading::default(),
            resumed: None,
        }
    }

    /// Sends answer text through the stop filter.
    async fn emit_answer(&mut self, text: &str) -> Result<(), RolloutError> {
        let out = self.answer.stop.push(text);
        if out.is_empty() {
            return Ok(());
        }
        self.answer.sent.push_str(&out);
        self.emit(RolloutEvent::Answer(out)).await
    }

    async fn emit(&self, event: RolloutEvent) -> Result<(), RolloutError> {
        self.events
            .send(event)
            .await
            .map_err(|_| RolloutError::Cancelled)
    }

    async fn run(mut self) -> Result<RolloutOutcome, RolloutError> {
        let mut continuation = self.start().await?;
        // Events from the scanner, reused round after round.
        let mut scanned = Vec::new();
        loop {
            if let Some(reason) = self.round(continuation.take(), &mut scanned).await? {
                return self.finish(reason).await;
            }
        }
    }

    /// One round: the client's continued text (first round only) scanned as
    /// if generated, then generation until a closing tag, the engine's stop
    /// or the budget, then what its end means ([`Rollout::end_round`]).
    /// `Some(reason)` ends the rollout.
    async fn round(
        &mut self,
        continuation: Option<String>,
        scanned: &mut Vec<ScanEvent>,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let number = self.ledger.rounds.iter().filter(|r| r.round > 0).count() + 1;
        // While page chunks wait, the round also ends at the pause string.
        let mut scanner = TagScanner::new(if self.reading.chunks.is_empty() {
            profile.tag_set()
        } else {
            profile.reading_tag_set()
        });
        self.answer.open = false;
        let mut round = RoundEnded {
            number,
            end: None,
            engine_finish: None,
            tokens: 0,
        };

        // The client's assistant message is scanned as if generated.
        if let Some(text) = continuation {
            scanner.push(&text, scanned);
            round.end = self.on_scan_events(scanned).await?;
            // A tool-calling turn that ends with a closed call has ended:
            // its calls run before any token is generated.
            if round.end.is_none()
                && profile.tools.is_some()
                && text.trim_end().ends_with(profile.query_close.as_str())
            {
                scanner.finish(scanned);
                round.end = self.on_scan_events(scanned).await?;
                round.engine_finish = Some(EngineFinish::Stop);
            }
        }
        if round.end.is_none() && round.engine_finish.is_none() && !self.answer.stop.stopped {
            if let Some(reason) = self.generate(&mut scanner, scanned, &mut round).await? {
                return Ok(Some(reason));
            }
        }

        let kept = scanner.kept_text().to_string();
        let finished = self.end_round(round, &kept).await?;
        self.announce_round(number).await?;
        Ok(finished)
    }

    /// The engine's part of a round: continues the transcript and what the
    /// scanner kept, feeding each token to the scanner until a closing tag
    /// ends the round (the engine is then cancelled), the engine stops, or a
    /// stop string ends the answer. `Some(Length)` when the budget was spent
    /// before the round or spliced documents filled the context (the round is
    /// recorded and announced here).
    async fn generate(
        &mut self,
        scanner: &mut TagScanner,
        scanned: &mut Vec<ScanEvent>,
        round: &mut RoundEnded,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let remaining = self
            .request
            .max_tokens
            .saturating_sub(self.meter.usage.completion_tokens);
        if remaining == 0 {
            scanner.finish(scanned);
            self.on_scan_events(scanned).await?;
            self.transcript.push_str(scanner.kept_text());
            self.record(round.number, RoundOutcome::Length, round.tokens);
            self.announce_round(round.number).await?;
            return Ok(Some(FinishReason::Length));
        }
        let params = self.round_params(remaining);
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
                self.meter.usage.prompt_tokens =
                    prompt_tokens.saturating_sub(self.meter.generated_before_round);
                self.meter.engine_ran = true;
                self.transcript.push_str(scanner.kept_text());
                self.record(round.number, RoundOutcome::Length, 0);
                self.announce_round(round.number).await?;
                return Ok(Some(FinishReason::Length));
            }
            Err(e) => return Err(e.into()),
        };
        self.meter.engine_ran = true;
        self.meter.round_prompt = Some(generation.prompt_tokens);
        self.meter.usage.prompt_tokens = generation
            .prompt_tokens
            .saturating_sub(self.meter.generated_before_round);
        while round.end.is_none() && round.engine_finish.is_none() && !self.answer.stop.stopped {
            let next = tokio::select! {
                // The client left: stop now, not at the next token (a long
                // prefill emits nothing for a while). Dropping the stream
                // cancels the engine.
                () = self.events.closed() => return Err(RolloutError::Cancelled),
                next = generation.events.recv() => next,
            };
            match next {
                Some(Ok(EngineEvent::Text { text, tokens })) => {
                    self.meter.usage.completion_tokens += tokens;
                    round.tokens += tokens;
                    scanner.push(&text, scanned);
                }
                Some(Ok(EngineEvent::Prompt { tokens, cached })) => {
                    self.meter.usage.prompt_tokens =
                        tokens.saturating_sub(self.meter.generated_before_round);
                    self.meter.round_prompt = Some(tokens);
                    self.meter.round_cached = cached;
                }
                Some(Ok(EngineEvent::Done(finish))) => {
                    scanner.finish(scanned);
                    round.engine_finish = Some(finish);
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(
                        EngineError::Internal("generation ended without finishing".into()).into(),
                    )
                }
            }
            round.end = self.on_scan_events(scanned).await?;
        }
        // Cancels the engine: nothing after the closing tag is kept.
        drop(generation);
        self.meter.generated_before_round = self.meter.usage.completion_tokens;
        Ok(None)
    }

    /// The engine's parameters for a round with `remaining` tokens of budget:
    /// the profile's round cap, its stop strings (and the pause string while
    /// page chunks wait), this rollout's session.
    fn round_params(&self, remaining: usize) -> GenerationParams {
        let profile = &self.ctx.profile;
        let round_cap = match profile.max_round_tokens {
            0 => usize::MAX,
            n => n,
        };
        let mut stop = profile.stop_strings();
        if let Some(pages) = profile
            .pages
            .as_ref()
            .filter(|_| !self.reading.chunks.is_empty())
        {
            if !pages.pause.is_empty() {
                stop.push(pages.pause.clone());
            }
        }
        GenerationParams {
            max_tokens: remaining.min(round_cap),
            temperature: self.request.temperature,
            top_p: self.request.top_p,
            stop,
            session: Some(self.session),
        }
    }

    async fn finish(mut self, finish_reason: FinishReason) -> Result<RolloutOutcome, RolloutError> {
        // A turn of calls for the client is no answer.
        let calls = finish_reason == FinishReason::ToolCalls;
        if !(self.answer.stripper.started || self.answer.open || calls) {
            let after = self.answer.since_splice.trim();
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
        let rest = self.answer.stop.flush();
        if !rest.is_empty() {
            self.answer.sent.push_str(&rest);
            self.emit(RolloutEvent::Answer(rest)).await?;
        }
        // No round reached the engine (the client's own assistant message
        // already held the answer): the prompt is still counted.
        if !self.meter.engine_ran {
            match self.ctx.text.count_tokens(&self.transcript).await {
                Ok(n) => self.meter.usage.prompt_tokens = n,
                Err(e) => tracing::warn!("usage: counting the prompt's tokens failed: {e}"),
            }
        }
        // What was sent is the answer.
        let answer = std::mem::take(&mut self.answer.sent);
        let transcript = self.transcript.split_off(self.prompt.len);
        Ok(RolloutOutcome {
            answer,
            finish_reason,
            usage: self.meter.usage,
            searches: self.ledger.searches,
            documents: std::mem::take(&mut self.ledger.documents),
            tool_calls: std::mem::take(&mut self.ledger.client_calls),
            prompt: std::mem::take(&mut self.transcript),
            transcript,
            rounds: std::mem::take(&mut self.ledger.rounds),
            resumed: self.resumed,
        })
    }
}
