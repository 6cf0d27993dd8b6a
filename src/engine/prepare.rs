//! `seeker model prepare`: rewrites a GGUF into the weight format the
//! embedded engine runs fastest on this CPU.
//!
//! candle 0.10 (mistral.rs 0.8.1's tensor library) has SIMD dot products for
//! Q8_0, Q4_0 and the K-quants but not for Q4_1 (the small SmolLM2 GGUF's
//! format), Q5_0, Q5_1 or Q8_1: those take its scalar path. Re-quantizing
//! them to Q8_0 keeps the model's values to within Q8_0's rounding (1/127 of
//! each 32-weight block's largest magnitude, on top of the source's own
//! error) and runs on the AVX2 kernel; an F32 copy runs dense matmuls.
//! Measured (`bench/README.md`): on SmolLM2-135M Q4_1 the F32 copy is the
//! fastest; on the default Qwen2.5-Coder-1.5B Q4_K_M the file as it is beats
//! its Q8_0 copy (half the prefill speed) and its 7 GB F32 copy (a quarter
//! of the decode speed). [`resolve`] picks accordingly. Q4_K is not offered:
//! it needs rows that are multiples of 256 and SmolLM2's are 576.
//!
//! The rewrite uses candle's own GGUF reader and writer: every metadata key
//! (tokenizer, chat template, hyper-parameters) is copied unchanged, and
//! tensors that are not quantized (norms in F32) or already in the target
//! format are copied as they are.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use crate::config::WeightFormat;

/// Largest F32 copy [`WeightFormat::Auto`] writes: 2 GiB (about 500M
/// parameters). Dense F32 wins on the small 135M model (`bench/README.md`);
/// decode on a CPU is bound by memory bandwidth, and the 1.5B default model's
/// 7 GB F32 copy decodes at a quarter of its Q4_K speed.
pub const AUTO_F32_LIMIT_BYTES: u64 = 2 << 30;

/// What a rewrite did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrepareReport {
    pub tensors: usize,
    /// Tensors re-quantized.
    pub converted: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub millis: u64,
}

/// Where the prepared copy of `gguf` in `format` lives: next to it, as
/// `STEM.q8_0.gguf` or `STEM.f32.gguf`. `None` for [`WeightFormat::AsIs`]
/// and [`WeightFormat::Auto`] (resolve it first with [`resolve`]).
pub fn prepared_path(gguf: &Path, format: WeightFormat) -> Option<PathBuf> {
    let suffix = format.suffix()?;
    let stem = gguf.file_stem()?.to_string_lossy();
    Some(gguf.with_file_name(format!("{stem}.{suffix}.gguf")))
}

/// Whether `dtype` is a quantized format without a SIMD kernel in candle 0.10.
fn needs_conversion(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    )
}

/// The header of `gguf` (metadata and tensor table, not the weights), and
/// the reader positioned after it (for the tensors).
///
/// # Errors
/// `gguf` cannot be opened, or is not a GGUF file (both name the file).
pub(crate) fn read_header(gguf: &Path) -> anyhow::Result<(gguf_file::Content, BufReader<File>)> {
    let mut reader =
        BufReader::new(File::open(gguf).map_err(|e| anyhow::anyhow!("{}: {e}", gguf.display()))?);
    let content = gguf_file::Content::read(&mut reader)
        .map_err(|e| anyhow::anyhow!("{}: not a GGUF file: {e}", gguf.display()))?;
    Ok((content, reader))
}

/// Reads the header of `gguf` (metadata and tensor table, not the weights):
/// a quick check that the file is a GGUF model at all, made before the server
/// listens so that a wrong file fails at once instead of after startup.
///
/// # Errors
/// `gguf` cannot be read, or is not a GGUF file; or it names no
/// `general.architecture`.
pub fn check_gguf(gguf: &Path) -> anyhow::Result<()> {
    let content = read_header(gguf)?.0;
    anyhow::ensure!(
        content.metadata.contains_key("general.architecture"),
        "{}: a GGUF file without general.architecture is not a model",
        gguf.display()
    );
    Ok(())
}

/// The control tokens of the tokenizer inside `gguf`: the entries of
/// `tokenizer.ggml.tokens` whose `tokenizer.ggml.token_type` is 3 (CONTROL,
/// in the GGUF specification's numbering: 1 normal, 2 unknown, 3 control,
/// 4 user-defined, 5 unused, 6 byte). These are what a tokenizer reads as
/// special tokens wherever they appear in text (`<|im_start|>`,
/// `<|im_end|>`, `<|endoftext|>` for ChatML models).
///
/// # Errors
/// `gguf` is not a readable GGUF. A GGUF without token types gives none.
pub fn special_tokens(gguf: &Path) -> anyhow::Result<Vec<String>> {
    let content = read_header(gguf)?.0;
    let (Some(tokens), Some(types)) = (
        content.metadata.get("tokenizer.ggml.tokens"),
        content.metadata.get("tokenizer.ggml.token_type"),
    ) else {
        return Ok(Vec::new());
    };
    let (Ok(tokens), Ok(types)) = (tokens.to_vec(), types.to_vec()) else {
        return Ok(Vec::new());
    };
    let mut special: Vec<String> = tokens
        .iter()
        .zip(types)
        .filter(|(_, kind)| kind.to_i32().ok() == Some(3))
        .filter_map(|(token, _)| token.to_string().ok().cloned())
        .filter(|token| !token.is_empty())
        .collect();
    special.sort();
    special.dedup();
    Ok(special)
}

/// What a chat template needs from a GGUF's metadata: the template source
/// (`tokenizer.chat_template`) and the BOS and EOS token strings
/// (`tokenizer.ggml.bos_token_id` / `eos_token_id` looked up in
/// `tokenizer.ggml.tokens`), each `None` when absent.
///
/// # Errors
/// `gguf` is not a readable GGUF.
pub fn chat_template_parts(
    gguf: &Path,
) -> anyhow::Result<(Option<String>, Option<String>, Option<String>)> {
    let content = read_header(gguf)?.0;
    let meta = &content.metadata;
    let template = meta
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok().cloned());
    let tokens = meta
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.to_vec().ok());
    let token = |key: &str| -> Option<String> {
        let id = meta.get(key)?.to_u32().ok()? as usize;
        tokens?.get(id)?.to_string().ok().cloned()
    };
    Ok((
        template,
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    ))
}

/// [`WeightFormat::Auto`] made concrete for `gguf` (other formats unchanged):
/// F32 if every weight in F32 fits in [`AUTO_F32_LIMIT_BYTES`]; else Q8_0 if
/// some weight is in a format candle has no SIMD kernel for (Q4_1, Q5_0,
/// Q5_1, Q8_1); else the file as it is. Each step is the measured winner on
/// this CPU (`bench/README.md`): F32 on SmolLM2-135M Q4_1; on
/// Qwen2.5-Coder-1.5B Q4_K_M (Q4_K/Q6_K, which have kernels) the file as it
/// is beats both its Q8_0 copy and its 7 GB F32 copy.
///
/// # Errors
/// `gguf` is not a readable GGUF.
pub fn resolve(gguf: &Path, format: WeightFormat) -> anyhow::Result<WeightFormat> {
    if format != WeightFormat::Auto {
        return Ok(format);
    }
    let content = read_header(gguf)?.0;
    let f32_bytes: u64 = content
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count() as u64 * 4)
        .sum();
    let kernel_less = content
        .tensor_infos
        .values()
        .any(|t| needs_conversion(t.ggml_dtype));
    Ok(if f32_bytes <= AUTO_F32_LIMIT_BYTES {
        WeightFormat::F32
    } else if kernel_less {
        WeightFormat::Q8_0
    } else {
        WeightFormat::AsIs
    })
}

/// Rewrites `src` into `dst` in `format`: [`WeightFormat::Q8_0`] re-quantizes
/// every quantized weight not in Q8_0 whose rows are whole Q8_0 blocks (32
/// values); [`WeightFormat::F32`] dequantizes every quantized weight (the
/// same values candle computes with `CANDLE_DEQUANTIZE_ALL=1`). Writes to a
/// temporary file (`DST.partial-PID`, removed again on error) and renames
/// it, so a crash never leaves a half-written `dst`; [`ensure_prepared`]
/// sweeps the temporary files of processes that died.
///
/// # Errors
/// `src` is not a readable GGUF, or `dst` cannot be written; `format` is
/// [`WeightFormat::AsIs`].
pub fn prepare(src: &Path, dst: &Path, format: WeightFormat) -> anyhow::Result<PrepareReport> {
    let format = resolve(src, format)?;
    anyhow::ensure!(format != WeightFormat::AsIs, "nothing to prepare for as_is");
    let started = Instant::now();
    let (content, mut reader) = read_header(src)?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut converted = 0;
    for name in names {
        let tensor = content.tensor(&mut reader, name, &Device::Cpu)?;
        let row = tensor.shape().dims().last().copied().unwrap_or(0);
        let quantized = !matches!(
            tensor.dtype(),
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16
        );
        let tensor = match format {
            WeightFormat::Q8_0
                if quantized
                    && tensor.dtype() != GgmlDType::Q8_0
                    && row % GgmlDType::Q8_0.block_size() == 0 =>
            {
                converted += 1;
                QTensor::quantize(&tensor.dequantize(&Device::Cpu)?, GgmlDType::Q8_0)?
            }
            WeightFormat::F32 if quantized => {
                converted += 1;
                QTensor::quantize(&tensor.dequantize(&Device::Cpu)?, GgmlDType::F32)?
            }
            _ => tensor,
        };
        tensors.push((name.clone(), tensor));
    }
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    let metadata: Vec<(&str, &gguf_file::Value)> = keys
        .into_iter()
        .map(|k| (k.as_str(), &content.metadata[k]))
        .collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    // Unique per writer: two processes preparing the same file never share it.
    let tmp = partial_path(dst, std::process::id());
    let written = (|| -> anyhow::Result<()> {
        let mut out = BufWriter::new(
            File::create(&tmp).map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?,
        );
        gguf_file::write(&mut out, &metadata, &tensor_refs)?;
        std::io::Write::flush(&mut out)?;
        std::fs::rename(&tmp, dst)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(PrepareReport {
        tensors: tensors.len(),
        converted,
        bytes_in: std::fs::metadata(src)?.len(),
        bytes_out: std::fs::metadata(dst)?.len(),
        millis: started.elapsed().as_millis() as u64,
    })
}

/// The temporary file a process with id `pid` writes `dst` to.
fn partial_path(dst: &Path, pid: u32) -> PathBuf {
    let mut name = dst.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{pid}"));
    dst.with_file_name(name)
}

/// Removes this process's unfinished copy of `gguf` prepared as `format`, if
/// any: a server stopped by a signal while it prepares the weights calls this
/// before it exits (the preparing thread cannot be interrupted; a file it
/// still writes to is unlinked and its rename then fails).
pub fn discard_own_partial(gguf: &Path, format: WeightFormat) {
    let dst = resolve(gguf, format)
        .ok()
        .and_then(|format| prepared_path(gguf, format));
    if let Some(dst) = dst {
        let tmp = partial_path(&dst, std::process::id());
        if std::fs::remove_file(&tmp).is_ok() {
            tracing::info!(file = %tmp.display(), "removed the unfinished weight copy");
        }
    }
}

/// Removes the temporary files of `dst` left by processes that no longer run
/// (a server stopped by a signal or killed while it prepared the weights);
/// returns how many. Only where `/proc` tells which processes run (Linux);
/// elsewhere nothing is removed.
pub fn sweep_partials(dst: &Path) -> usize {
    let (Some(dir), Some(name)) = (dst.parent(), dst.file_name()) else {
        return 0;
    };
    crate::tempfiles::remove_stale(dir, &format!("{}.partial-", name.to_string_lossy()))
}

/// The file to load for `gguf` in `format`: `gguf` itself for as-is, else its
/// prepared copy, written first when it is missing or older than `gguf`.
///
/// # Errors
/// As [`prepare`].
pub fn ensure_prepared(gguf: &Path, format: WeightFormat) -> anyhow::Result<PathBuf> {
    let format = resolve(gguf, format)?;
    let Some(dst) = prepared_path(gguf, format) else {
        return Ok(gguf.to_path_buf());
    };
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = match (modified(&dst), modified(gguf)) {
        (Some(prepared), Some(source)) => prepared >= source,
        _ => false,
    };
    if !fresh {
        sweep_partials(&dst);
        let report = prepare(gguf, &dst, format)?;
        tracing::info!(
            source = %gguf.display(),
            prepared = %dst.display(),
            converted = report.converted,
            tensors = report.tensors,
            millis = report.millis,
            format = ?format,
            "weights prepared (once; see `seeker model prepare`)"
        );
    }
    Ok(dst)
}
