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
mod page;
mod plot;
pub mod report;
pub mod summary;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

use dataset::QaItem;
pub use summary::{Group, Stats, Summary};

use crate::secret::Secret;

/// How to run an evaluation.
#[derive(Clone, Debug, Default, Serialize)]
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

/// One question's result: a line of the per-question JSONL (read back by
/// [`report`]).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct QuestionResult {
    pub id: String,
    pub question: String,
    pub golds: Vec<String>,
    pub prediction: String,
    /// EM, cover-EM and token F1, the best over the golds; `None` for a set
    /// answer of several members, which a single gold does not stand for.
    pub em: Option<f64>,
    pub cover_em: Option<f64>,
    pub f1: Option<f64>,
    /// Set precision, recall and F1 for a set answer
    /// ([`metrics::set_scores`]); `None` when the golds are aliases.
    pub set_precision: Option<f64>,
    pub set_recall: Option<f64>,
    pub set_f1: Option<f64>,
    /// The part of the prediction the set scores read
    /// ([`metrics::answer_clause`]); `None` when the golds are aliases.
    pub answer_clause: Option<String>,
    /// The question's hops and template, when the dataset gives them.
    pub difficulty: Option<u32>,
    pub template: Option<String>,
    /// A gold answer occurs in a spliced document (None: the server did not say
    /// what it spliced).
    pub answer_in_documents: Option<bool>,
    /// Share of the question's supporting articles among the documents the
    /// model's own searches retrieved (`None`: the dataset lists none, or the
    /// server did not say what it retrieved).
    pub support_recall: Option<f64>,
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

/// The fields of a result that come from the item: what it is, and its
/// scores for `prediction` (an empty prediction scores 0 everywhere).
fn scored(item: &QaItem, prediction: String) -> QuestionResult {
    let em_scored = !item.answer_is_set || item.golds.len() == 1;
    let set = item
        .answer_is_set
        .then(|| metrics::set_scores(&prediction, &item.golds));
    QuestionResult {
        id: item.id.clone(),
        question: item.question.clone(),
        golds: item.golds.clone(),
        em: em_scored.then(|| metrics::exact_match(&prediction, &item.golds)),
        cover_em: em_scored.then(|| metrics::cover_exact_match(&prediction, &item.golds)),
        f1: em_scored.then(|| metrics::f1(&prediction, &item.golds)),
        set_precision: set.map(|s| s.precision),
        set_recall: set.map(|s| s.recall),
        set_f1: set.map(|s| s.f1),
        answer_clause: item
            .answer_is_set
            .then(|| metrics::answer_clause(&prediction).to_string()),
        difficulty: item.difficulty,
        template: item.template.clone(),
        prediction,
        ..QuestionResult::default()
    }
}

fn failed(item: &QaItem, kind: &str, message: String, started: Instant) -> QuestionResult {
    QuestionResult {
        seconds: started.elapsed().as_secs_f64(),
        error: Some(message),
        error_kind: Some(kind.to_string()),
        ..scored(item, String::new())
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
        let retry = req.try_clone();
        let sent = match req.send().await {
            // A kept-alive connection the server had closed (llama-server
            // closes idle ones) fails before any answer: sent again once, on
            // a new connection.
            Err(e) if closed_before_answer(&e) => match retry {
                Some(again) => again.send().await,
                None => Err(e),
            },
            other => other,
        };
        let response = sent.map_err(|e| {
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

/// Whether sending failed because the connection closed before any part of
/// the answer came (hyper's "connection closed before message completed",
/// or a reset): the request can be sent again.
fn closed_before_answer(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() || e.is_status() || e.is_body() || e.is_decode() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) {
                return true;
            }
        }
        source = s.source();
    }
    false
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
        answer_in_documents: documents.as_ref().map(|docs| {
            docs.iter()
                .any(|d| metrics::contains_answer(d, &item.golds))
        }),
        support_recall: support_recall(&item.support, rounds.as_deref()),
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
        ..scored(item, prediction)
    }
}

/// The share of `support` (article titles) among the titles of the documents
/// the model's own searches retrieved (rounds after the question search,
/// round 0). `None` without supporting articles or without rounds.
fn support_recall(support: &[String], rounds: Option<&[Value]>) -> Option<f64> {
    if support.is_empty() {
        return None;
    }
    let found: std::collections::HashSet<&str> = rounds?
        .iter()
        .filter(|r| r["round"].as_u64() != Some(0))
        .flat_map(|r| r["results"].as_array().into_iter().flatten())
        .flat_map(|q| q["documents"].as_array().into_iter().flatten())
        .filter_map(|d| d["title"].as_str())
        .collect();
    let hits = support
        .iter()
        .filter(|t| found.contains(t.as_str()))
        .count();
    Some(hits as f64 / support.len() as f64)
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
    fn support_recall_counts_the_models_own_searches_only() {
        let doc = |t: &str| json!({"title": t, "text": "…"});
        let rounds = [
            json!({"round": 0, "results": [{"documents": [doc("Aida Wang")]}]}),
            json!({"round": 1, "results": [{"documents": [doc("Ryan Wang"), doc("X")]},
                                           {"documents": [doc("Dino Beltran")]}]}),
            json!({"round": 2, "results": []}),
        ];
        let support: Vec<String> = ["Aida Wang", "Ryan Wang", "Dino Beltran", "Vicki Hackworth"]
            .map(String::from)
            .to_vec();
        assert_eq!(support_recall(&support, Some(&rounds)), Some(0.5));
        assert_eq!(support_recall(&[], Some(&rounds)), None);
        assert_eq!(support_recall(&support, None), None);
    }

    #[test]
    fn a_set_answer_of_several_members_is_scored_by_set_f1_alone() {
        let item = QaItem {
            id: "q".into(),
            question: "Who is the sister of Aida Wang?".into(),
            golds: vec!["Barabara Beltran".into(), "Vicki Hackworth".into()],
            answer_is_set: true,
            difficulty: Some(1),
            ..QaItem::default()
        };
        let r = scored(&item, "Vicki Hackworth".into());
        assert_eq!(r.em, None, "one member is not the answer");
        assert_eq!((r.set_precision, r.set_recall), (Some(1.0), Some(0.5)));
        assert_eq!(r.difficulty, Some(1));
        let single = QaItem {
            golds: vec!["Ryan Wang".into()],
            ..item.clone()
        };
        let r = scored(&single, "Ryan Wang".into());
        assert_eq!((r.em, r.set_f1), (Some(1.0), Some(1.0)));
        let aliases = QaItem {
            answer_is_set: false,
            ..item
        };
        let r = scored(&aliases, "Vicki Hackworth".into());
        assert_eq!((r.em, r.set_f1), (Some(1.0), None));
    }

    /// A server that answers the first request of each connection, keeps it
    /// alive, then closes it on the next request without answering (as
    /// llama-server does with a connection idle past its timeout).
    async fn closing_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&connections);
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // One whole request: headers, then the body they announce.
                    loop {
                        let n = socket.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&request).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length: ")
                                        .map(|v| v.trim().parse::<usize>().unwrap())
                                })
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let body = r#"{"choices": [{"message": {"content": "Leonardo"}, "finish_reason": "stop"}]}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: keep-alive\r\n\r\n{body}",
                        body.len()
                    );
                    socket.write_all(response.as_bytes()).await.unwrap();
                    // The next request on this connection: closed unanswered.
                    let _ = socket.read(&mut buf).await;
                });
            }
        });
        (url, connections)
    }

    #[tokio::test]
    async fn a_kept_alive_connection_the_server_closed_costs_no_question() {
        let (url, connections) = closing_server().await;
        let config = EvalConfig {
            url,
            model: "default".into(),
            policy: None,
            backend: None,
            top_k: None,
            max_tokens: 8,
            temperature: 0.0,
            concurrency: 1,
            timeout: Duration::from_secs(10),
            stream: false,
            api_key: None,
        };
        let items: Vec<QaItem> = (0..3)
            .map(|i| QaItem {
                id: i.to_string(),
                question: "Who painted the Mona Lisa?".into(),
                golds: vec!["Leonardo".into()],
                ..QaItem::default()
            })
            .collect();
        let results = run(&config, &items, |_| {}).await;
        for r in &results {
            assert_eq!(r.error, None, "{r:?}");
            assert_eq!(r.em, Some(1.0));
        }
        // Each question after the first found its pooled connection closed
        // and was sent again on a new one.
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
