//! Loading the embedded engine: the GGUF (or its prepared copy), or a
//! Hugging Face checkpoint quantized while loading, becomes a mistral.rs
//! pipeline, then a running `mistralrs::Model` with its scheduler.
//!
//! Seam: [`MistralEngine::load`] is the only entry; it hands the prefix-reuse
//! state to [`super::reuse_state`] and flushes the warm-up run's entry there.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mistralrs::core::{
    AddModelConfig, EngineConfig, GGUFLoaderBuilder, GGUFSpecificConfig, IsqType, Loader,
    NormalLoaderBuilder, NormalSpecificConfig, Pipeline, TokenSource,
};
use mistralrs::model_builder_trait::build_model_from_pipeline;
use mistralrs::{
    AutoDeviceMapParams, DefaultSchedulerMethod, Device, DeviceMapSetting, ModelDType,
    SchedulerConfig,
};

use super::reuse_state::{flush, FlushReason, Reuse};
use super::{MistralConfig, MistralEngine, ModelFiles, LOG_TARGET};
use crate::config::ActivationDtype;
use crate::engine::checkpoint::Checkpoint;
use crate::engine::prepare::ensure_prepared;
use crate::engine::{Engine, EngineError, EngineEvent, GenerationParams};

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

/// What [`load_pipeline`] returns.
type Loaded = Arc<tokio::sync::Mutex<dyn Pipeline + Send + Sync>>;

impl MistralEngine {
    /// Loads the GGUF in `config`, or its Hugging Face checkpoint when it
    /// names one, on the CPU (or the first CUDA device when built with
    /// `cuda`).
    ///
    /// # Errors
    /// [`EngineError::Load`] when the file is missing or not a supported GGUF,
    /// or the checkpoint fails [`Checkpoint::open`]'s checks or mistral.rs's
    /// loader.
    pub async fn load(config: &MistralConfig) -> Result<Self, EngineError> {
        let (files, pipeline) = if let Some(dir) = &config.checkpoint {
            let dir = dir.clone();
            let checkpoint = tokio::task::spawn_blocking(move || Checkpoint::open(&dir))
                .await
                .map_err(|e| EngineError::Load(format!("checkpoint check failed: {e}")))?
                .map_err(|e| EngineError::Load(format!("{e:#}")))?;
            let pipeline = load_checkpoint(config, &checkpoint).await?;
            (ModelFiles::Checkpoint(checkpoint), pipeline)
        } else {
            if !config.gguf.is_file() {
                return Err(EngineError::Load(format!(
                    "{} not found (run scripts/fetch-defaults.sh)",
                    config.gguf.display()
                )));
            }
            let gguf = prepared_weights(config).await?;
            let pipeline = load_pipeline(config, &gguf).await?;
            (ModelFiles::Gguf(config.gguf.clone()), pipeline)
        };

        let seqs = NonZeroUsize::new(config.max_num_seqs.max(1)).expect("max(1) is non-zero");
        let scheduler = SchedulerConfig::DefaultScheduler {
            method: DefaultSchedulerMethod::Fixed(seqs),
        };
        // The flush relies on candle's bounds check, which CUDA lacks.
        let cuda = cfg!(feature = "cuda");
        if cuda && config.prefix_cache && !config.naive_prefix_cache {
            tracing::warn!(target: LOG_TARGET, "prefix reuse is CPU-only for now; off on CUDA");
        }
        let reuse = if config.prefix_cache && !config.naive_prefix_cache && !cuda {
            Some(Arc::new(Reuse::load(config, &files).await?))
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
            #[cfg(any(test, feature = "testing"))]
            files,
            reuse,
        };
        if !cuda {
            engine.warm_up().await?;
        }
        if let Some(reuse) = &engine.reuse {
            // mistral.rs's warm-up run ("hello", one token) left an entry whose
            // last token has no row, under a key seeker did not choose; seeker's
            // own left one too.
            flush(&engine.model, reuse, FlushReason::Startup).await?;
        }
        Ok(engine)
    }

    /// Runs [`WARM_UP_PROMPT`] and two decoded tokens, so that the first
    /// request does not pay for packing the weights.
    ///
    /// Why: candle-core 0.11 repacks each quantized weight the first time a
    /// matmul of a kind uses it, into one layout for one-row products
    /// (decode; mistral.rs's own warm-up run builds these) and, on CPUs with
    /// AMX, another for Q4K products of 32 rows or more (prefill):
    /// `quantized/repack.rs::try_matmul_f32`. Measured on the default model
    /// (`bench/README.md`, "candle 0.11's kernels"): the first 545-token
    /// prefill took 12.0 s, the next ones 6.4-6.9 s.
    ///
    /// # Errors
    /// [`EngineError`] when the run fails: the model cannot serve.
    async fn warm_up(&self) -> Result<(), EngineError> {
        let started = std::time::Instant::now();
        let params = GenerationParams {
            max_tokens: 2,
            temperature: None,
            top_p: None,
            stop: Vec::new(),
            session: None,
        };
        let mut generation = self.generate(WARM_UP_PROMPT, &params).await?;
        while let Some(event) = generation.events.recv().await {
            if matches!(event?, EngineEvent::Done(_)) {
                break;
            }
        }
        tracing::debug!(
            target: LOG_TARGET,
            prompt_tokens = generation.prompt_tokens,
            seconds = started.elapsed().as_secs_f64(),
            "warm-up run done"
        );
        Ok(())
    }
}

/// The warm-up run's prompt: plain text of more than 32 tokens in any
/// tokenizer of the model families seeker serves (the Qwen2.5 tokenizer
/// makes 56 of it), so its prefill takes the many-row kernels.
const WARM_UP_PROMPT: &str = "The search engine returned three documents. The first one \
    describes the history of the city, the second one lists its famous buildings, and the \
    third one gives the population in every census since the year 1900. Read them carefully \
    and answer the question in a few words.";

/// The GGUF to load: the prepared copy `config.weights` asks for
/// ([`crate::engine::prepare`]), or the original when the copy cannot be
/// written (read-only model directory, full disk: that costs speed, not the
/// server).
///
/// # Errors
/// [`EngineError::Load`] when the preparing thread panicked.
async fn prepared_weights(config: &MistralConfig) -> Result<PathBuf, EngineError> {
    let (source, weights) = (config.gguf.clone(), config.weights);
    let original = config.gguf.clone();
    let prepared = tokio::task::spawn_blocking(move || ensure_prepared(&source, weights))
        .await
        .map_err(|e| EngineError::Load(format!("prepare thread failed: {e}")))?;
    Ok(prepared.unwrap_or_else(|e| {
        tracing::warn!(
            target: LOG_TARGET,
            error = %format!("{e:#}"),
            weights = ?weights,
            "cannot prepare the weights; loading the GGUF as it is (slower)"
        );
        original
    }))
}

/// Loads `gguf` into a mistral.rs pipeline (file reads stay off the async
/// runtime).
///
/// # Errors
/// [`EngineError::Load`] when the file is not a supported GGUF.
async fn load_pipeline(config: &MistralConfig, gguf: &Path) -> Result<Loaded, EngineError> {
    let dir = gguf
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let file = gguf
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .ok_or_else(|| EngineError::Load(format!("{} is not a file", gguf.display())))?;
    load_with(
        move || {
            Ok(GGUFLoaderBuilder::new(
                None,
                None,
                dir.to_string_lossy().into_owned(),
                vec![file],
                GGUFSpecificConfig::default(),
                false,
                None,
            )
            .build())
        },
        config.dtype,
        None,
        &config.gguf,
    )
    .await
}

/// Builds a mistral.rs loader with `make` and loads its model from local
/// files on the CPU (or the first CUDA device), quantized in memory with
/// `isq` when given, on a blocking thread (file reads and quantization stay
/// off the async runtime).
///
/// # Errors
/// [`EngineError::Load`] with mistral.rs's error, prefixed with `name`.
async fn load_with(
    make: impl FnOnce() -> anyhow::Result<Box<dyn Loader>> + Send + 'static,
    dtype: ActivationDtype,
    isq: Option<IsqType>,
    name: &Path,
) -> Result<Loaded, EngineError> {
    let dtype = dtype.to_mistral();
    let device = best_device()?;
    tokio::task::spawn_blocking(move || {
        make()?.load_model_from_hf(
            None,
            TokenSource::None,
            &dtype,
            &device,
            true,
            DeviceMapSetting::Auto(AutoDeviceMapParams::default_text()),
            isq,
            None,
        )
    })
    .await
    .map_err(|e| EngineError::Load(format!("loader thread failed: {e}")))?
    .map_err(|e| EngineError::Load(format!("{}: {e:#}", name.display())))
}

/// Loads Hugging Face checkpoint `checkpoint` (checked by
/// [`Checkpoint::open`]) into a mistral.rs pipeline with its plain-model
/// loader, the architecture read from `config.json`, the weights quantized
/// in memory as `config.isq` says (file reads and quantization stay off the
/// async runtime). mistral.rs reads the chat template, the tokenizer and
/// the end-of-sequence ids from the directory itself.
///
/// # Errors
/// [`EngineError::Load`] with mistral.rs's error.
async fn load_checkpoint(
    config: &MistralConfig,
    checkpoint: &Checkpoint,
) -> Result<Loaded, EngineError> {
    let dir = checkpoint.dir.to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let loaded = load_with(
        move || {
            NormalLoaderBuilder::new(
                NormalSpecificConfig::default(),
                None,
                None,
                Some(dir),
                false,
                None,
            )
            .build(None)
        },
        config.dtype,
        config.isq.to_mistral(),
        &checkpoint.dir,
    )
    .await?;
    tracing::info!(
        target: LOG_TARGET,
        checkpoint = %checkpoint.dir.display(),
        architecture = %checkpoint.architecture,
        isq = ?config.isq,
        seconds = started.elapsed().as_secs_f64(),
        "checkpoint loaded"
    );
    Ok(loaded)
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
    pipeline: Arc<tokio::sync::Mutex<dyn Pipeline>>,
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

#[cfg(feature = "cuda")]
fn best_device() -> Result<Device, EngineError> {
    mistralrs::best_device(false).map_err(|e| EngineError::Load(format!("device: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn best_device() -> Result<Device, EngineError> {
    Ok(Device::Cpu)
}
