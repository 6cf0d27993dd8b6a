//! The embedded engine: a local GGUF model run by mistral.rs 0.8.1 on the CPU
//! (CUDA with the `cuda` feature), loaded from a local file with no network.
//!
//! Facts this module is built around (read from mistral.rs 0.8.1 and measured;
//! numbers in `bench/README.md`):
//! - The high-level `GgufModelBuilder` always picks the activation dtype itself
//!   (F16 on CPU, 2x slower than F32 here); the lower-level loader used below
//!   takes an explicit [`ModelDType`].
//! - A partial assistant turn is continued with a completion request on token
//!   ids (`RequestMessage::CompletionTokens`): chat requests always open a new
//!   assistant turn.
//! - Requests are always streaming: dropping the receiver of a non-streaming
//!   request can panic the engine thread in 0.8.1. Dropping a streaming
//!   receiver cancels the sequence at its next token.
//! - The prefix cache reuses the KV rows of a finished sequence for a prompt
//!   that starts with it; in 0.8.1 it can reuse a row that was never
//!   computed, and on CPU it is never evicted. seeker turns it on with a
//!   sentinel processor on every request and its own copy of the keys
//!   ([`super::reuse`]), and empties it past `prefix_cache_mib`: a failed
//!   forward pass makes mistral.rs evict every cached sequence
//!   (`handle_pipeline_forward_error`; a failing logits processor does not:
//!   it fails only its sequence), so a one-token prompt whose token id is
//!   past the embedding table ([`FLUSH_TOKEN`]), sent while nothing else
//!   runs, is the flush. CPU only: CUDA's index lookup checks no bounds, so
//!   with the `cuda` feature reuse stays off.
//! - Streaming trims leading whitespace from the first piece of every request;
//!   the token's own text (sent with `return_logprobs`) restores it.
//! - Building the engine waits for a warm-up run with a nested blocking wait
//!   on the calling thread: it runs on a thread of its own
//!   (`build_off_runtime`, issue 12).
//! - The engine thread panics when it answers a tokenize/detokenize request
//!   whose receiver was dropped: those calls run as detached tasks
//!   (`detached`, issue 18).
//! - A last token that ends inside a UTF-8 character gets no chunk, so a token
//!   budget ending there closes the stream without a finish reason: read as
//!   `length` while the engine still takes requests (issue 18).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use either::Either;
use mistralrs::core::{
    AddModelConfig, EngineConfig, GGUFLoaderBuilder, GGUFSpecificConfig, TokenSource,
};
use mistralrs::model_builder_trait::build_model_from_pipeline;
use mistralrs::{
    AutoDeviceMapParams, DefaultSchedulerMethod, Device, DeviceMapSetting, ModelDType,
    NormalRequest, Request, RequestMessage, Response, SamplingParams, SchedulerConfig, StopTokens,
    TextMessageRole, TextMessages,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::sync::mpsc;

use super::chat_template::ChatTemplate;
use super::prepare::{ensure_prepared, WeightFormat};
use super::reuse::{capacity_rows, Forced, PrefixTracker, Sentinel, Sentinels};
use super::vocab::Vocab;
use super::{
    ChatTurn, Engine, EngineError, EngineEvent, EngineFinish, Generation, GenerationParams, Role,
};
use crate::metrics::Metrics;

/// Activation dtype for the embedded model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationDtype {
    /// Fastest on CPU here: 72 prefill / 38 decode tok/s vs 54 / 27 for F16
    /// (SmolLM2-135M Q4_1, AVX2 build; `bench/README.md`).
    F32,
    F16,
    Bf16,
    /// Let mistral.rs choose (F16 on CPU).
    Auto,
}

impl ActivationDtype {
    fn to_mistral(self) -> ModelDType {
        match self {
            Self::F32 => ModelDType::F32,
            Self::F16 => ModelDType::F16,
            Self::Bf16 => ModelDType::BF16,
            Self::Auto => ModelDType::Auto,
        }
    }
}

/// How to load the embedded model.
#[derive(Clone, Debug)]
pub struct MistralConfig {
    /// Path to the GGUF file (tokenizer and chat template are read from it).
    pub gguf: PathBuf,
    pub dtype: ActivationDtype,
    /// Sequences the scheduler runs at once.
    pub max_num_seqs: usize,
    /// Weight format to run: the GGUF as it is, or a prepared copy next to
    /// it (Q8_0 or F32, written on first load; `auto` picks by size;
    /// [`super::prepare`]).
    pub weights: WeightFormat,
    /// Prefix reuse: a round's prompt takes the KV rows of the cached
    /// sequence it starts with and prefills only the rest
    /// ([`super::reuse`]). On in seeker's default configuration.
    pub prefix_cache: bool,
    /// Most MiB of KV rows the prefix cache may hold; past it the cache is
    /// emptied (seeker's count, [`PrefixTracker`]).
    pub prefix_cache_mib: usize,
    /// Tests and probes only: mistral.rs's prefix cache as it is, without
    /// seeker's sentinels and flushes (the zero-row bug of
    /// [`super::reuse`]). Needs `prefix_cache`.
    pub naive_prefix_cache: bool,
    /// A rollout's next round continues its last round's token ids
    /// ([`super::continued`]); needs `prefix_cache` (its sentinel knows the
    /// generated ids). `false`: each round's text is tokenized whole.
    pub token_continuation: bool,
}

/// Prefix reuse state of one engine ([`super::reuse`]).
struct Reuse {
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
    /// ids ([`super::continued`]); `None` with `token_continuation` off.
    rounds: Option<Mutex<super::continued::Rounds>>,
}

/// Why a flush empties the cache (the `reason` label of
/// `seeker_prefix_cache_flushes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlushReason {
    Budget,
    Covered,
    UnknownEnd,
    Startup,
}

impl FlushReason {
    fn label(self) -> &'static str {
        match self {
            Self::Budget => "budget",
            Self::Covered => "covered",
            Self::UnknownEnd => "unknown_end",
            Self::Startup => "startup",
        }
    }
}

/// See the module documentation.
pub struct MistralEngine {
    model: Arc<mistralrs::Model>,
    max_seq_len: Option<usize>,
    /// The GGUF tokenizer's control tokens ([`super::prepare::special_tokens`]).
    special_tokens: Vec<String>,
    /// The GGUF's chat template rendered by seeker, for prompts with tools;
    /// `None` when the GGUF has none that compiles.
    template: Option<Arc<ChatTemplate>>,
    /// `None`: no prefix cache, or mistral.rs's own (naive).
    reuse: Option<Arc<Reuse>>,
}

impl MistralEngine {
    /// Loads the GGUF in `config` on the CPU (or the first CUDA device when built
    /// with `cuda`).
    ///
    /// # Errors
    /// [`EngineError::Load`] when the file is missing or not a supported GGUF.
    pub async fn load(config: &MistralConfig) -> Result<Self, EngineError> {
        if !config.gguf.is_file() {
            return Err(EngineError::Load(format!(
                "{} not found (run scripts/fetch-defaults.sh)",
                config.gguf.display()
            )));
        }
        let (source, weights) = (config.gguf.clone(), config.weights);
        let original = config.gguf.clone();
        let prepared = tokio::task::spawn_blocking(move || ensure_prepared(&source, weights))
            .await
            .map_err(|e| EngineError::Load(format!("prepare thread failed: {e}")))?;
        // A copy that cannot be written (read-only model directory, full disk)
        // costs speed, not the server: load the original.
        let gguf = prepared.unwrap_or_else(|e| {
            tracing::warn!(
                error = %format!("{e:#}"),
                weights = ?weights,
                "cannot prepare the weights; loading the GGUF as it is (slower)"
            );
            original
        });
        let dir = gguf
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        let file = gguf
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .ok_or_else(|| EngineError::Load(format!("{} is not a file", gguf.display())))?;
        let dtype = config.dtype.to_mistral();
        let device = best_device()?;
        // The tokenizer's control tokens, read from the GGUF with the model
        // (file reads stay off the async runtime).
        let tokens_from = config.gguf.clone();
        let (pipeline, (special_tokens, template)) = tokio::task::spawn_blocking(move || {
            let special_tokens = super::prepare::special_tokens(&tokens_from)?;
            // seeker's own rendering of the same template, for prompts with
            // tools (mistral.rs's tojson is minijinja's, not Python's).
            let template = ChatTemplate::from_gguf(&tokens_from)
                .map_err(|e| tracing::warn!("tools cannot be rendered: {e}"))
                .ok()
                .map(Arc::new);
            let loader = GGUFLoaderBuilder::new(
                None,
                None,
                dir.to_string_lossy().into_owned(),
                vec![file],
                GGUFSpecificConfig::default(),
                false,
                None,
            )
            .build();
            loader
                .load_model_from_hf(
                    None,
                    TokenSource::None,
                    &dtype,
                    &device,
                    true,
                    DeviceMapSetting::Auto(AutoDeviceMapParams::default_text()),
                    None,
                    None,
                )
                .map(|pipeline| (pipeline, (special_tokens, template)))
        })
        .await
        .map_err(|e| EngineError::Load(format!("loader thread failed: {e}")))?
        .map_err(|e| EngineError::Load(format!("{}: {e:#}", config.gguf.display())))?;

        let seqs = NonZeroUsize::new(config.max_num_seqs.max(1)).expect("max(1) is non-zero");
        let scheduler = SchedulerConfig::DefaultScheduler {
            method: DefaultSchedulerMethod::Fixed(seqs),
        };
        // The flush relies on candle's bounds check, which CUDA lacks.
        let cuda = cfg!(feature = "cuda");
        if cuda && config.prefix_cache && !config.naive_prefix_cache {
            tracing::warn!("prefix reuse is CPU-only for now; off on CUDA");
        }
        let reuse = if config.prefix_cache && !config.naive_prefix_cache && !cuda {
            Some(Arc::new(Reuse::load(config).await?))
        } else {
            None
        };
        let engine_config = EngineConfig {
            no_prefix_cache: reuse.is_none() && !(config.prefix_cache && config.naive_prefix_cache),
            ..EngineConfig::default()
        };
        let model = build_off_runtime(pipeline, scheduler, engine_config).await?;
        let max_seq_len = model.max_sequence_length().ok().flatten();
        let engine = Self {
            model: Arc::new(model),
            max_seq_len,
            special_tokens,
            template,
            reuse,
        };
        if let Some(reuse) = &engine.reuse {
            // The warm-up run ("hello", one token) left an entry whose last
            // token has no row, under a key seeker did not choose.
            flush(&engine.model, reuse, FlushReason::Startup).await?;
        }
        Ok(engine)
    }

    /// Counts prefix reuse and flushes in `metrics` from now on.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        if let Some(reuse) = &self.reuse {
            // Flushes before now: the one at startup.
            let startup = reuse.flushes.load(Ordering::SeqCst) as u64;
            metrics
                .prefix_cache_flushes
                .with_label_values(&[FlushReason::Startup.label()])
                .inc_by(startup);
            let _ = reuse.metrics.set(metrics);
        }
        self
    }

    /// KV bytes seeker counts in the prefix cache (0 when reuse is off).
    pub fn prefix_cache_bytes(&self) -> usize {
        self.reuse
            .as_ref()
            .map_or(0, |r| r.tracker.lock().expect("tracker lock").bytes())
    }

    /// The texts of the `(stop, mark)` sentinels when reuse is on.
    pub fn sentinel_texts(&self) -> Option<(String, String)> {
        self.reuse
            .as_ref()
            .map(|r| (r.sentinels.stop.1.clone(), r.sentinels.mark.1.clone()))
    }

    /// Times the prefix cache was emptied (the one at startup included).
    pub fn prefix_cache_flushes(&self) -> usize {
        self.reuse
            .as_ref()
            .map_or(0, |r| r.flushes.load(Ordering::SeqCst))
    }

    /// Sequences mistral.rs found a prefix-cache match for since the engine
    /// was built (its own counter, `IntervalLogger::prefix_cache_stats`).
    pub fn prefix_cache_hits(&self) -> usize {
        self.model
            .inner()
            .get_logger(None)
            .map_or(0, |logger| logger.prefix_cache_stats().0)
    }

    /// The model's context length in tokens, when it declares one.
    pub fn max_seq_len(&self) -> Option<usize> {
        self.max_seq_len
    }

    /// Token ids of `text` (special tokens written out are recognised; no BOS added).
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the tokenizer fails.
    pub async fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let model = Arc::clone(&self.model);
        let text = text.to_string();
        detached(async move {
            model
                .tokenize(Either::Right(text), None, false, false, None)
                .await
        })
        .await?
        .map_err(|e| EngineError::Internal(format!("tokenize: {e}")))
    }
}

/// Rollouts whose last round the engine remembers for token-level
/// continuation (a few KiB each: the prompt's text and ids).
const ROLLOUTS_REMEMBERED: usize = 256;

impl MistralEngine {
    /// The token ids of `prompt`: for a rollout's next round, its last
    /// round's prompt ids and generated ids as far as the prompt repeats
    /// them, then the rest tokenized ([`super::continued`]); otherwise the
    /// whole text tokenized.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the tokenizer fails.
    async fn prompt_ids(
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
                round.and_then(|r| super::continued::head(&r, prompt, |id| reuse.vocab.piece(id)))
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

    /// The most tokens a sequence may still generate after a prompt of
    /// `prompt_tokens` (`None`: the model declares no context length).
    ///
    /// # Errors
    /// [`EngineError::ContextLength`] when the prompt fills the context.
    fn room_after(&self, prompt_tokens: usize) -> Result<Option<usize>, EngineError> {
        match self.max_seq_len {
            Some(limit) if prompt_tokens >= limit => Err(EngineError::ContextLength {
                prompt_tokens,
                limit,
            }),
            Some(limit) => Ok(Some(limit - prompt_tokens)),
            None => Ok(None),
        }
    }

    /// The `top` most likely next tokens after `prompt` (tokenized as
    /// [`MistralEngine::tokenize`] does), as `(token id, natural-log
    /// probability)` pairs, most likely first: the log-softmax (in f64) of the
    /// raw logits the model gives for the next position, read by a logits
    /// processor before sampling. One greedy step, no token kept.
    ///
    /// What faithfulness checks compare with llama.cpp's `n_probs` (same
    /// definition: probabilities of the unmodified distribution). mistral.rs's
    /// own `logprobs` are not used: in greedy mode 0.8.1 reports the base-10
    /// logarithm of a raw logit (`sampler.rs`, `sample_argmax`).
    ///
    /// # Errors
    /// [`EngineError::ContextLength`] when `prompt` fills the context;
    /// [`EngineError::Internal`] when the engine fails or sends no logits.
    pub async fn next_token_logprobs(
        &self,
        prompt: &str,
        top: usize,
    ) -> Result<Vec<(u32, f64)>, EngineError> {
        let ids = self.tokenize(prompt).await?;
        self.room_after(ids.len())?;
        let admitted = self.admit(&ids).await?;
        let captured: Arc<std::sync::Mutex<Option<Vec<f32>>>> = Arc::default();
        let sink = Arc::clone(&captured);
        let capture = move |logits: &candle_core::Tensor,
                            _context: &[u32]|
              -> candle_core::Result<candle_core::Tensor> {
            let mut slot = sink.lock().unwrap();
            if slot.is_none() {
                *slot = Some(logits.to_dtype(candle_core::DType::F32)?.to_vec1()?);
            }
            Ok(logits.clone())
        };
        let mut sampling = SamplingParams::deterministic();
        sampling.max_len = Some(1);
        let (mut request, mut engine_rx) = completion_request(ids.clone(), sampling, 8);
        let mut processors: Vec<Arc<dyn mistralrs::CustomLogitsProcessor>> =
            vec![Arc::new(capture)];
        let sentinel = self.sentinel(&[], 0, None, &mut request);
        processors.extend(sentinel.clone().map(|s| s as Arc<_>));
        request.logits_processors = Some(processors);
        submit(&self.model, request).await?;
        // Read to the end: the sequence is finished, not cancelled.
        while let Some(response) = engine_rx.recv().await {
            match response {
                Response::InternalError(e) | Response::ValidationError(e) => {
                    return Err(EngineError::Internal(e.to_string()))
                }
                Response::CompletionModelError(e, _) | Response::ModelError(e, _) => {
                    return Err(EngineError::Internal(e))
                }
                Response::CompletionDone(_) => break,
                Response::CompletionChunk(c)
                    if c.choices.iter().any(|c| c.finish_reason.is_some()) =>
                {
                    break
                }
                _ => {}
            }
        }
        if let (Some(reuse), Some(sentinel)) = (&self.reuse, sentinel) {
            reuse.record(&self.model, admitted, &ids, &sentinel).await;
        }
        let logits = captured
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| EngineError::Internal("no logits were computed".into()))?;
        Ok(top_log_softmax(&logits, top))
    }
}

/// A sequence of rollout `.1` not yet recorded ([`Reuse::settle`]).
struct Pending(Arc<Reuse>, u64);

impl Pending {
    fn new(reuse: &Arc<Reuse>, session: u64) -> Self {
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
struct Admitted {
    _guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    /// Prompt tokens mistral.rs will take from its cache.
    reused: usize,
    /// Rows of the entry they come from.
    reused_rows: usize,
}

impl Reuse {
    /// The vocabulary, sentinels and KV size of `config.gguf`.
    ///
    /// # Errors
    /// [`EngineError::Load`] when the GGUF's vocabulary cannot be read or has
    /// no two spare control tokens for sentinels.
    async fn load(config: &MistralConfig) -> Result<Self, EngineError> {
        let gguf = config.gguf.clone();
        let dtype_bytes = match config.dtype {
            ActivationDtype::F32 => 4,
            _ => 2,
        };
        let loaded = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let vocab = Vocab::from_gguf(&gguf)?;
            let (template, _, _) = super::prepare::chat_template_parts(&gguf)?;
            let bytes_per_row = super::vocab::kv_bytes_per_row(&gguf, dtype_bytes)?;
            let (stop, mark) = vocab
                .sentinels(&template.unwrap_or_default(), &[])
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: fewer than two spare control tokens to end cached \
                         sequences with; set model.prefix_cache = false",
                        gguf.display()
                    )
                })?;
            Ok((vocab, Sentinels { stop, mark }, bytes_per_row))
        })
        .await
        .map_err(|e| EngineError::Load(format!("vocabulary thread failed: {e}")))?
        .map_err(|e| EngineError::Load(format!("prefix reuse: {e:#}")))?;
        let (vocab, sentinels, bytes_per_row) = loaded;
        tracing::info!(
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
                .then(|| Mutex::new(super::continued::Rounds::new(ROLLOUTS_REMEMBERED))),
        })
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get().map(|m| m.as_ref())
    }

    /// Waits until rollout `session` has no sequence left to record. A round
    /// ends for the rollout at its closing tag, one engine step before its
    /// sequence ends and is recorded; the next round's lookup must see it.
    async fn settle(&self, session: u64) {
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
                tracing::warn!(error = %e, "prefix cache flush failed");
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
async fn flush(
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
        reason = reason.label(),
        freed_mib = freed as f64 / (1 << 20) as f64,
        ms = started.elapsed().as_millis() as u64,
        "prefix cache emptied"
    );
    Ok(())
}

impl MistralEngine {
    /// Lets a generation for prompt `ids` in: waits while a flush runs,
    /// flushes first when a sequence may be cached under an unknown key, the
    /// cache is over its budget or `ids` holds a whole cached key, and says
    /// what the prompt reuses.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when a flush finds the engine gone.
    async fn admit(&self, ids: &[u32]) -> Result<Admitted, EngineError> {
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
    fn sentinel(
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

/// Hands `request` to `model`'s engine; returns the engine's request queue
/// (closed once the engine has stopped).
///
/// # Errors
/// [`EngineError::Internal`] when the engine is gone.
async fn submit(
    model: &mistralrs::Model,
    request: NormalRequest,
) -> Result<mpsc::Sender<Request>, EngineError> {
    let sender = model
        .inner()
        .get_sender(None)
        .map_err(|e| EngineError::Internal(format!("engine unavailable: {e}")))?;
    sender
        .send(Request::Normal(Box::new(request)))
        .await
        .map_err(|_| EngineError::Internal("engine stopped".into()))?;
    Ok(sender)
}

/// A streaming completion request continuing the token `ids` (always
/// streaming: dropping a non-streaming receiver can panic the engine thread in
/// 0.8.1), and the receiver of its responses (`capacity` buffered).
fn completion_request(
    ids: Vec<u32>,
    sampling: SamplingParams,
    capacity: usize,
) -> (NormalRequest, mpsc::Receiver<Response>) {
    let (engine_tx, engine_rx) = mpsc::channel(capacity);
    let mut request = NormalRequest::new_simple(
        RequestMessage::CompletionTokens(ids),
        sampling,
        engine_tx,
        0,
        None,
        None,
    );
    request.is_streaming = true;
    (request, engine_rx)
}

/// The `top` largest entries of `log_softmax(logits)` as `(index, log-prob)`,
/// largest first (ties by lower index), computed in f64.
fn top_log_softmax(logits: &[f32], top: usize) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    order
        .into_iter()
        .take(top)
        .map(|i| (i, logits[i as usize] as f64 - log_sum))
        .collect()
}

/// Builds the engine (`mistralrs::Model`) from a loaded pipeline on a thread
/// of its own, so that nothing else can be parked behind it.
///
/// Why (seeker issue 12, a server that never answered after `model loaded`):
/// mistral.rs 0.8.1 `MistralRs::new` (`mistralrs-core/src/lib.rs`, "Do a dummy
/// run") waits for a one-token warm-up generation with
/// `tokio::task::block_in_place(|| rx.blocking_recv())`. `blocking_recv` parks
/// the calling thread with tokio's thread-local parker (`CURRENT_PARKER` in
/// `tokio/src/runtime/park.rs`) — the same parker that `Runtime::block_on`
/// uses on that thread for the future it drives. When the build was polled
/// inside `block_on` next to other futures (the accept loop, in one
/// `tokio::select!`), a wake-up for those futures (a connection arriving during
/// the warm-up) unparked the thread, the nested `blocking_recv` consumed it,
/// re-checked its own channel and parked again: the wake-up was lost, and the
/// accept loop, with its waker spent, was never polled again. Run on a thread
/// whose only future is this build, the nested park can swallow no one else's
/// wake-up, whoever awaits this function and however they poll it.
async fn build_off_runtime(
    pipeline: Arc<tokio::sync::Mutex<dyn mistralrs::core::Pipeline>>,
    scheduler: SchedulerConfig,
    engine_config: EngineConfig,
) -> Result<mistralrs::Model, EngineError> {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("seeker-engine-build".into())
        .spawn(move || {
            // `Handle::block_on` keeps the runtime's context (mistral.rs checks
            // for a multi-threaded runtime before its warm-up run) while this
            // thread's parker serves this future alone.
            let model = handle.block_on(build_model_from_pipeline(
                pipeline,
                scheduler,
                AddModelConfig::new(engine_config),
            ));
            let _ = tx.send(model);
        })
        .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))?;
    rx.await
        .map_err(|_| EngineError::Load("the engine build thread panicked".into()))
}

/// Runs a request-and-answer call to the engine (tokenize, detokenize) as a
/// task of its own, which finishes and receives the engine's answer even when
/// the caller is dropped.
///
/// Why (seeker issue 18): mistral.rs 0.8.1 answers tokenize and detokenize
/// requests with `send(..).await.expect("Sender disconnected unexpectedly!")`
/// (`mistralrs-core/src/engine/add_request.rs`, `tokenize_text` and
/// `detokenize_text`). A caller dropped while the engine was busy (a client
/// that abandoned a non-streamed request) dropped the receiver, the engine
/// thread panicked on the answer, and every request in flight failed.
///
/// # Errors
/// [`EngineError::Internal`] when the task panicked.
async fn detached<T: Send + 'static>(
    call: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::spawn(call)
        .await
        .map_err(|e| EngineError::Internal(format!("engine call failed: {e}")))
}

#[cfg(feature = "cuda")]
fn best_device() -> Result<Device, EngineError> {
    mistralrs::best_device(false).map_err(|e| EngineError::Load(format!("device: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn best_device() -> Result<Device, EngineError> {
    Ok(Device::Cpu)
}

#[async_trait]
impl Engine for MistralEngine {
    fn special_tokens(&self) -> &[String] {
        &self.special_tokens
    }

    async fn render_chat_with_tools(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        if tools.is_empty() && !messages.iter().any(ChatTurn::is_tool_turn) {
            return self.render_chat(messages).await;
        }
        match &self.template {
            Some(template) => template.render_with_tools(messages, tools),
            None => Err(EngineError::Internal(
                "the model's chat template could not be compiled, so tools cannot be rendered"
                    .into(),
            )),
        }
    }

    async fn render_chat(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        let mut chat = TextMessages::new();
        for m in messages {
            let role = match m.role {
                Role::System => TextMessageRole::System,
                Role::User => TextMessageRole::User,
                Role::Assistant => TextMessageRole::Assistant,
                // Tool turns are rendered by `render_chat_with_tools`.
                Role::Tool => TextMessageRole::Tool,
            };
            chat = chat.add_message(role, &m.content);
        }
        // The template is applied by the tokenizer request; decoding the ids with
        // special tokens kept gives the rendered text back.
        let model = Arc::clone(&self.model);
        detached(async move {
            let ids = model
                .tokenize(Either::Left(chat), None, false, true, None)
                .await
                .map_err(|e| EngineError::Internal(format!("chat template: {e}")))?;
            model
                .detokenize(ids, false)
                .await
                .map_err(|e| EngineError::Internal(format!("detokenize: {e}")))
        })
        .await?
    }

    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        Ok(self.tokenize(text).await?.len())
    }

    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        // The rollout's previous round is recorded first: this one continues
        // its token ids.
        let pending = match (&self.reuse, params.session) {
            (Some(reuse), Some(session)) => {
                reuse.settle(session).await;
                Some(Pending::new(reuse, session))
            }
            _ => None,
        };
        let ids = self.prompt_ids(prompt, params.session).await?;
        let prompt_tokens = ids.len();
        let mut max_tokens = params.max_tokens.max(1);
        if let Some(room) = self.room_after(prompt_tokens)? {
            max_tokens = max_tokens.min(room);
        }
        let mut sampling = if params.is_greedy() {
            SamplingParams::deterministic()
        } else {
            let mut s = SamplingParams::neutral();
            s.temperature = params.temperature;
            s.top_p = params.top_p;
            s
        };
        sampling.max_len = Some(max_tokens);
        if !params.stop.is_empty() {
            sampling.stop_toks = Some(StopTokens::Seqs(params.stop.clone()));
        }

        let admitted = self.admit(&ids).await?;
        let reused = admitted.reused;
        let (mut request, mut engine_rx) = completion_request(ids.clone(), sampling, 64);
        // Only for the first token's untrimmed text and the last token's id;
        // top-n logprobs stay 0.
        request.return_logprobs = true;
        let sentinel = self.sentinel(&params.stop, max_tokens, params.temperature, &mut request);
        if let Some(s) = &sentinel {
            request.logits_processors = Some(vec![Arc::clone(s) as Arc<_>]);
        }
        let engine_sender = submit(&self.model, request).await?;

        let (tx, rx) = mpsc::channel(64);
        let reuse = self.reuse.clone();
        let model = Arc::clone(&self.model);
        // The prompt is kept for the next round only when rounds continue by ids.
        let session = params
            .session
            .filter(|_| self.reuse.as_ref().is_some_and(|r| r.rounds.is_some()))
            .map(|s| (s, prompt.to_string()));
        tokio::spawn(async move {
            if reuse.is_some() {
                let prompt = EngineEvent::Prompt {
                    tokens: prompt_tokens,
                    cached: Some(reused),
                };
                let _ = tx.send(Ok(prompt)).await;
            }
            let mut first = true;
            // The consumer left: with a sentinel the sequence is ended by the
            // processor at its next step and read to its end (so that its
            // cache key is known); without one, dropping `engine_rx` cancels it.
            let mut gone = false;
            loop {
                let response = tokio::select! {
                    () = tx.closed(), if !gone => {
                        match &sentinel {
                            Some(s) => {
                                s.cancel();
                                gone = true;
                                continue;
                            }
                            None => return,
                        }
                    }
                    r = engine_rx.recv() => r,
                };
                let event = match response {
                    Some(Response::CompletionChunk(chunk)) => {
                        let Some(choice) = chunk.choices.into_iter().next() else {
                            continue;
                        };
                        let mut text = choice.text;
                        if first {
                            first = false;
                            // mistral.rs trims the first piece's leading whitespace.
                            if let Some(raw) = choice
                                .logprobs
                                .as_ref()
                                .and_then(|l| l.bytes.as_ref())
                                .and_then(|b| std::str::from_utf8(b).ok())
                            {
                                if raw != text && raw.trim_start() == text {
                                    text = raw.to_string();
                                }
                            }
                        }
                        let forced = sentinel.as_ref().and_then(|s| s.forced());
                        let finish = choice.finish_reason.as_deref().map(|r| match (r, forced) {
                            ("length", _) | (_, Some(Forced::Length)) => EngineFinish::Length,
                            _ => EngineFinish::Stop,
                        });
                        // A sentinel forced at the budget or on leaving is no
                        // token of the answer.
                        let sentinel_step = finish.is_some()
                            && matches!(forced, Some(Forced::Length | Forced::Cancelled));
                        let nothing = sentinel_step && text.is_empty();
                        if !gone && !nothing {
                            // One chunk per sampled token (a chunk that would end
                            // inside a UTF-8 character is merged into the next one).
                            let tokens = usize::from(!sentinel_step);
                            let event = EngineEvent::Text { text, tokens };
                            if tx.send(Ok(event)).await.is_err() {
                                if let Some(s) = &sentinel {
                                    s.cancel();
                                    gone = true;
                                } else {
                                    return;
                                }
                            }
                        }
                        match finish {
                            None => continue,
                            Some(finish) => Ok(EngineEvent::Done(finish)),
                        }
                    }
                    Some(Response::CompletionDone(done)) => {
                        let forced = sentinel.as_ref().and_then(|s| s.forced());
                        let finish = match (
                            done.choices.first().map(|c| c.finish_reason.as_str()),
                            forced,
                        ) {
                            (Some("length"), _) | (_, Some(Forced::Length)) => EngineFinish::Length,
                            _ => EngineFinish::Stop,
                        };
                        Ok(EngineEvent::Done(finish))
                    }
                    Some(Response::InternalError(e)) | Some(Response::ValidationError(e)) => {
                        Err(EngineError::Internal(e.to_string()))
                    }
                    Some(Response::CompletionModelError(e, _))
                    | Some(Response::ModelError(e, _)) => Err(EngineError::Internal(e)),
                    Some(_) => continue,
                    // mistral.rs 0.8.1 sends no chunk for a last token that
                    // ends inside a UTF-8 character (`get_delta` holds the
                    // bytes back), so a token budget that ends there closes
                    // the stream with no finish reason; EOS and stop strings
                    // always end on whole text. The engine still taking
                    // requests tells that case from an engine that died.
                    None => {
                        // A dying engine drops its request queue while it
                        // unwinds, just after the sequences; give it that time.
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        if engine_sender.is_closed() {
                            Err(EngineError::Internal(
                                "engine closed the stream without finishing".into(),
                            ))
                        } else {
                            Ok(EngineEvent::Done(EngineFinish::Length))
                        }
                    }
                };
                let failed = event.is_err();
                if !gone {
                    let _ = tx.send(event).await;
                }
                if let (Some(reuse), Some(sentinel)) = (&reuse, &sentinel) {
                    if failed {
                        // A failed step may have evicted the cache, or not.
                        reuse.unknown_end.store(true, Ordering::SeqCst);
                    }
                    if let (Some((session, prompt)), false) = (session, failed) {
                        let round = super::continued::Round {
                            prompt,
                            ids: ids.clone(),
                            generated: sentinel.generated(),
                        };
                        if let Some(rounds) = &reuse.rounds {
                            rounds.lock().expect("rounds lock").insert(session, round);
                        }
                    }
                    reuse.record(&model, admitted, &ids, sentinel).await;
                    drop(pending);
                }
                return;
            }
        });
        Ok(Generation {
            prompt_tokens,
            events: rx,
        })
    }
}
