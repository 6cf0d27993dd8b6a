//! End to end with real components: the `seeker` binary, the real small GGUF
//! (SmolLM2-135M-Instruct Q4_1, as `config/small.toml` serves it), a real BM25 index over the real Wikipedia
//! corpus, a real server on port 0, real HTTP.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{default_data, get_json, post_json, root};
use crate::http::sse_data;

pub(crate) const SEEKER: &str = env!("CARGO_BIN_EXE_seeker");

/// The `seeker` binary the servers are started from: this build's, or the
/// one `SEEKER_TEST_BIN` names (a release build, or an older commit's to show
/// that a test fails there).
pub(crate) fn seeker_bin() -> String {
    std::env::var("SEEKER_TEST_BIN").unwrap_or_else(|_| SEEKER.to_string())
}

/// Kills the server when the test ends, pass or fail.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One BM25 index over the default corpus for every test that needs one
/// but does not look into it (built once, kept for the test process).
pub(crate) fn shared_index() -> &'static Path {
    static INDEX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let index = dir.join("index");
        build_index(&index);
        index
    })
}

pub(crate) fn build_index(index: &Path) {
    let corpus = default_data("data/wiki/corpus.jsonl");
    let out = Command::new(SEEKER)
        .args(["index", "--corpus"])
        .arg(&corpus)
        .arg("--index")
        .arg(index)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The corpus built by scripts/fetch-defaults.sh has 10,033 lead paragraphs.
    assert!(stdout.starts_with("indexed 10033 documents"), "{stdout}");
}

/// A BM25 index of `docs` (title, text; ids from 1) built by `seeker index`
/// in `dir/index`, for a real-binary test that needs no fetched corpus.
pub(crate) fn small_index(dir: &Path, docs: &[(&str, &str)]) -> PathBuf {
    let corpus = dir.join("corpus.jsonl");
    let lines: String = docs
        .iter()
        .enumerate()
        .map(|(i, (title, text))| {
            format!(
                "{}\n",
                serde_json::json!({"id": (i + 1).to_string(), "title": title, "text": text})
            )
        })
        .collect();
    std::fs::write(&corpus, lines).unwrap();
    let index = dir.join("index");
    let out = Command::new(seeker_bin())
        .args(["index", "--corpus"])
        .arg(&corpus)
        .arg("--index")
        .arg(&index)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    index
}

fn search_cli(index: &Path, query: &str) -> String {
    let out = Command::new(SEEKER)
        .args(["search", "-k", "3", "--index"])
        .arg(index)
        .arg(query)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn start_server(index: &Path) -> Server {
    start_server_with(index, &[])
}

/// A server on the small model (as `config/small.toml` serves it), with
/// `env` added.
pub(crate) fn start_server_with(index: &Path, env: &[(&str, &str)]) -> Server {
    start_server_args(index, env, &[])
}

/// A server on the small model (as `config/small.toml` serves it: the fast
/// suites' model; `tests/it/qwen.rs` runs the default one), with `env` added
/// and `args` after `seeker serve`.
pub(crate) fn start_server_args(index: &Path, env: &[(&str, &str)], args: &[&str]) -> Server {
    let gguf = default_data(seeker::config::SMALL_GGUF);
    let gguf = gguf.to_str().unwrap();
    let mut all = vec![
        ("SEEKER_MODEL__GGUF", gguf),
        ("SEEKER_MODEL__ID", "SmolLM2-135M-Instruct"),
        ("SEEKER_POLICY__DEFAULT", "search-r1-prefetch"),
    ];
    all.extend_from_slice(env);
    start_default_model(index, &all, args)
}

/// A server on the default config and model, with `env` added and `args`
/// after `seeker serve`.
pub(crate) fn start_default_model(index: &Path, env: &[(&str, &str)], args: &[&str]) -> Server {
    let mut command = Command::new(seeker_bin());
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .current_dir(root())
        .env("SEEKER_SEARCH__INDEX", index)
        // mistral.rs warns of "a mix of GPU and CPU" on every CPU load.
        .env("RUST_LOG", "warn,mistralrs_core::pipeline::gguf=error");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let base = announced(&mut child, "seeker listening on ");
    Server { child, base }
}

/// What a started server's first stdout line gives after `prefix` (its
/// address); panics with the line when it is something else.
pub(crate) fn announced(child: &mut Child, prefix: &str) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string()
}

pub(crate) async fn wait_healthy(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await {
            if r.status() == 200 {
                return;
            }
            assert_eq!(r.status(), 503, "health is 503 while loading, then 200");
        }
        assert!(Instant::now() < deadline, "the model did not load in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn question(stream: bool) -> Value {
    json!({
        "model": "default",
        "stream": stream,
        "max_tokens": 96,
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn real_model_searches_real_wikipedia_and_answers_streamed_and_not() {
    let tmp = tempfile::tempdir().unwrap();
    let index = tmp.path().join("index");
    build_index(&index);
    let hits = search_cli(&index, "Who painted the Mona Lisa?");
    assert!(
        hits.starts_with("1. [") && hits.contains("Mona Lisa"),
        "{hits}"
    );
    // Any text is a query: no parser errors.
    let hits = search_cli(&index, "title:\"(unbalanced AND -");
    assert!(hits.starts_with("1. ["), "{hits}");

    let server = start_server(&index);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;

    let models: Value = get_json(&client, &format!("{}/v1/models", server.base)).await;
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct");

    // Streamed.
    let response = client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&question(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let body = response.text().await.unwrap();
    for frame in body.split("\n\n").filter(|f| !f.is_empty()) {
        assert!(
            frame
                .lines()
                .all(|l| l.starts_with("data: ") || l.starts_with(':')),
            "not an SSE frame: {frame:?}"
        );
    }
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed_content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let streamed_reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    // The question was searched and its documents spliced in Search-R1's format.
    assert!(
        streamed_reasoning.starts_with("<information>Doc 1(Title: \""),
        "{streamed_reasoning}"
    );
    let block_end = streamed_reasoning
        .find("</information>")
        .expect("a closed block");
    assert!(
        streamed_reasoning[..block_end].contains("Leonardo da Vinci"),
        "{streamed_reasoning}"
    );
    assert!(!streamed_content.trim().is_empty(), "empty answer: {body}");
    let last = chunks.last().unwrap();
    assert!(last["choices"][0]["finish_reason"].is_string());
    assert!(last["seeker"]["documents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["title"] == "Mona Lisa"));

    // Not streamed: greedy decoding gives the same final text.
    let v: Value = post_json(
        &client,
        &format!("{}/v1/chat/completions", server.base),
        &question(false),
    )
    .await;
    let message = &v["choices"][0]["message"];
    assert_eq!(
        message["content"].as_str().unwrap(),
        streamed_content,
        "{v}"
    );
    assert_eq!(
        message["reasoning_content"].as_str().unwrap(),
        streamed_reasoning
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    every_profile_continues_a_search_call_with_the_real_model(&client, &server.base).await;
    cjk_and_emoji_stream_without_replacement_characters(&client, &server.base).await;
    let base = server.base.clone();
    tokio::task::spawn_blocking(move || eval_runs_against_the_real_server(&base))
        .await
        .unwrap();

    the_fast_weights_give_the_reference_greedy_tokens(&client, &server.base, &index).await;
}

/// The default weights (`auto`: the Q4_1 GGUF dequantized once to an F32 copy,
/// run with dense matmuls, chosen for speed) generate exactly the greedy tokens
/// of the reference path: the original GGUF with candle dequantizing it at load
/// (`CANDLE_DEQUANTIZE_ALL=1`). Two rounds: the question search, then 96 tokens.
async fn the_fast_weights_give_the_reference_greedy_tokens(
    client: &reqwest::Client,
    fast: &str,
    index: &Path,
) {
    assert!(
        root()
            .join("models/SmolLM2-135M-Instruct.Q4_1.f32.gguf")
            .is_file(),
        "the default server runs the prepared F32 copy"
    );
    let reference = start_server_with(
        index,
        &[
            ("SEEKER_MODEL__WEIGHTS", "as_is"),
            ("CANDLE_DEQUANTIZE_ALL", "1"),
        ],
    );
    wait_healthy(client, &reference.base).await;
    let mut body = question(false);
    body["return_transcript"] = json!(true);
    let url = |base: &str| format!("{base}/v1/chat/completions");
    let a = post_json(client, &url(fast), &body).await;
    let b = post_json(client, &url(&reference.base), &body).await;
    assert!(a["seeker"]["transcript"].is_string(), "{a}");
    assert_eq!(a["seeker"]["transcript"], b["seeker"]["transcript"]);
    assert_eq!(a["usage"], b["usage"]);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

/// For each profile: an assistant message that ends in a search call is
/// continued (`continue_final_message`), so the search runs before any token; the
/// golden transcript records the splice and the real model's greedy continuation.
/// (Re-bless with INSTA_UPDATE=always after a change to the engine's numerics.)
async fn every_profile_continues_a_search_call_with_the_real_model(
    client: &reqwest::Client,
    base: &str,
) {
    // The baselines `direct` and `rag` never run a search call.
    for (name, p) in crate::common::profiles()
        .iter()
        .filter(|(_, p)| p.max_searches > 0)
    {
        let query = if p.query_separator.is_empty() {
            "Mona Lisa painter".to_string()
        } else {
            format!("Mona Lisa painter{} Leonardo da Vinci", p.query_separator)
        };
        let call = if let Some(tools) = &p.tools {
            let call =
                json!({"name": tools.search, "arguments": {tools.query_argument.as_str(): query}});
            format!("{}\n{call}\n{}", p.query_open, p.query_close)
        } else {
            format!("{} {query} {}", p.query_open, p.query_close)
        };
        let v: Value = post_json(
            client,
            &format!("{base}/v1/chat/completions"),
            &json!({
                "model": "default",
                "policy": name,
                "max_tokens": 24,
                "continue_final_message": true,
                "return_transcript": true,
                "messages": [
                    {"role": "user", "content": "Who painted the Mona Lisa?"},
                    {"role": "assistant", "content": call}
                ]
            }),
        )
        .await;
        let seeker = &v["seeker"];
        assert_eq!(seeker["policy"], name.as_str(), "{v}");
        let transcript = seeker["transcript"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        let rounds = seeker["rounds"].as_array().unwrap();
        let first = rounds
            .iter()
            .find(|r| r["round"] == 1)
            .unwrap_or_else(|| panic!("{name}: {v}"));
        assert_eq!(first["outcome"], "search", "{name}: {v}");
        assert_eq!(
            first["tokens_generated"], 0,
            "{name}: searched before generating"
        );
        assert_eq!(
            first["results"][0]["documents"][0]["title"], "Mona Lisa",
            "{name}"
        );
        assert!(
            transcript.contains("Leonardo da Vinci"),
            "{name}: {transcript}"
        );
        // A dated prompt (Tongyi DeepResearch, DeepResearcher) changes what
        // the model writes from one day to the next: only its splice is fixed.
        let dated = std::fs::read_to_string(&p.source)
            .unwrap()
            .contains("{date}");
        if !dated {
            insta::assert_snapshot!(format!("e2e_{name}"), transcript);
        }
    }
}

/// Multi-byte characters the model writes arrive whole: no U+FFFD anywhere, and
/// the streamed text equals the non-streamed text.
async fn cjk_and_emoji_stream_without_replacement_characters(client: &reqwest::Client, base: &str) {
    let opening = "<think>Tokyo is 東京 and a tower is タワー, so Tokyo Tower 🗼 is";
    let body = |stream: bool| {
        json!({
            "policy": "search-r1",
            "stream": stream,
            "max_tokens": 32,
            "continue_final_message": true,
            "messages": [
                {"role": "user", "content": "How do you write Tokyo Tower in Japanese?"},
                {"role": "assistant", "content": opening}
            ]
        })
    };
    let streamed = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut reasoning = String::new();
    for data in sse_data(&streamed) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        if let Some(t) = chunk["choices"][0]["delta"]["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
    }
    assert!(!reasoning.contains('\u{fffd}'), "{reasoning}");
    assert!(reasoning.starts_with(opening), "{reasoning}");
    assert!(reasoning.len() > opening.len(), "the model wrote nothing");
    let v: Value = post_json(client, &format!("{base}/v1/chat/completions"), &body(false)).await;
    assert_eq!(
        v["choices"][0]["message"]["reasoning_content"].as_str(),
        Some(reasoning.as_str())
    );
}

/// `seeker eval` on the first 20 FanOutQA dev sub-questions whose evidence
/// article is in the default corpus, against the real server.
fn eval_runs_against_the_real_server(base: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("results.jsonl");
    let out = run_eval(base, 20, &out_path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "EM",
        "cover-EM",
        "F1",
        "answer recall of spliced documents",
        "seconds / question",
    ] {
        assert!(
            stdout.contains(row),
            "{row} missing from the table:\n{stdout}"
        );
    }
    let lines: Vec<Value> = std::fs::read_to_string(&out_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    for line in &lines {
        for key in ["question", "golds", "prediction", "em", "f1", "transcript"] {
            assert!(line.get(key).is_some(), "{key} missing in {line}");
        }
        assert!(line["error"].is_null(), "{line}");
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("results.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["questions"], 20);
    assert_eq!(summary["completed"], 20);
    assert_eq!(summary["served_model"], "SmolLM2-135M-Instruct");
    assert_eq!(summary["config"]["max_tokens"], 32);
    // Retrieval alone finds the gold answer for some of these questions: BM25 over
    // the lead paragraphs, deterministic, so this does not depend on the model.
    let recall = summary["answer_recall"].as_f64().unwrap();
    assert!(recall >= 0.1, "answer recall {recall}");
    let ttft = summary["time_to_first_token_s"]["p50"].as_f64().unwrap();
    let seconds = summary["seconds_per_question"]["p50"].as_f64().unwrap();
    assert!(
        ttft > 0.0 && ttft < seconds,
        "ttft {ttft}, seconds {seconds}"
    );

    // Greedy decoding is the reproducible mode: the same command again gives
    // the same predictions.
    let again_path = tmp.path().join("again.jsonl");
    let again = run_eval(base, 5, &again_path);
    assert!(again.status.success());
    let again: Vec<Value> = std::fs::read_to_string(&again_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(again.len(), 5);
    for (first, second) in lines.iter().zip(&again) {
        assert_eq!(first["question"], second["question"]);
        assert_eq!(first["prediction"], second["prediction"]);
    }

    // Without streaming (`--no-stream`, one JSON answer a question): the same
    // answers, searches and rollouts, and no time to first token.
    let whole_path = tmp.path().join("whole.jsonl");
    let whole = run_eval_with(base, 5, &whole_path, &["--no-stream"]);
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let whole: Vec<Value> = std::fs::read_to_string(&whole_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(whole.len(), 5);
    for (first, second) in lines.iter().zip(&whole) {
        for key in [
            "question",
            "prediction",
            "transcript",
            "searches",
            "rounds",
            "completion_tokens",
        ] {
            assert_eq!(first[key], second[key], "{key}");
        }
        assert!(second["error"].is_null(), "{second}");
        assert!(second["time_to_first_token_s"].is_null(), "{second}");
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("whole.summary.json")).unwrap(),
    )
    .unwrap();
    assert!(summary["time_to_first_token_s"].is_null(), "{summary}");
}

/// Runs `seeker eval` on the first `limit` FanOutQA dev sub-questions whose
/// evidence article is in the default corpus, greedy, 32 tokens per answer.
fn run_eval(base: &str, limit: usize, out_path: &Path) -> std::process::Output {
    run_eval_with(base, limit, out_path, &[])
}

/// [`run_eval`] with `extra` arguments.
fn run_eval_with(
    base: &str,
    limit: usize,
    out_path: &Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(SEEKER)
        .arg("eval")
        .arg("--dataset")
        .arg(default_data("data/fanoutqa/dev.json"))
        .args(["--fanoutqa-subquestions", "--max-tokens", "32"])
        .args(["--limit", &limit.to_string()])
        .arg("--evidence-in")
        .arg(default_data("data/wiki/corpus.jsonl"))
        .args(["--url", base, "--out"])
        .arg(out_path)
        .args(extra)
        .output()
        .unwrap()
}
