//! Web search providers (issue 49): an in-test server that answers as
//! Brave, Tavily, Serper, Exa, Google Programmable Search, Bing v7 and
//! SearXNG document (results, nothing found, a refused key, a spent quota,
//! 429 with `Retry-After`, 500, a malformed body, a slow answer), read
//! through the config and the dispatcher, then through the real binary
//! (over a scripted remote engine) with a text-tag policy and a tool-call
//! policy, with `fallback` and `merge` over providers that fail every
//! request, and with every key kept out of logs, answers, events and
//! `/metrics`.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::common::get_json;
use crate::e2e::{announced, seeker_bin, shared_index, wait_healthy, Server};
use crate::remote::serve;
use seeker::config::{BackendConfig, BackendKind, SearchConfig};
use seeker::search::dispatch::QueryResult;

/// The providers, as `kind`s.
const PROVIDERS: &[&str] = &[
    "brave", "tavily", "serper", "exa", "google", "bing", "searxng",
];

/// The key each provider's stub expects (`searxng` takes none).
fn key_of(provider: &str) -> String {
    format!("KEY-{provider}-5ecret-c0ffee")
}

/// The route of `provider` on the stub, under `prefix`.
fn route(provider: &str) -> &'static str {
    match provider {
        "brave" => "/res/v1/web/search",
        "tavily" | "serper" | "exa" => "/search",
        "google" => "/customsearch/v1",
        "bing" => "/v7.0/search",
        "searxng" => "",
        other => panic!("no route for {other}"),
    }
}

/// What the stub was asked, by provider: each request's query.
#[derive(Default)]
pub(crate) struct Stub {
    asked: Mutex<Vec<(String, String)>>,
    hits: AtomicUsize,
}

impl Stub {
    fn asked(&self, provider: &str, query: &str) -> usize {
        self.asked
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, q)| p == provider && q == query)
            .count()
    }
}

/// The query and the key a request carried, in the provider's own way.
fn read_request(
    provider: &str,
    headers: &HeaderMap,
    params: &BTreeMap<String, String>,
    body: &Value,
) -> (String, Option<String>) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    match provider {
        "brave" => (params["q"].clone(), header("x-subscription-token")),
        "tavily" => (
            body["query"].as_str().unwrap_or_default().into(),
            header("authorization").and_then(|h| h.strip_prefix("Bearer ").map(str::to_string)),
        ),
        "serper" => (
            body["q"].as_str().unwrap_or_default().into(),
            header("x-api-key"),
        ),
        "exa" => (
            body["query"].as_str().unwrap_or_default().into(),
            header("x-api-key"),
        ),
        "google" => (params["q"].clone(), params.get("key").cloned()),
        "bing" => (params["q"].clone(), header("ocp-apim-subscription-key")),
        "searxng" => (params["q"].clone(), Some(key_of("searxng"))),
        other => panic!("{other}"),
    }
}

/// `n` results in `provider`'s shape, or nothing found when `n` is 0.
fn results(provider: &str, query: &str, n: usize) -> Value {
    let item = |i: usize| {
        let url = format!("https://example.org/{provider}/{i}");
        let title = format!("{provider} result {i}");
        let text = format!("About {query}: fact {i}.");
        match provider {
            "brave" => json!({"title": title, "url": url,
                "description": format!("<strong>{text}</strong>"), "extra_snippets": ["More."]}),
            "tavily" => json!({"title": title, "url": url, "content": text, "score": 0.9,
                "raw_content": format!("The whole page. {text}")}),
            "serper" => json!({"title": title, "link": url, "snippet": text, "position": i + 1}),
            "exa" => json!({"title": title, "url": url, "id": url, "score": 0.5,
                "highlights": [text], "text": "The whole page."}),
            "google" => json!({"title": title, "link": url, "snippet": text}),
            "bing" => json!({"name": title, "url": url, "snippet": text}),
            "searxng" => json!({"title": title, "url": url, "content": text}),
            other => panic!("{other}"),
        }
    };
    let items: Vec<Value> = (0..n).map(item).collect();
    match (provider, n) {
        ("brave", 0) => json!({"type": "search"}),
        ("brave", _) => json!({"type": "search", "web": {"type": "search", "results": items}}),
        ("tavily", _) => json!({"query": query, "results": items, "response_time": 0.5}),
        ("serper", _) => json!({"searchParameters": {"q": query}, "organic": items}),
        ("exa", _) => json!({"requestId": "r1", "results": items}),
        ("google", 0) => json!({"kind": "customsearch#search"}),
        ("google", _) => json!({"kind": "customsearch#search", "items": items}),
        ("bing", _) => json!({"_type": "SearchResponse", "webPages": {"value": items}}),
        ("searxng", _) => json!({"query": query, "results": items}),
        (other, _) => panic!("{other}"),
    }
}

/// `provider`'s documented error body for `status` (what its API sends for
/// a bad key, a spent quota, a rate limit, a failure).
fn error_body(provider: &str, status: u16, what: &str) -> Value {
    match provider {
        "brave" => {
            let code = match what {
                "key" => "SUBSCRIPTION_TOKEN_INVALID",
                "rate" => "RATE_LIMITED",
                _ => "INTERNAL_ERROR",
            };
            json!({"type": "ErrorResponse", "error": {"id": "e1", "status": status,
                "code": code, "detail": format!("{what} problem"), "meta": {}}})
        }
        "tavily" => json!({"detail": {"error": format!("{what} problem")}}),
        "serper" => json!({"message": if what == "quota" { "Not enough credits" }
            else if what == "key" { "Unauthorized." } else { "Server error" },
            "statusCode": status}),
        "exa" => json!({"requestId": "r1", "error": format!("{what} problem"), "tag": what}),
        "google" => {
            let (message, reason) = match what {
                "key" => (
                    "API key not valid. Please pass a valid API key.",
                    "badRequest",
                ),
                "quota" => ("Daily Limit Exceeded.", "dailyLimitExceeded"),
                _ => ("Backend Error", "backendError"),
            };
            json!({"error": {"code": status, "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}]}})
        }
        "bing" => {
            json!({"_type": "ErrorResponse", "errors": [{"code": what, "message": format!("{what} problem")}]})
        }
        "searxng" => json!({"error": format!("{what} problem")}),
        other => panic!("{other}"),
    }
}

/// How each provider says its quota is spent.
fn quota_status(provider: &str) -> u16 {
    match provider {
        "tavily" => 432,
        "serper" => 400,
        "exa" => 402,
        "google" => 403,
        // Brave and Bing answer a spent quota with 429, SearXNG has none.
        _ => 429,
    }
}

/// The stub's answer: by the key, then by the query's first word (`ok`,
/// `empty`, `quota`, `limited`, `broken`, `malformed`, `slow`). Paths
/// starting `/always429/` or `/always500/` fail every request.
async fn answer(
    stub: Arc<Stub>,
    mode: String,
    provider: String,
    headers: HeaderMap,
    params: BTreeMap<String, String>,
    body: Value,
) -> Response {
    stub.hits.fetch_add(1, Ordering::SeqCst);
    let (query, key) = read_request(&provider, &headers, &params, &body);
    stub.asked
        .lock()
        .unwrap()
        .push((format!("{mode}/{provider}"), query.clone()));
    let error = |status: u16, what: &str| {
        let mut r = (
            StatusCode::from_u16(status).unwrap(),
            Json(error_body(&provider, status, what)),
        )
            .into_response();
        if status == 429 {
            r.headers_mut().insert("retry-after", "0".parse().unwrap());
        }
        r
    };
    match mode.as_str() {
        "always429" => return error(429, "rate"),
        "always500" => return error(500, "server"),
        _ => {}
    }
    if key.as_deref() != Some(key_of(&provider).as_str()) {
        let status = match provider.as_str() {
            "brave" => 422,
            "serper" => 403,
            "google" => 400,
            _ => 401,
        };
        return error(status, "key");
    }
    let word = query.split_whitespace().next().unwrap_or_default();
    match word {
        // A provider that quotes the key it was sent in its error message.
        "leak" => {
            // SearXNG takes no key: it has none to quote.
            let sent = if provider == "searxng" {
                String::new()
            } else {
                key.unwrap_or_default()
            };
            let quoted = format!("token {sent} rejected");
            let body = match provider.as_str() {
                "brave" => json!({"type": "ErrorResponse", "error": {"status": 500,
                    "code": "INTERNAL_ERROR", "detail": quoted}}),
                "tavily" => json!({"detail": {"error": quoted}}),
                "serper" => json!({"message": quoted, "statusCode": 500}),
                "exa" => json!({"error": quoted}),
                "google" => json!({"error": {"code": 500, "message": quoted}}),
                "bing" => {
                    json!({"_type": "ErrorResponse", "errors": [{"code": "x", "message": quoted}]})
                }
                _ => json!({"error": quoted}),
            };
            (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
        }
        // Google's daily quota, as a 429.
        "daily" => {
            let message = "Quota exceeded for quota metric 'Queries' and limit 'Queries per day'";
            let body =
                json!({"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}});
            (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response()
        }
        "empty" => Json(results(&provider, &query, 0)).into_response(),
        "quota" => error(quota_status(&provider), "quota"),
        "limited" => error(429, "rate"),
        "broken" => error(500, "server"),
        "malformed" => (StatusCode::OK, "{\"results\": [").into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Json(results(&provider, &query, 3)).into_response()
        }
        _ => Json(results(&provider, &query, 3)).into_response(),
    }
}

/// Starts the stub: `{base}/{mode}/{provider}{route}` answers as
/// `provider` (mode `ok`, `always429` or `always500`).
pub(crate) async fn start_stub() -> (Arc<Stub>, String) {
    let stub = Arc::new(Stub::default());
    type Params = Query<BTreeMap<String, String>>;
    async fn on_get(
        State(stub): State<Arc<Stub>>,
        Path((mode, provider, _rest)): Path<(String, String, String)>,
        headers: HeaderMap,
        Query(params): Params,
    ) -> Response {
        answer(stub, mode, provider, headers, params, Value::Null).await
    }
    async fn on_post(
        State(stub): State<Arc<Stub>>,
        Path((mode, provider, _rest)): Path<(String, String, String)>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> Response {
        answer(stub, mode, provider, headers, BTreeMap::new(), body).await
    }
    let app = Router::new()
        .route("/{mode}/{provider}/{*rest}", get(on_get).post(on_post))
        .with_state(Arc::clone(&stub));
    (stub, serve(app).await)
}

/// `[search.backends.NAME]` for `provider` on the stub in `mode`, with its
/// key in `TEST_{PROVIDER}_KEY`.
fn provider_config(base: &str, mode: &str, provider: &str) -> BackendConfig {
    let url = match provider {
        "searxng" => format!("{base}/{mode}/searxng/x"),
        p => format!("{base}/{mode}/{p}/x{}", route(p)),
    };
    BackendConfig {
        url: Some(url),
        api_key_env: (provider != "searxng")
            .then(|| format!("TEST_{}_KEY", provider.to_uppercase())),
        cx: (provider == "google").then(|| "engine-0123".to_string()),
        retries: Some(1),
        ..BackendConfig::of(BackendKind::named(provider).unwrap())
    }
}

fn env_keys(var: &str) -> Option<String> {
    let provider = var.strip_prefix("TEST_")?.strip_suffix("_KEY")?;
    Some(key_of(&provider.to_lowercase()))
}

fn kind(r: &QueryResult) -> &'static str {
    r.result.as_ref().err().map_or("ok", |e| e.kind())
}

/// Each provider, built from the config as a user writes it, reads its
/// results, nothing found, and each documented failure as the dispatcher's
/// error kinds; a spent quota is not retried, a 429 is; a wrong key is
/// `auth` and its message never holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn every_provider_reads_its_shape_and_its_errors() {
    let (stub, base) = start_stub().await;
    let mut backends = BTreeMap::new();
    for p in PROVIDERS {
        backends.insert(p.to_string(), provider_config(&base, "ok", p));
        let mut wrong = provider_config(&base, "ok", p);
        wrong.api_key_env = Some("WRONG_KEY".into());
        if *p != "searxng" {
            backends.insert(format!("{p}-wrong"), wrong);
        }
    }
    let config = SearchConfig {
        index: shared_index().to_path_buf(),
        query_timeout_ms: 1500,
        backends,
        ..SearchConfig::default()
    };
    let wrong_key = "WRONG-5ecret-key-0000";
    let d = seeker::search::dispatcher_from_config(&config, &Default::default(), |var| {
        if var == "WRONG_KEY" {
            Some(wrong_key.to_string())
        } else {
            env_keys(var)
        }
    })
    .unwrap();
    let queries: Vec<String> = [
        "ok capital of France",
        "empty",
        "quota",
        "limited",
        "broken",
        "malformed",
        "slow",
    ]
    .map(String::from)
    .to_vec();
    for p in PROVIDERS {
        let r = d.search_round(Some(p), &queries, 2).await;
        let docs = r[0].result.as_ref().unwrap();
        assert_eq!(docs.len(), 2, "{p}: top k");
        assert_eq!(docs[0].title, format!("{p} result 0"), "{p}");
        assert_eq!(
            docs[0].url.as_deref(),
            Some(format!("https://example.org/{p}/0").as_str()),
            "{p}"
        );
        assert_eq!(docs[0].id, format!("https://example.org/{p}/0"), "{p}");
        assert!(
            docs[0].text.contains("About ok capital of France: fact 0."),
            "{p}: {}",
            docs[0].text
        );
        assert!(!docs[0].text.contains('<'), "{p}: markup stripped");
        assert_eq!(docs[0].backend, *p);
        assert_eq!(
            r[1].result.as_ref().unwrap(),
            &Vec::new(),
            "{p}: nothing found"
        );
        assert_eq!(kind(&r[2]), "rate_limited", "{p}: {:?}", r[2].result);
        assert_eq!(kind(&r[3]), "rate_limited", "{p}: {:?}", r[3].result);
        assert_eq!(kind(&r[4]), "http_status", "{p}: {:?}", r[4].result);
        assert_eq!(kind(&r[5]), "malformed", "{p}: {:?}", r[5].result);
        assert_eq!(kind(&r[6]), "timeout", "{p}: {:?}", r[6].result);
        // A 429 is retried once (retries = 1); a spent quota is not, where
        // the provider says so apart from a 429.
        assert_eq!(stub.asked(&format!("ok/{p}"), "limited"), 2, "{p}");
        let quota_tries = if quota_status(p) == 429 { 2 } else { 1 };
        assert_eq!(stub.asked(&format!("ok/{p}"), "quota"), quota_tries, "{p}");
        if *p != "searxng" {
            let wrong = d
                .search_round(Some(&format!("{p}-wrong")), &queries[..1], 2)
                .await;
            let e = wrong[0].result.as_ref().unwrap_err();
            assert_eq!(e.kind(), "auth", "{p}: {e}");
            assert!(!e.to_string().contains(wrong_key), "{p}: {e}");
            assert!(!e.to_string().contains(&key_of(p)), "{p}: {e}");
        }
    }
    let long = format!("ok {}", "x".repeat(70_000));
    for p in PROVIDERS {
        // A key the provider quotes back never reaches the error.
        let r = d.search_round(Some(p), &["leak".to_string()], 2).await;
        let e = r[0].result.as_ref().unwrap_err().to_string();
        if *p != "searxng" {
            assert!(e.contains("[redacted]"), "{p}: {e}");
        }
        assert!(!e.contains(&key_of(p)), "{p}: {e}");
        // A query longer than any provider takes is cut to its limit, not
        // a failed request.
        let r = d
            .search_round(Some(p), std::slice::from_ref(&long), 2)
            .await;
        assert!(r[0].result.is_ok(), "{p}: {:?}", r[0].result);
    }
    // Google's daily quota comes as a 429 too: not retried.
    let r = d
        .search_round(Some("google"), &["daily".to_string()], 2)
        .await;
    assert_eq!(kind(&r[0]), "rate_limited");
    assert!(matches!(
        r[0].result,
        Err(seeker::search::SearchError::Quota(_))
    ));
    assert_eq!(stub.asked("ok/google", "daily"), 1, "not retried");

    // The document text each provider gives.
    let r = d.search_round(Some("brave"), &queries[..1], 1).await;
    assert_eq!(
        r[0].result.as_ref().unwrap()[0].text,
        "About ok capital of France: fact 0. More.",
        "Brave: description and extra snippets, markup stripped"
    );
    let r = d.search_round(Some("exa"), &queries[..1], 1).await;
    assert_eq!(
        r[0].result.as_ref().unwrap()[0].text,
        "About ok capital of France: fact 0."
    );
    let kinds = d.backend_kinds();
    assert_eq!(kinds["brave"], "brave");
    assert_eq!(kinds["tantivy"], "tantivy");
}

/// `page_text = true` asks Tavily and Exa for the page and reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn page_text_reads_the_page_where_the_provider_returns_it() {
    let (_stub, base) = start_stub().await;
    let mut backends = BTreeMap::new();
    for p in ["tavily", "exa"] {
        let mut b = provider_config(&base, "ok", p);
        b.page_text = true;
        backends.insert(p.to_string(), b);
    }
    let config = SearchConfig {
        index: shared_index().to_path_buf(),
        backends,
        ..SearchConfig::default()
    };
    let d = seeker::search::dispatcher_from_config(&config, &Default::default(), env_keys).unwrap();
    let q = vec!["ok Paris".to_string()];
    let tavily = d.search_round(Some("tavily"), &q, 1).await;
    assert_eq!(
        tavily[0].result.as_ref().unwrap()[0].text,
        "The whole page. About ok Paris: fact 0."
    );
    let exa = d.search_round(Some("exa"), &q, 1).await;
    assert_eq!(exa[0].result.as_ref().unwrap()[0].text, "The whole page.");
}

/// A missing key names its variable; a Google backend without `cx` says
/// what `cx` is.
#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn a_missing_key_or_cx_is_named_at_start() {
    for (provider, var) in [
        ("brave", "BRAVE_SEARCH_API_KEY"),
        ("tavily", "TAVILY_API_KEY"),
        ("serper", "SERPER_API_KEY"),
        ("exa", "EXA_API_KEY"),
        ("google", "GOOGLE_API_KEY"),
    ] {
        let config = SearchConfig {
            index: shared_index().to_path_buf(),
            backends: [(
                "web".to_string(),
                BackendConfig::of(BackendKind::named(provider).unwrap()),
            )]
            .into(),
            ..SearchConfig::default()
        };
        let err = seeker::search::dispatcher_from_config(&config, &Default::default(), |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(var) && err.contains("not set"),
            "{provider}: {err}"
        );
    }
    let config = SearchConfig {
        index: shared_index().to_path_buf(),
        backends: [(
            "web".to_string(),
            BackendConfig::of(BackendKind::named("google").unwrap()),
        )]
        .into(),
        ..SearchConfig::default()
    };
    let err = seeker::search::dispatcher_from_config(&config, &Default::default(), |_| {
        Some("google-key-0123".into())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("`cx`"), "{err}");
    // A key that is empty, or holds a line break, a space or other than
    // printable ASCII, is refused at start (for Google too, whose key
    // travels in the URL), naming its variable and never the key.
    for (key, says) in [
        ("", "set but empty"),
        ("short1", "shorter than 8"),
        ("KEY-google-5ecret\n", "line"),
        (" KEY-google-5ecret", "spaces"),
        ("KEY-gøøgle-5ecret", "printable ASCII"),
    ] {
        let err = seeker::search::dispatcher_from_config(&config, &Default::default(), |_| {
            Some(key.to_string())
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("GOOGLE_API_KEY") && err.contains(says),
            "{key:?}: {err}"
        );
        assert!(err.contains("export GOOGLE_API_KEY="), "{err}");
        if !key.is_empty() {
            assert!(!err.contains(key.trim()), "{err}");
        }
    }
}

// ------------------------------------------------------------ real binary

/// A scripted model behind an OpenAI-style completions server: it searches
/// once (`<search>` for text-tag policies, a `<tool_call>` for tool-call
/// ones) and answers "Paris" once results are in its prompt.
pub(crate) async fn scripted_model() -> String {
    async fn complete(Json(body): Json<Value>) -> Response {
        let prompt = body["prompt"].as_str().unwrap_or_default().to_string();
        let tools = prompt.contains("<tools>") || prompt.contains("\"name\": \"search\"");
        // The question is "LOOKUP: QUERY"; the model searches QUERY once
        // and answers once its call is in the prompt (results spliced after
        // it: documents, "no results" or the failure text).
        let query: String = prompt
            .split("LOOKUP: ")
            .nth(1)
            .unwrap_or_default()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == ' ')
            .collect();
        let query = query.trim().to_string();
        // "OPEN: TARGET" asks for a page action (ASearcher's `<access>`).
        let target: String = prompt
            .split("OPEN: ")
            .nth(1)
            .unwrap_or_default()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == ' ')
            .collect();
        let target = target.trim().to_string();
        if !target.is_empty() {
            let opened = prompt.contains(&format!("<access> {target} </access>"));
            let (text, stop) = if opened {
                ("<answer> Paris </answer>".to_string(), Value::Null)
            } else {
                (format!("<access> {target} </access>"), json!("</access>"))
            };
            let sse = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                json!({"choices": [{"text": text, "index": 0, "finish_reason": null}]}),
                json!({"choices": [{"text": "", "index": 0, "finish_reason": "stop", "stop_reason": stop}]})
            );
            return (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                sse,
            )
                .into_response();
        }
        let searched = prompt.contains(&format!("<search> {query} </search>"));
        let called = prompt.contains(&format!("\"query\": \"{query}\""));
        let (text, stop) = if searched {
            ("<answer> Paris </answer>".to_string(), Value::Null)
        } else if called {
            ("Paris".to_string(), Value::Null)
        } else if tools {
            (
                format!(
                    "<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"query\": \"{query}\"}}}}\n</tool_call>"
                ),
                Value::Null,
            )
        } else {
            (
                format!("<think>I will search.</think>\n<search> {query} </search>"),
                json!("</search>"),
            )
        };
        let text = text.as_str();
        let chunk = |text: &str, finish: Value, stop: Value| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"text": text, "index": 0, "finish_reason": finish,
                    "stop_reason": stop}]})
            )
        };
        let sse = chunk(text, Value::Null, Value::Null)
            + &chunk("", json!("stop"), stop)
            + "data: [DONE]\n\n";
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            sse,
        )
            .into_response()
    }
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "scripted"}]})) }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/tokenize",
            post(|Json(body): Json<Value>| async move {
                let text = body["content"].as_str().unwrap_or_default();
                let ids: Vec<u32> = text.chars().map(u32::from).collect();
                Json(json!({"tokens": ids}))
            }),
        )
        .route("/v1/completions", post(complete));
    serve(app).await
}

/// The real binary over the scripted model, with `config` (TOML) and every
/// test key in its environment; its log (at debug level) goes to the
/// returned file.
pub(crate) fn seeker_with(
    model: &str,
    config: &str,
    dir: &std::path::Path,
) -> (Server, std::path::PathBuf) {
    let file = dir.join("seeker.toml");
    std::fs::write(&file, config).unwrap();
    let log = dir.join("seeker.log");
    let mut command = Command::new(seeker_bin());
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--config"])
        .arg(&file)
        .current_dir(crate::common::root())
        .env("SEEKER_SEARCH__INDEX", shared_index())
        .env("SEEKER_MODEL__ENGINE", "remote")
        .env("SEEKER_MODEL__REMOTE_URLS", model)
        .env("SEEKER_MODEL__TOKEN_CONTINUATION", "false")
        .env("RUST_LOG", "debug,hyper=info,h2=info,tantivy=info");
    for p in PROVIDERS {
        command.env(format!("TEST_{}_KEY", p.to_uppercase()), key_of(p));
    }
    command.env("WRONG_KEY", "WRONG-5ecret-key-0000");
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let base = announced(&mut child, "seeker listening on ");
    (Server { child, base }, log)
}

/// `[search.backends]` for every provider on the stub, a provider that
/// answers 429 to everything (`limited`), one that answers 500
/// (`broken`), one with a wrong key, and lists over them.
pub(crate) fn binary_config(stub: &str) -> String {
    let mut text = String::from("[search]\ndefault = \"brave\"\nquery_timeout_ms = 3000\n");
    let mut add = |name: &str, provider: &str, mode: &str, key_var: &str| {
        let b = provider_config(stub, mode, provider);
        text += &format!(
            "[search.backends.{name}]\nkind = \"{provider}\"\nurl = \"{}\"\nretries = 1\n",
            b.url.unwrap()
        );
        if provider != "searxng" {
            text += &format!("api_key_env = \"{key_var}\"\n");
        }
        if provider == "google" {
            text += "cx = \"engine-0123\"\n";
        }
    };
    for p in PROVIDERS {
        add(p, p, "ok", &format!("TEST_{}_KEY", p.to_uppercase()));
        if *p != "searxng" {
            add(&format!("{p}-wrong"), p, "ok", "WRONG_KEY");
        }
    }
    add("limited", "brave", "always429", "TEST_BRAVE_KEY");
    add("broken", "serper", "always500", "TEST_SERPER_KEY");
    add("wrongkey", "tavily", "ok", "WRONG_KEY");
    text += "[search.backends.fallback]\nkind = \"fallback\"\nbackends = [\"limited\", \"broken\", \"wrongkey\", \"exa\"]\n";
    text += "[search.backends.merge]\nkind = \"merge\"\nbackends = [\"broken\", \"serper\", \"google\"]\n";
    text += "[search.backends.down]\nkind = \"fallback\"\nbackends = [\"limited\", \"broken\"]\n";
    text
}

/// The real binary over the scripted model (and `extra_replicas`, a
/// comma-separated list of more engine URLs, when not empty), with
/// [`binary_config`]'s backends on a fresh stub, loaded.
pub(crate) struct OverStubs {
    /// What the provider stubs were asked.
    pub stub: Arc<Stub>,
    pub server: Server,
    /// The server's log (debug level).
    pub log: std::path::PathBuf,
    pub client: reqwest::Client,
    /// `{base}/v1/chat/completions`.
    pub chat: String,
    /// Holds the config and the log; dropped after the server.
    pub dir: tempfile::TempDir,
}

pub(crate) async fn over_stubs(extra_replicas: &str) -> OverStubs {
    let (stub, stub_base) = start_stub().await;
    let mut replicas = scripted_model().await;
    if !extra_replicas.is_empty() {
        replicas = format!("{replicas},{extra_replicas}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, log) = seeker_with(&replicas, &binary_config(&stub_base), dir.path());
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    let chat = format!("{}/v1/chat/completions", server.base);
    OverStubs {
        stub,
        server,
        log,
        client,
        chat,
        dir,
    }
}

fn ask(policy: &str, backend: &str) -> Value {
    ask_for(policy, backend, "ok capital of France")
}

/// A question the scripted model answers by searching `query`.
pub(crate) fn ask_for(policy: &str, backend: &str, query: &str) -> Value {
    json!({"max_tokens": 64, "policy": policy, "search": {"backend": backend},
        "return_transcript": true,
        "messages": [{"role": "user", "content": format!("LOOKUP: {query}")}]})
}

/// Through the real binary: each provider answers a Search-R1 rollout (text
/// tags) and a tool-search rollout (tool calls); the documents reach the
/// model's next round and the client; `/v1/models` lists each backend with
/// its kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn each_provider_serves_text_tag_and_tool_call_rollouts_through_the_binary() {
    let OverStubs {
        stub: _,
        server,
        log: _,
        client,
        chat: url,
        dir: _dir,
    } = over_stubs("").await;
    let models: Value = get_json(&client, &format!("{}/v1/models", server.base)).await;
    let kinds = &models["data"][0]["search_backend_kinds"];
    for p in PROVIDERS {
        assert_eq!(kinds[p], *p, "{models}");
    }
    assert_eq!(kinds["fallback"], "fallback");
    assert_eq!(kinds["merge"], "merge");
    assert_eq!(kinds["tantivy"], "tantivy");
    for policy in ["search-r1", "tool-search"] {
        for p in PROVIDERS {
            let answer: Value = crate::common::post_json(&client, &url, &ask(policy, p)).await;
            let rounds = answer["seeker"]["rounds"]
                .as_array()
                .unwrap_or_else(|| panic!("{policy} {p}: {answer}"));
            let results = &rounds[0]["results"][0];
            assert_eq!(
                results["query"], "ok capital of France",
                "{policy} {p}: {answer}"
            );
            assert_eq!(results["backend"], *p, "{policy} {p}: {answer}");
            let docs = results["documents"].as_array().unwrap();
            assert!(!docs.is_empty(), "{policy} {p}: {answer}");
            assert_eq!(docs[0]["url"], format!("https://example.org/{p}/0"));
            assert!(results.get("error").is_none(), "{policy} {p}: {answer}");
            assert_eq!(
                answer["choices"][0]["message"]["content"], "Paris",
                "{policy} {p}: {answer}"
            );
        }
    }
    // Each provider's failures, as the rollout reports them; the rollout
    // answers either way.
    let cases = [
        ("empty", None),
        ("quota", Some("rate_limited")),
        ("limited", Some("rate_limited")),
        ("broken", Some("http_status")),
        ("malformed", Some("malformed")),
    ];
    for p in PROVIDERS {
        let mut asked = cases
            .iter()
            .map(|&(query, kind)| (p.to_string(), query, kind))
            .collect::<Vec<_>>();
        if *p != "searxng" {
            asked.push((format!("{p}-wrong"), "ok capital of France", Some("auth")));
        }
        for (backend, query, kind) in asked {
            let answer: Value =
                crate::common::post_json(&client, &url, &ask_for("search-r1", &backend, query))
                    .await;
            let results = &answer["seeker"]["rounds"][0]["results"][0];
            assert_eq!(results["query"], query, "{backend} {query}: {answer}");
            match kind {
                Some(kind) => {
                    assert_eq!(results["error_kind"], kind, "{backend} {query}: {answer}")
                }
                None => {
                    assert!(results.get("error").is_none(), "{backend}: {answer}");
                    assert_eq!(results["documents"], json!([]), "{backend}: {answer}");
                }
            }
            assert_eq!(
                answer["choices"][0]["message"]["content"], "Paris",
                "{backend} {query}: {answer}"
            );
        }
    }
}

/// A `fallback` whose first providers answer 429, 500 and "bad key" to every
/// request still searches and answers (on the fourth), a `merge` with a
/// broken member answers with the others' documents fused, and each
/// failure shows in the round's event and in `/metrics`; a list whose every
/// member fails gives the policy's failure text, not a failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn fallback_and_merge_survive_providers_that_always_fail() {
    let OverStubs {
        stub,
        server,
        log: _,
        client,
        chat: url,
        dir: _dir,
    } = over_stubs("").await;

    for policy in ["search-r1", "tool-search"] {
        let answer: Value = crate::common::post_json(&client, &url, &ask(policy, "fallback")).await;
        assert_eq!(
            answer["choices"][0]["message"]["content"], "Paris",
            "{answer}"
        );
        let results = &answer["seeker"]["rounds"][0]["results"][0];
        let docs = results["documents"].as_array().unwrap();
        assert_eq!(docs[0]["backend"], "exa", "{answer}");
        let failed: Vec<(&str, &str)> = results["failed_backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["backend"].as_str().unwrap(),
                    f["error_kind"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            failed,
            [
                ("limited", "rate_limited"),
                ("broken", "http_status"),
                ("wrongkey", "auth")
            ],
            "{answer}"
        );
    }

    // Streamed, the failures are in the results event.
    let mut streamed = ask("search-r1", "merge");
    streamed["stream"] = json!(true);
    let text = client
        .post(&url)
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let event = crate::http::sse_data(&text)
        .into_iter()
        .filter_map(|d| serde_json::from_str::<Value>(&d).ok())
        .find(|v| v["seeker"]["event"]["type"] == "results")
        .unwrap_or_else(|| panic!("no results event: {text}"));
    let event = &event["seeker"]["event"];
    assert_eq!(event["failed_backends"][0]["backend"], "broken", "{event}");
    let docs = event["documents"].as_array().unwrap();
    let backends: std::collections::BTreeSet<&str> = docs
        .iter()
        .map(|d| d["backend"].as_str().unwrap())
        .collect();
    assert_eq!(
        backends,
        ["google", "serper"].into(),
        "fused from both: {event}"
    );
    assert!(text.contains("Paris"), "{text}");

    // Every member failing: the rollout goes on with the failure text.
    let answer: Value = crate::common::post_json(&client, &url, &ask("search-r1", "down")).await;
    let results = &answer["seeker"]["rounds"][0]["results"][0];
    // Failed alike they would keep the kind; here they failed differently.
    assert_eq!(results["error_kind"], "backend", "{answer}");
    let error = results["error"].as_str().unwrap();
    assert!(
        error.contains("limited (rate_limited)") && error.contains("broken (http_status)"),
        "{answer}"
    );
    assert_eq!(
        results["failed_backends"].as_array().unwrap().len(),
        2,
        "{answer}"
    );
    assert!(answer["choices"][0]["message"]["content"].is_string());

    let metrics = crate::common::metrics_of(&client, &server.base).await;
    for line in [
        "seeker_search_errors_total{backend=\"limited\",kind=\"rate_limited\"}",
        "seeker_search_errors_total{backend=\"broken\",kind=\"http_status\"}",
        "seeker_search_errors_total{backend=\"wrongkey\",kind=\"auth\"}",
        "seeker_search_queries_total{backend=\"exa\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing in {metrics}");
    }
    assert!(stub.hits.load(Ordering::SeqCst) > 0);
}

/// No key, right or wrong, appears in the server's log (at debug level),
/// an answer, a streamed event, `/v1/models` or `/metrics`, while every
/// provider is asked, a wrong key is refused and providers fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn no_key_appears_in_logs_answers_events_or_metrics() {
    let OverStubs {
        stub: _,
        server,
        log,
        client,
        chat: url,
        dir: _dir,
    } = over_stubs("").await;
    let mut seen = String::new();
    let wrong = PROVIDERS[..6].iter().map(|p| format!("{p}-wrong"));
    for backend in PROVIDERS
        .iter()
        .map(|p| p.to_string())
        .chain(wrong)
        .chain(["limited", "broken", "fallback", "merge"].map(String::from))
    {
        for stream in [false, true] {
            let query = if stream {
                "leak"
            } else {
                "ok capital of France"
            };
            let mut body = ask_for("search-r1", &backend, query);
            body["stream"] = json!(stream);
            body["return_transcript"] = json!(true);
            let response = client.post(&url).json(&body).send().await.unwrap();
            seen += &response.text().await.unwrap();
        }
    }
    for path in ["/v1/models", "/metrics", "/health"] {
        seen += &client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }
    drop(server);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("search failed"),
        "the log holds the failures: {logged}"
    );
    assert!(seen.contains("refused the API key"), "{seen}");
    for key in PROVIDERS
        .iter()
        .map(|p| key_of(p))
        .chain(["WRONG-5ecret-key-0000".to_string()])
    {
        assert!(!logged.contains(&key), "{key} in the log");
        assert!(!seen.contains(&key), "{key} in an answer");
        // Nor a part long enough to recognise it.
        assert!(!logged.contains("5ecret"), "a key's part in the log");
        assert!(!seen.contains("5ecret"), "a key's part in an answer");
    }
}

/// A provider URL that redirects is not followed: the key never reaches the
/// server it points to (reqwest keeps custom headers across hosts), and the
/// query fails as `http_status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn a_redirect_is_not_followed_with_the_key() {
    let reached = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&reached);
    let target = serve(Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Json(results("brave", "x", 1))
        }
    }))
    .await;
    let location = format!("{target}/res/v1/web/search");
    let redirector = serve(Router::new().fallback(move || {
        let location = location.clone();
        async move {
            (
                StatusCode::FOUND,
                [(axum::http::header::LOCATION, location)],
            )
                .into_response()
        }
    }))
    .await;
    let brave = BackendConfig {
        url: Some(format!("{redirector}/res/v1/web/search")),
        api_key_env: Some("TEST_BRAVE_KEY".into()),
        ..BackendConfig::of(BackendKind::named("brave").unwrap())
    };
    let config = SearchConfig {
        index: shared_index().to_path_buf(),
        backends: [("brave".to_string(), brave)].into(),
        ..SearchConfig::default()
    };
    let d = seeker::search::dispatcher_from_config(&config, &Default::default(), env_keys).unwrap();
    let r = d
        .search_round(Some("brave"), &["ok x".to_string()], 2)
        .await;
    assert_eq!(kind(&r[0]), "http_status", "{:?}", r[0].result);
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

/// An environment variable that is not UTF-8 no longer crashes the start:
/// another program's is skipped; a `SEEKER_` one is an error naming it,
/// never printing its bytes.
#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn a_variable_that_is_not_utf8_is_named_or_skipped() {
    use std::os::unix::ffi::OsStringExt;
    let bad = std::ffi::OsString::from_vec(b"zz\xff\xfe-5ecret".to_vec());
    let out = Command::new(seeker_bin())
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .current_dir(crate::common::root())
        .env("SEEKER_SEARCH__DEFAULT", &bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("SEEKER_SEARCH__DEFAULT") && stderr.contains("not UTF-8"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("5ecret") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Another program's variable: the server starts (and is stopped).
    let mut child = Command::new(seeker_bin())
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .current_dir(crate::common::root())
        .env("SEEKER_SEARCH__INDEX", shared_index())
        .env("OTHER_PROGRAMS_VARIABLE", &bad)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = announced(&mut child, "seeker listening on ");
    assert!(base.starts_with("http://127.0.0.1:"));
    let _ = child.kill();
    let _ = child.wait();
}
