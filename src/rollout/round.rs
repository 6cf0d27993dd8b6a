//! The end of a round: what the scanner saw, the round's record and events,
//! and the search call or tool-call turn it ends in.

use std::sync::Arc;

use super::ToolChoice;
use super::{
    ClientCall, FinishReason, Rollout, RolloutError, RolloutEvent, RoundEnded, RoundOutcome,
    RoundRecord,
};
use crate::engine::EngineFinish;
use crate::profile::{CallPlan, Profile, PromptText, RoundCap, ToolResult};
use crate::scanner::{Region, RoundEnd, ScanEvent, TagKind};
use crate::toolcall::{parse_turn, ToolCall};

impl Rollout<'_> {
    /// Sends [`RolloutEvent::RoundEnd`] for round `number`, from its record.
    pub(super) async fn announce_round(&self, number: usize) -> Result<(), RolloutError> {
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
    pub(super) async fn end_round(
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
            let mut calls = turn_calls(&profile, kept);
            // `tool_choice: "none"`: the client's functions were not offered;
            // a call of one the model writes anyway is text, not a call.
            let client = &self.request.client_tools;
            if client.choice == ToolChoice::None {
                calls.retain(|c| !matches!(&c.parsed, Ok(call) if client.has(&call.name)));
            }
            // A call of the profile's answer function is the answer.
            if let Some(answer) = profile.answer_of(&calls) {
                self.transcript.push_str(kept);
                self.record(number, RoundOutcome::Answer, tokens);
                if let Some(text) = self.answer.push(&answer) {
                    self.emit_answer(&text).await?;
                }
                return Ok(Some(FinishReason::Stop));
            }
            if self.take_client_calls(&calls) {
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
                self.query_round(number, kept, &raw, tokens).await
            }
            Some(RoundEnd::Page(raw)) if !self.answer.started => {
                self.page_round(number, kept, &raw, tokens).await
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
                self.invalid_action_round(number, kept, tokens).await
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

    /// Keeps, as `client_calls`, the calls in `calls` of the
    /// client's own functions (all of them when the client allows parallel
    /// calls, else the first), each with a fresh id; returns whether there
    /// were any. The client runs these, so the rollout ends with the turn;
    /// calls of seeker's own functions in the same turn are not run.
    fn take_client_calls(&mut self, calls: &[ToolCall]) -> bool {
        let client = &self.request.client_tools;
        let for_client: Vec<&ToolCall> = calls
            .iter()
            .filter(|c| matches!(&c.parsed, Ok(call) if client.has(&call.name)))
            .collect();
        if for_client.is_empty() {
            return false;
        }
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
        true
    }

    /// After a call's splice: `length` when the call cap is reached and the
    /// profile stops there (`on_round_cap = "stop"`), else the rollout goes
    /// on.
    fn stop_at_cap(&self) -> Option<FinishReason> {
        let profile = &self.ctx.profile;
        (self.calls >= profile.max_searches && profile.on_round_cap == RoundCap::Stop)
            .then_some(FinishReason::Length)
    }

    /// A round that ended in a search call with the `raw` query text: keeps
    /// the round's text, then (below the search cap) searches the cleaned
    /// queries and splices the documents, or splices the profile's no-query
    /// text. `Some(reason)` ends the rollout: at the cap, with no query and
    /// no no-query text, or at the cap after this search when the profile
    /// stops there.
    async fn query_round(
        &mut self,
        number: usize,
        kept: &str,
        raw: &str,
        tokens: usize,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        self.transcript
            .push_str(&profile.round_text(kept, &profile.query_close));
        if self.calls >= profile.max_searches {
            // The round cap: this final round's search call is not run.
            self.record(number, RoundOutcome::Search, tokens);
            return Ok(Some(FinishReason::Length));
        }
        self.calls += 1;
        let cleaned = profile.clean_queries(raw);
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
        Ok(self.stop_at_cap())
    }

    /// A round that ended in a page action naming `raw`: keeps the round's
    /// text, then (below the call cap) opens the page and splices its first
    /// chunk, or splices the profile's failed-page text when it names none.
    /// `Some(reason)` ends the rollout: at the cap, or at the cap after this
    /// action when the profile stops there.
    async fn page_round(
        &mut self,
        number: usize,
        kept: &str,
        raw: &str,
        tokens: usize,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
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
            let specials = self.ctx.text.special_tokens();
            let text = profile.page_failed("", "the page action names no page", specials);
            self.splice(text).await?;
        } else {
            self.open_page(number, target, tokens).await?;
        }
        Ok(self.stop_at_cap())
    }

    /// A round that ended in a tag the profile does not act on (or in the
    /// document block the policy started writing itself): keeps its text and
    /// splices the profile's invalid-action text, which counts as a call.
    /// `Some(FinishReason::Stop)` when the profile has no such text, answer
    /// text was already streamed, or the call cap is reached.
    async fn invalid_action_round(
        &mut self,
        number: usize,
        kept: &str,
        tokens: usize,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
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

    /// A turn of tool calls: every search call's queries are searched at once
    /// (with the request's cache), the other calls get the profile's error or
    /// `unavailable` text, and the tool-response turn is spliced after the
    /// turn, which stays in the transcript as the model wrote it.
    pub(super) async fn tool_round(
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
        let plans: Vec<CallPlan> = calls
            .iter()
            .map(|c| self.without_repeats(&profile, profile.plan_call(c)))
            .collect();
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
        let splice = profile.render_tool_splice(&refs, &results, self.ctx.text.special_tokens());
        self.splice(splice).await?;
        Ok(self.stop_at_cap())
    }

    /// `plan` without the queries this rollout already searched, when the
    /// profile answers repeated queries (`tools.repeated`): a search call
    /// left with none gets that reply instead. Queries compare trimmed and
    /// lower-cased.
    fn without_repeats(&self, profile: &Profile, plan: CallPlan) -> CallPlan {
        let repeated = profile.tools.as_ref().map_or("", |t| t.repeated.as_str());
        let CallPlan::Search(mut cleaned) = plan else {
            return plan;
        };
        if repeated.is_empty() {
            return CallPlan::Search(cleaned);
        }
        let key = |q: &str| q.trim().to_lowercase();
        let before: std::collections::HashSet<String> = self
            .rounds
            .iter()
            .filter(|r| r.round > 0)
            .flat_map(|r| r.queries.iter().map(|q| key(q)))
            .collect();
        let (new, old): (Vec<String>, Vec<String>) = cleaned
            .queries
            .into_iter()
            .partition(|q| !before.contains(&key(q)));
        if new.is_empty() {
            return CallPlan::Reply {
                text: repeated.to_string(),
                reason: format!("already searched: {old:?}"),
            };
        }
        if !old.is_empty() {
            cleaned
                .notes
                .push(format!("dropped queries searched before: {old:?}"));
        }
        cleaned.queries = new;
        CallPlan::Search(cleaned)
    }

    /// Whether a prompt over the context `limit` (in tokens) is so because of
    /// spliced documents rather than the client's conversation: after a round
    /// generated tokens (its search results came next), or when the
    /// conversation without the question search's documents fits.
    pub(super) async fn documents_overflowed(&self, limit: usize) -> Result<bool, RolloutError> {
        if self.usage.completion_tokens > 0 {
            return Ok(true);
        }
        let Some(bare) = &self.bare_prompt else {
            return Ok(false);
        };
        let mut text = match bare {
            PromptText::Chat(turns) => self.ctx.text.render(turns, &self.template_tools)?,
            PromptText::Raw(text) => text.clone(),
        };
        text.push_str(&self.ctx.profile.assistant_prefix);
        Ok(self.ctx.text.count_tokens(&text).await? < limit)
    }

    /// The current round's prompt and cached tokens, as the engine reported
    /// them, taken for its record; `(None, None)` for round 0 (the question
    /// search, which runs before the engine).
    pub(super) fn take_round_prompt(&mut self, round: usize) -> (Option<usize>, Option<usize>) {
        if round == 0 {
            return (None, None);
        }
        (self.round_prompt.take(), self.round_cached.take())
    }

    /// Adds a record for a round that ran no search.
    pub(super) fn record(&mut self, round: usize, outcome: RoundOutcome, tokens_generated: usize) {
        let (prompt_tokens, prompt_tokens_cached) = self.take_round_prompt(round);
        self.rounds.push(RoundRecord {
            round,
            outcome,
            queries: Vec::new(),
            notes: Vec::new(),
            results: Vec::new(),
            pages: Vec::new(),
            tokens_generated,
            prompt_tokens,
            prompt_tokens_cached,
        });
    }

    /// Renders scanner events; returns the round's end, if it came.
    pub(super) async fn on_scan_events(
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
    pub(super) async fn on_scan_event(
        &mut self,
        event: ScanEvent,
    ) -> Result<Option<RoundEnd>, RolloutError> {
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
            } => {
                // Without an opening query tag (IRCoT) the reasoning is the
                // query: it is also what the fallback answer reads.
                if profile.query_open.is_empty() {
                    self.since_splice.push_str(&text);
                }
                self.emit(RolloutEvent::Reasoning(text)).await?;
            }
            ScanEvent::Text {
                region: Region::Page,
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
}

/// The calls in a tool-calling policy's finished turn `kept`, at most
/// `tools.calls_per_turn` of them when the profile caps them.
fn turn_calls(profile: &Profile, kept: &str) -> Vec<ToolCall> {
    let mut calls = parse_turn(kept, &profile.query_open, &profile.query_close);
    if let Some(tools) = profile.tools.as_ref().filter(|t| t.calls_per_turn > 0) {
        calls.truncate(tools.calls_per_turn);
    }
    calls
}
