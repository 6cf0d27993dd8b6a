//! Sentence embeddings in-process: a BERT-family encoder (MiniLM, e5, bge)
//! from a local Hugging Face directory, run with candle on the CPU.
//!
//! A model directory holds `config.json`, `model.safetensors` and
//! `tokenizer.json` (what `huggingface-cli download` or a sentence-transformers
//! checkout gives). How a text becomes a vector follows the model's own
//! sentence-transformers files where they exist, else its family's published
//! usage:
//!
//! | setting | read from | else |
//! |---|---|---|
//! | pooling | `1_Pooling/config.json` (`pooling_mode_cls_token` / `pooling_mode_mean_tokens`) | CLS for bge, mean otherwise |
//! | prefixes | `config_sentence_transformers.json` `prompts.query` / `prompts.passage` (or `document`) | e5: `query: ` / `passage: ` (intfloat/e5 model cards); bge-*-en: `Represent this sentence for searching relevant passages: ` on queries only (FlagEmbedding README); none otherwise |
//! | max length | `sentence_bert_config.json` `max_seq_length` | 512, at most `max_position_embeddings` |
//!
//! Every vector is L2-normalised (sentence-transformers' `Normalize` module for
//! MiniLM; Search-R1's and FlashRAG's e5 encoders and FlagEmbedding normalise
//! too), so the inner product is the cosine similarity. Each of these can be
//! overridden in `[search.dense]`.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// Why a model could not be loaded or a text not embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file of the model directory is missing or unreadable.
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    /// The tokenizer refused the text or its own settings.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// candle failed (shapes, weights that do not match `config.json`).
    #[error("encoder: {0}")]
    Model(#[from] candle_core::Error),
}

/// How token states become one vector.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// Mean of the non-padding tokens' last hidden states (MiniLM, e5).
    Mean,
    /// The `[CLS]` token's last hidden state (bge).
    Cls,
}

/// Overrides of what the model's files say (`[search.dense]`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmbedOptions {
    /// Prepended to every query.
    #[serde(default)]
    pub query_prefix: Option<String>,
    /// Prepended to every passage.
    #[serde(default)]
    pub passage_prefix: Option<String>,
    #[serde(default)]
    pub pooling: Option<Pooling>,
    /// Tokens per text, `[CLS]` and `[SEP]` included; longer texts are cut.
    #[serde(default)]
    pub max_length: Option<usize>,
}

/// What an [`Embedder`] does to a text, recorded in a dense index's manifest
/// so that an index is only ever searched with the encoder that built it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct EncoderSpec {
    /// sha256 over `config.json`, `tokenizer.json`, and the size, first and
    /// last 64 KiB of `model.safetensors` (a full hash of a 1.3 GB bge-large
    /// would cost seconds at every start).
    pub fingerprint: String,
    /// Vector length (`hidden_size`).
    pub dim: usize,
    pub pooling: Pooling,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub max_length: usize,
}

/// A loaded encoder. `embed_*` are synchronous CPU work: call them on the
/// blocking pool. Safe to share between threads.
pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    spec: EncoderSpec,
    dir: PathBuf,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("dir", &self.dir)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(path).map_err(|e| EmbedError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, EmbedError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = read(path)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| EmbedError::File {
            path: path.to_path_buf(),
            message: format!("not valid JSON: {e}"),
        })
}

/// Which published family a model belongs to, from its `_name_or_path` and
/// its directory name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    E5,
    BgeEnglish,
    Other,
}

fn family(dir: &Path, config: &serde_json::Value) -> Family {
    let mut names = config
        .get("_name_or_path")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_lowercase();
    names.push(' ');
    names.push_str(
        &dir.file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default(),
    );
    let words: Vec<&str> = names
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    if words.contains(&"e5") {
        Family::E5
    } else if words.contains(&"bge") && words.contains(&"en") {
        Family::BgeEnglish
    } else {
        Family::Other
    }
}

/// The model's encoder settings: its files, its family, then `options`.
fn spec_of(
    dir: &Path,
    config: &serde_json::Value,
    bert: &BertConfig,
    options: &EmbedOptions,
    fingerprint: String,
) -> Result<EncoderSpec, EmbedError> {
    let family = family(dir, config);
    let pooling_file = read_json(&dir.join("1_Pooling/config.json"))?;
    let file_pooling = pooling_file.as_ref().and_then(|p| {
        let on = |k: &str| p.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        if on("pooling_mode_cls_token") {
            Some(Pooling::Cls)
        } else if on("pooling_mode_mean_tokens") {
            Some(Pooling::Mean)
        } else {
            None
        }
    });
    let st = read_json(&dir.join("config_sentence_transformers.json"))?;
    let prompt = |keys: &[&str]| -> Option<String> {
        let prompts = st.as_ref()?.get("prompts")?;
        keys.iter()
            .find_map(|k| prompts.get(*k).and_then(|v| v.as_str()).map(str::to_string))
    };
    let (family_query, family_passage) = match family {
        Family::E5 => ("query: ", "passage: "),
        Family::BgeEnglish => (
            "Represent this sentence for searching relevant passages: ",
            "",
        ),
        Family::Other => ("", ""),
    };
    let sbert = read_json(&dir.join("sentence_bert_config.json"))?;
    let file_max = sbert
        .as_ref()
        .and_then(|s| s.get("max_seq_length"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize);
    let max_length = options
        .max_length
        .or(file_max)
        .unwrap_or(512)
        .clamp(2, bert.max_position_embeddings);
    Ok(EncoderSpec {
        fingerprint,
        dim: bert.hidden_size,
        pooling: options
            .pooling
            .or(file_pooling)
            .unwrap_or(if family == Family::BgeEnglish {
                Pooling::Cls
            } else {
                Pooling::Mean
            }),
        query_prefix: options
            .query_prefix
            .clone()
            .or_else(|| prompt(&["query"]))
            .unwrap_or_else(|| family_query.to_string()),
        passage_prefix: options
            .passage_prefix
            .clone()
            .or_else(|| prompt(&["passage", "document"]))
            .unwrap_or_else(|| family_passage.to_string()),
        max_length,
    })
}

fn fingerprint(config: &[u8], tokenizer: &[u8], weights: &Path) -> Result<String, EmbedError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e: std::io::Error| EmbedError::File {
        path: weights.to_path_buf(),
        message: e.to_string(),
    };
    let mut file = std::fs::File::open(weights).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut h = Sha256::new();
    h.update(config);
    h.update(tokenizer);
    h.update(size.to_le_bytes());
    let mut head = vec![0u8; 64 * 1024];
    let n = file.read(&mut head).map_err(io)?;
    h.update(&head[..n]);
    file.seek(SeekFrom::Start(size.saturating_sub(64 * 1024)))
        .map_err(io)?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).map_err(io)?;
    h.update(&tail);
    Ok(format!("{:x}", h.finalize()))
}

impl Embedder {
    /// Loads the encoder in `dir` (F32 on the CPU).
    ///
    /// # Errors
    /// A missing or malformed `config.json`, `tokenizer.json` or
    /// `model.safetensors` (named in the message), weights that do not fit the
    /// config.
    pub fn load(dir: &Path, options: &EmbedOptions) -> Result<Self, EmbedError> {
        let config_path = dir.join("config.json");
        let config_bytes = read(&config_path)?;
        let config: serde_json::Value =
            serde_json::from_slice(&config_bytes).map_err(|e| EmbedError::File {
                path: config_path.clone(),
                message: format!("not valid JSON: {e}"),
            })?;
        let bert: BertConfig =
            serde_json::from_value(config.clone()).map_err(|e| EmbedError::File {
                path: config_path.clone(),
                message: format!("not a BERT config: {e}"),
            })?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_bytes = read(&tokenizer_path)?;
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(EmbedError::File {
                path: weights,
                message: "missing (seeker reads safetensors weights only)".into(),
            });
        }
        let fingerprint = fingerprint(&config_bytes, &tokenizer_bytes, &weights)?;
        let spec = spec_of(dir, &config, &bert, options, fingerprint)?;
        let mut tokenizer =
            Tokenizer::from_bytes(&tokenizer_bytes).map_err(|e| EmbedError::File {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            })?;
        let pad_token = tokenizer
            .id_to_token(bert.pad_token_id as u32)
            .unwrap_or_else(|| "[PAD]".to_string());
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_id: bert.pad_token_id as u32,
            pad_token,
            ..PaddingParams::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: spec.max_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        // SAFETY: the weights file is memory-mapped read-only; seeker never
        // writes it, and a user who rewrites it under a running server gets
        // what any mmap reader gets.
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu)? };
        let model = BertModel::load(vb, &bert)?;
        Ok(Self {
            model,
            tokenizer,
            spec,
            dir: dir.to_path_buf(),
        })
    }

    /// What this encoder does to a text (prefixes, pooling, length, model).
    pub fn spec(&self) -> &EncoderSpec {
        &self.spec
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Query vectors (the query prefix prepended), one per text, each of
    /// [`EncoderSpec::dim`] floats with unit L2 norm.
    ///
    /// # Errors
    /// Tokenizer or candle failures.
    pub fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts, &self.spec.query_prefix)
    }

    /// Passage vectors (the passage prefix prepended); see [`Self::embed_queries`].
    ///
    /// # Errors
    /// Tokenizer or candle failures.
    pub fn embed_passages(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts, &self.spec.passage_prefix)
    }

    /// One forward pass over `texts` as a batch (padded to the longest).
    fn embed(&self, texts: &[&str], prefix: &str) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let inputs: Vec<String> = texts.iter().map(|t| format!("{prefix}{t}")).collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let len = encodings[0].get_ids().len();
        let mut ids = Vec::with_capacity(texts.len() * len);
        let mut mask = Vec::with_capacity(texts.len() * len);
        for e in &encodings {
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
        }
        let device = &self.model.device;
        let ids = Tensor::from_vec(ids, (texts.len(), len), device)?;
        let mask = Tensor::from_vec(mask, (texts.len(), len), device)?;
        let types = ids.zeros_like()?;
        let states = self.model.forward(&ids, &types, Some(&mask))?; // (b, len, dim)
        let pooled = match self.spec.pooling {
            Pooling::Cls => states.narrow(1, 0, 1)?.squeeze(1)?,
            Pooling::Mean => {
                let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (b, len, 1)
                let sum = states.broadcast_mul(&m)?.sum(1)?; // (b, dim)
                let count = m.sum(1)?.clamp(1e-9, f64::MAX)?; // (b, 1)
                sum.broadcast_div(&count)?
            }
        };
        let norm = pooled
            .sqr()?
            .sum_keepdim(1)?
            .sqrt()?
            .clamp(1e-12, f64::MAX)?;
        Ok(pooled.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }
}

/// Inner product of two vectors of the same length (the cosine similarity of
/// unit vectors). Eight lanes, so the compiler vectorises it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// The `k` best of `scored` (`(row, score)` in row order), best first; ties
/// go to the lower row. A heap of k, so the rows are not all sorted.
pub(super) fn top_k(scored: impl IntoIterator<Item = (usize, f32)>, k: usize) -> Vec<(usize, f32)> {
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    for (row, s) in scored {
        if heap.len() < k {
            heap.push(Hit(s, row));
        } else if heap.peek().is_some_and(|worst: &Hit| s > worst.0) {
            heap.pop();
            heap.push(Hit(s, row));
        }
    }
    let mut hits: Vec<(usize, f32)> = heap.into_iter().map(|Hit(s, r)| (r, s)).collect();
    hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    hits
}

/// A row and its score, ordered so that a `BinaryHeap` pops the worst first.
#[derive(PartialEq)]
struct Hit(f32, usize);
impl Eq for Hit {}
impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Hit {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: the heap's top is the lowest score (ties: the later row).
        other
            .0
            .total_cmp(&self.0)
            .then_with(|| self.1.cmp(&other.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_told_apart_by_name() {
        let cfg = |n: &str| serde_json::json!({ "_name_or_path": n });
        let d = Path::new("models/x");
        assert_eq!(family(d, &cfg("intfloat/e5-base-v2")), Family::E5);
        assert_eq!(
            family(d, &cfg("BAAI/bge-large-en-v1.5")),
            Family::BgeEnglish
        );
        assert_eq!(
            family(Path::new("models/bge-base-en"), &cfg("")),
            Family::BgeEnglish
        );
        assert_eq!(
            family(d, &cfg("nreimers/MiniLM-L6-H384-uncased")),
            Family::Other
        );
        // A name that merely contains the letters is not e5.
        assert_eq!(family(Path::new("models/ae5x"), &cfg("")), Family::Other);
    }

    #[test]
    fn dot_matches_the_naive_sum() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }
}
