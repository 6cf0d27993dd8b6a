//! The embedded model's vocabulary as prefix reuse needs it, read from the
//! GGUF (or a Hugging Face checkpoint's `tokenizer.json`,
//! [`Vocab::from_checkpoint`]): each token's bytes in the generated text, the end-of-sequence ids
//! mistral.rs stops on, and two control tokens no prompt of seeker's uses
//! (the sentinels of [`super::reuse`]).
//!
//! Facts mirrored from mistral.rs 0.8.1 (`gguf/gguf_tokenizer.rs`,
//! `pipeline/chat_template.rs`, `sequence.rs`), each checked against the
//! engine by `tests/it/reuse.rs`:
//! - Every token whose GGUF type is not 1 (normal) becomes a special token,
//!   and special tokens add no bytes to the text that stop strings are
//!   searched in (`completion_bytes`).
//! - A normal token's bytes: byte-level BPE (`tokenizer.ggml.model = gpt2`,
//!   Qwen, SmolLM2) writes byte `b` as the character GPT-2's `bytes_to_unicode`
//!   gives it; SentencePiece (`llama`) writes a space as `▁`.
//! - The ids that end a sequence: the GGUF's `tokenizer.ggml.eos_token_id`,
//!   plus each of `<|im_end|>`, `<end_of_turn>`, `<|end_of_text|>`, `<|end|>`,
//!   `<|eot_id|>`, `<|message|>`, `<|start|>`, `<|channel|>` that is in the
//!   vocabulary and written in the chat template.

use std::collections::HashMap;
use std::path::Path;

/// GGUF token type of a normal token (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
/// GGUF token type of a control token.
const CONTROL: i32 = 3;

/// mistral.rs 0.8.1's extra end-of-sequence tokens
/// (`SUPPORTED_ALTERNATE_EOS`), used when the vocabulary has them and the
/// chat template writes them.
const ALTERNATE_EOS: &[&str] = &[
    "<|im_end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<|end|>",
    "<|eot_id|>",
    "<|message|>",
    "<|start|>",
    "<|channel|>",
];

/// See the module documentation.
#[derive(Debug)]
pub struct Vocab {
    /// Bytes each token adds to the generated text (empty for special
    /// tokens), indexed by token id.
    pieces: Vec<Vec<u8>>,
    /// Token id of each token's text as written in the GGUF.
    ids: HashMap<String, u32>,
    /// Token id of each normal token's bytes.
    by_bytes: HashMap<Vec<u8>, u32>,
    /// The ids mistral.rs ends a sequence on.
    pub eos: Vec<u32>,
    /// Control tokens, by id.
    control: Vec<(u32, String)>,
}

impl Vocab {
    /// Reads the vocabulary of `gguf`.
    ///
    /// # Errors
    /// `gguf` is not a readable GGUF; it has no token list; or its tokenizer
    /// model is neither `gpt2` nor `llama` (no byte mapping known).
    pub fn from_gguf(gguf: &Path) -> anyhow::Result<Self> {
        let content = super::prepare::read_header(gguf)?.0;
        let meta = &content.metadata;
        let strings = |key: &str| -> anyhow::Result<Vec<String>> {
            let values = meta
                .get(key)
                .ok_or_else(|| anyhow::anyhow!("{}: no {key}", gguf.display()))?
                .to_vec()?;
            Ok(values
                .iter()
                .map(|v| v.to_string().cloned().unwrap_or_default())
                .collect())
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<i32> = match meta.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32().unwrap_or(NORMAL))
                .collect(),
            None => vec![NORMAL; tokens.len()],
        };
        let model = meta
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        let decode: fn(&str) -> Vec<u8> = match model.as_str() {
            "gpt2" => byte_level_bytes,
            "llama" => sentencepiece_bytes,
            other => anyhow::bail!(
                "{}: tokenizer model {other:?} (prefix reuse knows gpt2 and llama)",
                gguf.display()
            ),
        };
        let pieces: Vec<Vec<u8>> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&NORMAL)))
            .map(|(t, &kind)| {
                if kind == NORMAL {
                    decode(t)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut by_bytes = HashMap::new();
        for (i, piece) in pieces.iter().enumerate() {
            if !piece.is_empty() {
                by_bytes.entry(piece.clone()).or_insert(i as u32);
            }
        }
        let control = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, &kind))| kind == CONTROL)
            .map(|(i, (t, _))| (i as u32, t.clone()))
            .collect();
        let template = meta
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        let mut eos: Vec<u32> = meta
            .get("tokenizer.ggml.eos_token_id")
            .and_then(|v| v.to_u32().ok())
            .into_iter()
            .collect();
        add_alternate_eos(&mut eos, &ids, &template);
        Ok(Self {
            pieces,
            ids,
            by_bytes,
            eos,
            control,
        })
    }

    /// Reads the vocabulary of Hugging Face checkpoint `checkpoint`, as
    /// mistral.rs 0.8.1's plain loader runs it: `tokenizer.json`'s BPE
    /// `model.vocab` and its `added_tokens` (those marked `special` add no
    /// bytes and are the control tokens; the others add their text), the
    /// bytes of a normal token by the `decoder` (`ByteLevel`: GPT-2's byte
    /// table, Qwen and Llama 3; a `Replace` of `▁`: SentencePiece, Llama 2
    /// and Mistral). End-of-sequence ids as mistral.rs's
    /// `calculate_eos_tokens` gathers them: `tokenizer_config.json`'s
    /// `eos_token`, the alternates its chat template writes, and
    /// `generation_config.json`'s `eos_token_id` (an id or a list).
    ///
    /// # Errors
    /// Unreadable or malformed files; a model that is not BPE; a decoder of
    /// neither kind.
    pub fn from_checkpoint(checkpoint: &super::checkpoint::Checkpoint) -> anyhow::Result<Self> {
        let path = checkpoint.tokenizer_json();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", path.display()))?;
        let vocab = json["model"]["vocab"].as_object().ok_or_else(|| {
            anyhow::anyhow!(
                "{}: model {:?} has no token-to-id vocab (prefix reuse knows BPE)",
                path.display(),
                json["model"]["type"]
            )
        })?;
        let decoder = &json["decoder"];
        let kinds: Vec<&serde_json::Value> = match decoder["type"].as_str() {
            Some("Sequence") => decoder["decoders"]
                .as_array()
                .into_iter()
                .flatten()
                .collect(),
            _ => vec![decoder],
        };
        let byte_level = kinds.iter().any(|d| d["type"] == "ByteLevel");
        let sentencepiece = kinds
            .iter()
            .any(|d| d["type"] == "Replace" && d["pattern"]["String"] == "\u{2581}");
        let decode: fn(&str) -> Vec<u8> = match (byte_level, sentencepiece) {
            (true, _) => byte_level_bytes,
            (false, true) => sentencepiece_bytes,
            _ => anyhow::bail!(
                "{}: decoder {:?} (prefix reuse knows ByteLevel and SentencePiece's \u{2581})",
                path.display(),
                decoder["type"]
            ),
        };
        let mut texts: Vec<(u32, String, Option<bool>)> = vocab
            .iter()
            .filter_map(|(t, id)| Some((id.as_u64()? as u32, t.clone(), None)))
            .collect();
        for added in json["added_tokens"].as_array().into_iter().flatten() {
            let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str())
            else {
                continue;
            };
            let special = added["special"] == true;
            texts.retain(|(i, _, _)| *i != id as u32);
            texts.push((id as u32, content.to_string(), Some(special)));
        }
        let size = texts
            .iter()
            .map(|(id, _, _)| *id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut pieces = vec![Vec::new(); size];
        let mut ids = HashMap::new();
        let mut control = Vec::new();
        for (id, text, added) in &texts {
            pieces[*id as usize] = match added {
                None => decode(text),
                Some(false) => text.as_bytes().to_vec(),
                Some(true) => {
                    control.push((*id, text.clone()));
                    Vec::new()
                }
            };
            ids.insert(text.clone(), *id);
        }
        control.sort();
        let mut by_bytes = HashMap::new();
        for (i, piece) in pieces.iter().enumerate() {
            if !piece.is_empty() {
                by_bytes.entry(piece.clone()).or_insert(i as u32);
            }
        }
        let (template, _, eos_token) = super::checkpoint::chat_template_parts(&checkpoint.dir)?;
        let template = template.unwrap_or_default();
        let mut eos: Vec<u32> = eos_token
            .and_then(|t| ids.get(&t).copied())
            .into_iter()
            .collect();
        add_alternate_eos(&mut eos, &ids, &template);
        if let Some(generation) = checkpoint.generation_config() {
            let text = std::fs::read_to_string(&generation)
                .map_err(|e| anyhow::anyhow!("{}: {e}", generation.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", generation.display()))?;
            for id in super::checkpoint::ids_of(&json["eos_token_id"]) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        Ok(Self {
            pieces,
            ids,
            by_bytes,
            eos,
            control,
        })
    }

    /// A vocabulary of `tokens` (`(text, special)`; a normal token's bytes
    /// are its text) ending sequences on `eos`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(tokens: &[(&str, bool)], eos: &[u32]) -> Self {
        let pieces: Vec<Vec<u8>> = tokens
            .iter()
            .map(|(t, special)| {
                if *special {
                    Vec::new()
                } else {
                    t.as_bytes().to_vec()
                }
            })
            .collect();
        Self {
            by_bytes: pieces
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.is_empty())
                .map(|(i, p)| (p.clone(), i as u32))
                .collect(),
            pieces,
            ids: tokens
                .iter()
                .enumerate()
                .map(|(i, (t, _))| (t.to_string(), i as u32))
                .collect(),
            eos: eos.to_vec(),
            control: tokens
                .iter()
                .enumerate()
                .filter(|(_, (_, special))| *special)
                .map(|(i, (t, _))| (i as u32, t.to_string()))
                .collect(),
        }
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The bytes token `id` adds to the generated text (empty for special
    /// tokens and unknown ids).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The single token that `text` is, if one is: a special token written
    /// out, or a normal token with exactly these bytes.
    pub fn token_of(&self, text: &str) -> Option<u32> {
        self.ids
            .get(text)
            .copied()
            .filter(|&id| self.piece(id).is_empty())
            .or_else(|| self.by_bytes.get(text.as_bytes()).copied())
    }

    /// Two control tokens to mark the end of cached sequences: the last two
    /// by id that are no end-of-sequence id and that neither the chat
    /// template nor any of `avoid` writes (`None` when the vocabulary has
    /// fewer). Returned as `(stop, mark)`.
    pub fn sentinels(
        &self,
        template: &str,
        avoid: &[String],
    ) -> Option<((u32, String), (u32, String))> {
        let mut free = self.control.iter().rev().filter(|(id, text)| {
            !self.eos.contains(id)
                && !template.contains(text.as_str())
                && !avoid.iter().any(|a| a.contains(text.as_str()))
        });
        let stop = free.next()?.clone();
        let mark = free.next()?.clone();
        Some((stop, mark))
    }
}

/// Adds to `eos` each of [`ALTERNATE_EOS`] that is in the vocabulary (`ids`)
/// and written in `template`, as mistral.rs 0.8.1 does for GGUF and
/// checkpoint models alike (`calculate_eos_tokens`).
fn add_alternate_eos(eos: &mut Vec<u32>, ids: &HashMap<String, u32>, template: &str) {
    for alternate in ALTERNATE_EOS {
        if let Some(&id) = ids.get(*alternate) {
            if template.contains(alternate) && !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
}

/// KV-cache bytes one token of context takes in the model of `gguf`, all
/// layers, K and V, at `dtype_bytes` per element: `block_count ×
/// head_count_kv × (key_length + value_length) × dtype_bytes` from the GGUF's
/// `{arch}.*` keys (a head's length defaults to `embedding_length /
/// head_count`). Qwen2.5-1.5B in F32: 28 × 2 × 256 × 4 = 57,344 bytes.
///
/// # Errors
/// `gguf` is not a readable GGUF, or lacks those keys.
pub fn kv_bytes_per_row(gguf: &Path, dtype_bytes: usize) -> anyhow::Result<usize> {
    let content = super::prepare::read_header(gguf)?.0;
    let meta = &content.metadata;
    let arch = meta
        .get("general.architecture")
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| anyhow::anyhow!("{}: no general.architecture", gguf.display()))?;
    let number = |key: &str| -> Option<usize> {
        meta.get(&format!("{arch}.{key}"))
            .and_then(|v| {
                v.to_u32()
                    .ok()
                    .or_else(|| v.to_u64().ok().map(|n| n as u32))
            })
            .map(|n| n as usize)
    };
    let missing = |key: &str| anyhow::anyhow!("{}: no {arch}.{key}", gguf.display());
    let layers = number("block_count").ok_or_else(|| missing("block_count"))?;
    let heads = number("attention.head_count").ok_or_else(|| missing("attention.head_count"))?;
    let kv_heads = number("attention.head_count_kv").unwrap_or(heads);
    let head =
        number("embedding_length").ok_or_else(|| missing("embedding_length"))? / heads.max(1);
    let k = number("attention.key_length").unwrap_or(head);
    let v = number("attention.value_length").unwrap_or(head);
    Ok(layers * kv_heads * (k + v) * dtype_bytes)
}

/// GPT-2's byte-to-character table inverted: the byte each character of a
/// byte-level BPE token stands for. Printable bytes (`!`..`~`, `¡`..`¬`,
/// `®`..`ÿ`) stand for themselves; the other 68 bytes, in order, are written
/// as the characters from U+0100 on (OpenAI GPT-2 `encoder.py`,
/// `bytes_to_unicode`).
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let code = c as u32;
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    // The 68 others, in byte order, from U+0100.
    static OTHERS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let others = OTHERS.get_or_init(|| {
        (0u32..0x100)
            .filter(|&b| !printable(b))
            .map(|b| b as u8)
            .collect()
    });
    others.get((code - 0x100) as usize).copied()
}

/// A byte-level BPE token's bytes; a character outside the table is kept as
/// its UTF-8 bytes.
fn byte_level_bytes(token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match byte_of_char(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// A SentencePiece token's bytes: `▁` is a space; `<0xAB>` is byte 0xAB.
fn sentencepiece_bytes(token: &str) -> Vec<u8> {
    if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    token.replace('\u{2581}', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_characters_map_back_to_their_bytes() {
        // GPT-2 writes a space as Ġ (U+0120), a newline as Ċ (U+010A).
        assert_eq!(byte_level_bytes("Ġthe"), b" the");
        assert_eq!(byte_level_bytes("ĊĊ"), b"\n\n");
        assert_eq!(byte_level_bytes("</search>"), b"</search>");
        // é is two bytes, 0xC3 0xA9, written Ã and ©.
        assert_eq!(byte_level_bytes("Ã©"), "é".as_bytes());
        // Every byte has exactly one character.
        let mut seen = std::collections::HashSet::new();
        for code in 0x21u32..0x200 {
            if let Some(b) = char::from_u32(code).and_then(byte_of_char) {
                assert!(seen.insert(b), "byte {b} mapped twice");
            }
        }
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn sentinels_are_spare_control_tokens() {
        let vocab = Vocab::for_tests(
            &[
                ("a", false),
                ("<|end|>", true),
                ("<|x|>", true),
                ("<|y|>", true),
                ("<|z|>", true),
            ],
            &[1],
        );
        // The last two control tokens that are no end and that the template
        // and the stop strings do not write.
        let template = "{{ '<|z|>' }}";
        let (stop, mark) = vocab.sentinels(template, &[]).unwrap();
        assert_eq!((stop.0, mark.0), (3, 2));
        assert!(vocab.sentinels(template, &["<|y|>".into()]).is_none());
        assert_eq!(vocab.token_of("<|x|>"), Some(2));
        assert_eq!(vocab.token_of("a"), Some(0));
        assert_eq!(vocab.token_of("ab"), None);
    }

    #[test]
    fn sentencepiece_spaces_and_byte_tokens() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
    }
}
