//! Measures the embedded engine's prefill and decode speed on a realistic
//! search prompt, and prints the greedy continuation so it can be compared with
//! llama.cpp on the same text (`bench/llama_cpp_bench.py`).
//!
//! The prompt: the Search-R1 instruction for `--question` through the model's chat
//! template, then an `<information>` splice of the top `--docs` documents from the
//! index, as `search-r1-prefetch` builds it. It is written to `--prompt-out`.
//!
//! ```text
//! cargo run --example engine_bench -- --docs 8 --max-tokens 64 --runs 3
//! ```
//! Output: one JSON object per run: prompt_tokens, prefill_s (time to first token),
//! prefill_tok_s, decode_tokens, decode_tok_s, load_s (the model's load: weights
//! read, prepared or quantized, warm-up run) and rss_mib_after_load (resident
//! memory then, MiB), then the generated text. `--checkpoint DIR --isq q4k` loads
//! a Hugging Face checkpoint instead of the GGUF.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::{Engine, EngineEvent, GenerationParams};
use seeker::profile::{Profile, QueryOutcome};
use seeker::search::bm25::Bm25Index;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    gguf: PathBuf,
    /// A Hugging Face checkpoint directory to load instead of `--gguf`.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// In-situ quantization of `--checkpoint` (`auto`, `none`, `q4k`, `q8_0`, …).
    #[arg(long, default_value = "auto")]
    isq: seeker::config::Isq,
    #[arg(long, default_value = seeker::config::DEFAULT_INDEX)]
    index: PathBuf,
    #[arg(long, default_value = "config/policies/search-r1-prefetch.toml")]
    profile: PathBuf,
    #[arg(long, default_value = "Who painted the Mona Lisa?")]
    question: String,
    /// Documents spliced into the prompt (8 gives about 1,000 prompt tokens).
    #[arg(long, default_value_t = 8)]
    docs: usize,
    /// Instead of `--docs`: splice the fewest top documents that make the
    /// prompt at least this many tokens (for the prefill curve of
    /// `bench/prefill.sh`; the index must return enough documents).
    #[arg(long)]
    prompt_tokens: Option<usize>,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value = "target/engine_bench_prompt.txt")]
    prompt_out: PathBuf,
    /// Weight format: as_is, auto, q8_0 or f32 (a prepared copy next to the GGUF).
    #[arg(long, default_value = "as_is")]
    weights: String,
    /// Turn on mistral.rs's prefix cache (runs after the first reuse the prompt).
    #[arg(long)]
    prefix_cache: bool,
    /// A `perf record --control fifo:PATH -D -1` control FIFO: the bench writes
    /// `enable` and `disable` around `--perf-phase` of every run, so the
    /// profile holds that phase alone (not loading, not the other phase).
    #[arg(long)]
    perf_ctl: Option<PathBuf>,
    /// The phase `--perf-ctl` records: `prefill` (request to first token) or
    /// `decode` (first token to the end).
    #[arg(long, value_enum, default_value_t = Phase::Decode)]
    perf_phase: Phase,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Phase {
    Prefill,
    Decode,
}

/// Sends `perf record` a control command (`enable`/`disable`) when asked to.
struct PerfControl(Option<std::fs::File>);

impl PerfControl {
    /// Opens `path` for writing. A FIFO's open waits for its reader, so a
    /// FIFO that `perf record` does not read is refused after 10 s.
    fn open(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self(None));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let owned = path.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::OpenOptions::new().write(true).open(owned));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(Ok(file)) => Ok(Self(Some(file))),
            Ok(Err(e)) => anyhow::bail!("--perf-ctl {}: {e}", path.display()),
            Err(_) => anyhow::bail!(
                "--perf-ctl {}: nothing reads it after 10 s (run under \
                 `perf record -D -1 --control fifo:{}`)",
                path.display(),
                path.display()
            ),
        }
    }

    fn command(&mut self, command: &str) -> anyhow::Result<()> {
        use std::io::Write;
        if let Some(fifo) = &mut self.0 {
            fifo.write_all(format!("{command}\n").as_bytes())?;
            fifo.flush()?;
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    // As `seeker serve` runs the engine (candle's thread pool settings), set
    // before any thread starts.
    seeker::engine::set_cpu_defaults();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let dtype = match args.dtype.as_str() {
        "f32" => ActivationDtype::F32,
        "f16" => ActivationDtype::F16,
        "bf16" => ActivationDtype::Bf16,
        _ => ActivationDtype::Auto,
    };
    let loading = Instant::now();
    let engine = MistralEngine::load(&MistralConfig {
        gguf: args.gguf.clone(),
        checkpoint: args.checkpoint.clone(),
        isq: args.isq,
        dtype,
        max_num_seqs: 1,
        weights: match args.weights.as_str() {
            "q8_0" => WeightFormat::Q8_0,
            "as_is" => WeightFormat::AsIs,
            "f32" => WeightFormat::F32,
            "auto" => WeightFormat::Auto,
            other => anyhow::bail!("--weights {other}: expected as_is, auto, q8_0 or f32"),
        },
        prefix_cache: args.prefix_cache,
        prefix_cache_mib: 2048,
        naive_prefix_cache: false,
        token_continuation: true,
    })
    .await?;
    // Load time (weights read, quantized, warm-up run) and resident memory.
    let rss_kib: Option<u64> = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        });
    let (load_s, rss_mib) = (loading.elapsed().as_secs_f64(), rss_kib.map(|k| k / 1024));
    let profile = Arc::new(Profile::load(&args.profile)?);
    let index = Bm25Index::open(&args.index)?;
    let head = engine
        .render_chat(&[ChatTurn::new(
            Role::User,
            profile.user_message(&args.question),
        )])
        .await?;
    let with_docs = |docs: &[seeker::search::Document]| {
        let mut prompt = head.clone();
        prompt.push_str(
            &profile.render_splice(&[(args.question.as_str(), QueryOutcome::Documents(docs))]),
        );
        prompt
    };
    let prompt = match args.prompt_tokens {
        None => with_docs(&index.search(&args.question, args.docs)?),
        Some(target) => {
            // Whole documents, so the prompt is a real splice: the fewest
            // top documents that reach `target` tokens (more documents, more
            // tokens, so a binary search).
            let pool = index.search(&args.question, 1_000)?;
            let tokens = |n: usize| {
                let prompt = with_docs(&pool[..n]);
                let engine = &engine;
                async move { anyhow::Ok((engine.tokenize(&prompt).await?.len(), prompt)) }
            };
            let (all, _) = tokens(pool.len()).await?;
            anyhow::ensure!(
                all >= target,
                "--prompt-tokens {target}: the {} documents the index returns make {all} prompt tokens",
                pool.len()
            );
            let (mut lo, mut hi) = (0, pool.len());
            while lo + 1 < hi {
                let mid = (lo + hi) / 2;
                if tokens(mid).await?.0 >= target {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            tokens(hi).await?.1
        }
    };
    std::fs::write(&args.prompt_out, &prompt)?;
    let ids = engine.tokenize(&prompt).await?;
    std::fs::write(
        args.prompt_out.with_extension("ids.json"),
        serde_json::to_string(&ids)?,
    )?;

    let params = GenerationParams {
        max_tokens: args.max_tokens,
        temperature: None,
        top_p: None,
        stop: Vec::new(),
        session: None,
    };
    let phase = args.perf_phase;
    let mut perf = PerfControl::open(args.perf_ctl.as_deref())?;
    for run in 0..args.runs {
        let started = Instant::now();
        if phase == Phase::Prefill {
            perf.command("enable")?;
        }
        let mut generation = engine.generate(&prompt, &params).await?;
        let mut first = None;
        let mut tokens = 0;
        let mut text = String::new();
        while let Some(event) = generation.events.recv().await {
            match event? {
                EngineEvent::Text { text: t, tokens: n } => {
                    if first.is_none() {
                        first = Some(Instant::now());
                        perf.command(if phase == Phase::Prefill {
                            "disable"
                        } else {
                            "enable"
                        })?;
                    }
                    tokens += n;
                    text.push_str(&t);
                }
                EngineEvent::Done(_) => break,
                EngineEvent::Prompt { .. } => {}
            }
        }
        let end = Instant::now();
        if phase == Phase::Decode {
            perf.command("disable")?;
        }
        let ttft = first.map_or(0.0, |f| (f - started).as_secs_f64());
        let decode_s = first.map_or(0.0, |f| (end - f).as_secs_f64());
        println!(
            "{}",
            serde_json::json!({
                "run": run,
                "prompt_tokens": generation.prompt_tokens,
                "prefill_s": ttft,
                "prefill_tok_s": generation.prompt_tokens as f64 / ttft,
                "decode_tokens": tokens.saturating_sub(1),
                "decode_tok_s": tokens.saturating_sub(1) as f64 / decode_s,
                "load_s": load_s,
                "rss_mib_after_load": rss_mib,
            })
        );
        if run == 0 {
            println!("{}", serde_json::json!({ "text": text }));
        }
    }
    Ok(())
}
