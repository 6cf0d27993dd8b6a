//! `[model]`: [`EngineKind`] and [`ModelConfig`] (the policy model, the
//! engine that runs it, the remote engine's servers, the prefix cache) with
//! their checks, the values they take that the engine reads ([`Isq`],
//! [`WeightFormat`]), and the default and small models' ids and paths
//! ([`DEFAULT_MODEL_ID`], [`DEFAULT_GGUF`], [`SMALL_GGUF`]). Used by `startup`
//! (which engine to build, on which weights), `engine::remote`, `main` and the
//! examples' and tests' defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

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

/// Which engine runs the policy.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// mistral.rs in this process, on `model.gguf` (the default).
    #[default]
    Embedded,
    /// Inference servers at `model.remote_urls` (vLLM, SGLang, llama-server)
    /// through `/v1/completions`; `engine::remote`.
    Remote,
}

/// `[model]`: the policy model and the engine that runs it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Id served in `/v1/models` (the alias `default` also works).
    pub id: String,
    /// `embedded` (mistral.rs, default) or `remote`.
    pub engine: EngineKind,
    /// GGUF file with weights, tokenizer and chat template. With the remote
    /// engine only its chat template and control tokens are read, unless
    /// `tokenizer_config` or `checkpoint` is set. Not read when `checkpoint`
    /// is set.
    pub gguf: PathBuf,
    /// A Hugging Face checkpoint directory (`config.json`, `*.safetensors`
    /// with `model.safetensors.index.json` when sharded, `tokenizer.json`,
    /// `tokenizer_config.json`; `engine::checkpoint`) to serve instead of
    /// `gguf`: the embedded engine loads it with mistral.rs's plain-model
    /// loader, quantized in memory as `isq` says; its chat template and
    /// control tokens come from its `tokenizer_config.json` (also for the
    /// remote engine, when `tokenizer_config` is empty). Empty = `gguf`.
    /// `seeker serve --model DIR` sets it.
    pub checkpoint: PathBuf,
    /// In-situ quantization of `checkpoint`'s weights while loading: `auto`
    /// (= `q4k`), `none` (the weights as they are, in `dtype`), `q4_0`,
    /// `q4_1`, `q5_0`, `q5_1`, `q8_0`, `q2k`, `q3k`, `q4k`, `q5k`, `q6k`.
    /// Measured in `bench/README.md`.
    pub isq: Isq,
    /// Remote engine: base URL of each replica (`http://gpu1:8000`). A
    /// rollout stays on one replica; new rollouts go to the least busy.
    pub remote_urls: Vec<String>,
    /// Remote engine: the model name sent to the servers; empty = the first
    /// model the first reachable server lists at `/v1/models`.
    pub remote_model: String,
    /// Remote engine: environment variable holding the servers' API key
    /// (sent as `Authorization: Bearer`); unset or empty = none.
    pub remote_api_key_env: String,
    /// Remote engine: seconds to open a connection to a replica.
    pub remote_connect_timeout_s: u64,
    /// Remote engine: the longest silence from a replica in seconds (to its
    /// first token, a long prefill included, and between tokens); past it
    /// the round moves to another replica.
    pub remote_read_timeout_s: u64,
    /// Remote engine: a Hugging Face `tokenizer_config.json` to take the chat
    /// template and control tokens from instead of `gguf` (for servers that
    /// run safetensors checkpoints). Empty = `gguf`.
    pub tokenizer_config: PathBuf,
    /// Activation dtype; `f32` is the fastest on CPU (`bench/README.md`).
    pub dtype: ActivationDtype,
    /// Sequences the engine runs at once. 1 (the default) serves requests one
    /// after another: on a CPU, running sequences of different lengths together
    /// is slower in total (measured: 4 questions 140 s together, 58 s in turn)
    /// and makes greedy output depend on what else runs. Above 1, prefix reuse
    /// (`prefix_cache`) is turned off: it is not correct with batched
    /// sequences yet (`startup::mistral_config`).
    pub max_num_seqs: usize,
    /// Weight format the engine runs (GGUF only), prepared once next to `gguf` and loaded
    /// from there: `auto` (default) is `f32` when the F32 copy is at most
    /// 2 GiB, else `q8_0` when some weight has no candle SIMD kernel (Q4_1,
    /// Q5_0, Q5_1, Q8_1), else `as_is` (the default Qwen Q4_K_M file);
    /// `f32` dequantizes every weight (dense matmuls, `STEM.f32.gguf`);
    /// `q8_0` re-quantizes every quantized weight (`STEM.q8_0.gguf`); `as_is`
    /// loads `gguf` unchanged. Measured in `bench/README.md`.
    pub weights: WeightFormat,
    /// Prefix reuse in the embedded engine: a round's prompt takes the KV
    /// rows of the cached sequence it starts with (the previous round, or an
    /// earlier request sharing the system prompt) and prefills only the rest
    /// (`engine::reuse`; measured in `bench/README.md`).
    pub prefix_cache: bool,
    /// Most MiB of KV rows the prefix cache may hold (seeker counts them:
    /// a cached sequence holds its tokens rounded up to 512, times the
    /// model's KV bytes per token, 56 KiB for Qwen2.5-1.5B in F32); past it
    /// the cache is emptied.
    pub prefix_cache_mib: usize,
    /// A rollout's next round continues the previous round's token ids (its
    /// prompt's and the ones the model generated) instead of tokenizing the
    /// transcript text again, so that the prefix cache reuses all of them
    /// (`engine::continued`). Embedded engine with `prefix_cache`, and the
    /// remote engine (later rounds sent as token ids,
    /// `engine::remote::tokens`); `false` tokenizes each round's text whole,
    /// as before (for comparison).
    pub token_continuation: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            id: DEFAULT_MODEL_ID.into(),
            engine: EngineKind::Embedded,
            gguf: DEFAULT_GGUF.into(),
            checkpoint: PathBuf::new(),
            isq: Isq::Auto,
            remote_urls: Vec::new(),
            remote_model: String::new(),
            remote_api_key_env: "SEEKER_REMOTE_API_KEY".into(),
            remote_connect_timeout_s: 5,
            remote_read_timeout_s: 300,
            tokenizer_config: PathBuf::new(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 1,
            weights: WeightFormat::Auto,
            prefix_cache: true,
            prefix_cache_mib: 2048,
            token_continuation: true,
        }
    }
}

/// The served id of the default model, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M):
/// the Qwen2.5 architecture and chat template of Search-R1's and RAG-R1's
/// policies, small enough for a CPU, and it writes its own search calls
/// under Search-R1's prompt.
pub const DEFAULT_MODEL_ID: &str = "Qwen2.5-Coder-1.5B-Instruct";

/// Where `scripts/fetch-defaults.sh` puts the default model's GGUF (joined
/// from hash-pinned wheels; `scripts/models/`).
pub const DEFAULT_GGUF: &str = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The small model (SmolLM2-135M-Instruct Q4_1, 98 MB): tests and
/// low-memory machines; `config/small.toml` serves it with the
/// `search-r1-prefetch` profile (it never writes a search call itself).
pub const SMALL_GGUF: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

impl ModelConfig {
    /// Checks the remote engine's settings when `engine = "remote"` (nothing
    /// otherwise): at least one `remote_urls`, each an http(s) URL listed
    /// once, `tokenizer_config` a file when set, `remote_read_timeout_s` at
    /// least 1. The top level runs this before `[generation]` and `[search]`
    /// and [`ModelConfig::validate_limits`] after them.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub(super) fn validate_engine(&self) -> Result<(), ConfigError> {
        if self.engine != EngineKind::Remote {
            return Ok(());
        }
        if self.remote_urls.is_empty() {
            return Err(ConfigError::Invalid(
                "model.engine = \"remote\" needs model.remote_urls (the servers' base URLs)".into(),
            ));
        }
        for (i, url) in self.remote_urls.iter().enumerate() {
            match reqwest::Url::parse(url) {
                Err(e) => {
                    return Err(ConfigError::Invalid(format!(
                        "model.remote_urls: {url:?}: {e}"
                    )))
                }
                Ok(u) if !matches!(u.scheme(), "http" | "https") || !u.has_host() => {
                    return Err(ConfigError::Invalid(format!(
                        "model.remote_urls: {url:?} is not an http(s) URL"
                    )))
                }
                Ok(_) => {}
            }
            if self.remote_urls[..i].contains(url) {
                return Err(ConfigError::Invalid(format!(
                    "model.remote_urls: {url:?} is listed twice"
                )));
            }
        }
        let tokenizer_config = &self.tokenizer_config;
        if !tokenizer_config.as_os_str().is_empty() && !tokenizer_config.is_file() {
            return Err(ConfigError::Invalid(format!(
                "model.tokenizer_config = {} is not a file",
                tokenizer_config.display()
            )));
        }
        if self.remote_read_timeout_s == 0 {
            return Err(ConfigError::Invalid(
                "model.remote_read_timeout_s must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Serves `path` (`seeker serve --model PATH`): a directory becomes
    /// `checkpoint`, a file `gguf` (and `checkpoint` is cleared); the served
    /// `id` becomes its name (the directory's, or the file's without its
    /// extension) unless it was set to something other than
    /// [`DEFAULT_MODEL_ID`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] when `path` is neither a file nor a directory.
    pub fn serve(&mut self, path: &std::path::Path) -> Result<(), ConfigError> {
        let name = if path.is_dir() {
            self.checkpoint = path.to_path_buf();
            // The name as given (a link keeps its own name); `.` and `..`
            // name the directory they stand for.
            path.file_name().map(|n| n.to_owned()).or_else(|| {
                path.canonicalize()
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_owned()))
            })
        } else if path.is_file() {
            self.gguf = path.to_path_buf();
            self.checkpoint = PathBuf::new();
            path.file_stem().map(|n| n.to_owned())
        } else {
            return Err(ConfigError::Invalid(format!(
                "--model {}: no such file or directory (a GGUF file or a Hugging Face \
                 checkpoint directory)",
                path.display()
            )));
        };
        if let (true, Some(name)) = (self.id == DEFAULT_MODEL_ID, name) {
            self.id = name.to_string_lossy().into_owned();
        }
        Ok(())
    }

    /// Checks the sizes: `prefix_cache_mib` at least 1 when `prefix_cache`
    /// is on, `max_num_seqs` at least 1.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub(super) fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.prefix_cache && self.prefix_cache_mib == 0 {
            return Err(ConfigError::Invalid(
                "model.prefix_cache_mib must be at least 1 (or set model.prefix_cache = false)"
                    .into(),
            ));
        }
        if self.max_num_seqs == 0 {
            return Err(ConfigError::Invalid(
                "model.max_num_seqs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// In-situ quantization (mistral.rs ISQ): the checkpoint's weights are
/// quantized while loading, in memory; nothing is written to disk.
///
/// `auto` (the default) is `q4k`: the format of the default GGUF
/// (Q4_K_M), whose CPU kernels seeker's patched candle speeds up on AVX2
/// (`docs/kernels.md`), at about a quarter of the F16 weights' memory.
/// Measured against the GGUF path in `bench/README.md` ("Serving a Hugging
/// Face checkpoint"). The names are mistral.rs's (`parse_isq_value`); the
/// ones listed are those with CPU kernels in candle.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum Isq {
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// The checkpoint's weights as they are, in `model.dtype`.
    #[serde(rename = "none")]
    None,
    #[serde(rename = "q4_0")]
    Q4_0,
    #[serde(rename = "q4_1")]
    Q4_1,
    #[serde(rename = "q5_0")]
    Q5_0,
    #[serde(rename = "q5_1")]
    Q5_1,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q2k")]
    Q2K,
    #[serde(rename = "q3k")]
    Q3K,
    #[serde(rename = "q4k")]
    Q4K,
    #[serde(rename = "q5k")]
    Q5K,
    #[serde(rename = "q6k")]
    Q6K,
}

impl Isq {
    /// The names accepted in config files and on the command line.
    pub const NAMES: &'static [&'static str] = &[
        "auto", "none", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2k", "q3k", "q4k", "q5k", "q6k",
    ];
}

impl std::str::FromStr for Isq {
    type Err = String;

    /// One of [`Isq::NAMES`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
            format!(
                "unknown quantization {s:?}; one of {}",
                Isq::NAMES.join(", ")
            )
        })
    }
}

/// Weight formats `engine::prepare` writes (`model.weights`, `seeker prepare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// The measured winner, picked by
    /// [`resolve`](crate::engine::prepare::resolve) from the file's size and
    /// weight types (the default).
    Auto,
    /// Load the GGUF as it is (what `auto` picks when every quantized
    /// weight has a SIMD kernel and the F32 copy would exceed 2 GiB).
    AsIs,
    /// Re-quantize every quantized weight to Q8_0 (those already in Q8_0,
    /// and rows that are not whole 32-value blocks, stay as they are).
    Q8_0,
    /// Dequantize every weight to F32: dense matmuls (fast prefill on a
    /// small model; 4 bytes per weight).
    F32,
}

impl WeightFormat {
    /// The file name suffix of a prepared copy (`.q8_0.gguf`); `None` for as-is.
    pub fn suffix(self) -> Option<&'static str> {
        match self {
            Self::AsIs | Self::Auto => None,
            Self::Q8_0 => Some("q8_0"),
            Self::F32 => Some("f32"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_names_parse_and_name_themselves() {
        for name in Isq::NAMES {
            let isq: Isq = name.parse().unwrap();
            assert_eq!(serde_json::to_value(isq).unwrap(), *name);
        }
        assert!("q9".parse::<Isq>().unwrap_err().contains("q4k"));
    }

    #[test]
    fn serving_a_path_picks_the_engine_input_and_the_served_id() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("SearchR1-3b");
        std::fs::create_dir(&dir).unwrap();
        let gguf = tmp.path().join("policy.Q4_K_M.gguf");
        std::fs::write(&gguf, b"GGUF").unwrap();

        let mut model = ModelConfig::default();
        model.serve(&dir).unwrap();
        assert_eq!(
            (model.checkpoint.as_path(), model.id.as_str()),
            (dir.as_path(), "SearchR1-3b")
        );

        // A file after a directory: the GGUF, and no checkpoint; the id
        // set above is kept (it is no longer the default).
        model.serve(&gguf).unwrap();
        assert_eq!(model.gguf, gguf);
        assert!(model.checkpoint.as_os_str().is_empty());
        assert_eq!(model.id, "SearchR1-3b");
        let mut fresh = ModelConfig::default();
        fresh.serve(&gguf).unwrap();
        assert_eq!(fresh.id, "policy.Q4_K_M");

        // An id from the config wins.
        let mut named = ModelConfig {
            id: "mine".into(),
            ..ModelConfig::default()
        };
        named.serve(&dir).unwrap();
        assert_eq!(named.id, "mine");

        let error = ModelConfig::default()
            .serve(&tmp.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no such file or directory"), "{error}");
    }
}
