//! A Hugging Face checkpoint directory served by the embedded engine
//! (`model.checkpoint`, `seeker serve --model DIR`), on a real checkpoint
//! made here: `scripts/hf-from-gguf.sh` converts the default GGUF
//! (Qwen2.5-Coder-1.5B, the Qwen2 architecture of Search-R1's checkpoints)
//! into F16 safetensors shards with an index, `config.json`,
//! `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`
//! (converted once into `target/hf/`, kept between runs).
//!
//! - The conversion checked by comparison with the GGUF path: the rendered
//!   prompt, the token ids of every profile's prompt and golden splices, the
//!   end-of-sequence ids and sentinels, the next-token log-probabilities.
//! - The real binary serves the directory quantized in memory (ISQ `q4k`,
//!   the default) and a Search-R1 rollout searches and answers.
//! - Bad directories stop `seeker serve` before it listens, with one line.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::common::{default_data, get_json, post_json, root};
use crate::e2e::{seeker_bin, shared_index, start_default_model, wait_healthy};
use crate::qwen::{golden_prompts, round2_prompt, top5_gap};
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::Isq;
use seeker::config::WeightFormat;
use seeker::engine::checkpoint::Checkpoint;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::vocab::Vocab;
use seeker::profile::Profile;

/// Largest difference allowed between the next-token log-probabilities
/// (natural log, each of the GGUF path's top 5) of the GGUF path and of the
/// converted checkpoint served without quantization. The GGUF path runs
/// Q4_K/Q6_K weights with activations quantized to Q8_K; the checkpoint the
/// same weights dequantized (rounded to F16) in dense F32 matmuls: measured,
/// seeker on the GGUF vs on its exact F32 dequantization up to 0.13 on its
/// top 5 (the `qwen` module's tolerance notes), and here (F16-rounded) the
/// figure printed by the test. A wrong tensor name, transposition, RoPE
/// permutation or config value moves log-probs by whole nats.
const LOGPROB_TOLERANCE: f64 = 0.3;

/// The converted default model: made by `scripts/hf-from-gguf.sh` on first
/// use, behind a lock so that tests in parallel processes convert once.
pub(crate) fn qwen_checkpoint() -> PathBuf {
    let gguf = default_data(seeker::config::DEFAULT_GGUF);
    let dir = root().join("target/hf/qwen2.5-coder-1.5b-instruct-f16");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(dir.with_extension("lock")).unwrap();
    fs4::fs_std::FileExt::lock_exclusive(&lock).unwrap();
    if !dir.join("config.json").is_file() {
        let status = Command::new(root().join("scripts/hf-from-gguf.sh"))
            .arg(&gguf)
            .arg(&dir)
            .current_dir(root())
            .status()
            .unwrap();
        assert!(status.success(), "scripts/hf-from-gguf.sh failed");
    }
    dir
}

fn config(gguf: PathBuf, checkpoint: Option<PathBuf>, isq: Isq) -> MistralConfig {
    MistralConfig {
        gguf,
        checkpoint,
        isq,
        dtype: ActivationDtype::F32,
        max_num_seqs: 1,
        weights: WeightFormat::AsIs,
        prefix_cache: false,
        prefix_cache_mib: 2048,
        naive_prefix_cache: false,
        token_continuation: true,
    }
}

/// The conversion against the GGUF it came from, both through the embedded
/// engine: the checkpoint is sharded as published checkpoints are, renders
/// the same Search-R1 prompt, tokenizes every profile's prompt and golden
/// splices to the same ids, ends sequences on the same ids, and predicts
/// the same next tokens (within [`LOGPROB_TOLERANCE`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_converted_checkpoint_renders_tokenizes_and_predicts_as_its_gguf() {
    let gguf = default_data(seeker::config::DEFAULT_GGUF);
    let dir = qwen_checkpoint();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    assert_eq!(checkpoint.architecture, "Qwen2ForCausalLM");
    assert!(
        checkpoint.weight_files.len() > 1,
        "sharded, with an index: {:?}",
        checkpoint.weight_files
    );
    assert_eq!(
        checkpoint.kv_bytes_per_row(4),
        seeker::engine::vocab::kv_bytes_per_row(&gguf, 4).unwrap()
    );

    // What prefix reuse reads: the end-of-sequence ids and the sentinels.
    // The GGUF ends on `<|im_end|>` (its EOS id, which the template writes);
    // the checkpoint also on `<|endoftext|>`, which its generation_config.json
    // lists (as Qwen2.5's own does) and mistral.rs stops on.
    let (from_gguf, from_dir) = (
        Vocab::from_gguf(&gguf).unwrap(),
        Vocab::from_checkpoint(&checkpoint).unwrap(),
    );
    let sorted = |v: &Vocab| {
        let mut eos = v.eos.clone();
        eos.sort();
        eos
    };
    assert_eq!(sorted(&from_gguf), [151645]);
    assert_eq!(sorted(&from_dir), [151643, 151645]);
    let template = seeker::engine::checkpoint::chat_template_parts(&dir)
        .unwrap()
        .0
        .unwrap();
    assert_eq!(
        from_dir.sentinels(&template, &[]),
        from_gguf.sentinels(&template, &[])
    );

    let reference = MistralEngine::load(&config(gguf.clone(), None, Isq::None))
        .await
        .unwrap();
    let engine = MistralEngine::load(&config(gguf, Some(dir.clone()), Isq::None))
        .await
        .unwrap();

    // 1. Search-R1's prompt, through mistral.rs's template (read from the
    //    directory) and seeker's own.
    let question = "Where does the Mekong River originate?";
    let search_r1 = Profile::load(&root().join("config/policies/search-r1.toml")).unwrap();
    let turns = [ChatTurn::new(Role::User, search_r1.user_message(question))];
    let prompt = reference.render_chat(&turns).await.unwrap();
    assert_eq!(engine.render_chat(&turns).await.unwrap(), prompt);
    let ours = seeker::engine::chat_template::ChatTemplate::from_checkpoint(&dir).unwrap();
    assert_eq!(ours.render(&turns).unwrap(), prompt);

    // 2. Every profile's prompt (tool profiles with their functions in the
    //    template) renders the same; token ids of those prompts, of them with
    //    their golden splices, and of text that trips pre-tokenizers.
    let mut texts = golden_prompts(&engine, question).await;
    assert_eq!(
        texts,
        golden_prompts(&reference, question).await,
        "every profile's prompt renders as from the GGUF"
    );
    texts.extend(
        [
            "It has a land area of 7,688,287 km2 (2,968,464 sq mi).",
            "木星 (Jupiter) 🪐 — naïve café, İstanbul; don't you'll I'M",
            "  two  spaces,\ttab,\n\n\nthree newlines\r\n and trailing   ",
            "<think>\nx\n</think>\n<search> q </search><|im_end|>\n<|endoftext|>",
            "<tool_call>\n{\"name\": \"search\"}\n</tool_call><|fim_prefix|>",
        ]
        .map(String::from),
    );
    assert!(texts.len() >= 20, "{} texts", texts.len());
    for text in &texts {
        assert_eq!(
            engine.tokenize(text).await.unwrap(),
            reference.tokenize(text).await.unwrap(),
            "token ids of {text:?}"
        );
    }

    // 3. Next-token log-probabilities: the round-1 prompt and a round-2
    //    prompt (a search call and Search-R1's splice).
    let round2 = round2_prompt(&prompt);
    let mut worst: f64 = 0.0;
    for text in [&prompt, &round2] {
        let theirs = reference.next_token_logprobs(text, 10).await.unwrap();
        let ours = engine.next_token_logprobs(text, 10).await.unwrap();
        assert_eq!(
            ours[0].0, theirs[0].0,
            "greedy token:\n{ours:?}\n{theirs:?}"
        );
        worst = worst.max(top5_gap(&ours, &theirs, "the GGUF's"));
    }
    eprintln!("largest top-5 next-token log-prob difference, checkpoint vs GGUF: {worst:.4}");
    assert!(
        worst <= LOGPROB_TOLERANCE,
        "log-probs differ by {worst} (> {LOGPROB_TOLERANCE})"
    );
}

/// `seeker serve --model DIR` on the converted checkpoint, quantized in
/// memory to Q4K (`model.isq = "auto"`): Search-R1 writes its own search
/// call, seeker splices the documents, round 2 continues from the prefix
/// cache (the sentinels and end ids read from the directory), and the model
/// answers.
///
/// The question is one the Q4K model searches for. The web UI's default
/// (the `qwen` module's) it answers from memory ("1632"), where the GGUF and
/// ISQ Q8_0 search: the converted weights already carry the GGUF's Q4_K
/// error, and quantizing them to Q4K a second time (candle's quantizer, not
/// llama.cpp's) moves near-ties (bench/README.md, "Serving a Hugging Face
/// checkpoint").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_served_with_isq_searches_and_answers() {
    let dir = qwen_checkpoint();
    let server = start_default_model(shared_index(), &[], &["--model", dir.to_str().unwrap()]);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    // Served under the directory's name (`--model` sets the id).
    let models: Value = get_json(&client, &format!("{}/v1/models", server.base)).await;
    assert_eq!(
        models["data"][0]["id"], "qwen2.5-coder-1.5b-instruct-f16",
        "{models}"
    );
    let body = json!({
        "model": "default",
        "policy": "search-r1",
        "max_tokens": 320,
        "return_transcript": true,
        "messages": [{"role": "user", "content": "What is the population of Hong Kong?"}],
    });
    let answer: Value = post_json(
        &client,
        &format!("{}/v1/chat/completions", server.base),
        &body,
    )
    .await;
    let seeker_info = &answer["seeker"];
    assert!(seeker_info["searches"].as_u64().unwrap() >= 1, "{answer}");
    let rounds = seeker_info["rounds"].as_array().unwrap();
    assert_eq!(rounds[0]["outcome"], "search", "{answer}");
    let transcript = seeker_info["transcript"].as_str().unwrap();
    assert!(
        transcript.contains("</search>\n\n<information>Doc 1(Title: \""),
        "{transcript}"
    );
    assert!(
        rounds[1]["prompt_tokens_cached"].as_u64().unwrap() > 0,
        "round 2 reads round 1 from the prefix cache: {answer}"
    );
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
}

/// A copy of the converted checkpoint's small files, with the weights
/// linked (not copied), to spoil one way.
fn spoilable(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::os::unix::fs::symlink(&path, &target).unwrap();
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Bad directories stop `seeker serve --model DIR` before it listens, with
/// one line naming the file and no panic: a missing tokenizer, an
/// architecture mistral.rs does not serve, a truncated shard, a shard the
/// index names that is missing.
#[test]
fn bad_checkpoints_fail_at_startup_with_one_line() {
    let good = qwen_checkpoint();
    let tmp = tempfile::tempdir().unwrap();
    let shard = Checkpoint::open(&good).unwrap().weight_files[1].clone();
    let shard_name = shard.file_name().unwrap().to_owned();
    // A two-document index of its own: CI fetches the corpus without building
    // data/wiki/index, and the search setup is checked before the model.
    let index = crate::e2e::small_index(
        tmp.path(),
        &[
            ("Taj Mahal", "The Taj Mahal is in Agra."),
            ("Mona Lisa", "Leonardo painted the Mona Lisa."),
        ],
    );
    // (directory name, how the good copy is spoilt, what the error says)
    type Case<'a> = (&'a str, Box<dyn Fn(&Path) + 'a>, &'a str);
    let cases: [Case; 4] = [
        (
            "no-tokenizer",
            Box::new(|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap()),
            "no tokenizer.json",
        ),
        (
            "bert",
            Box::new(|d| {
                let path = d.join("config.json");
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(path, text.replace("Qwen2ForCausalLM", "BertForMaskedLM")).unwrap()
            }),
            "architecture \"BertForMaskedLM\" is not a text model mistral.rs serves",
        ),
        (
            "truncated",
            Box::new(|d| {
                // A real shard cut short (a download that stopped).
                let target = d.join(&shard_name);
                std::fs::remove_file(&target).unwrap();
                let mut bytes = vec![0u8; 0];
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(std::fs::File::open(&shard).unwrap(), 1 << 20),
                    &mut bytes,
                )
                .unwrap();
                std::fs::write(target, bytes).unwrap();
            }),
            "truncated",
        ),
        (
            "missing-shard",
            Box::new(|d| std::fs::remove_file(d.join(&shard_name)).unwrap()),
            "which is missing",
        ),
    ];
    for (name, spoil, message) in cases {
        let dir = tmp.path().join(name);
        spoilable(&good, &dir);
        spoil(&dir);
        let out = Command::new(seeker_bin())
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
            .arg(&dir)
            .current_dir(root())
            .env("SEEKER_SEARCH__INDEX", &index)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {stdout}{stderr}");
        assert!(!stdout.contains("listening"), "{name}: {stdout}");
        let line = stderr.lines().last().unwrap_or_default();
        assert!(line.starts_with("seeker: "), "{name}: {stderr}");
        assert!(line.contains(message), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    }
    // And a path that is neither a file nor a directory.
    let out = Command::new(seeker_bin())
        .args(["serve", "--model", "no/such/model"])
        .current_dir(root())
        .env("SEEKER_SEARCH__INDEX", &index)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--model no/such/model: no such file or directory"),
        "{stderr}"
    );
}
