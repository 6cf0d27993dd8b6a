//! PhantomWiki end to end, as `bench/phantomwiki.sh` runs it: a generated
//! universe (`scripts/phantomwiki.sh --size 500`, seed 1, made by
//! `scripts/test.sh`), indexed by the real binary, served on the default
//! config and model, three one-hop questions asked by `seeker eval` and
//! scored by set F1.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::root;
use crate::e2e::{start_default_model, wait_healthy, SEEKER};

/// The size-500 universe's file `name`; panics with the command that makes it.
fn universe(name: &str) -> std::path::PathBuf {
    let path = root().join("data/phantomwiki/seed1-500").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/phantomwiki.sh --size 500 --no-index first",
        path.display()
    );
    path
}

/// `seeker eval` on the universe's first three one-hop questions.
fn eval(base: &str, out: &Path, extra: &[&str]) -> (String, Value, Vec<Value>) {
    let run = Command::new(SEEKER)
        .arg("eval")
        .arg("--dataset")
        .arg(universe("questions.jsonl"))
        .args(["--max-difficulty", "1", "--no-aggregation", "--limit", "3"])
        .args(["--max-tokens", "256", "--url", base, "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("summary.json")).unwrap())
            .unwrap();
    let lines = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (stdout, summary, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn a_generated_universe_is_indexed_served_and_scored_by_set_f1() {
    let tmp = tempfile::tempdir().unwrap();
    let index = tmp.path().join("index");
    let built = Command::new(SEEKER)
        .args(["index", "--corpus"])
        .arg(universe("corpus.jsonl"))
        .arg("--index")
        .arg(&index)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&built.stdout);
    // Seed 1 at size 500 (10 family trees) is 503 articles, pinned by sha256
    // in scripts/phantomwiki.sh.
    assert!(stdout.starts_with("indexed 503 documents"), "{stdout}");

    let server = start_default_model(&index, &[], &[]);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;

    // The default policy: the model writes its own searches.
    let (table, summary, lines) = eval(&server.base, &tmp.path().join("default.jsonl"), &[]);
    for row in [
        "set F1 (precision / recall)",
        "searched by the model",
        "support recall",
    ] {
        assert!(table.contains(row), "{row} missing:\n{table}");
    }
    assert!(table.contains("difficulty  questions"), "{table}");
    assert_eq!(summary["questions"], 3, "{summary}");
    assert_eq!(summary["completed"], 3, "{summary}");
    assert_eq!(summary["set_questions"], 3, "{summary}");
    assert_eq!(summary["by_difficulty"][0]["key"], "1", "{summary}");
    for line in &lines {
        assert_eq!(line["difficulty"], 1, "{line}");
        let f1 = line["set_f1"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f1), "{line}");
        // A set of several names has no EM; a single name has.
        let several = line["golds"].as_array().unwrap().len() > 1;
        assert_eq!(line["em"].is_null(), several, "{line}");
    }

    // Single-shot RAG, asked with an answer format before the question
    // (`--instruction`). The question is searched with it, so what it
    // finds depends on BM25 alone. Each question names one person, whose
    // article holds the answer (PhantomWiki writes every relation into both
    // people's articles), and BM25 ranks it in the top 3 for these three;
    // the instruction's words are in no article, so it changes no rank.
    let instruction = "Answer with names only, separated by commas.";
    let (_, rag, rag_lines) = eval(
        &server.base,
        &tmp.path().join("rag.jsonl"),
        &["--policy", "rag", "--instruction", instruction],
    );
    assert_eq!(rag["completed"], 3, "{rag}");
    assert_eq!(rag["answer_recall"], 1.0, "{rag}");
    assert_eq!(rag["searched"], 0.0, "rag never searches by itself: {rag}");
    assert_eq!(rag["instruction"], instruction, "{rag}");
    for line in &rag_lines {
        let transcript = line["transcript"].as_str().unwrap_or("");
        assert!(!transcript.contains("<search>"), "{line}");
        // What was asked: the instruction, then the question.
        let asked = line["question"].as_str().unwrap();
        assert!(
            asked.starts_with(&format!("{instruction} Who is ")),
            "{line}"
        );
    }
}
