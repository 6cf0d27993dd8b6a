//! Searching and splicing: a round's queries dispatched at once (with the
//! request's cache), pages opened and read chunk by chunk, splices appended.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{
    PageRecord, QueryRecord, Rollout, RolloutError, RolloutEvent, RoundOutcome, RoundRecord,
};
use crate::profile::{PageChunk, QueryOutcome};
use crate::search::dispatch::QueryResult;
use crate::search::Document;

impl Rollout<'_> {
    /// Searches `queries` at once ([`Rollout::run_queries`]) and returns the
    /// text to splice in the profile's format.
    pub(super) async fn search(
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
            .render_splice_defusing(&outcomes, self.ctx.text.special_tokens()))
    }

    /// Searches `queries` at once (repeats of this request come from its
    /// cache), reports the call and each query's documents, records the round
    /// and its documents, and returns one record per query, in order.
    pub(super) async fn run_queries(
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
            if !self.ledger.cache.contains_key(q) && !missing.contains(q) {
                missing.push(q.clone());
            }
        }
        let k = self.request.top_k.unwrap_or(profile.top_k);
        let backend = self
            .ctx
            .search
            .resolve(self.request.backend.as_deref())
            .to_string();
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
            let (result, cached, failed_backends) = match fresh.remove(q) {
                Some(r) => {
                    if let Ok(docs) = &r.result {
                        self.ledger.cache.insert(q.clone(), docs.clone());
                    }
                    (r.result, r.cached, r.failed_backends)
                }
                None => (
                    Ok(self.ledger.cache.get(q).cloned().unwrap_or_default()),
                    true,
                    Vec::new(),
                ),
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
                failed_backends,
            };
            self.emit(RolloutEvent::Results(record.clone())).await?;
            records.push(record);
        }
        for r in &records {
            self.ledger.documents.extend(r.documents.iter().cloned());
        }
        let (prompt_tokens, prompt_tokens_cached) = self.take_round_prompt(round);
        self.ledger.rounds.push(RoundRecord {
            round,
            outcome: RoundOutcome::Search,
            queries,
            notes,
            results: records.clone(),
            pages: Vec::new(),
            tokens_generated: 0,
            prompt_tokens,
            prompt_tokens_cached,
        });
        Ok(records)
    }

    /// Opens a page action's target with the dispatcher's page reader,
    /// reports it, records the round, and splices its first chunk (the rest
    /// wait, one per round) or the profile's failure text.
    pub(super) async fn open_page(
        &mut self,
        round: usize,
        target: &str,
        tokens: usize,
    ) -> Result<(), RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let specials = self.ctx.text.special_tokens();
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
        self.ledger.rounds.push(RoundRecord {
            round,
            outcome: RoundOutcome::Page,
            queries: Vec::new(),
            notes: Vec::new(),
            results: Vec::new(),
            pages: vec![record.clone()],
            tokens_generated: tokens,
            prompt_tokens: self.meter.round_prompt.take(),
            prompt_tokens_cached: self.meter.round_cached.take(),
        });
        match chunks.pop_front() {
            Some(first) => {
                self.reading.chunks = chunks;
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
    pub(super) async fn open_pages(
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
    pub(super) async fn open_pages_with(
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
                            .ledger
                            .documents
                            .iter()
                            .any(|d| d.id == page.url && d.backend == page.source);
                        if !known {
                            self.ledger.documents.push(Document {
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
    pub(super) async fn splice_chunk(&mut self, chunk: PageChunk) -> Result<(), RolloutError> {
        let start = self.transcript.len();
        if let Some(short) = chunk.short {
            self.reading.unread = Some((start..start + chunk.full.len(), short));
        }
        self.splice(chunk.full).await
    }

    /// Appends `splice` to the transcript and shows it in the trace.
    pub(super) async fn splice(&mut self, splice: String) -> Result<(), RolloutError> {
        self.transcript.push_str(&splice);
        self.answer.since_splice.clear();
        self.emit(RolloutEvent::Splice(splice)).await
    }
}
