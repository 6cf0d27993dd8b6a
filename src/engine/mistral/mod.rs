//! The embedded engine: a local GGUF model, or a Hugging Face checkpoint
//! directory quantized while loading ([`super::checkpoint`]), run by
//! mistral.rs 0.8.1 on the CPU (CUDA with the `cuda` feature), loaded from
//! local files with no network.
//!
//! Facts this module is built around (read from mistral.rs 0.8.1 and measured;
//! numbers in `bench/README.md`):
//! - The high-level `GgufModelBuilder` always picks the activation dtype itself
//!   (F16 on CPU, 2x slower than F32 here); the lower-level loader `load.rs`
//!   uses takes an explicit `mistralrs::ModelDType`.
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
//!
//! Files: `load` (the GGUF to a running model), `reuse_state` (prefix reuse
//! at run time: admission, records, the flush, rounds for token-level
//! continuation), `stream` (one sequence: submit, read its responses as
//! events), `probe` (next-token log-probs for faithfulness checks, and
//! mistral.rs's own rendering of the chat template); this file
//! holds the configuration, the engine and its [`Engine`] impl.

mod load;
#[cfg(any(test, feature = "testing"))]
mod probe;
mod reuse_state;
mod stream;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use either::Either;
use mistralrs::{SamplingParams, StopTokens};
use tokio::sync::mpsc;

use super::text::TokenCount;
use super::{Engine, EngineError, EngineEvent, Generation, GenerationParams};
use crate::config::ActivationDtype;
use crate::config::{Isq, WeightFormat};
use crate::metrics::Metrics;
use reuse_state::{Pending, Reuse};
pub use reuse_state::{FLUSH_ERROR_MARK, FLUSH_TOKEN};
use stream::{completion_request, submit, Forward};

/// The target of this module's log events, in every file of it (what log
/// filters and readers saw before the module was split).
const LOG_TARGET: &str = module_path!();

/// How to load the embedded model.
#[derive(Clone, Debug)]
pub struct MistralConfig {
    /// Path to the GGUF file (tokenizer and chat template are read from it).
    /// Not read when `checkpoint` is set.
    pub gguf: PathBuf,
    /// A Hugging Face checkpoint directory to serve instead of `gguf`
    /// ([`super::checkpoint`]), loaded by mistral.rs's plain-model loader.
    pub checkpoint: Option<PathBuf>,
    /// In-situ quantization of `checkpoint`'s weights while loading.
    pub isq: Isq,
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
    /// emptied (seeker's count, [`super::reuse::PrefixTracker`]).
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

/// Where the embedded model's weights, tokenizer and chat template are.
#[derive(Clone, Debug)]
enum ModelFiles {
    Gguf(PathBuf),
    Checkpoint(super::checkpoint::Checkpoint),
}

/// See the module documentation.
pub struct MistralEngine {
    model: Arc<mistralrs::Model>,
    max_seq_len: Option<usize>,
    /// The GGUF or checkpoint the model was loaded from (its chat template,
    /// for probes).
    #[cfg(any(test, feature = "testing"))]
    files: ModelFiles,
    /// `None`: no prefix cache, or mistral.rs's own (naive).
    reuse: Option<Arc<Reuse>>,
}

impl MistralEngine {
    /// Counts prefix reuse and flushes in `metrics` from now on.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        if let Some(reuse) = &self.reuse {
            reuse.set_metrics(metrics);
        }
        self
    }

    /// KV bytes seeker counts in the prefix cache (0 when reuse is off).
    #[cfg(any(test, feature = "testing"))]
    pub fn prefix_cache_bytes(&self) -> usize {
        self.reuse.as_ref().map_or(0, |r| r.bytes())
    }

    /// The texts of the `(stop, mark)` sentinels when reuse is on.
    #[cfg(any(test, feature = "testing"))]
    pub fn sentinel_texts(&self) -> Option<(String, String)> {
        self.reuse.as_ref().map(|r| r.sentinel_texts())
    }

    /// Times the prefix cache was emptied (the one at startup included).
    #[cfg(any(test, feature = "testing"))]
    pub fn prefix_cache_flushes(&self) -> usize {
        self.reuse.as_ref().map_or(0, |r| r.flushes())
    }

    /// Sequences mistral.rs found a prefix-cache match for since the engine
    /// was built (its own counter, `IntervalLogger::prefix_cache_stats`).
    #[cfg(any(test, feature = "testing"))]
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
        tokenize(&self.model, text).await
    }

    /// The model's tokenizer as a [`TokenCount`], for the policy's
    /// [`crate::engine::text::PolicyText`] (it shares the running model).
    pub fn token_count(&self) -> Arc<dyn TokenCount> {
        Arc::new(Tokens(Arc::clone(&self.model)))
    }
}

/// Token ids of `text` by `model`'s tokenizer (special tokens written out
/// are recognised; no BOS added).
///
/// # Errors
/// [`EngineError::Internal`] when the tokenizer fails.
async fn tokenize(model: &Arc<mistralrs::Model>, text: &str) -> Result<Vec<u32>, EngineError> {
    let model = Arc::clone(model);
    let text = text.to_string();
    detached(async move {
        model
            .tokenize(Either::Right(text), None, false, false, None)
            .await
    })
    .await?
    .map_err(|e| EngineError::Internal(format!("tokenize: {e}")))
}

/// The embedded model's tokenizer (see [`MistralEngine::token_count`]).
struct Tokens(Arc<mistralrs::Model>);

#[async_trait]
impl TokenCount for Tokens {
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        Ok(tokenize(&self.0, text).await?.len())
    }
}

impl MistralEngine {
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

#[async_trait]
impl Engine for MistralEngine {
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
        let admitted = self.admit(&ids).await?;
        let reused = admitted.reused;
        let (mut request, engine_rx) =
            completion_request(ids.clone(), sampling(params, max_tokens), 64);
        // Only for the first token's untrimmed text and the last token's id;
        // top-n logprobs stay 0.
        request.return_logprobs = true;
        let sentinel = self.sentinel(&params.stop, max_tokens, params.temperature, &mut request);
        if let Some(s) = &sentinel {
            request.logits_processors = Some(vec![Arc::clone(s) as Arc<_>]);
        }
        let engine_sender = submit(&self.model, request).await?;

        let (tx, rx) = mpsc::channel(64);
        let prompt_event = self.reuse.as_ref().map(|_| EngineEvent::Prompt {
            tokens: prompt_tokens,
            cached: Some(reused),
        });
        let forward = Forward::new(tx, engine_rx, engine_sender, sentinel.clone(), prompt_event);
        let reuse = self.reuse.clone();
        let model = Arc::clone(&self.model);
        // The prompt is kept for the next round only when rounds continue by ids.
        let session = params
            .session
            .filter(|_| self.reuse.as_ref().is_some_and(|r| r.continues_rounds()))
            .map(|s| (s, prompt.to_string()));
        tokio::spawn(async move {
            let mut forward = forward;
            let Some(failed) = forward.run().await else {
                return;
            };
            if let (Some(reuse), Some(sentinel)) = (&reuse, &sentinel) {
                reuse
                    .end_sequence(&model, admitted, ids, sentinel, session, failed)
                    .await;
                drop(pending);
            }
            // The stream closes only now: a consumer that waits for its end
            // (the gate's slot) lets the next generation in after this one is
            // recorded.
            drop(forward);
        });
        Ok(Generation {
            prompt_tokens,
            events: rx,
        })
    }
}

/// mistral.rs's sampling settings for `params`, at most `max_tokens` new
/// tokens: deterministic when greedy, else temperature and top-p over a
/// neutral sampler; the stop strings as stop sequences.
fn sampling(params: &GenerationParams, max_tokens: usize) -> SamplingParams {
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
    sampling
}
