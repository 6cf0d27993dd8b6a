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
//! # Issue 13's bug case (round 2's splice starts with the token the model
//! # wrote after `</search>`): no cache vs mistral.rs's cache as it is vs
//! # seeker's reuse (small model, F32 weights by default):
//! cargo run --release --example logprob_probe -- splice [--gguf G] [--weights as-is]
//! # Which rows reuse can take exactly: prefill-computed rows (Y), the
//! # never-computed row of a cached sequence's last token (Y2), rows of
//! # generated tokens computed by decode steps (Y3):
//! cargo run --release --example logprob_probe -- rows [--gguf G] [--weights f32]
//! # The kernels check (bench/kernels.sh): one JSON line per prompt of a fixed
//! # set (Search-R1 round 1 and round 2, tool-search, PhantomWiki), with the
//! # token ids, the top 10 next-token log-probs and 48 greedy tokens, to set
//! # this build against another build's and llama.cpp's:
//! cargo run --release --example logprob_probe -- kernels > kernels.jsonl
//! # The same on a Hugging Face checkpoint (bench/checkpoint.sh):
//! cargo run --release --example logprob_probe -- kernels --checkpoint DIR --isq q4k
//! ```
//! Prints the top 5 `(token id, log-prob)` of each run and the largest
//! difference against the first.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::{Engine, EngineEvent, GenerationParams};
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
    /// The bug case of issue 13: round 1 ends at `</search>`, round 2's
    /// splice starts with what the model predicted after it. Next-token
    /// log-probabilities after round 2's prompt with no cache, mistral.rs's
    /// cache as it is, and seeker's reuse.
    Splice {
        #[arg(long, default_value = seeker::config::SMALL_GGUF)]
        gguf: PathBuf,
        /// as-is | f32 | auto
        #[arg(long, default_value = "auto")]
        weights: String,
    },
    /// Reuse of prefill-computed rows only: the entry comes from a one-token
    /// request on X; Y continues X with a token other than the one sampled
    /// (no missing row), Y2 with exactly that token (the missing row).
    Rows {
        #[arg(long, default_value = seeker::config::SMALL_GGUF)]
        gguf: PathBuf,
        #[arg(long, default_value = "as-is")]
        weights: String,
    },
    /// One JSON line per prompt of [`kernel_prompts`]: `{"name", "ids",
    /// "top": [[id, logprob], ...10], "greedy": text}` (no prefix cache).
    Kernels {
        #[arg(long, default_value = seeker::config::DEFAULT_GGUF)]
        gguf: PathBuf,
        /// A Hugging Face checkpoint directory to load instead of `--gguf`
        /// (bench/checkpoint.sh sets it against the GGUF it came from).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// In-situ quantization of `--checkpoint`.
        #[arg(long, default_value = "auto")]
        isq: seeker::config::Isq,
        /// Greedy tokens after each prompt.
        #[arg(long, default_value_t = 48)]
        tokens: usize,
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
    load_mode(gguf, weights, if prefix_cache { "naive" } else { "off" }).await
}

/// `mode`: `off` (no prefix cache), `naive` (mistral.rs's as it is) or
/// `sentinel` (seeker's reuse).
async fn load_mode(
    gguf: &Path,
    weights: WeightFormat,
    mode: &str,
) -> anyhow::Result<MistralEngine> {
    let prefix_cache = mode != "off";
    Ok(MistralEngine::load(&MistralConfig {
        gguf: gguf.to_path_buf(),
        checkpoint: None,
        isq: Default::default(),
        dtype: ActivationDtype::F32,
        max_num_seqs: 1,
        weights,
        prefix_cache,
        prefix_cache_mib: 2048,
        naive_prefix_cache: mode == "naive",
        token_continuation: true,
    })
    .await?)
}

/// Greedy text of at most `max_tokens` tokens after `prompt`.
async fn greedy(engine: &MistralEngine, prompt: &str, max_tokens: usize) -> anyhow::Result<String> {
    greedy_until(engine, prompt, max_tokens, Vec::new()).await
}

/// Greedy text of at most `max_tokens` tokens after `prompt`, ended by
/// `stop` strings as the engine ends them.
async fn greedy_until(
    engine: &MistralEngine,
    prompt: &str,
    max_tokens: usize,
    stop: Vec<String>,
) -> anyhow::Result<String> {
    let params = GenerationParams {
        max_tokens,
        temperature: None,
        top_p: None,
        stop,
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

/// Issue 13's bug case on `engine`: a Search-R1 round 1 continued from an
/// open `<search>` and stopped at `</search>`, then round 2's prompt: round 1,
/// the closing tag and Search-R1's splice (which starts with `\n\n`, the
/// token a policy predicts after the tag). Returns round 2's prompt and
/// round 1's text.
async fn splice_case(
    engine: &MistralEngine,
    late: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let profile = Profile::load("config/policies/search-r1.toml".as_ref())?;
    let instruction = profile.user_message("Where does the Mekong River originate?");
    let round1 = engine
        .render_chat(&[ChatTurn::new(Role::User, instruction)])
        .await?;
    let round1 = format!(
        "{round1}<think>\nI need to find where the Mekong starts.\n</think>\n<search> Mekong River origin"
    );
    let text = greedy_until(engine, &round1, 16, vec!["</search>".into()]).await?;
    // The engine's text runs on past the stop string by the token that found
    // it (cut here, as the rollout cuts at its closing tag).
    let kept = text.split("</search>").next().unwrap_or_default();
    let splice = std::fs::read_to_string("tests/fixtures/splices/search-r1.two-docs.txt")?;
    // Search-R1's splice, starting with what the model wrote after the tag.
    let splice = match late {
        Some(late) => format!("{late}{}", splice.trim_start_matches('\n')),
        None => splice,
    };
    Ok((format!("{round1}{kept}</search>{splice}"), text))
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

/// The kernels check's prompts, `(name, text)`: every question under
/// Search-R1's prompt (round 1), two of them continued with a search call and
/// Search-R1's splice (round 2), two under tool-search's template with its
/// function, and two PhantomWiki questions.
async fn kernel_prompts(engine: &MistralEngine) -> anyhow::Result<Vec<(String, String)>> {
    let search_r1 = Profile::load("config/policies/search-r1.toml".as_ref())?;
    let tool_search = Profile::load("config/policies/tool-search.toml".as_ref())?;
    let splice = std::fs::read_to_string("tests/fixtures/splices/search-r1.two-docs.txt")?;
    let questions = [
        "Where does the Mekong River originate?",
        "Who painted the Mona Lisa?",
        "When was the Taj Mahal built?",
        "What is the population of Macau?",
        "Who is the mother of Earle Coe?",
        "Who is the friend of the child of Lindsey Hartwell?",
    ];
    let mut out = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        let round1 = engine
            .render_chat(&[ChatTurn::new(Role::User, search_r1.user_message(q))])
            .await?;
        if i < 2 {
            out.push((
                format!("search-r1 round 2 #{i}"),
                format!("{round1}<think>\nI need to look this up.\n</think>\n<search> {q} </search>{splice}"),
            ));
        }
        out.push((format!("search-r1 round 1 #{i}"), round1));
        if i % 3 == 0 {
            let prompt = engine
                .render_chat_with_tools(
                    &[ChatTurn::new(Role::User, tool_search.user_message(q))],
                    tool_search.template_tools(),
                )
                .await?;
            out.push((format!("tool-search #{i}"), prompt));
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().probe {
        Probe::Kernels {
            gguf,
            checkpoint,
            isq,
            tokens,
        } => {
            let engine = match checkpoint {
                None => load(&gguf, WeightFormat::AsIs, false).await?,
                Some(dir) => {
                    MistralEngine::load(&MistralConfig {
                        gguf,
                        checkpoint: Some(dir),
                        isq,
                        dtype: ActivationDtype::F32,
                        max_num_seqs: 1,
                        weights: WeightFormat::AsIs,
                        prefix_cache: false,
                        prefix_cache_mib: 2048,
                        naive_prefix_cache: false,
                        token_continuation: true,
                    })
                    .await?
                }
            };
            for (name, prompt) in kernel_prompts(&engine).await? {
                let ids = engine.tokenize(&prompt).await?;
                let top = engine.next_token_logprobs(&prompt, 10).await?;
                let text = greedy(&engine, &prompt, tokens).await?;
                println!(
                    "{}",
                    serde_json::json!({"name": name, "ids": ids, "top": top, "greedy": text})
                );
            }
        }
        Probe::Weights { gguf } => {
            let profile = Profile::load("config/policies/search-r1.toml".as_ref())?;
            let instruction = profile.user_message("Where does the Mekong River originate?");
            let splice = std::fs::read_to_string("tests/fixtures/splices/search-r1.two-docs.txt")?;
            let mut results: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
            for (name, weights) in [("as is", WeightFormat::AsIs), ("f32", WeightFormat::F32)] {
                let engine = load(&gguf, weights, false).await?;
                let round1 = engine
                    .render_chat(&[ChatTurn::new(Role::User, instruction.clone())])
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
        Probe::Splice { gguf, weights } => {
            let weights = match weights.as_str() {
                "f32" => WeightFormat::F32,
                "as-is" => WeightFormat::AsIs,
                _ => WeightFormat::Auto,
            };
            // The token the model writes after the tag (a run without the
            // cache keeps it in its text): the splice starts with it.
            let off = load_mode(&gguf, weights, "off").await?;
            let (_, written) = splice_case(&off, None).await?;
            let late = written.split("</search>").nth(1).map(str::to_string);
            println!("round 1 wrote {written:?}; the splice starts with {late:?}");
            let mut runs: Vec<Run> = Vec::new();
            let mut engine = Some(off);
            for mode in ["off", "naive", "sentinel"] {
                let engine = match engine.take() {
                    Some(e) => e,
                    None => load_mode(&gguf, weights, mode).await?,
                };
                let (round2, _) = splice_case(&engine, late.as_deref()).await?;
                let top = engine.next_token_logprobs(&round2, 10).await?;
                runs.push((mode, top));
            }
            report("round 2", &runs);
        }
        Probe::Rows { gguf, weights } => {
            let weights = match weights.as_str() {
                "f32" => WeightFormat::F32,
                _ => WeightFormat::AsIs,
            };
            let x = format!(
                "<|im_start|>user\n{} Tell me about Augustus.<|im_end|>\n<|im_start|>assistant\n",
                "The history of the Roman Empire spans many centuries and includes emperors, wars, roads, laws and reforms. ".repeat(20)
            );
            let plain = load(&gguf, weights, false).await?;
            let t1 = greedy(&plain, &x, 1).await?;
            println!("t1 = {t1:?}");
            let y = format!("{x}Zebra crossing");
            let y2 = format!("{x}{t1} crossing");
            let fy = ("full Y", plain.next_token_logprobs(&y, 10).await?);
            let fy2 = ("full Y2", plain.next_token_logprobs(&y2, 10).await?);
            let cached = load(&gguf, weights, true).await?;
            cached.next_token_logprobs(&x, 10).await?;
            let ry = ("reuse X rows, Y", cached.next_token_logprobs(&y, 10).await?);
            let cached = load(&gguf, weights, true).await?;
            cached.next_token_logprobs(&x, 10).await?;
            let ry2 = (
                "reuse X+t1 rows, Y2",
                cached.next_token_logprobs(&y2, 10).await?,
            );
            let text = greedy(&plain, &x, 10).await?;
            let half: String = text.split_inclusive(' ').take(3).collect();
            println!("decoded rows of {half:?}");
            let y3 = format!("{x}{half}zebra");
            let fy3 = ("full Y3", plain.next_token_logprobs(&y3, 10).await?);
            let cached = load(&gguf, weights, true).await?;
            greedy(&cached, &x, 10).await?;
            let ry3 = (
                "reuse decode rows, Y3",
                cached.next_token_logprobs(&y3, 10).await?,
            );
            report("Y3", &[fy3, ry3]);
            report("Y", &[fy, ry]);
            report("Y2", &[fy2, ry2]);
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
