//! Prefix reuse at run time ([`crate::engine::reuse`] holds the pure parts):
//! what seeker knows of mistral.rs's prefix cache, letting a generation in
//! ([`MistralEngine::admit`]), recording a finished sequence's key, the flush
//! that empties the cache, and each rollout's last round for token-level
//! continuation ([`crate::engine::continued`]).
//!
//! Seam: [`super::MistralEngine`]'s `generate` calls `prompt_ids`, `admit`
//! and `sentinel` before a sequence and [`Reuse::end_sequence`] after it (the
//! log-prob probe the same, with a plain tokenization); [`super::load`] builds [`Reuse`] and
//! flushes the warm-up run's entry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mistralrs::{NormalRequest, Response, SamplingParams, StopTokens};

use super::stream::{completion_request, submit};
use super::{MistralConfig, MistralEngine, ModelFiles, LOG_TARGET};
use crate::config::ActivationDtype;
use crate::engine::continued;
use crate::engine::reuse::{capacity_rows, Forced, PrefixTracker, Sentinel, Sentinels};
use crate::engine::vocab::{self, Vocab};
use crate::engine::EngineError;
use crate::metrics::Metrics;

/// Prefix reuse state of one engine ([`crate::engine::reuse`]).
pub(super) struct Reuse {
    vocab: Arc<Vocab>,
    sentinels: Sentinels,
    tracker: Mutex<PrefixTracker>,
    budget_bytes: usize,
    /// Generations in flight hold it shared; a flush holds it alone, so that
    /// its failing step errors no one else's sequence.
    inflight: Arc<tokio::sync::RwLock<()>>,
    /// A sequence may be cached under a key seeker does not know (it ended
    /// on an unexpected token, or the engine failed): flush before the next.
    unknown_end: AtomicBool,
    /// Flushes so far.
    flushes: std::sync::atomic::AtomicUsize,
    /// Sequences per rollout (`GenerationParams::session`) not yet recorded;
    /// a rollout's next round waits for its last one to be recorded.
    pending: Mutex<std::collections::HashMap<u64, usize>>,
    recorded: tokio::sync::Notify,
    metrics: OnceLock<Arc<Metrics>>,
    /// Each rollout's last round, so that its next round continues by token
    /// ids ([`continued`]); `None` with `token_continuation` off.
    rounds: Option<Mutex<continued::Rounds>>,
}

/// Why a flush empties the cache (the `reason` label of
/// `seeker_prefix_cache_flushes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FlushReason {
    Budget,
    Covered,
    UnknownEnd,
    Startup,
}

impl FlushReason {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Budget => "budget",
            Self::Covered => "covered",
            Self::UnknownEnd => "unknown_end",
            Self::Startup => "startup",
        }
    }
}

/// A sequence of rollout `.1` not yet recorded ([`Reuse::settle`]).
pub(super) struct Pending(Arc<Reuse>, u64);

impl Pending {
    pub(super) fn new(reuse: &Arc<Reuse>, session: u64) -> Self {
        *reuse
            .pending
            .lock()
            .expect("pending lock")
            .entry(session)
            .or_default() += 1;
        Self(Arc::clone(reuse), session)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock().expect("pending lock");
        if let Some(n) = pending.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.1);
            }
        }
        drop(pending);
        self.0.recorded.notify_waiters();
    }
}

/// A generation let in by [`MistralEngine::admit`]: holds the engine shared
/// (no flush runs under it) until recorded.
pub(super) struct Admitted {
    _guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    /// Prompt tokens mistral.rs will take from its cache.
    pub(super) reused: usize,
    /// Rows of the entry they come from.
    reused_rows: usize,
}

impl Reuse {
    /// The vocabulary, sentinels and KV size of the model in `files`.
    ///
    /// # Errors
    /// [`EngineError::Load`] when the model's vocabulary cannot be read or
    /// has no two spare control tokens for sentinels.
    pub(super) async fn load(
        config: &MistralConfig,
        files: &ModelFiles,
    ) -> Result<Self, EngineError> {
        let files = files.clone();
        let dtype_bytes = match config.dtype {
            ActivationDtype::F32 => 4,
            _ => 2,
        };
        let loaded = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let (vocab, template, bytes_per_row, name) = match &files {
                ModelFiles::Gguf(gguf) => (
                    Vocab::from_gguf(gguf)?,
                    crate::engine::prepare::chat_template_parts(gguf)?.0,
                    vocab::kv_bytes_per_row(gguf, dtype_bytes)?,
                    gguf.display().to_string(),
                ),
                ModelFiles::Checkpoint(checkpoint) => (
                    Vocab::from_checkpoint(checkpoint)?,
                    crate::engine::checkpoint::chat_template_parts(&checkpoint.dir)?.0,
                    checkpoint.kv_bytes_per_row(dtype_bytes),
                    checkpoint.dir.display().to_string(),
                ),
            };
            let (stop, mark) = vocab
                .sentinels(&template.unwrap_or_default(), &[])
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{name}: fewer than two spare control tokens to end cached \
                         sequences with; set model.prefix_cache = false"
                    )
                })?;
            Ok((vocab, Sentinels { stop, mark }, bytes_per_row))
        })
        .await
        .map_err(|e| EngineError::Load(format!("vocabulary thread failed: {e}")))?
        .map_err(|e| EngineError::Load(format!("prefix reuse: {e:#}")))?;
        let (vocab, sentinels, bytes_per_row) = loaded;
        tracing::info!(
            target: LOG_TARGET,
            stop = %sentinels.stop.1,
            mark = %sentinels.mark.1,
            eos = ?vocab.eos,
            kv_bytes_per_token = bytes_per_row,
            budget_mib = config.prefix_cache_mib,
            "prefix reuse on"
        );
        Ok(Self {
            vocab: Arc::new(vocab),
            sentinels,
            tracker: Mutex::new(PrefixTracker::new(bytes_per_row)),
            budget_bytes: config.prefix_cache_mib.saturating_mul(1 << 20),
            inflight: Arc::new(tokio::sync::RwLock::new(())),
            unknown_end: AtomicBool::new(false),
            flushes: std::sync::atomic::AtomicUsize::new(0),
            pending: Mutex::default(),
            recorded: tokio::sync::Notify::new(),
            metrics: OnceLock::new(),
            rounds: config
                .token_continuation
                .then(|| Mutex::new(continued::Rounds::new(ROLLOUTS_REMEMBERED))),
        })
    }

    /// Counts reuse and flushes in `metrics` from now on, and the flushes
    /// before now (the one at startup).
    pub(super) fn set_metrics(&self, metrics: Arc<Metrics>) {
        let startup = self.flushes.load(Ordering::SeqCst) as u64;
        metrics
            .prefix_cache_flushes
            .with_label_values(&[FlushReason::Startup.label()])
            .inc_by(startup);
        let _ = self.metrics.set(metrics);
    }

    /// KV bytes seeker counts in the cache.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn bytes(&self) -> usize {
        self.tracker.lock().expect("tracker lock").bytes()
    }

    /// Times the cache was emptied.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn flushes(&self) -> usize {
        self.flushes.load(Ordering::SeqCst)
    }

    /// The texts of the `(stop, mark)` sentinels.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn sentinel_texts(&self) -> (String, String) {
        (self.sentinels.stop.1.clone(), self.sentinels.mark.1.clone())
    }

    /// Whether a rollout's rounds continue by token ids (`token_continuation`).
    pub(super) fn continues_rounds(&self) -> bool {
        self.rounds.is_some()
    }

    /// After a sequence for prompt `ids` has ended (`failed`: with an engine
    /// error): remembers it as `session`'s last round `(id, prompt text)`
    /// unless it failed, and records its key ([`Reuse::record`]). A failed
    /// step may have evicted the cache, or not: the next request flushes.
    pub(super) async fn end_sequence(
        &self,
        model: &Arc<mistralrs::Model>,
        admitted: Admitted,
        ids: Vec<u32>,
        sentinel: &Sentinel,
        session: Option<(u64, String)>,
        failed: bool,
    ) {
        if failed {
            self.unknown_end.store(true, Ordering::SeqCst);
        }
        if let (Some((session, prompt)), false) = (session, failed) {
            let round = continued::Round {
                prompt,
                ids: ids.clone(),
                generated: sentinel.generated(),
            };
            if let Some(rounds) = &self.rounds {
                rounds.lock().expect("rounds lock").insert(session, round);
            }
        }
        self.record(model, admitted, &ids, sentinel).await;
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get().map(|m| m.as_ref())
    }

    /// Waits until rollout `session` has no sequence left to record. A round
    /// ends for the rollout at its closing tag, one engine step before its
    /// sequence ends and is recorded; the next round's lookup must see it.
    pub(super) async fn settle(&self, session: u64) {
        loop {
            let notified = self.recorded.notified();
            let busy = self
                .pending
                .lock()
                .expect("pending lock")
                .get(&session)
                .is_some_and(|&n| n > 0);
            if !busy {
                return;
            }
            notified.await;
        }
    }

    fn publish(&self, tracker: &PrefixTracker) {
        if let Some(m) = self.metrics() {
            m.prefix_cache_bytes.set(tracker.bytes() as i64);
            m.prefix_cache_entries.set(tracker.len() as i64);
        }
    }

    /// Records the end of a sequence admitted with `admitted` for prompt
    /// `ids`: its key (prompt, generated tokens, the sentinel the processor
    /// forced) and rows. A sequence the processor did not end (mistral.rs
    /// stopped on a token seeker did not foresee) makes the next request
    /// flush first. Past the budget, flushes now.
    async fn record(
        &self,
        model: &Arc<mistralrs::Model>,
        admitted: Admitted,
        ids: &[u32],
        sentinel: &Sentinel,
    ) {
        let generated = sentinel.generated();
        let last = match sentinel.forced() {
            Some(Forced::StopString) => Some(self.sentinels.mark.0),
            Some(_) => Some(self.sentinels.stop.0),
            None => None,
        };
        let over = {
            let mut tracker = self.tracker.lock().expect("tracker lock");
            let rows = capacity_rows(ids.len() + generated.len()).max(admitted.reused_rows);
            let mut key = Vec::with_capacity(ids.len() + generated.len() + 1);
            key.extend_from_slice(ids);
            key.extend_from_slice(&generated);
            match last {
                Some(id) if id == self.sentinels.stop.0 || id == self.sentinels.mark.0 => {
                    key.push(id);
                }
                _ => {
                    tracing::warn!(
                        target: LOG_TARGET,
                        generated = generated.len(),
                        "mistral.rs ended a sequence on a token seeker did not foresee; the prefix cache is emptied before the next request"
                    );
                    self.unknown_end.store(true, Ordering::SeqCst);
                    key.push(u32::MAX);
                }
            }
            tracker.insert(key, rows);
            self.publish(&tracker);
            tracker.bytes() > self.budget_bytes
        };
        drop(admitted);
        if over {
            if let Err(e) = flush(model, self, FlushReason::Budget).await {
                tracing::warn!(target: LOG_TARGET, error = %e, "prefix cache flush failed");
            }
        }
    }
}

/// A token id past every vocabulary: the embedding lookup of a prompt made of
/// it fails (candle checks the index on CPU), which fails the forward pass.
pub const FLUSH_TOKEN: u32 = 0x3FFF_FFFF;

/// [`FLUSH_TOKEN`] written out: the engine's error for the flush step
/// (candle's `InvalidIndex`) names it, and `seeker`'s log filter drops
/// mistral.rs's events that do (`crate::logging`).
pub const FLUSH_ERROR_MARK: &str = "1073741823";

/// Empties mistral.rs's prefix cache (see the module documentation) once no
/// generation is in flight, unless the reason went away meanwhile.
///
/// # Errors
/// [`EngineError::Internal`] when the engine is gone.
pub(super) async fn flush(
    model: &Arc<mistralrs::Model>,
    reuse: &Reuse,
    reason: FlushReason,
) -> Result<(), EngineError> {
    let _alone = reuse.inflight.write().await;
    {
        let tracker = reuse.tracker.lock().expect("tracker lock");
        let still = match reason {
            FlushReason::Budget => tracker.bytes() > reuse.budget_bytes,
            FlushReason::UnknownEnd => reuse.unknown_end.load(Ordering::SeqCst),
            FlushReason::Covered | FlushReason::Startup => true,
        };
        if !still {
            return Ok(());
        }
    }
    let started = std::time::Instant::now();
    let mut sampling = SamplingParams::deterministic();
    sampling.max_len = Some(1);
    let (request, mut engine_rx) = completion_request(vec![FLUSH_TOKEN], sampling, 8);
    submit(model, request).await?;
    // Wait for the step's error (mistral.rs unwraps its send of it: the
    // receiver must live until then). Only a failed forward pass evicts.
    let mut evicted = false;
    while let Some(response) = engine_rx.recv().await {
        match response {
            Response::CompletionModelError(..) | Response::ModelError(..) => {
                evicted = true;
                break;
            }
            Response::InternalError(_)
            | Response::ValidationError(_)
            | Response::CompletionDone(_) => break,
            _ => {}
        }
    }
    if !evicted {
        reuse.unknown_end.store(true, Ordering::SeqCst);
        return Err(EngineError::Internal(
            "the prefix-cache flush step did not fail as expected".into(),
        ));
    }
    let mut tracker = reuse.tracker.lock().expect("tracker lock");
    let freed = tracker.bytes();
    tracker.clear();
    reuse.unknown_end.store(false, Ordering::SeqCst);
    reuse.flushes.fetch_add(1, Ordering::SeqCst);
    reuse.publish(&tracker);
    if let Some(m) = reuse.metrics() {
        m.prefix_cache_flushes
            .with_label_values(&[reason.label()])
            .inc();
    }
    tracing::info!(
        target: LOG_TARGET,
        reason = reason.label(),
        freed_mib = freed as f64 / (1 << 20) as f64,
        ms = started.elapsed().as_millis() as u64,
        "prefix cache emptied"
    );
    Ok(())
}

/// Rollouts whose last round the engine remembers for token-level
/// continuation (a few KiB each: the prompt's text and ids).
const ROLLOUTS_REMEMBERED: usize = 256;

impl MistralEngine {
    /// The token ids of `prompt`: for a rollout's next round, its last
    /// round's prompt ids and generated ids as far as the prompt repeats
    /// them, then the rest tokenized ([`continued`]); otherwise the
    /// whole text tokenized.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the tokenizer fails.
    pub(super) async fn prompt_ids(
        &self,
        prompt: &str,
        session: Option<u64>,
    ) -> Result<Vec<u32>, EngineError> {
        let head = match (&self.reuse, session) {
            (Some(reuse), Some(session)) => {
                let round = reuse
                    .rounds
                    .as_ref()
                    .and_then(|rounds| rounds.lock().expect("rounds lock").take(session));
                round.and_then(|r| continued::head(&r, prompt, |id| reuse.vocab.piece(id)))
            }
            _ => None,
        };
        let Some((mut ids, used)) = head else {
            return self.tokenize(prompt).await;
        };
        if used < prompt.len() {
            ids.extend(self.tokenize(&prompt[used..]).await?);
        }
        Ok(ids)
    }

    /// Lets a generation for prompt `ids` in: waits while a flush runs,
    /// flushes first when a sequence may be cached under an unknown key, the
    /// cache is over its budget or `ids` holds a whole cached key, and says
    /// what the prompt reuses.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when a flush finds the engine gone.
    pub(super) async fn admit(&self, ids: &[u32]) -> Result<Admitted, EngineError> {
        let Some(reuse) = &self.reuse else {
            return Ok(Admitted {
                _guard: None,
                reused: 0,
                reused_rows: 0,
            });
        };
        loop {
            let guard = Arc::clone(&reuse.inflight).read_owned().await;
            let reason = {
                let tracker = reuse.tracker.lock().expect("tracker lock");
                if reuse.unknown_end.load(Ordering::SeqCst) {
                    FlushReason::UnknownEnd
                } else if tracker.bytes() > reuse.budget_bytes {
                    // The sequence that passed the budget is flushed when it
                    // is recorded, but a generation admitted between its
                    // record and that flush would run on an over-budget
                    // cache (and share its flush): flush first.
                    FlushReason::Budget
                } else if tracker.covers_a_whole_key(ids) {
                    FlushReason::Covered
                } else {
                    let (reused, reused_rows) = tracker.lookup(ids);
                    drop(tracker);
                    if let Some(m) = reuse.metrics() {
                        m.prompt_tokens_cached.inc_by(reused as u64);
                        m.prompt_tokens_prefilled
                            .inc_by(ids.len().saturating_sub(reused) as u64);
                    }
                    return Ok(Admitted {
                        _guard: Some(guard),
                        reused,
                        reused_rows,
                    });
                }
            };
            drop(guard);
            flush(&self.model, reuse, reason).await?;
        }
    }

    /// Puts a [`Sentinel`] on `request` (budget `max_tokens`; `max_len`
    /// becomes one more, the stop sentinel joins the stop strings) when
    /// reuse is on.
    pub(super) fn sentinel(
        &self,
        stop: &[String],
        max_tokens: usize,
        temperature: Option<f64>,
        request: &mut NormalRequest,
    ) -> Option<Arc<Sentinel>> {
        let reuse = self.reuse.as_ref()?;
        let sentinel = Arc::new(Sentinel::new(
            Arc::clone(&reuse.vocab),
            reuse.sentinels.clone(),
            stop,
            max_tokens,
            temperature,
        ));
        let params = &mut request.sampling_params;
        params.max_len = Some(max_tokens + 1);
        let stop_text = reuse.sentinels.stop.1.clone();
        match &mut params.stop_toks {
            Some(StopTokens::Seqs(seqs)) => seqs.push(stop_text),
            _ => params.stop_toks = Some(StopTokens::Seqs(vec![stop_text])),
        }
        Some(sentinel)
    }
}
