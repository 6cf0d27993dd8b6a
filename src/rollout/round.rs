//! A round's end carried out: what the scanner saw becomes events, then
//! [`decide`]'s decision becomes the round's record, its transcript text and
//! the search call, page action or tool-call turn it asks for.

use std::sync::Arc;

use super::decide::{decide, Decision, RoundState, Step};
use super::{
    ClientCall, FinishReason, Rollout, RolloutError, RolloutEvent, RoundEnded, RoundOutcome,
    RoundRecord,
};
use crate::profile::{CallPlan, PromptText, RoundCap, ToolResult};
use crate::scanner::{Region, RoundEnd, ScanEvent, TagKind};
use crate::toolcall::ToolCall;

impl Rollout<'_> {
    /// Sends [`RolloutEvent::RoundEnd`] for round `number`, from its record.
    pub(super) async fn announce_round(&self, number: usize) -> Result<(), RolloutError> {
        let Some(record) = self.ledger.rounds.iter().rev().find(|r| r.round == number) else {
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

    /// What the round's end means ([`decide`]), carried out: keeps the
    /// round's text in the transcript, records the round, runs its search
    /// call, page action or tool calls and splices what they return (or the
    /// profile's text for no query or an invalid action). `Some(reason)`
    /// ends the rollout; `None` continues with the next round.
    pub(super) async fn end_round(
        &mut self,
        round: RoundEnded,
        kept: &str,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let (number, tokens) = (round.number, round.tokens);
        // The chunk spliced before this round has been read: later prompts
        // carry its short form (ASearcher's `short_text`).
        if let Some((range, short)) = self.reading.unread.take() {
            self.transcript.replace_range(range, &short);
        }
        let state = RoundState {
            calls: self.ledger.calls,
            answer_started: self.answer.stripper.started,
            stopped: self.answer.stop.stopped,
            client: &self.request.client_tools,
            rounds: &self.ledger.rounds,
        };
        let Decision { keep, step } = decide(&profile, &state, &round, kept);
        if step != Step::ReadOn {
            // The model acted before reading the rest of the page.
            self.reading.chunks.clear();
        }
        self.transcript.push_str(&keep);
        match step {
            Step::ReadOn => {
                self.record(number, RoundOutcome::Read, tokens);
                if let Some(chunk) = self.reading.chunks.pop_front() {
                    self.splice_chunk(chunk).await?;
                }
                Ok(None)
            }
            Step::Finish {
                outcome,
                reason,
                fallback,
            } => {
                if !fallback {
                    self.answer.since_splice.clear();
                }
                self.record(number, outcome, tokens);
                Ok(Some(reason))
            }
            Step::AnswerCall(answer) => {
                self.record(number, RoundOutcome::Answer, tokens);
                if let Some(text) = self.answer.stripper.push(&answer) {
                    self.emit_answer(&text).await?;
                }
                Ok(Some(FinishReason::Stop))
            }
            Step::ClientCalls(calls) => {
                self.ledger.client_calls = calls
                    .iter()
                    .map(|call| ClientCall {
                        id: format!("call_{}", uuid::Uuid::new_v4().simple()),
                        name: call.name.clone(),
                        arguments: serde_json::Value::Object(call.arguments.clone()).to_string(),
                    })
                    .collect();
                self.record(number, RoundOutcome::ToolCalls, tokens);
                Ok(Some(FinishReason::ToolCalls))
            }
            Step::Tools { calls, plans } => {
                self.ledger.calls += 1;
                self.tool_round(number, &calls, plans, tokens).await
            }
            Step::Search(cleaned) => {
                self.ledger.calls += 1;
                let splice = self.search(number, cleaned.queries, cleaned.notes).await?;
                self.ledger.searches += 1;
                if let Some(last) = self.ledger.rounds.last_mut() {
                    last.tokens_generated = tokens;
                }
                self.splice(splice).await?;
                Ok(self.stop_at_cap())
            }
            Step::Reply {
                outcome,
                text,
                cap_stops,
            } => {
                self.ledger.calls += 1;
                self.record(number, outcome, tokens);
                self.splice(text).await?;
                Ok(if cap_stops { self.stop_at_cap() } else { None })
            }
            Step::OpenPage(target) => {
                self.ledger.calls += 1;
                self.open_page(number, &target, tokens).await?;
                Ok(self.stop_at_cap())
            }
            Step::NoPage => {
                // Nothing to open: the policy's text for a page it cannot
                // read, as ASearcher answers an empty page.
                self.ledger.calls += 1;
                self.record(number, RoundOutcome::NoQuery, tokens);
                let specials = self.ctx.text.special_tokens();
                let text = profile.page_failed("", "the page action names no page", specials);
                self.splice(text).await?;
                Ok(self.stop_at_cap())
            }
        }
    }

    /// After a call's splice: `length` when the call cap is reached and the
    /// profile stops there (`on_round_cap = "stop"`), else the rollout goes
    /// on.
    fn stop_at_cap(&self) -> Option<FinishReason> {
        let profile = &self.ctx.profile;
        (self.ledger.calls >= profile.max_searches && profile.on_round_cap == RoundCap::Stop)
            .then_some(FinishReason::Length)
    }

    /// A turn of tool calls: every search call's queries are searched at once
    /// (with the request's cache), the other calls get the profile's error or
    /// `unavailable` text, and the tool-response turn is spliced after the
    /// turn, which stays in the transcript as the model wrote it.
    pub(super) async fn tool_round(
        &mut self,
        number: usize,
        calls: &[ToolCall],
        plans: Vec<CallPlan>,
        tokens: usize,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
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
            if let Some(last) = self.ledger.rounds.last_mut() {
                last.notes = notes;
            }
            Vec::new()
        } else {
            let records = self.run_queries(number, queries, notes).await?;
            self.ledger.searches += 1;
            if let Some(last) = self.ledger.rounds.last_mut() {
                last.tokens_generated = tokens;
            }
            records
        };
        if let Some(last) = self.ledger.rounds.last_mut() {
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

    /// Whether a prompt over the context `limit` (in tokens) is so because of
    /// spliced documents rather than the client's conversation: after a round
    /// generated tokens (its search results came next), or when the
    /// conversation without the question search's documents fits.
    pub(super) async fn documents_overflowed(&self, limit: usize) -> Result<bool, RolloutError> {
        if self.meter.usage.completion_tokens > 0 {
            return Ok(true);
        }
        let Some(bare) = &self.prompt.bare else {
            return Ok(false);
        };
        let mut text = match bare {
            PromptText::Chat(turns) => self.ctx.text.render(turns, &self.prompt.tools)?,
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
        (
            self.meter.round_prompt.take(),
            self.meter.round_cached.take(),
        )
    }

    /// Adds a record for a round that ran no search.
    pub(super) fn record(&mut self, round: usize, outcome: RoundOutcome, tokens_generated: usize) {
        let (prompt_tokens, prompt_tokens_cached) = self.take_round_prompt(round);
        self.ledger.rounds.push(RoundRecord {
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
                self.answer.since_splice.push_str(&text);
                self.emit(RolloutEvent::Reasoning(text)).await?;
            }
            ScanEvent::Text {
                region: Region::Query,
                text,
            } => {
                // Without an opening query tag (IRCoT) the reasoning is the
                // query: it is also what the fallback answer reads.
                if profile.query_open.is_empty() {
                    self.answer.since_splice.push_str(&text);
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
                if let Some(delta) = self.answer.stripper.push(&text) {
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
            ScanEvent::Open(_) => self.answer.open = true,
            ScanEvent::End(end) => {
                let tag = match &end {
                    RoundEnd::Query(_) => Some(profile.query_close.clone()),
                    RoundEnd::Page(_) => profile.pages.as_ref().map(|p| p.close.clone()),
                    RoundEnd::Pause => profile.pages.as_ref().map(|p| p.pause.clone()),
                    // A closing tag without its opening stays in the transcript
                    // (an invalid action), so the reasoning shows it too; inside
                    // an open answer it is the answer's business.
                    RoundEnd::Unmatched(kind) if !self.answer.open => match kind {
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
