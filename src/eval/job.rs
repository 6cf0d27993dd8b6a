//! One `seeker eval` run from start to end: load and filter the questions,
//! then either ask a server ([`Target::Server`]: progress bar, summary table,
//! per-question JSONL and summary JSON) or search the local index only
//! ([`Target::Retrieval`]: answer recall of a backend's top-k, no generation).

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::dataset::{self, FanoutMode, QaItem};
use super::metrics::contains_answer;
use super::{run, served_model, EvalConfig, Summary};

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
    /// Keep only questions with a gold answer in some document of this
    /// corpus (JSONL with `title` and `text`), as [`contains_answer`] finds it.
    pub answer_in: Option<PathBuf>,
    /// Keep only questions of at most this many hops (datasets that give a
    /// `difficulty`).
    pub max_difficulty: Option<u32>,
    /// Leave out aggregation ("How many …") questions.
    pub no_aggregation: bool,
    /// Questions skipped first (after the evidence filter).
    pub skip: usize,
    /// Only the first N questions (after the evidence filter and `skip`).
    pub limit: Option<usize>,
    /// Text put before every question, after one space, as a user types an
    /// answer format before a question (`--instruction`): what is asked, and
    /// what a question search searches, is `"{instruction} {question}"`; an
    /// empty (or blank) instruction asks the bare question. PhantomWiki's
    /// own agents are asked for "a list of names separated by ','"
    /// (`phantom_eval/prompts.py`); bench/phantomwiki.sh asks bare questions
    /// by default (bench/README "Asking for the answer format").
    pub instruction: Option<String>,
    /// Per-question JSONL; the server run's summary goes next to it with
    /// `.summary.json`.
    pub out: Option<PathBuf>,
}

/// A retrieval-only run.
#[derive(Clone, Debug)]
pub struct Retrieval {
    /// `[search]`, whose `index` is the local index.
    pub search: crate::config::SearchConfig,
    /// The backend searched (a name the dispatcher of `search` has).
    pub backend: String,
    /// Documents per query.
    pub k: usize,
    /// Questions searched at once (each its own round), for latency under
    /// load; 1 measures one client.
    pub clients: usize,
    /// Per-question JSONL of an earlier `seeker eval` run: each question is
    /// searched with the queries the model wrote there (`search_queries`,
    /// all in one round, as the rollout searched them) instead of its text,
    /// and a hit in any query's top-k counts. Questions the model searched
    /// for nothing are left out (and counted).
    pub queries_from: Option<PathBuf>,
}

/// What answers the questions.
#[derive(Clone, Debug)]
pub enum Target {
    /// A running server (seeker, or any OpenAI-compatible one).
    Server(EvalConfig),
    /// Retrieval alone: is a gold answer in the top 1, 3, 5 and `k`
    /// documents of the question (or of the model's own queries) searched on
    /// a backend?
    Retrieval(Retrieval),
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
        Target::Retrieval(r) => retrieval(job, &r, &items),
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
    if let Some(corpus) = &job.answer_in {
        items = with_answer_in(items, corpus)?;
    }
    if job.max_difficulty.is_some() || job.no_aggregation {
        items = dataset::by_kind(items, job.max_difficulty, job.no_aggregation);
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
    if let Some(instruction) = job.instruction.as_deref().map(str::trim) {
        for item in &mut items {
            item.question = instructed(instruction, &item.question);
        }
    }
    anyhow::ensure!(
        !items.is_empty(),
        "no questions to evaluate in {}",
        job.dataset.display()
    );
    Ok(items)
}

/// `question` as asked with `instruction` before it; the question alone
/// when the instruction is empty.
fn instructed(instruction: &str, question: &str) -> String {
    if instruction.is_empty() {
        question.to_string()
    } else {
        format!("{instruction} {question}")
    }
}

/// The items with a gold answer in some document of `corpus`: each document
/// normalised once, documents joined by a line break, which no normalised
/// gold holds, so a match never spans two documents.
fn with_answer_in(items: Vec<QaItem>, corpus: &Path) -> anyhow::Result<Vec<QaItem>> {
    let text = std::fs::read_to_string(corpus)
        .map_err(|e| anyhow::anyhow!("{}: {e}", corpus.display()))?;
    let mut all = String::from(" ");
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let doc = format!(
            "{} {}",
            v["title"].as_str().unwrap_or(""),
            v["text"].as_str().unwrap_or("")
        );
        all.push_str(&super::metrics::normalize(&doc));
        all.push_str(" \n ");
    }
    Ok(items
        .into_iter()
        .filter(|i| {
            i.golds.iter().any(|g| {
                let g = super::metrics::normalize(g);
                !g.is_empty() && all.contains(&format!(" {g} "))
            })
        })
        .collect())
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
    let mut summary = Summary::new(
        config,
        job.dataset.display().to_string(),
        served,
        &results,
        started.elapsed().as_secs_f64(),
    );
    summary.instruction = job.instruction.clone().filter(|i| !i.trim().is_empty());
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

/// The ranks answer recall is reported at: 1, 3, 5 and `k`, those up to `k`.
fn recall_ranks(k: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = [1, 3, 5].into_iter().filter(|&r| r < k).collect();
    ranks.push(k);
    ranks
}

/// The model's queries per question id, from an eval run's per-question
/// JSONL (`search_queries`).
fn model_queries(path: &Path) -> anyhow::Result<std::collections::HashMap<String, Vec<String>>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = std::collections::HashMap::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        let id = v["id"].as_str().ok_or_else(|| {
            anyhow::anyhow!(
                "{}:{}: no `id` (not a seeker eval output?)",
                path.display(),
                n + 1
            )
        })?;
        let queries: Vec<String> = v["search_queries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|q| q.as_str().map(str::to_string))
            .collect();
        out.insert(id.to_string(), queries);
    }
    Ok(out)
}

/// Answer recall of a backend's top `k` for each question (and of its top
/// 1, 3 and 5), searched through the dispatcher as a rollout would, with
/// `clients` questions in flight; per-round latency mean, p50 and p99.
fn retrieval(job: &Job, r: &Retrieval, items: &[QaItem]) -> anyhow::Result<()> {
    use futures::StreamExt;

    let (search, backend, k) = (&r.search, r.backend.as_str(), r.k);
    let dispatcher = crate::search::dispatcher_from_config(
        search,
        &crate::config::PagesConfig::default(),
        crate::config::env_value,
    )?;
    dispatcher
        .check_backend(backend)
        .map_err(|message| anyhow::anyhow!(message))?;
    let (asked, unsearched) = to_search(r, items)?;
    anyhow::ensure!(
        !asked.is_empty(),
        "no question to search (none of the questions has model queries in the file?)"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let rounds: Vec<(f64, Vec<crate::search::dispatch::QueryResult>)> = runtime.block_on(
        futures::stream::iter(asked.iter().map(|(_, queries)| {
            let dispatcher = &dispatcher;
            async move {
                let t = std::time::Instant::now();
                let found = dispatcher.search_round(Some(backend), queries, k).await;
                (t.elapsed().as_secs_f64(), found)
            }
        }))
        .buffered(r.clients.max(1))
        .collect(),
    );
    let wall = started.elapsed().as_secs_f64();
    let ranks = recall_ranks(k);
    let mut found = vec![0usize; ranks.len()];
    // Supporting articles: the share found, and questions with any found.
    let mut support = vec![(0.0f64, 0usize); ranks.len()];
    let with_support = asked.iter().filter(|(i, _)| !i.support.is_empty()).count();
    let mut failed = 0usize;
    let mut lines = String::new();
    let mut seconds = Vec::with_capacity(rounds.len());
    for ((item, queries), (secs, results)) in asked.iter().zip(rounds) {
        seconds.push(secs);
        let (first_hit, documents) = best_hit(item, results, &mut failed);
        for (i, &r) in ranks.iter().enumerate() {
            found[i] += usize::from(first_hit.is_some_and(|p| p < r));
            if let Some(share) = support_share(&item.support, &documents, r) {
                support[i].0 += share;
                support[i].1 += usize::from(share > 0.0);
            }
        }
        lines.push_str(&serde_json::to_string(&serde_json::json!({
            "id": item.id,
            "question": item.question,
            "golds": item.golds,
            "queries": queries,
            "answer_in_documents": first_hit.is_some(),
            "answer_rank": first_hit.map(|p| p + 1),
            "documents": documents,
        }))?);
        lines.push('\n');
    }
    let n = seconds.len();
    let mean = seconds.iter().sum::<f64>() / n as f64;
    let mut sorted = seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let rank = |p: f64| sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let source = if r.queries_from.is_some() {
        "the model's queries"
    } else {
        "the question"
    };
    println!(
        "questions {n}\nbackend {backend} (index {}), query: {source}",
        search.index.display()
    );
    if unsearched > 0 {
        println!("left out: {unsearched} questions the model searched nothing for");
    }
    for (i, r) in ranks.iter().enumerate() {
        println!(
            "answer recall@{r}: {:.3} ({} of {n})",
            found[i] as f64 / n as f64,
            found[i]
        );
    }
    if with_support > 0 {
        for (i, r) in ranks.iter().enumerate() {
            println!(
                "support recall@{r}: {:.3}; a supporting article in the top {r}: {:.3} ({} of {with_support})",
                support[i].0 / with_support as f64,
                support[i].1 as f64 / with_support as f64,
                support[i].1
            );
        }
    }
    println!(
        "search ms per round ({} clients): mean {:.1}, p50 {:.1}, p99 {:.1}; {:.1} rounds/s",
        r.clients.max(1),
        mean * 1e3,
        rank(0.5) * 1e3,
        rank(0.99) * 1e3,
        n as f64 / wall
    );
    if failed > 0 {
        println!("failed searches: {failed} (counted as misses; see the log)");
    }
    if let Some(out) = &job.out {
        write(out, &lines)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// The share of `support` (article titles) among the first `rank` titles
/// of any query's `documents`; `None` when the question lists no support.
fn support_share(support: &[String], documents: &[Vec<String>], rank: usize) -> Option<f64> {
    if support.is_empty() {
        return None;
    }
    let top: std::collections::HashSet<&str> = documents
        .iter()
        .flat_map(|titles| titles.iter().take(rank))
        .map(String::as_str)
        .collect();
    let hits = support.iter().filter(|t| top.contains(t.as_str())).count();
    Some(hits as f64 / support.len() as f64)
}

/// Questions with the queries to search for each.
type Asked<'a> = Vec<(&'a QaItem, Vec<String>)>;

/// The questions to search, each with its queries (the question itself, or
/// the model's queries read from `r.queries_from`), and how many questions
/// were left out for having no model query.
///
/// # Errors
/// A queries file that does not read or parse.
fn to_search<'a>(r: &Retrieval, items: &'a [QaItem]) -> anyhow::Result<(Asked<'a>, usize)> {
    Ok(match &r.queries_from {
        None => (
            items
                .iter()
                .map(|i| (i, vec![i.question.clone()]))
                .collect(),
            0,
        ),
        Some(path) => {
            let by_id = model_queries(path)?;
            let asked: Vec<_> = items
                .iter()
                .filter_map(|i| {
                    by_id
                        .get(&i.id)
                        .filter(|q| !q.is_empty())
                        .map(|q| (i, q.clone()))
                })
                .collect();
            let n = asked.len();
            (asked, items.len() - n)
        }
    })
}

/// The best rank over a round's queries of a document holding one of
/// `item`'s gold answers (0-based), and every query's document titles for
/// the output. A failed query counts in `failed` and finds nothing.
fn best_hit(
    item: &QaItem,
    results: Vec<crate::search::dispatch::QueryResult>,
    failed: &mut usize,
) -> (Option<usize>, Vec<Vec<String>>) {
    let mut first_hit: Option<usize> = None;
    let mut documents = Vec::with_capacity(results.len());
    for result in results {
        let docs = result.result.unwrap_or_else(|e| {
            *failed += 1;
            tracing::warn!(question = %item.id, error = %e, "retrieval failed");
            Vec::new()
        });
        let hit = docs
            .iter()
            .position(|d| contains_answer(&format!("{} {}", d.title, d.text), &item.golds));
        first_hit = match (first_hit, hit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        documents.push(docs.into_iter().map(|d| d.title).collect::<Vec<_>>());
    }
    (first_hit, documents)
}

/// Writes `text` to `path` whole or not at all: into `.{name}.tmp-{pid}`
/// beside it, then renamed over it (a kill or a full disk leaves the old
/// file, never half a new one; what a killed run left is removed).
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{}: not a file name", path.display()))?
        .to_string_lossy()
        .into_owned();
    let dir = path.parent().unwrap_or(Path::new(""));
    let prefix = format!(".{name}.tmp-");
    crate::tempfiles::remove_stale(dir, &prefix);
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_share_counts_titles_in_any_querys_top_ranks() {
        let support = ["Aida Wang", "Ryan Wang"].map(String::from).to_vec();
        let documents = vec![
            vec!["X".to_string(), "Aida Wang".to_string()],
            vec!["Ryan Wang".to_string()],
        ];
        assert_eq!(support_share(&support, &documents, 1), Some(0.5));
        assert_eq!(support_share(&support, &documents, 2), Some(1.0));
        assert_eq!(support_share(&[], &documents, 2), None);
        assert_eq!(recall_ranks(3), [1, 3]);
    }

    #[test]
    fn an_instruction_goes_before_every_question_asked() {
        let dir = tempfile::tempdir().unwrap();
        let dataset = dir.path().join("q.jsonl");
        std::fs::write(
            &dataset,
            "{\"question\": \"Who is the son of Aida Wang?\", \"answers\": [\"Ryan Wang\"]}\n",
        )
        .unwrap();
        let job = |instruction: Option<&str>| Job {
            dataset: dataset.clone(),
            mode: FanoutMode::Questions,
            evidence_in: None,
            answer_in: None,
            max_difficulty: None,
            no_aggregation: false,
            skip: 0,
            limit: None,
            instruction: instruction.map(String::from),
            out: None,
        };
        let asked = |instruction| load_items(&job(instruction)).unwrap()[0].question.clone();
        assert_eq!(
            asked(Some(" Answer with names only. ")),
            "Answer with names only. Who is the son of Aida Wang?"
        );
        assert_eq!(asked(None), "Who is the son of Aida Wang?");
        assert_eq!(asked(Some("  ")), "Who is the son of Aida Wang?");
    }

    #[test]
    fn output_files_are_replaced_whole_and_leave_nothing_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run.jsonl");
        std::fs::write(&out, "old\n").unwrap();
        // What a killed run left: removed by the next one.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.path().join(format!(".run.jsonl.tmp-{dead}")), "half").unwrap();
        write(&out, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["run.jsonl"]);
        // A directory that cannot be written keeps the old file.
        let missing = dir.path().join("no-such-dir").join("run.jsonl");
        assert!(write(&missing, "x")
            .unwrap_err()
            .to_string()
            .contains("no-such-dir"));
    }
}
