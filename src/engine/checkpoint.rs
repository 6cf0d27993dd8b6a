//! A Hugging Face checkpoint directory as the embedded engine serves it
//! (`model.checkpoint`), and the in-situ quantization it is loaded with
//! ([`crate::config::Isq`], a config value whose meaning to mistral.rs is
//! here).
//!
//! The layout is the one the seeds publish and `transformers`' `save_pretrained`
//! writes (Search-R1's `PeterJinGo/SearchR1-*` checkpoints, R1-Searcher's,
//! RAG-R1's):
//! - `config.json`: `architectures` (one of mistral.rs 0.8.1's plain models:
//!   `Qwen2ForCausalLM`, `LlamaForCausalLM`, `MistralForCausalLM`,
//!   `Qwen3ForCausalLM`, …; `NormalLoaderType::from_causal_lm_name`) and the
//!   sizes;
//! - the weights: `model.safetensors`, or shards named in
//!   `model.safetensors.index.json` (`{"weight_map": {tensor: file}}`);
//! - `tokenizer.json` (the `tokenizers` library's format), and
//!   `tokenizer_config.json` with the `chat_template` the policy was trained
//!   with (or a `chat_template.jinja` beside it, which mistral.rs prefers) and
//!   `added_tokens_decoder` (its control tokens are the entries marked
//!   `special`);
//! - optionally `generation_config.json` (`eos_token_id`: an id or a list).
//!
//! [`Checkpoint::open`] checks all of it before mistral.rs reads a byte, so a
//! bad directory fails at startup with one line naming the file, never a
//! panic inside the loader (mistral.rs 0.8.1 panics on an end-of-sequence id
//! its tokenizer cannot decode, `pipeline/chat_template.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

#[cfg(feature = "embedded")]
use crate::config::Isq;

// `Isq` is a config value (`config::model`); what it means to mistral.rs is
// the engine's business.
#[cfg(feature = "embedded")]
impl Isq {
    /// mistral.rs's quantization type (`None` for [`Isq::None`]).
    pub fn to_mistral(self) -> Option<mistralrs::IsqType> {
        use mistralrs::IsqType as T;
        Some(match self {
            Self::None => return None,
            Self::Auto | Self::Q4K => T::Q4K,
            Self::Q4_0 => T::Q4_0,
            Self::Q4_1 => T::Q4_1,
            Self::Q5_0 => T::Q5_0,
            Self::Q5_1 => T::Q5_1,
            Self::Q8_0 => T::Q8_0,
            Self::Q2K => T::Q2K,
            Self::Q3K => T::Q3K,
            Self::Q5K => T::Q5K,
            Self::Q6K => T::Q6K,
        })
    }
}

/// A checked checkpoint directory: see the module documentation.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// `config.json`'s first `architectures` entry (`Qwen2ForCausalLM`).
    pub architecture: String,
    /// The weight files, in the order the index names them (or the one file).
    pub weight_files: Vec<PathBuf>,
    /// Bytes of tensor data in all weight files.
    pub weight_bytes: u64,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// The largest safetensors header seeker reads (the format itself caps it
/// at 100 MB: `safetensors` crate, `MAX_HEADER_SIZE`).
const MAX_HEADER_BYTES: u64 = 100_000_000;

impl Checkpoint {
    /// Checks `dir` (see the module documentation): every file the loader
    /// reads exists and parses, the architecture is one mistral.rs serves,
    /// every weight shard is whole (its size is what its header says) and
    /// holds the tensors the index puts there, and every end-of-sequence id
    /// is in the vocabulary.
    ///
    /// # Errors
    /// The first problem found, naming the file.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            bail!("{} is not a directory", dir.display());
        }
        let config = read_json(&dir.join("config.json"))?;
        let architecture = config["architectures"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .ok_or_else(|| {
                anyhow!(
                    "{}: no \"architectures\" list naming the model class",
                    dir.join("config.json").display()
                )
            })?
            .to_string();
        // Only the embedded engine runs the weights; a build without it
        // reads the directory for its text side alone.
        #[cfg(feature = "embedded")]
        if let Err(e) = mistralrs::core::NormalLoaderType::from_causal_lm_name(&architecture) {
            bail!(
                "{}: architecture {architecture:?} is not a text model mistral.rs serves ({e})",
                dir.join("config.json").display()
            );
        }
        let number = |key: &str| config[key].as_u64().map(|n| n as usize);
        let missing = |key: &str| anyhow!("{}: no {key:?}", dir.join("config.json").display());
        let layers = number("num_hidden_layers").ok_or_else(|| missing("num_hidden_layers"))?;
        let heads = number("num_attention_heads").ok_or_else(|| missing("num_attention_heads"))?;
        let hidden = number("hidden_size").ok_or_else(|| missing("hidden_size"))?;
        let kv_heads = number("num_key_value_heads").unwrap_or(heads);
        let head_dim = number("head_dim").unwrap_or(hidden / heads.max(1));
        for (key, value) in [
            ("num_hidden_layers", layers),
            ("num_attention_heads", heads),
            ("hidden_size", hidden),
            ("num_key_value_heads", kv_heads),
            ("head_dim", head_dim),
        ] {
            if value == 0 {
                bail!("{}: {key} is 0", dir.join("config.json").display());
            }
        }

        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            bail!(
                "{}: no tokenizer.json (the policy's tokenizer, as transformers saves it)",
                dir.display()
            );
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_json).map_err(|e| {
            anyhow!(
                "{}: not a tokenizer the tokenizers library reads: {e}",
                tokenizer_json.display()
            )
        })?;
        let vocab_size = tokenizer.get_vocab_size(true);

        let tokenizer_config = dir.join("tokenizer_config.json");
        if !tokenizer_config.is_file() {
            bail!(
                "{}: no tokenizer_config.json (its chat_template and control tokens)",
                dir.display()
            );
        }
        let (template, bos, eos) = chat_template_parts(dir)?;
        let template = template.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
            anyhow!(
                "{}: no chat_template (and no chat_template.jinja beside it)",
                tokenizer_config.display()
            )
        })?;
        // The template must compile: the embedded engine renders with it.
        if let Err(e) = super::chat_template::ChatTemplate::new(&template, bos, eos) {
            let message = e.to_string();
            let message = message.trim_start_matches("model load failed: ");
            bail!("{}: {message}", dir.display());
        }
        let generation = dir.join("generation_config.json");
        if generation.is_file() {
            let eos = &read_json(&generation)?["eos_token_id"];
            let listed: Vec<&serde_json::Value> = match eos {
                serde_json::Value::Array(list) => list.iter().collect(),
                serde_json::Value::Null => Vec::new(),
                one => vec![one],
            };
            for id in listed {
                match id.as_u64() {
                    Some(n) if n < vocab_size as u64 => {}
                    Some(n) => bail!(
                        "{}: eos_token_id {n} is not in the vocabulary ({vocab_size} tokens)",
                        generation.display()
                    ),
                    None => bail!(
                        "{}: eos_token_id {id} is not a token id",
                        generation.display()
                    ),
                }
            }
        }

        let (weight_files, weight_bytes) = check_weights(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            architecture,
            weight_files,
            weight_bytes,
            layers,
            kv_heads,
            head_dim,
        })
    }

    /// `tokenizer.json`.
    pub fn tokenizer_json(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }

    /// `tokenizer_config.json`.
    pub fn tokenizer_config(&self) -> PathBuf {
        self.dir.join("tokenizer_config.json")
    }

    /// `generation_config.json`, when there is one.
    pub fn generation_config(&self) -> Option<PathBuf> {
        Some(self.dir.join("generation_config.json")).filter(|p| p.is_file())
    }

    /// KV-cache bytes one token of context takes, all layers, K and V, at
    /// `dtype_bytes` per element: `num_hidden_layers × num_key_value_heads ×
    /// 2 × head_dim × dtype_bytes` (`head_dim` defaults to `hidden_size /
    /// num_attention_heads`, as in `transformers`). Qwen2.5-1.5B in F32:
    /// 28 × 2 × 2 × 128 × 4 = 57,344, as from its GGUF.
    pub fn kv_bytes_per_row(&self, dtype_bytes: usize) -> usize {
        self.layers * self.kv_heads * 2 * self.head_dim * dtype_bytes
    }
}

/// The chat template of checkpoint `dir` and its BOS and EOS token strings:
/// the template from `chat_template.jinja` when there is one (mistral.rs
/// 0.8.1 prefers it, `pipeline/macros.rs`), else `tokenizer_config.json`'s
/// `chat_template`; the tokens from `tokenizer_config.json`.
///
/// # Errors
/// An unreadable `chat_template.jinja`, or an unreadable or malformed
/// `tokenizer_config.json`.
pub fn chat_template_parts(
    dir: &Path,
) -> anyhow::Result<(Option<String>, Option<String>, Option<String>)> {
    let (template, bos, eos) =
        super::chat_template::tokenizer_config_parts(&dir.join("tokenizer_config.json"))?;
    let jinja = dir.join("chat_template.jinja");
    let template = if jinja.exists() {
        Some(std::fs::read_to_string(&jinja).with_context(|| jinja.display().to_string())?)
    } else {
        template
    };
    Ok((template, bos, eos))
}

/// The ids of a `generation_config.json` id field: a number or a list.
pub(crate) fn ids_of(value: &serde_json::Value) -> Vec<u32> {
    match value {
        serde_json::Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        serde_json::Value::Array(list) => list
            .iter()
            .filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| anyhow!("{}: not JSON: {e}", path.display()))
}

/// The weight files of `dir` and their tensor bytes: the shards the index
/// names, or the `*.safetensors` files there. Each file's header must parse
/// and its size be what the header says; the index's tensors must be in the
/// shard it names.
fn check_weights(dir: &Path) -> anyhow::Result<(Vec<PathBuf>, u64)> {
    let index = dir.join("model.safetensors.index.json");
    let mut expected: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let files: Vec<String> = if index.is_file() {
        let map = read_json(&index)?;
        let map = map["weight_map"]
            .as_object()
            .ok_or_else(|| anyhow!("{}: no \"weight_map\"", index.display()))?;
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| anyhow!("{}: {tensor} names no file", index.display()))?;
            if file.contains('/') || file.contains('\\') || file == ".." {
                bail!("{}: {file:?} is not a file name", index.display());
            }
            expected
                .entry(file.to_string())
                .or_default()
                .insert(tensor.clone());
        }
        expected.keys().cloned().collect()
    } else {
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| anyhow!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".safetensors"))
            .collect();
        files.sort();
        files
    };
    if files.is_empty() {
        bail!(
            "{}: no *.safetensors weights (PyTorch .bin checkpoints are not read: \
             save them as safetensors)",
            dir.display()
        );
    }
    let mut total = 0;
    let mut paths = Vec::new();
    for file in files {
        let path = dir.join(&file);
        if !path.is_file() {
            bail!("{}: names {file}, which is missing", index.display());
        }
        let (tensors, bytes) = safetensors_header(&path)?;
        if let Some(wanted) = expected.get(&file) {
            if let Some(absent) = wanted.iter().find(|t| !tensors.contains(*t)) {
                bail!(
                    "{}: the index puts {absent} here, but the file has no such tensor",
                    path.display()
                );
            }
        }
        total += bytes;
        paths.push(path);
    }
    Ok((paths, total))
}

/// The tensor names and data bytes of a safetensors file, checking that
/// the file is as long as its header says (8-byte little-endian header
/// length, the JSON header, then the data: `safetensors` format).
fn safetensors_header(path: &Path) -> anyhow::Result<(BTreeSet<String>, u64)> {
    let mut file = std::fs::File::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let size = file
        .metadata()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?
        .len();
    let mut head = [0u8; 8];
    file.read_exact(&mut head).map_err(|_| {
        anyhow!(
            "{}: not a safetensors file (shorter than 8 bytes)",
            path.display()
        )
    })?;
    let n = u64::from_le_bytes(head);
    if n > MAX_HEADER_BYTES || n > size - 8 {
        bail!(
            "{}: not a safetensors file, or truncated (header of {n} bytes in a file of {size})",
            path.display()
        );
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let header: serde_json::Value = serde_json::from_slice(&header).map_err(|e| {
        anyhow!(
            "{}: its safetensors header is not JSON: {e}",
            path.display()
        )
    })?;
    let header = header.as_object().ok_or_else(|| {
        anyhow!(
            "{}: its safetensors header is not an object",
            path.display()
        )
    })?;
    let mut names = BTreeSet::new();
    let mut end = 0u64;
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let offsets = info["data_offsets"].as_array().map(|o| {
            o.iter()
                .filter_map(serde_json::Value::as_u64)
                .collect::<Vec<_>>()
        });
        let Some([_, stop]) = offsets.as_deref() else {
            bail!("{}: tensor {name} has no data_offsets", path.display());
        };
        end = end.max(*stop);
        names.insert(name.clone());
    }
    if size != 8 + n + end {
        bail!(
            "{}: truncated or padded: its header says {} bytes, the file has {size}",
            path.display(),
            8 + n + end
        );
    }
    Ok((names, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file with one F32 tensor `name` of `values`.
    fn safetensors(name: &str, values: &[f32]) -> Vec<u8> {
        let bytes = values.len() * 4;
        let header = format!(
            r#"{{"{name}":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{bytes}]}}}}"#,
            values.len()
        );
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// A directory that passes [`Checkpoint::open`]: a 4-token byte-level
    /// vocabulary, a ChatML template, two shards with an index.
    fn good(dir: &Path) {
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write(
            "config.json",
            r#"{"architectures":["Qwen2ForCausalLM"],"num_hidden_layers":2,
                "num_attention_heads":4,"num_key_value_heads":2,"hidden_size":32}"#,
        );
        write(
            "tokenizer.json",
            r#"{"version":"1.0","added_tokens":[{"id":3,"content":"<|im_end|>","single_word":false,
                "lstrip":false,"rstrip":false,"normalized":false,"special":true}],
                "normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,
                "trim_offsets":false,"use_regex":true},"post_processor":null,
                "decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,
                "use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,
                "continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,
                "byte_fallback":false,"vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}"#,
        );
        write(
            "tokenizer_config.json",
            r#"{"chat_template":"{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}",
                "eos_token":"<|im_end|>","added_tokens_decoder":{"3":{"content":"<|im_end|>","special":true}}}"#,
        );
        write("generation_config.json", r#"{"eos_token_id":[3]}"#);
        std::fs::write(dir.join("a.safetensors"), safetensors("x", &[1.0, 2.0])).unwrap();
        std::fs::write(dir.join("b.safetensors"), safetensors("y", &[3.0])).unwrap();
        write(
            "model.safetensors.index.json",
            r#"{"metadata":{},"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}"#,
        );
    }

    fn open_err(dir: &Path) -> String {
        format!("{:#}", Checkpoint::open(dir).unwrap_err())
    }

    #[test]
    fn opens_a_sharded_checkpoint_and_counts_its_kv_bytes() {
        let dir = tempfile::tempdir().unwrap();
        good(dir.path());
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(checkpoint.architecture, "Qwen2ForCausalLM");
        assert_eq!(checkpoint.weight_files.len(), 2);
        assert_eq!(checkpoint.weight_bytes, 12);
        // 2 layers × 2 KV heads × (K + V) × head 8 × 4 bytes.
        assert_eq!(checkpoint.kv_bytes_per_row(4), 2 * 2 * 2 * 8 * 4);
    }

    #[test]
    fn names_the_file_of_each_bad_directory() {
        // (what, how the good directory is spoilt, what the error says)
        type Case<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);
        let cases: &[Case] = &[
            (
                "no tokenizer",
                &|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap(),
                "no tokenizer.json",
            ),
            (
                "unknown architecture",
                &|d| {
                    std::fs::write(
                        d.join("config.json"),
                        r#"{"architectures":["BertModel"],"num_hidden_layers":1,"num_attention_heads":1,"hidden_size":8}"#,
                    )
                    .unwrap()
                },
                "architecture \"BertModel\" is not a text model mistral.rs serves",
            ),
            (
                "truncated shard",
                &|d| {
                    let path = d.join("b.safetensors");
                    let bytes = std::fs::read(&path).unwrap();
                    std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
                },
                "b.safetensors: truncated",
            ),
            (
                "missing shard",
                &|d| std::fs::remove_file(d.join("b.safetensors")).unwrap(),
                "names b.safetensors, which is missing",
            ),
            (
                "tensor in the wrong shard",
                &|d| {
                    std::fs::write(
                        d.join("model.safetensors.index.json"),
                        r#"{"weight_map":{"x":"b.safetensors","y":"b.safetensors"}}"#,
                    )
                    .unwrap()
                },
                "the index puts x here",
            ),
            (
                "no chat template",
                &|d| {
                    std::fs::write(
                        d.join("tokenizer_config.json"),
                        r#"{"eos_token":"<|im_end|>"}"#,
                    )
                    .unwrap()
                },
                "no chat_template",
            ),
            (
                "end-of-sequence id past the vocabulary",
                &|d| {
                    std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id":7}"#)
                        .unwrap()
                },
                "eos_token_id 7 is not in the vocabulary",
            ),
            (
                "a template that does not compile",
                &|d| std::fs::write(d.join("chat_template.jinja"), "{% for %}").unwrap(),
                "chat template: syntax error",
            ),
            (
                "a template file that is a directory",
                &|d| std::fs::create_dir(d.join("chat_template.jinja")).unwrap(),
                "chat_template.jinja",
            ),
            (
                "no attention heads",
                &|d| {
                    std::fs::write(
                        d.join("config.json"),
                        r#"{"architectures":["Qwen2ForCausalLM"],"num_hidden_layers":2,"num_attention_heads":0,"hidden_size":32}"#,
                    )
                    .unwrap()
                },
                "num_attention_heads is 0",
            ),
            (
                "an end id that is no token id",
                &|d| {
                    std::fs::write(
                        d.join("generation_config.json"),
                        r#"{"eos_token_id":[3,-1]}"#,
                    )
                    .unwrap()
                },
                "eos_token_id -1 is not a token id",
            ),
            (
                "an end id past 32 bits",
                &|d| {
                    std::fs::write(
                        d.join("generation_config.json"),
                        r#"{"eos_token_id":4294967297}"#,
                    )
                    .unwrap()
                },
                "eos_token_id 4294967297 is not in the vocabulary",
            ),
            (
                "config not JSON",
                &|d| std::fs::write(d.join("config.json"), "{").unwrap(),
                "config.json: not JSON",
            ),
            (
                "no weights",
                &|d| {
                    for f in [
                        "a.safetensors",
                        "b.safetensors",
                        "model.safetensors.index.json",
                    ] {
                        std::fs::remove_file(d.join(f)).unwrap();
                    }
                },
                "no *.safetensors weights",
            ),
        ];
        for (what, spoil, message) in cases {
            let dir = tempfile::tempdir().unwrap();
            good(dir.path());
            spoil(dir.path());
            if *what == "unknown architecture" && cfg!(not(feature = "embedded")) {
                // A build without the embedded engine reads a checkpoint for
                // its text side alone, whatever runs its weights.
                assert!(Checkpoint::open(dir.path()).is_ok(), "{what}");
                continue;
            }
            let error = open_err(dir.path());
            assert!(error.contains(message), "{what}: {error}");
            assert!(!error.contains('\n'), "{what}: one line: {error}");
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(open_err(file.path()).contains("is not a directory"));
    }

    #[test]
    fn a_jinja_file_beside_the_config_is_the_template() {
        let dir = tempfile::tempdir().unwrap();
        good(dir.path());
        std::fs::write(dir.path().join("chat_template.jinja"), "JINJA").unwrap();
        let (template, _, eos) = chat_template_parts(dir.path()).unwrap();
        assert_eq!(template.as_deref(), Some("JINJA"));
        assert_eq!(eos.as_deref(), Some("<|im_end|>"));
    }

    #[cfg(feature = "embedded")]
    #[test]
    fn auto_quantization_is_q4k_to_mistral_rs() {
        assert_eq!(Isq::Auto.to_mistral(), Some(mistralrs::IsqType::Q4K));
        assert_eq!(Isq::None.to_mistral(), None);
    }
}
