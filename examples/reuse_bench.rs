//! Prefix reuse side by side (issue 13): the same multi-round Search-R1
//! rollout on one engine without a prefix cache and one with seeker's reuse,
//! alternating in one process; prompt tokens sent, tokens actually
//! prefilled, and wall time per rollout.
//!
//! The searches are forced by the policy: a copy of `search-r1` whose splice
//! ends by opening the next `<search>` (and `max_searches` = rounds − 1), so
//! every round writes a query, and the assistant turn starts inside
//! `<search>`. Everything else is seeker's rollout as served: the default
//! BM25 index, Search-R1's splice, greedy decoding.
//!
//! ```text
//! cargo run --release --example reuse_bench -- [--gguf GGUF] [--rounds 4] [--runs 2]
//! ```
//! Prints one JSON object per rollout, then the medians of both modes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Parser;
use seeker::engine::mistral::{ActivationDtype, MistralConfig, MistralEngine};
use seeker::engine::prepare::WeightFormat;
use seeker::engine::{
    ChatTurn, Engine, EngineError, EngineEvent, Generation, GenerationParams, Role,
};
use seeker::profile::Profile;
use seeker::rollout::{self, RolloutContext, RolloutRequest};
use seeker::search::bm25::{Bm25Backend, Bm25Index};
use seeker::search::dispatch::{DispatchConfig, Dispatcher};
use tokio::sync::mpsc;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = seeker::config::DEFAULT_GGUF)]
    gguf: PathBuf,
    #[arg(long, default_value = seeker::config::DEFAULT_INDEX)]
    index: PathBuf,
    #[arg(long, default_value = "Where does the Mekong River originate?")]
    question: String,
    /// Rounds per rollout (searches = rounds − 1, then the round cap).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Rollouts per mode.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// Tokens each round may write.
    #[arg(long, default_value_t = 64)]
    round_tokens: usize,
}

/// Per engine call: prompt tokens, those reused, generated tokens.
#[derive(Clone, Copy, Debug, Default)]
struct Call {
    prompt: usize,
    reused: usize,
    generated: usize,
}

/// Wraps an engine and counts every generation's tokens.
struct Counted {
    inner: Arc<MistralEngine>,
    calls: Arc<Mutex<Vec<Call>>>,
}

#[async_trait]
impl Engine for Counted {
    fn special_tokens(&self) -> &[String] {
        self.inner.special_tokens()
    }

    async fn render_chat(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        self.inner.render_chat(messages).await
    }

    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        self.inner.count_tokens(text).await
    }

    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let mut inner = self.inner.generate(prompt, params).await?;
        let (tx, rx) = mpsc::channel(64);
        let calls = Arc::clone(&self.calls);
        let mut call = Call {
            prompt: inner.prompt_tokens,
            ..Call::default()
        };
        tokio::spawn(async move {
            while let Some(event) = inner.events.recv().await {
                match &event {
                    Ok(EngineEvent::Prompt { tokens, cached }) => {
                        call.prompt = *tokens;
                        call.reused = cached.unwrap_or(0);
                    }
                    Ok(EngineEvent::Text { tokens, .. }) => call.generated += tokens,
                    _ => {}
                }
                let done = matches!(event, Ok(EngineEvent::Done(_)));
                if tx.send(event).await.is_err() || done {
                    break;
                }
            }
            calls.lock().unwrap().push(call);
        });
        Ok(Generation {
            prompt_tokens: call.prompt,
            events: rx,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `search-r1` with every splice opening the next search call.
fn forcing_profile(rounds: usize) -> anyhow::Result<Profile> {
    let text = std::fs::read_to_string("config/policies/search-r1.toml")?;
    let block = r#"block = "\n\n<information>{docs}</information>\n\n""#;
    anyhow::ensure!(text.contains(block), "search-r1's splice block changed");
    let text = text
        .replace(
            block,
            r#"block = "\n\n<information>{docs}</information>\n\n<search>""#,
        )
        .replace(
            "max_searches = 4",
            &format!("max_searches = {}", rounds - 1),
        );
    let dir = std::env::temp_dir().join(format!("seeker-reuse-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("search-r1-forced.toml");
    std::fs::write(&path, text)?;
    Ok(Profile::load(&path)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds >= 2, "--rounds must be at least 2");
    let profile = Arc::new(forcing_profile(args.rounds)?);
    let index = Arc::new(Bm25Index::open(&args.index)?);
    let mut engines = Vec::new();
    for reuse in [false, true] {
        let engine = MistralEngine::load(&MistralConfig {
            gguf: args.gguf.clone(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 1,
            weights: WeightFormat::Auto,
            prefix_cache: reuse,
            prefix_cache_mib: 2048,
            naive_prefix_cache: false,
        })
        .await?;
        engines.push((if reuse { "reuse" } else { "no reuse" }, Arc::new(engine)));
    }
    let mut rows: Vec<(&str, serde_json::Value)> = Vec::new();
    for run in 0..args.runs {
        for (mode, engine) in &engines {
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
                engine: Arc::new(Counted {
                    inner: Arc::clone(engine),
                    calls: Arc::clone(&calls),
                }),
                search: Arc::new(search),
                profile: Arc::clone(&profile),
            };
            let request = RolloutRequest {
                messages: vec![
                    ChatTurn {
                        role: Role::User,
                        content: args.question.clone(),
                    },
                    ChatTurn {
                        role: Role::Assistant,
                        content: "<think>I need to search for this.</think>\n<search>".into(),
                    },
                ],
                max_tokens: args.round_tokens * args.rounds,
                temperature: None,
                top_p: None,
                continue_final_message: true,
                top_k: None,
                backend: None,
                stop: Vec::new(),
            };
            let (tx, mut rx) = mpsc::channel(256);
            let started = Instant::now();
            let drain = async { while rx.recv().await.is_some() {} };
            let run_rollout = async {
                let r = rollout::run(&ctx, &request, &tx).await;
                drop(tx);
                r
            };
            let (outcome, ()) = tokio::join!(run_rollout, drain);
            let outcome = outcome?;
            let wall = started.elapsed().as_secs_f64();
            let calls = calls.lock().unwrap().clone();
            let sent: usize = calls.iter().map(|c| c.prompt).sum();
            let reused: usize = calls.iter().map(|c| c.reused).sum();
            let generated: usize = calls.iter().map(|c| c.generated).sum();
            // Prompt, splices and generated text: the last round's prompt
            // plus what it wrote.
            let needed = calls.last().map_or(0, |c| c.prompt + c.generated);
            let row = serde_json::json!({
                "run": run,
                "mode": mode,
                "rounds": calls.len(),
                "searches": outcome.searches,
                "prompt_tokens_sent": sent,
                "prompt_tokens_reused": reused,
                "prefilled": sent - reused,
                "generated": generated,
                "transcript_tokens": needed,
                "prefilled_per_transcript_token": (sent - reused) as f64 / needed.max(1) as f64,
                "wall_s": wall,
                "per_round": calls.iter().map(|c| serde_json::json!({
                    "prompt": c.prompt, "reused": c.reused, "generated": c.generated,
                })).collect::<Vec<_>>(),
            });
            println!("{row}");
            rows.push((mode, row));
        }
    }
    let mut summary = serde_json::Map::new();
    for (mode, _) in &engines {
        let part = |k: &str| {
            median(
                rows.iter()
                    .filter(|(m, _)| m == mode)
                    .map(|(_, r)| r[k].as_f64().unwrap())
                    .collect(),
            )
        };
        summary.insert(
            mode.to_string(),
            serde_json::json!({
                "rounds": part("rounds"),
                "prefilled": part("prefilled"),
                "transcript_tokens": part("transcript_tokens"),
                "prefilled_per_transcript_token": part("prefilled_per_transcript_token"),
                "wall_s": part("wall_s"),
            }),
        );
    }
    println!("{}", serde_json::json!({ "median": summary }));
    Ok(())
}
