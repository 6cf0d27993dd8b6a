//! Prefix reuse side by side (issue 13): the same multi-round Search-R1
//! rollout on one engine without a prefix cache and one with seeker's reuse,
//! alternating in one process; prompt tokens sent, tokens actually
//! prefilled, and wall time per rollout.
//!
//! The searches are forced by a scripted policy: a wrapper around the engine
//! opens `<search>` at the start of every round (it adds the tag to the
//! prompt the engine continues and to the text the rollout reads), so the
//! model writes a query each round. Everything else is seeker's rollout as
//! served: Search-R1's profile (`max_searches` = rounds − 1: the last round's
//! call is the round cap), the default BM25 index, Search-R1's splice,
//! greedy decoding.
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
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::text::PolicyText;
use seeker::engine::{Engine, EngineError, EngineEvent, Generation, GenerationParams};
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
    /// Questions, one per run (cycled): a run repeating an earlier run's
    /// rollout would reuse nothing, as every prompt of it is a prefix of a
    /// cached sequence and mistral.rs 0.8.1 does not reuse a match that
    /// covers the whole prompt.
    #[arg(long, num_args = 1.., default_values_t = [
        "Where does the Mekong River originate?".to_string(),
        "Who designed the Eiffel Tower?".to_string(),
        "When was the Taj Mahal built?".to_string(),
    ])]
    questions: Vec<String>,
    /// Rounds per rollout (each writes a search call; the last one's is the
    /// round cap).
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

/// Wraps an engine: opens `<search>` at the start of every round, and
/// counts every generation's tokens.
struct Counted {
    inner: Arc<MistralEngine>,
    calls: Arc<Mutex<Vec<Call>>>,
    started: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Engine for Counted {
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let open = !prompt.trim_end().ends_with("<search>");
        let prompt = if open {
            format!("{prompt}<search>")
        } else {
            prompt.to_string()
        };
        let mut inner = self.inner.generate(&prompt, params).await?;
        let (tx, rx) = mpsc::channel(64);
        if open {
            let tag = EngineEvent::Text {
                text: "<search>".into(),
                tokens: 0,
            };
            let _ = tx.send(Ok(tag)).await;
        }
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

/// `search-r1` with `max_searches` = `rounds` − 1.
fn profile_of(rounds: usize) -> anyhow::Result<Profile> {
    let text = std::fs::read_to_string("config/policies/search-r1.toml")?;
    anyhow::ensure!(
        text.contains("max_searches = 4"),
        "search-r1 no longer says max_searches = 4"
    );
    let text = text.replace(
        "max_searches = 4",
        &format!("max_searches = {}", rounds - 1),
    );
    let dir = std::env::temp_dir().join(format!("seeker-reuse-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("search-r1-bench.toml");
    std::fs::write(&path, text)?;
    Ok(Profile::load(&path)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds >= 2, "--rounds must be at least 2");
    let profile = Arc::new(profile_of(args.rounds)?);
    let index = Arc::new(Bm25Index::open(&args.index)?);
    let mut engines = Vec::new();
    for reuse in [false, true] {
        let engine = MistralEngine::load(&MistralConfig {
            gguf: args.gguf.clone(),
            checkpoint: None,
            isq: Default::default(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 1,
            weights: WeightFormat::Auto,
            prefix_cache: reuse,
            prefix_cache_mib: 2048,
            naive_prefix_cache: false,
            token_continuation: true,
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
            let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let ctx = RolloutContext {
                text: Arc::new(PolicyText::from_gguf(&args.gguf, engine.token_count())?),
                engine: Arc::new(Counted {
                    inner: Arc::clone(engine),
                    calls: Arc::clone(&calls),
                    started: Arc::clone(&started),
                }),
                search: Arc::new(search),
                profile: Arc::clone(&profile),
            };
            let request = RolloutRequest {
                messages: vec![
                    ChatTurn::new(
                        Role::User,
                        args.questions[run % args.questions.len()].clone(),
                    ),
                    ChatTurn::new(
                        Role::Assistant,
                        "<think>I need to search for this.</think>\n<search>",
                    ),
                ],
                max_tokens: args.round_tokens * args.rounds,
                temperature: None,
                top_p: None,
                continue_final_message: true,
                top_k: None,
                backend: None,
                stop: Vec::new(),
                client_tools: Default::default(),
            };
            let (tx, mut rx) = mpsc::channel(256);
            let started_at = Instant::now();
            let drain = async { while rx.recv().await.is_some() {} };
            let run_rollout = async {
                let r = rollout::run(&ctx, &request, &tx).await;
                drop(tx);
                r
            };
            let (outcome, ()) = tokio::join!(run_rollout, drain);
            let outcome = outcome?;
            let wall = started_at.elapsed().as_secs_f64();
            // Each engine call's count lands when its stream ends.
            while calls.lock().unwrap().len() < started.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let searches = outcome.searches;
            let assistant = outcome.transcript;
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
                "searches": searches,
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
            if run == 0 {
                println!(
                    "{}",
                    serde_json::json!({ "mode": mode, "transcript": assistant })
                );
            }
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
