//! Next-token log-probabilities of the embedded engine under two settings,
//! side by side: the figures behind the faithfulness notes in
//! `bench/README.md` and the prefix-reuse findings of issue 13.
//!
//! ```text
//! # The file as it is vs its exact F32 dequantization (writes STEM.f32.gguf,
//! # 7.1 GB for the default model, once), on tests/it/qwen.rs's two prompts:
//! cargo run --release --example logprob_probe -- weights
//! # mistral.rs's prefix cache on vs off (small model): a prompt that extends
//! # a finished sequence's computed rows, with and without another request
//! # sharing part of its prefix in between:
//! cargo run --release --example logprob_probe -- reuse
//! ```
//! Prints the top 5 `(token id, log-prob)` of each run and the largest
//! difference against the first.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};
use seeker::engine::mistral::{ActivationDtype, MistralConfig, MistralEngine};
use seeker::engine::prepare::WeightFormat;
use seeker::engine::{ChatTurn, Engine, EngineEvent, GenerationParams, Role};
use seeker::profile::Profile;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    probe: Probe,
}

#[derive(Subcommand)]
enum Probe {
    /// As-is weights vs the F32 copy, Search-R1 round-1 and round-2 prompts.
    Weights {
        #[arg(long, default_value = seeker::config::DEFAULT_GGUF)]
        gguf: PathBuf,
    },
    /// Prefix cache off vs on (and on, with a request in between).
    Reuse {
        #[arg(long, default_value = seeker::config::SMALL_GGUF)]
        gguf: PathBuf,
    },
}

/// A named run's top tokens: `(token id, natural-log probability)`.
type Run = (&'static str, Vec<(u32, f64)>);

async fn load(
    gguf: &Path,
    weights: WeightFormat,
    prefix_cache: bool,
) -> anyhow::Result<MistralEngine> {
    Ok(MistralEngine::load(&MistralConfig {
        gguf: gguf.to_path_buf(),
        dtype: ActivationDtype::F32,
        max_num_seqs: 1,
        weights,
        prefix_cache,
    })
    .await?)
}

/// Greedy text of at most `max_tokens` tokens after `prompt`.
async fn greedy(engine: &MistralEngine, prompt: &str, max_tokens: usize) -> anyhow::Result<String> {
    let params = GenerationParams {
        max_tokens,
        temperature: None,
        top_p: None,
        stop: Vec::new(),
        session: None,
    };
    let mut generation = engine.generate(prompt, &params).await?;
    let mut text = String::new();
    while let Some(event) = generation.events.recv().await {
        match event? {
            EngineEvent::Text { text: t, .. } => text.push_str(&t),
            EngineEvent::Done(_) => break,
            EngineEvent::Prompt { .. } => {}
        }
    }
    Ok(text)
}

/// Prints `runs` (name, top-5) and each run's largest difference from the
/// first run on the first run's top-5 tokens.
fn report(prompt: &str, runs: &[Run]) {
    println!("{prompt}:");
    let reference = &runs[0].1;
    for (name, top) in runs {
        let worst = reference
            .iter()
            .take(5)
            .filter_map(|(id, lp)| top.iter().find(|(i, _)| i == id).map(|t| (t.1 - lp).abs()))
            .fold(0.0, f64::max);
        let shown: Vec<String> = top
            .iter()
            .take(5)
            .map(|(id, lp)| format!("({id}, {lp:.4})"))
            .collect();
        println!("  {name:<24} max diff {worst:.4}  {}", shown.join(" "));
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().probe {
        Probe::Weights { gguf } => {
            let profile = Profile::load("config/policies/search-r1.toml".as_ref())?;
            let instruction = profile.user_message("Where does the Mekong River originate?");
            let splice = std::fs::read_to_string("tests/fixtures/splices/search-r1.two-docs.txt")?;
            let mut results: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
            for (name, weights) in [("as is", WeightFormat::AsIs), ("f32", WeightFormat::F32)] {
                let engine = load(&gguf, weights, false).await?;
                let round1 = engine
                    .render_chat(&[ChatTurn {
                        role: Role::User,
                        content: instruction.clone(),
                    }])
                    .await?;
                let round2 = format!(
                    "{round1}<think>\nI need to find where the Mekong starts.\n</think>\n<search> Mekong River origin </search>{splice}"
                );
                for (i, prompt) in [round1, round2].iter().enumerate() {
                    results[i].push((name, engine.next_token_logprobs(prompt, 10).await?));
                }
            }
            report("round 1", &results[0]);
            report("round 2", &results[1]);
        }
        Probe::Reuse { gguf } => {
            let base = format!(
                "<|im_start|>user\n{} Tell me about",
                "The history of the Roman Empire spans many centuries and includes emperors, wars, roads, laws and reforms. ".repeat(20)
            );
            let a = format!(
                "{base} Augustus and his reign in detail.<|im_end|>\n<|im_start|>assistant\n"
            );
            let b = format!("{base} the fall of Constantinople and Byzantium.<|im_end|>\n<|im_start|>assistant\n");
            let plain = load(&gguf, WeightFormat::AsIs, false).await?;
            let text = greedy(&plain, &a, 24).await?;
            // Half of A's text: every row a reuse takes was computed (no
            // sampled-but-never-run last token).
            let half: String = text.chars().take(text.chars().count() / 2).collect();
            let a2 = format!("{a}{half}");
            let timed = |name: &'static str, engine: MistralEngine| {
                let a2 = a2.clone();
                async move {
                    let started = Instant::now();
                    let top = engine.next_token_logprobs(&a2, 10).await?;
                    println!("{name}: {:.2} s", started.elapsed().as_secs_f64());
                    anyhow::Ok((name, top))
                }
            };
            let full = timed("no cache (full prefill)", plain).await?;
            let cached = load(&gguf, WeightFormat::AsIs, true).await?;
            greedy(&cached, &a, 24).await?;
            let reuse = timed("cache: A, then A2", cached).await?;
            let cached = load(&gguf, WeightFormat::AsIs, true).await?;
            greedy(&cached, &a, 24).await?;
            greedy(&cached, &b, 24).await?;
            let between = timed("cache: A, B, then A2", cached).await?;
            report("A2", &[full, reuse, between]);
        }
    }
    Ok(())
}
