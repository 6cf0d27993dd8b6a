//! Engines: what generates the policy's text.
//!
//! An [`Engine`] continues a text prefix (the growing transcript: prompt,
//! generated rounds and spliced documents) and streams the continuation in
//! pieces. The search loop re-sends the whole transcript each round, as the
//! reference implementations do (Search-R1 `infer.py` re-encodes the string).
//!
//! Implementations: `mistral::MistralEngine` (mistral.rs, embedded; with
//! the `embedded` feature, on by default),
//! [`remote::RemoteEngine`] (inference servers) and `scripted::ScriptedEngine`
//! (replays given text; with the `testing` feature only, which the tests,
//! examples and benches turn on);
//! [`gate::Gated`] puts any engine behind a first-come, first-served gate.
//! The chat template, control tokens and token count sit above the engine
//! in [`text::PolicyText`].
//! Dropping the receiver returned by [`Engine::generate`] cancels generation.

pub mod chat_template;
pub mod checkpoint;
#[cfg(feature = "embedded")]
pub mod continued;
pub mod gate;
#[cfg(feature = "embedded")]
pub mod mistral;
pub mod prepare;
pub mod remote;
#[cfg(feature = "embedded")]
pub mod reuse;
#[cfg(any(test, feature = "testing"))]
pub mod scripted;
pub mod text;
pub mod vocab;

use async_trait::async_trait;
use tokio::sync::mpsc;

/// The environment variable candle-core 0.11 reads for how long its worker
/// threads spin before they sleep (`utils.rs`, `barrier_pool_spin_limit`).
pub const SPIN_LIMIT_VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// The spin limit seeker runs candle with unless [`SPIN_LIMIT_VAR`] is set:
/// candle's default (25,000 spins) kept its idle worker spinning while
/// mistral.rs's own threads waited for the core. Decode tok/s of the default
/// model on 2 cores, quiet machine, two runs each (`bench/README.md`,
/// "candle 0.11's kernels"): 25,000 → 9.8–10.8; 0 → 10.9–11.3; 200 →
/// 10.9–11.5; 2,000 → 11.8–12.3; 10,000 → 11.1–11.9. Prefill unchanged.
pub const SPIN_LIMIT: &str = "2000";

/// Sets [`SPIN_LIMIT_VAR`] to [`SPIN_LIMIT`] when the environment does not
/// set it. Call it first thing in `main`, while no other thread exists:
/// candle reads the variable when its pool starts.
pub fn set_cpu_defaults() {
    if std::env::var_os(SPIN_LIMIT_VAR).is_none() {
        std::env::set_var(SPIN_LIMIT_VAR, SPIN_LIMIT);
    }
}

/// Decoding settings for one generation call.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    /// Most new tokens this call may generate (at least 1).
    pub max_tokens: usize,
    /// Sampling temperature; `None` or `0.0` is greedy decoding, which is exact
    /// and reproducible.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass in (0, 1]; ignored when greedy.
    pub top_p: Option<f64>,
    /// Strings at which the engine may stop early. The search loop still cuts
    /// the text itself: mistral.rs stops one token late.
    pub stop: Vec<String>,
    /// The rollout this generation belongs to (one id per rollout, the same
    /// for all its rounds), so an engine with several replicas can keep a
    /// rollout where its prefix is cached; `None` for a one-off generation.
    pub session: Option<u64>,
}

impl GenerationParams {
    /// True when decoding is greedy.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_none_or(|t| t <= 0.0)
    }
}

/// Why the engine stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineFinish {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the model's context length reached.
    Length,
}

/// One item of a generation stream.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The next piece of decoded text (never a partial UTF-8 character) and
    /// how many tokens produced it (usually 1).
    Text { text: String, tokens: usize },
    /// What the engine reports of the prompt once it has read it (remote
    /// engines: the server's count, and how many of those tokens it took
    /// from its prefix cache instead of prefilling); replaces
    /// [`Generation::prompt_tokens`].
    Prompt {
        tokens: usize,
        cached: Option<usize>,
    },
    /// The last item: why it stopped.
    Done(EngineFinish),
}

/// Engine failures.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The model could not be loaded.
    #[error("model load failed: {0}")]
    Load(String),
    /// The prompt does not fit in the model's context.
    #[error("the transcript is {prompt_tokens} tokens, the model's context is {limit} tokens")]
    ContextLength { prompt_tokens: usize, limit: usize },
    /// The engine failed while serving a request.
    #[error("engine failure: {0}")]
    Internal(String),
}

/// One running generation. Dropping `events` cancels it.
#[derive(Debug)]
pub struct Generation {
    /// Length of the prompt in tokens (0 when the engine only learns it
    /// later: then an [`EngineEvent::Prompt`] follows).
    pub prompt_tokens: usize,
    /// The continuation: [`EngineEvent::Text`] pieces, then one
    /// [`EngineEvent::Done`] (or an error).
    pub events: mpsc::Receiver<Result<EngineEvent, EngineError>>,
}

/// A text generator the search loop drives: the one seam between seeker and
/// what runs the model. The text side — chat template, control tokens, token
/// count — sits above it in [`text::PolicyText`], shared by all engines, so
/// a wrapper (the gate, a test double) forwards these two methods only.
/// See the module documentation.
#[async_trait]
pub trait Engine: Send + Sync {
    /// Whether the engine can take a generation now (`/health` answers 503
    /// otherwise). Default: true; a remote engine is unhealthy while every
    /// replica is marked down.
    fn healthy(&self) -> bool {
        true
    }

    /// Starts generating a continuation of `prompt` (raw text, special tokens
    /// written out, no BOS added).
    ///
    /// # Errors
    /// [`EngineError::ContextLength`] when the prompt leaves no room to
    /// generate; [`EngineError::Internal`] when the engine refuses the request.
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError>;
}
