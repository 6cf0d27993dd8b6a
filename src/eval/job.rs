//! One `seeker eval` run from start to end: load and filter the questions,
//! then either ask a server ([`Target::Server`]: progress bar, summary table,
//! per-question JSONL and summary JSON) or search the local index only
//! ([`Target::Retrieval`]: answer recall of the top-k, no generation).

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::dataset::{self, FanoutMode, QaItem};
use super::metrics::contains_answer;
use super::{run, served_model, EvalConfig, Summary};
use crate::search::bm25::Bm25Index;

/// The questions to take and where to write the results.
#[derive(Clone, Debug)]
pub struct Job {
    /// JSONL with `question` and `answers`/`golden_answers`, or FanOutQA JSON.
    pub dataset: PathBuf,
    /// FanOutQA: top-level questions or their single-hop sub-questions.
    pub mode: FanoutMode,
    /// Keep only questions whose evidence article's title is in this corpus
    /// (JSONL with `title`).
    pub evidence_in: Option<PathBuf>,
    /// Questions skipped first (after the evidence filter).
    pub skip: usize,
    /// Only the first N questions (after the evidence filter and `skip`).
    pub limit: Option<usize>,
    /// Per-question JSONL; the server run's summary goes next to it with
    /// `.summary.json`.
    pub out: Option<PathBuf>,
}

/// What answers the questions.
#[derive(Clone, Debug)]
pub enum Target {
    /// A running server (seeker, or any OpenAI-compatible one).
    Server(EvalConfig),
    /// The local index alone: is a gold answer in the top `k` documents?
    Retrieval { index: PathBuf, k: usize },
}

/// Runs `job` against `target`, printing the summary to stdout.
///
/// # Errors
/// An unreadable dataset, corpus or index, no question left to evaluate, an
/// output file that cannot be written.
pub fn run_job(job: &Job, target: Target) -> anyhow::Result<()> {
    let items = load_items(job)?;
    match target {
        Target::Server(config) => ask_server(job, config, &items),
        Target::Retrieval { index, k } => retrieval(job, &index, k, &items),
    }
}

/// The dataset's questions, filtered and cut as `job` says.
fn load_items(job: &Job) -> anyhow::Result<Vec<QaItem>> {
    let mut items = dataset::load(&job.dataset, job.mode)?;
    if let Some(corpus) = &job.evidence_in {
        let text = std::fs::read_to_string(corpus)
            .map_err(|e| anyhow::anyhow!("{}: {e}", corpus.display()))?;
        let titles = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["title"].as_str().map(str::to_string))
            .collect();
        items = dataset::with_evidence_in(items, &titles);
    }
    let before_skip = items.len();
    items.drain(..job.skip.min(items.len()));
    anyhow::ensure!(
        before_skip == 0 || !items.is_empty(),
        "--skip {} leaves none of the {before_skip} questions of {} to evaluate",
        job.skip,
        job.dataset.display()
    );
    if let Some(n) = job.limit {
        items.truncate(n);
    }
    anyhow::ensure!(
        !items.is_empty(),
        "no questions to evaluate in {}",
        job.dataset.display()
    );
    Ok(items)
}

fn ask_server(job: &Job, config: EvalConfig, items: &[QaItem]) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let bar = ProgressBar::new(items.len() as u64).with_style(
        ProgressStyle::with_template("eval {bar:40} {pos}/{len} ({eta}) {msg}")
            .expect("valid progress template"),
    );
    let (served, results) = runtime.block_on(async {
        let served = served_model(&config).await;
        let results = run(&config, items, |r| {
            bar.inc(1);
            if let Some(e) = &r.error_kind {
                bar.set_message(format!("last failure: {e}"));
            }
        })
        .await;
        (served, results)
    });
    bar.finish_and_clear();
    let summary = Summary::new(
        config,
        job.dataset.display().to_string(),
        served,
        &results,
        started.elapsed().as_secs_f64(),
    );
    print!("{}", summary.table());
    if let Some(out) = &job.out {
        let mut lines = String::new();
        for r in &results {
            lines.push_str(&serde_json::to_string(r)?);
            lines.push('\n');
        }
        write(out, &lines)?;
        let summary_path = out.with_extension("summary.json");
        write(
            &summary_path,
            &(serde_json::to_string_pretty(&summary)? + "\n"),
        )?;
        println!("wrote {} and {}", out.display(), summary_path.display());
    }
    Ok(())
}

/// Answer recall of the local index's top `k` for each question.
fn retrieval(job: &Job, index_dir: &Path, k: usize, items: &[QaItem]) -> anyhow::Result<()> {
    let index = Bm25Index::open(index_dir)?;
    let mut lines = String::new();
    let mut found = 0usize;
    for item in items {
        let docs = index.search(&item.question, k)?;
        let hit = docs
            .iter()
            .any(|d| contains_answer(&format!("{} {}", d.title, d.text), &item.golds));
        found += usize::from(hit);
        lines.push_str(&serde_json::to_string(&serde_json::json!({
            "id": item.id,
            "question": item.question,
            "golds": item.golds,
            "answer_in_documents": hit,
            "documents": docs.iter().map(|d| &d.title).collect::<Vec<_>>(),
        }))?);
        lines.push('\n');
    }
    let recall = found as f64 / items.len() as f64;
    println!(
        "questions {}\nanswer recall@{k} of {} ({} documents): {recall:.3} ({found} of {})",
        items.len(),
        index_dir.display(),
        index.num_docs(),
        items.len()
    );
    if let Some(out) = &job.out {
        write(out, &lines)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
