//! `seeker eval`: runs a QA dataset against a running seeker (or any
//! OpenAI-compatible) server and scores it the way the search-policy papers do.
//!
//! Each question is one streamed chat completion (greedy by default; or one
//! JSON answer with `--no-stream`, which has no time to first token). Against a
//! seeker server the request also asks for the rollout (`return_transcript`),
//! which gives searches, queries, rounds, generated tokens and the documents
//! spliced — hence the answer recall of retrieval, a metric that needs no good
//! generator. Against another server those fields are absent and reported as
//! such.
//!
//! Outputs: a summary (terminal table and JSON, with the exact configuration)
//! and one JSON line per question with the prediction, golds, metrics and the
//! rollout transcript, in dataset order.

pub mod dataset;
pub mod job;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

use dataset::QaItem;

use crate::secret::Secret;

/// How to run an evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct EvalConfig {
    /// Server base URL (`http://127.0.0.1:8080`).
    pub url: String,
    /// Model id sent in requests.
    pub model: String,
    /// seeker extension: policy profile.
    pub policy: Option<String>,
    /// seeker extension: search backend.
    pub backend: Option<String>,
    /// seeker extension: documents per query.
    pub top_k: Option<usize>,
    /// Token budget per question (all rounds).
    pub max_tokens: usize,
    /// 0 is greedy decoding, the reproducible mode.
    pub temperature: f64,
    /// Questions in flight at once.
    pub concurrency: usize,
    /// Per-question deadline.
    #[serde(serialize_with = "as_secs")]
    pub timeout: Duration,
    /// Stream each answer (`stream: true`, which gives the time to first
    /// token) or ask for one JSON answer (`stream: false`).
    pub stream: bool,
    /// `Authorization: Bearer` key, when the server wants one (never written out).
    #[serde(skip)]
    pub api_key: Option<Secret>,
}

fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// One question's result: a line of the per-question JSONL.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QuestionResult {
    pub id: String,
    pub question: String,
    pub golds: Vec<String>,
    pub prediction: String,
    pub em: f64,
    pub cover_em: f64,
    pub f1: f64,
    /// A gold answer occurs in a spliced document (None: the server did not say
    /// what it spliced).
    pub answer_in_documents: Option<bool>,
    /// Search calls that ran a query.
    pub searches: Option<usize>,
    /// Queries searched by the model's search calls (not the question search).
    pub queries: Option<usize>,
    /// Those queries' text, in the order the model wrote them (what
    /// `seeker eval --retrieval-only --queries-from` scores again).
    pub search_queries: Option<Vec<String>>,
    /// Generation rounds.
    pub rounds: Option<usize>,
    pub completion_tokens: Option<usize>,
    /// Prompt tokens the engine read, all generation rounds together (a round
    /// reads its whole transcript; seeker only).
    pub prompt_tokens: Option<usize>,
    /// Of those, the tokens taken from the engine's prefix cache instead of
    /// prefilled (rounds whose engine says; seeker only).
    pub prompt_tokens_cached: Option<usize>,
    /// Seconds to the first generated text (reasoning or answer; text seeker
    /// marks as spliced does not count).
    pub time_to_first_token_s: Option<f64>,
    /// Seconds to the whole answer.
    pub seconds: f64,
    pub finish_reason: Option<String>,
    /// What failed, when the question could not be completed.
    pub error: Option<String>,
    /// `timeout`, `connect`, `http_<status>`, `server_error`, `stream`.
    pub error_kind: Option<String>,
    /// Text after the prompt that the model saw (seeker only).
    pub transcript: Option<String>,
}

/// Mean, median and 90th percentile.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
}

impl Stats {
    /// Stats of `values` (nearest-rank percentiles); zeros when empty.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.5),
            p90: rank(0.9),
        }
    }
}

/// The summary of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub config: EvalConfig,
    pub dataset: String,
    /// Model id the server reported.
    pub served_model: Option<String>,
    pub seeker_version: String,
    pub questions: usize,
    pub completed: usize,
    /// EM, cover-EM and F1 over all questions (a failed question scores 0).
    pub em: f64,
    pub cover_em: f64,
    pub f1: f64,
    /// Share of questions whose gold occurs in a spliced document.
    pub answer_recall: Option<f64>,
    pub searches_per_question: Option<f64>,
    pub queries_per_search: Option<f64>,
    pub rounds_per_question: Option<f64>,
    pub generated_tokens_per_question: Option<f64>,
    /// Prompt tokens read per question, all rounds together.
    pub prompt_tokens_per_question: Option<f64>,
    /// Prompt tokens prefilled per question (read less cached).
    pub prefilled_tokens_per_question: Option<f64>,
    /// `None` when no question reported one (`--no-stream`).
    pub time_to_first_token_s: Option<Stats>,
    pub seconds_per_question: Stats,
    /// Failures by kind.
    pub failures: BTreeMap<String, usize>,
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
}

fn mean_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Summary {
    /// Aggregates `results`.
    pub fn new(
        config: EvalConfig,
        dataset: String,
        served_model: Option<String>,
        results: &[QuestionResult],
        wall_seconds: f64,
    ) -> Self {
        let n = results.len().max(1) as f64;
        let ok: Vec<&QuestionResult> = results.iter().filter(|r| r.error.is_none()).collect();
        let mut failures = BTreeMap::new();
        for r in results {
            if let Some(kind) = &r.error_kind {
                *failures.entry(kind.clone()).or_insert(0) += 1;
            }
        }
        let searches: usize = ok.iter().filter_map(|r| r.searches).sum();
        let queries: usize = ok.iter().filter_map(|r| r.queries).sum();
        let has_rollouts = ok.iter().any(|r| r.searches.is_some());
        Self {
            config,
            dataset,
            served_model,
            seeker_version: env!("CARGO_PKG_VERSION").to_string(),
            questions: results.len(),
            completed: ok.len(),
            em: results.iter().map(|r| r.em).sum::<f64>() / n,
            cover_em: results.iter().map(|r| r.cover_em).sum::<f64>() / n,
            f1: results.iter().map(|r| r.f1).sum::<f64>() / n,
            answer_recall: mean_of(
                ok.iter()
                    .map(|r| r.answer_in_documents.map(|b| if b { 1.0 } else { 0.0 })),
            ),
            searches_per_question: mean_of(ok.iter().map(|r| r.searches.map(|s| s as f64))),
            queries_per_search: (has_rollouts && searches > 0)
                .then(|| queries as f64 / searches as f64),
            rounds_per_question: mean_of(ok.iter().map(|r| r.rounds.map(|s| s as f64))),
            generated_tokens_per_question: mean_of(
                ok.iter().map(|r| r.completion_tokens.map(|s| s as f64)),
            ),
            prompt_tokens_per_question: mean_of(
                ok.iter().map(|r| r.prompt_tokens.map(|s| s as f64)),
            ),
            prefilled_tokens_per_question: mean_of(ok.iter().map(|r| {
                r.prompt_tokens
                    .map(|p| p.saturating_sub(r.prompt_tokens_cached.unwrap_or(0)) as f64)
            })),
            time_to_first_token_s: Some(
                ok.iter()
                    .filter_map(|r| r.time_to_first_token_s)
                    .collect::<Vec<_>>(),
            )
            .filter(|t| !t.is_empty())
            .map(|t| Stats::of(&t)),
            seconds_per_question: Stats::of(&ok.iter().map(|r| r.seconds).collect::<Vec<_>>()),
            failures,
            wall_seconds,
        }
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "n/a".to_string(), |x| format!("{x:.digits$}"))
        };
        let mut rows: Vec<(String, String)> = vec![
            (
                "questions".into(),
                format!("{} ({} completed)", self.questions, self.completed),
            ),
            ("EM".into(), format!("{:.3}", self.em)),
            ("cover-EM".into(), format!("{:.3}", self.cover_em)),
            ("F1".into(), format!("{:.3}", self.f1)),
            (
                "answer recall of spliced documents".into(),
                opt(self.answer_recall, 3),
            ),
            (
                "searches / question".into(),
                opt(self.searches_per_question, 2),
            ),
            ("queries / search".into(), opt(self.queries_per_search, 2)),
            ("rounds / question".into(), opt(self.rounds_per_question, 2)),
            (
                "generated tokens / question".into(),
                opt(self.generated_tokens_per_question, 1),
            ),
            (
                "prompt tokens / question".into(),
                opt(self.prompt_tokens_per_question, 1),
            ),
            (
                "prefilled tokens / question".into(),
                opt(self.prefilled_tokens_per_question, 1),
            ),
        ];
        for (name, s) in [
            ("time to first token (s)", self.time_to_first_token_s),
            ("seconds / question", Some(self.seconds_per_question)),
        ] {
            rows.push((
                name.into(),
                s.map_or_else(
                    || "n/a (not streamed)".to_string(),
                    |s| format!("mean {:.2}, p50 {:.2}, p90 {:.2}", s.mean, s.p50, s.p90),
                ),
            ));
        }
        let failures = if self.failures.is_empty() {
            "none".to_string()
        } else {
            self.failures
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        rows.push(("failures".into(), failures));
        rows.push(("wall time (s)".into(), format!("{:.1}", self.wall_seconds)));
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:width$}  {v}\n"))
            .collect()
    }
}

/// Runs every item against the server, `config.concurrency` at a time;
/// `on_done` is called once per finished question. Results are in item order.
pub async fn run(
    config: &EvalConfig,
    items: &[QaItem],
    on_done: impl Fn(&QuestionResult) + Sync,
) -> Vec<QuestionResult> {
    let client = reqwest::Client::new();
    let config = Arc::new(config.clone());
    let mut results: Vec<(usize, QuestionResult)> = futures::stream::iter(items.iter().enumerate())
        .map(|(i, item)| {
            let client = client.clone();
            let config = Arc::clone(&config);
            async move { (i, ask(&client, &config, item).await) }
        })
        .buffer_unordered(config.concurrency.max(1))
        .inspect(|(_, r)| on_done(r))
        .collect()
        .await;
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// The model id the server serves (`GET /v1/models`), if it answers.
pub async fn served_model(config: &EvalConfig) -> Option<String> {
    let mut req = reqwest::Client::new().get(format!("{}/v1/models", config.url));
    if let Some(key) = &config.api_key {
        req = req.bearer_auth(key.expose());
    }
    let v: Value = req.send().await.ok()?.json().await.ok()?;
    v["data"][0]["id"].as_str().map(str::to_string)
}

fn failed(item: &QaItem, kind: &str, message: String, started: Instant) -> QuestionResult {
    QuestionResult {
        id: item.id.clone(),
        question: item.question.clone(),
        golds: item.golds.clone(),
        seconds: started.elapsed().as_secs_f64(),
        error: Some(message),
        error_kind: Some(kind.to_string()),
        ..QuestionResult::default()
    }
}

/// Asks one question (streamed) and scores the answer.
async fn ask(client: &reqwest::Client, config: &EvalConfig, item: &QaItem) -> QuestionResult {
    let started = Instant::now();
    let mut body = json!({
        "model": config.model,
        "stream": config.stream,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "messages": [{"role": "user", "content": item.question}],
        "return_transcript": true,
    });
    if let Some(p) = &config.policy {
        body["policy"] = json!(p);
    }
    if config.backend.is_some() || config.top_k.is_some() {
        let mut search = json!({});
        if let Some(b) = &config.backend {
            search["backend"] = json!(b);
        }
        if let Some(k) = config.top_k {
            search["top_k"] = json!(k);
        }
        body["search"] = search;
    }
    let mut req = client
        .post(format!("{}/v1/chat/completions", config.url))
        .json(&body);
    if let Some(key) = &config.api_key {
        req = req.bearer_auth(key.expose());
    }
    let work = async {
        let response = req.send().await.map_err(|e| {
            let kind = if e.is_connect() { "connect" } else { "stream" };
            (kind.to_string(), e.to_string())
        })?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err((format!("http_{}", status.as_u16()), text));
        }
        if config.stream {
            read_stream(response, started).await
        } else {
            read_answer(response).await
        }
    };
    let outcome = match tokio::time::timeout(config.timeout, work).await {
        Err(_) => {
            return failed(
                item,
                "timeout",
                format!("no answer within {:?}", config.timeout),
                started,
            )
        }
        Ok(Err((kind, message))) => return failed(item, &kind, message, started),
        Ok(Ok(o)) => o,
    };
    score(item, outcome, started)
}

/// What a streamed completion gave.
#[derive(Default)]
struct Streamed {
    content: String,
    first_token: Option<f64>,
    finish_reason: Option<String>,
    seeker: Option<Value>,
}

/// What a non-streamed completion gave (`choices[0].message.content`, its
/// `finish_reason`, seeker's `seeker` object); no time to first token.
async fn read_answer(response: reqwest::Response) -> Result<Streamed, (String, String)> {
    let v: Value = response
        .json()
        .await
        .map_err(|e| ("stream".to_string(), format!("bad answer: {e}")))?;
    if let Some(err) = v.get("error") {
        return Err(("server_error".to_string(), err.to_string()));
    }
    let choice = &v["choices"][0];
    Ok(Streamed {
        content: choice["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        first_token: None,
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        seeker: v["seeker"].is_object().then(|| v["seeker"].clone()),
    })
}

async fn read_stream(
    response: reqwest::Response,
    started: Instant,
) -> Result<Streamed, (String, String)> {
    let mut out = Streamed::default();
    let mut buffer = String::new();
    let mut bytes = response.bytes_stream();
    let mut done = false;
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk.map_err(|e| ("stream".to_string(), e.to_string()))?;
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(at) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..at + 2).collect();
            for line in frame.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim_start();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data)
                    .map_err(|e| ("stream".to_string(), format!("bad chunk {data:?}: {e}")))?;
                if let Some(err) = v.get("error") {
                    return Err(("server_error".to_string(), err.to_string()));
                }
                let choice = &v["choices"][0];
                // seeker marks text it spliced; the first token is the model's.
                let spliced = v["seeker"]["event"]["type"] == "splice";
                for field in ["reasoning_content", "content"] {
                    if let Some(t) = choice["delta"][field].as_str() {
                        if !t.is_empty() && !spliced && out.first_token.is_none() {
                            out.first_token = Some(started.elapsed().as_secs_f64());
                        }
                        if field == "content" {
                            out.content.push_str(t);
                        }
                    }
                }
                if let Some(reason) = choice["finish_reason"].as_str() {
                    out.finish_reason = Some(reason.to_string());
                    if v["seeker"].is_object() {
                        out.seeker = Some(v["seeker"].clone());
                    }
                }
            }
        }
    }
    if !done {
        return Err((
            "stream".to_string(),
            "the stream ended without [DONE]".to_string(),
        ));
    }
    Ok(out)
}

fn score(item: &QaItem, s: Streamed, started: Instant) -> QuestionResult {
    let prediction = s.content.trim().to_string();
    let rounds = s
        .seeker
        .as_ref()
        .and_then(|v| v["rounds"].as_array().cloned());
    let documents: Option<Vec<String>> = rounds.as_ref().map(|rounds| {
        rounds
            .iter()
            .flat_map(|r| r["results"].as_array().cloned().unwrap_or_default())
            .flat_map(|q| q["documents"].as_array().cloned().unwrap_or_default())
            .map(|d| {
                format!(
                    "{} {}",
                    d["title"].as_str().unwrap_or(""),
                    d["text"].as_str().unwrap_or("")
                )
            })
            .collect()
    });
    QuestionResult {
        id: item.id.clone(),
        question: item.question.clone(),
        golds: item.golds.clone(),
        em: metrics::exact_match(&prediction, &item.golds),
        cover_em: metrics::cover_exact_match(&prediction, &item.golds),
        f1: metrics::f1(&prediction, &item.golds),
        answer_in_documents: documents.as_ref().map(|docs| {
            docs.iter()
                .any(|d| metrics::contains_answer(d, &item.golds))
        }),
        searches: s
            .seeker
            .as_ref()
            .and_then(|v| v["searches"].as_u64())
            .map(|n| n as usize),
        queries: rounds.as_ref().map(|r| {
            r.iter()
                .filter(|x| x["round"].as_u64() != Some(0))
                .map(|x| x["queries"].as_array().map_or(0, Vec::len))
                .sum()
        }),
        search_queries: rounds.as_ref().map(|r| {
            r.iter()
                .filter(|x| x["round"].as_u64() != Some(0))
                .filter_map(|x| x["queries"].as_array())
                .flatten()
                .filter_map(|q| q.as_str().map(str::to_string))
                .collect()
        }),
        rounds: rounds
            .as_ref()
            .map(|r| r.iter().filter(|x| x["round"].as_u64() != Some(0)).count()),
        completion_tokens: rounds.as_ref().map(|r| {
            r.iter()
                .map(|x| x["tokens_generated"].as_u64().unwrap_or(0) as usize)
                .sum()
        }),
        prompt_tokens: round_sum(rounds.as_deref(), "prompt_tokens"),
        prompt_tokens_cached: round_sum(rounds.as_deref(), "prompt_tokens_cached"),
        time_to_first_token_s: s.first_token,
        seconds: started.elapsed().as_secs_f64(),
        finish_reason: s.finish_reason,
        transcript: s
            .seeker
            .as_ref()
            .and_then(|v| v["transcript"].as_str())
            .map(str::to_string),
        prediction,
        error: None,
        error_kind: None,
    }
}

/// The sum of `field` over the generation rounds (`None` when no round
/// reports it: another server, or a rollout that never generated).
fn round_sum(rounds: Option<&[Value]>, field: &str) -> Option<usize> {
    let values: Vec<u64> = rounds?
        .iter()
        .filter(|r| r["round"].as_u64() != Some(0))
        .filter_map(|r| r[field].as_u64())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<u64>() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_add_up_over_the_generation_rounds() {
        let rounds = [
            json!({"round": 0, "prompt_tokens": 5}),
            json!({"round": 1, "prompt_tokens": 152, "prompt_tokens_cached": 0}),
            json!({"round": 2, "prompt_tokens": 566, "prompt_tokens_cached": 191}),
        ];
        assert_eq!(round_sum(Some(&rounds), "prompt_tokens"), Some(718));
        assert_eq!(round_sum(Some(&rounds), "prompt_tokens_cached"), Some(191));
        assert_eq!(round_sum(Some(&rounds[..1]), "prompt_tokens"), None);
        assert_eq!(round_sum(None, "prompt_tokens"), None);
    }

    #[test]
    fn stats_use_nearest_rank_percentiles() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0, 10.0]);
        assert_eq!(s.mean, 4.0);
        assert_eq!(s.p50, 3.0);
        assert_eq!(s.p90, 10.0);
        assert_eq!(Stats::of(&[]), Stats::default());
    }
}
