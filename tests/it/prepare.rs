//! `seeker model prepare` on the default model: the rewritten GGUF keeps every
//! metadata key and tensor, converts what it says it converts, and keeps the
//! weights' values (exactly for F32; within Q8_0 rounding for Q8_0).

use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::Device;
use seeker::config::WeightFormat;
use seeker::engine::prepare::prepare;

use crate::common::default_data;

fn read(path: &std::path::Path) -> (gguf_file::Content, BufReader<File>) {
    let mut reader = BufReader::new(File::open(path).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    (content, reader)
}

#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn prepared_weights_keep_the_model() {
    let src = default_data("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = tempfile::tempdir().unwrap();
    for format in [WeightFormat::Q8_0, WeightFormat::F32] {
        let dst = dir.path().join(format!("{format:?}.gguf"));
        let report = prepare(&src, &dst, format).unwrap();
        let (a, mut ra) = read(&src);
        let (b, mut rb) = read(&dst);
        assert_eq!(a.metadata.len(), b.metadata.len());
        for (key, value) in &a.metadata {
            assert_eq!(
                format!("{value:?}"),
                format!("{:?}", b.metadata[key]),
                "{key}"
            );
        }
        assert_eq!(report.tensors, a.tensor_infos.len());
        assert!(report.converted > 100, "{report:?}");
        let mut converted = 0;
        for name in a.tensor_infos.keys() {
            let ta = a.tensor(&mut ra, name, &Device::Cpu).unwrap();
            let tb = b.tensor(&mut rb, name, &Device::Cpu).unwrap();
            assert_eq!(ta.shape(), tb.shape(), "{name}");
            if ta.dtype() != tb.dtype() {
                converted += 1;
                let want = if format == WeightFormat::F32 {
                    GgmlDType::F32
                } else {
                    GgmlDType::Q8_0
                };
                assert_eq!(tb.dtype(), want, "{name}");
            }
            let va: Vec<f32> = ta
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let vb: Vec<f32> = tb
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            match format {
                WeightFormat::F32 => assert!(va == vb, "{name}: F32 must be exact"),
                _ => {
                    // Q8_0: each 32-value block rounds to half a step of 1/127 of its
                    // largest magnitude (the step itself stored as f16).
                    for (block_a, block_b) in va.chunks(32).zip(vb.chunks(32)) {
                        let max = block_a.iter().fold(0f32, |m, x| m.max(x.abs()));
                        for (x, y) in block_a.iter().zip(block_b) {
                            assert!(
                                (x - y).abs() <= max / 127.0 * 0.6 + 1e-6,
                                "{name}: {x} vs {y}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(converted, report.converted, "{format:?}");
    }
}

/// A weight copy left half-written by a process that died (killed while it
/// prepared the weights) is removed; one a running process still writes
/// (here: this test's own id) is kept, and so are unrelated files.
#[test]
fn unfinished_copies_of_dead_processes_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("model.f32.gguf");
    // Above any pid_max Linux allows (2^22): no process has this id.
    let dead = dir.path().join("model.f32.gguf.partial-999999999");
    let alive = dir
        .path()
        .join(format!("model.f32.gguf.partial-{}", std::process::id()));
    let other = dir.path().join("other.f32.gguf.partial-999999999");
    for file in [&dead, &alive, &other] {
        std::fs::write(file, b"GGUF").unwrap();
    }
    assert_eq!(seeker::engine::prepare::sweep_partials(&dst), 1);
    assert!(!dead.exists());
    assert!(alive.exists());
    assert!(other.exists());
}

/// The default GGUF's control tokens are read from its tokenizer metadata:
/// the ChatML markers the template writes, and not ordinary text.
#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn the_default_models_control_tokens_are_found() {
    let gguf = default_data("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let special = seeker::engine::prepare::special_tokens(&gguf).unwrap();
    for token in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        assert!(special.iter().any(|s| s == token), "{token} in {special:?}");
    }
    assert!(special.len() < 100, "{special:?}");
    assert!(!special.iter().any(|s| s == "the" || s == "Paris"));
}
