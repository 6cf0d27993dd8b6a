//! Where a 2-round rollout's wall time goes: engine prefill, engine decode,
//! search, and seeker's own overhead (prompt building, scanning, splicing,
//! channels), on the real model and the default index.
//!
//! The rollout is Search-R1's: the assistant turn is continued from
//! `<think>…</think>\n<search>` so the model writes the query and closes the
//! tag (round 1), the documents are spliced, and the model continues (round 2).
//! Prefill of a round = from the engine call to its first token (the prompt,
//! or the splice when the prefix cache reuses the rest); decode = first token
//! to the end of the round; search = from the search call to its splice.
//!
//! ```text
//! cargo run --release --example rollout_bench -- --runs 3 [--weights q8_0] [--prefix-cache]
//! ```
//! Prints one JSON object per run and the median of each part.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Parser;
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::text::PolicyText;
use seeker::engine::{Engine, EngineError, EngineEvent, Generation, GenerationParams};
use seeker::profile::Profile;
use seeker::rollout::{self, RolloutContext, RolloutEvent, RolloutRequest};
use seeker::search::bm25::{Bm25Backend, Bm25Index};
use seeker::search::dispatch::{DispatchConfig, Dispatcher};
use tokio::sync::mpsc;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    gguf: PathBuf,
    #[arg(long, default_value = seeker::config::DEFAULT_INDEX)]
    index: PathBuf,
    #[arg(long, default_value = "config/policies/search-r1.toml")]
    profile: PathBuf,
    #[arg(long, default_value = "Who painted the Mona Lisa?")]
    question: String,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// as_is, auto, q8_0 or f32.
    #[arg(long, default_value = "as_is")]
    weights: String,
    #[arg(long)]
    prefix_cache: bool,
}

/// Per engine call: seconds to the first token, and from it to the end.
#[derive(Clone, Copy, Debug, Default)]
struct Call {
    prefill: f64,
    decode: f64,
    tokens: usize,
}

/// Wraps an engine and times every generation.
struct Timed {
    inner: Arc<MistralEngine>,
    calls: Arc<Mutex<Vec<Call>>>,
}

#[async_trait]
impl Engine for Timed {
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let started = Instant::now();
        let mut inner = self.inner.generate(prompt, params).await?;
        let (tx, rx) = mpsc::channel(64);
        let calls = Arc::clone(&self.calls);
        tokio::spawn(async move {
            let mut first: Option<Instant> = None;
            let mut tokens = 0;
            let record = |first: Option<Instant>, tokens: usize| {
                let end = Instant::now();
                let first = first.unwrap_or(end);
                calls.lock().unwrap().push(Call {
                    prefill: (first - started).as_secs_f64(),
                    decode: (end - first).as_secs_f64(),
                    tokens,
                });
            };
            // The round ends at the engine's Done (recorded before the rollout
            // sees it), or when the rollout drops it after its closing tag.
            loop {
                let event = tokio::select! {
                    event = inner.events.recv() => event,
                    () = tx.closed() => None,
                };
                let Some(event) = event else {
                    record(first, tokens);
                    break;
                };
                if let Ok(EngineEvent::Text { tokens: n, .. }) = &event {
                    first.get_or_insert_with(Instant::now);
                    tokens += n;
                }
                if matches!(event, Ok(EngineEvent::Done(_))) {
                    record(first, tokens);
                    let _ = tx.send(event).await;
                    break;
                }
                if tx.send(event).await.is_err() {
                    record(first, tokens);
                    break;
                }
            }
        });
        Ok(Generation {
            prompt_tokens: inner.prompt_tokens,
            events: rx,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let weights = match args.weights.as_str() {
        "q8_0" => WeightFormat::Q8_0,
        "as_is" => WeightFormat::AsIs,
        "f32" => WeightFormat::F32,
        "auto" => WeightFormat::Auto,
        other => anyhow::bail!("--weights {other}: expected as_is, auto, q8_0 or f32"),
    };
    let engine = Arc::new(
        MistralEngine::load(&MistralConfig {
            gguf: args.gguf.clone(),
            checkpoint: None,
            isq: Default::default(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 1,
            weights,
            prefix_cache: args.prefix_cache,
            prefix_cache_mib: 2048,
            naive_prefix_cache: false,
            token_continuation: true,
        })
        .await?,
    );
    let index = Arc::new(Bm25Index::open(&args.index)?);
    let mut rows = Vec::new();
    for run in 0..args.runs {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut search = Dispatcher::new(DispatchConfig {
            cache_ttl: Duration::ZERO,
            ..DispatchConfig::default()
        });
        search.add(
            "tantivy",
            Arc::new(Bm25Backend::new(Arc::clone(&index))),
            Default::default(),
        );
        let ctx = RolloutContext {
            text: Arc::new(PolicyText::from_gguf(&args.gguf, engine.token_count())?),
            engine: Arc::new(Timed {
                inner: Arc::clone(&engine),
                calls: Arc::clone(&calls),
            }),
            search: Arc::new(search),
            profile: Arc::new(Profile::load(&args.profile)?),
        };
        let request = RolloutRequest {
            messages: vec![
                ChatTurn::new(Role::User, args.question.clone()),
                ChatTurn::new(
                    Role::Assistant,
                    "<think>I need to find who painted it.</think>\n<search>",
                ),
            ],
            max_tokens: args.max_tokens,
            temperature: None,
            top_p: None,
            continue_final_message: true,
            top_k: None,
            backend: None,
            stop: Vec::new(),
            client_tools: Default::default(),
        };
        let (tx, mut rx) = mpsc::channel(256);
        let started = Instant::now();
        let collect = async {
            let mut search_s = 0.0;
            let mut search_started = None;
            while let Some(event) = rx.recv().await {
                match event {
                    RolloutEvent::Search { .. } => search_started = Some(Instant::now()),
                    RolloutEvent::Splice(_) => {
                        if let Some(s) = search_started.take() {
                            search_s += s.elapsed().as_secs_f64();
                        }
                    }
                    _ => {}
                }
            }
            search_s
        };
        let run_rollout = async {
            let r = rollout::run(&ctx, &request, &tx).await;
            drop(tx);
            r
        };
        let (outcome, search_s) = tokio::join!(run_rollout, collect);
        let outcome = outcome?;
        let wall = started.elapsed().as_secs_f64();
        let calls = calls.lock().unwrap().clone();
        let prefill: f64 = calls.iter().map(|c| c.prefill).sum();
        let decode: f64 = calls.iter().map(|c| c.decode).sum();
        let row = serde_json::json!({
            "run": run,
            "rounds": calls.len(),
            "searches": outcome.searches,
            "prompt_tokens": outcome.usage.prompt_tokens,
            "generated_tokens": outcome.usage.completion_tokens,
            "per_round": calls.iter().map(|c| serde_json::json!({
                "prefill_s": c.prefill, "decode_s": c.decode, "tokens": c.tokens,
            })).collect::<Vec<_>>(),
            "wall_s": wall,
            "prefill_s": prefill,
            "decode_s": decode,
            "search_s": search_s,
            "overhead_s": wall - prefill - decode - search_s,
        });
        println!("{row}");
        if run == 0 {
            println!("{}", serde_json::json!({"transcript": outcome.transcript}));
        }
        rows.push(row);
    }
    let part = |k: &str| median(rows.iter().map(|r| r[k].as_f64().unwrap()).collect());
    println!(
        "{}",
        serde_json::json!({
            "median": {
                "wall_s": part("wall_s"),
                "prefill_s": part("prefill_s"),
                "decode_s": part("decode_s"),
                "search_s": part("search_s"),
                "overhead_s": part("overhead_s"),
                "prompt_tokens": part("prompt_tokens"),
                "generated_tokens": part("generated_tokens"),
            }
        })
    );
    Ok(())
}
