//! The HTTP surface through the router (`app(state).oneshot`), with a scripted
//! engine: wire shapes, streaming framing, and errors in OpenAI's shape.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use seeker::config::GenerationConfig;
use seeker::engine::scripted::ScriptedEngine;
use seeker::server::{app, AppState};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{doc, profiles, StaticBackend};

pub fn state(engine: Option<ScriptedEngine>) -> Arc<AppState> {
    let backend = StaticBackend::with(&[(
        "Mona Lisa painter",
        vec![doc("7", "Mona Lisa", "A portrait by Leonardo da Vinci.")],
    )]);
    let state = AppState::new(
        "test-model".into(),
        crate::common::dispatcher(backend),
        profiles(),
        "search-r1".into(),
        GenerationConfig::default(),
    );
    if let Some(engine) = engine {
        state.set_engine(Arc::new(engine.clone()), engine.text());
    }
    Arc::new(state)
}

pub fn script() -> ScriptedEngine {
    ScriptedEngine::new([
        vec![
            "<think>look it up</think>",
            "<search> Mona Lisa painter </search>",
        ],
        vec!["<answer> Leonardo", " da Vinci </answer>"],
    ])
}

pub async fn send(
    state: Arc<AppState>,
    method: &str,
    uri: &str,
    body: &str,
) -> (StatusCode, String) {
    send_bytes(state, method, uri, body.as_bytes().to_vec()).await
}

/// [`send`] with a body that need not be text.
async fn send_bytes(
    state: Arc<AppState>,
    method: &str,
    uri: &str,
    body: Vec<u8>,
) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app(state).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

pub fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let err = v["error"].clone();
    for key in ["message", "type", "code"] {
        assert!(err[key].is_string(), "error.{key} missing in {body}");
    }
    assert!(err.get("param").is_some(), "error.param missing in {body}");
    err
}

fn chat_body(stream: bool) -> String {
    json!({
        "model": "test-model",
        "stream": stream,
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}],
        "some_future_field": {"ignored": true}
    })
    .to_string()
}

#[tokio::test]
async fn non_streamed_completion_has_openai_shape_and_trace() {
    let (status, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &chat_body(false),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "test-model");
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Leonardo da Vinci");
    assert_eq!(choice["finish_reason"], "stop");
    let reasoning = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(reasoning.contains(
        "<search> Mona Lisa painter </search>\n\n<information>Doc 1(Title: \"Mona Lisa\")"
    ));
    assert_eq!(v["seeker"]["searches"], 1);
    assert_eq!(v["seeker"]["documents"][0]["title"], "Mona Lisa");
    let usage = &v["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage["completion_tokens"], 4);
}

/// Parses an SSE body into its `data:` payloads.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .filter_map(|frame| {
            let data: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

#[tokio::test]
async fn streamed_completion_is_chunks_then_done_and_matches_non_streamed() {
    let (status, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &chat_body(true),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["seeker"]["searches"], 1);
    // Search events arrive as they happen; spliced text is marked as such.
    let events: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["seeker"]["event"]["type"].as_str())
        .collect();
    assert_eq!(events, ["search", "results", "splice", "round", "round"]);
    // Each round's end says how it ended and what it generated.
    let rounds: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["seeker"]["event"]["type"] == "round")
        .map(|c| &c["seeker"]["event"])
        .collect();
    assert_eq!(rounds[0]["round"], 1);
    assert_eq!(rounds[0]["outcome"], "search");
    assert_eq!(rounds[0]["tokens_generated"], 2);
    assert_eq!(rounds[1]["round"], 2);
    assert_eq!(rounds[1]["outcome"], "answer");
    // A results event carries what a UI shows of each document while the
    // rollout runs: passage and score too.
    let results = &chunks
        .iter()
        .find(|c| c["seeker"]["event"]["type"] == "results")
        .unwrap()["seeker"]["event"];
    assert_eq!(results["query"], "Mona Lisa painter");
    assert_eq!(results["backend"], "static");
    assert_eq!(results["documents"][0]["title"], "Mona Lisa");
    assert_eq!(
        results["documents"][0]["text"],
        "A portrait by Leonardo da Vinci."
    );
    assert!(results["documents"][0]["score"].is_number());
    let splice = chunks
        .iter()
        .find(|c| c["seeker"]["event"]["type"] == "splice")
        .unwrap();
    assert!(splice["choices"][0]["delta"]["reasoning_content"]
        .as_str()
        .unwrap()
        .starts_with("\n\n<information>Doc 1"));

    let (_, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &chat_body(false),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        content,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        reasoning,
        v["choices"][0]["message"]["reasoning_content"]
            .as_str()
            .unwrap()
    );
}

#[tokio::test]
async fn models_answers_to_its_id_and_default_only() {
    let (status, body) = send(state(None), "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["id"], "test-model");
    assert_eq!(v["data"][0]["policy"], "search-r1");
    // What a client (the web UI) needs to fill its request settings.
    assert_eq!(v["data"][0]["search_backends"], json!(["static"]));
    assert_eq!(v["data"][0]["default_search_backend"], "static");
    let generation = GenerationConfig::default();
    assert_eq!(v["data"][0]["max_tokens"], generation.max_tokens);
    assert_eq!(
        v["data"][0]["max_tokens_limit"],
        generation.max_tokens_limit
    );
    assert!(v["data"][0]["policies"]
        .as_array()
        .unwrap()
        .contains(&json!("rag-r1-mq")));
    for id in ["test-model", "default"] {
        let (status, _) = send(state(None), "GET", &format!("/v1/models/{id}"), "").await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = send(state(None), "GET", "/v1/models/gpt-4", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body)["code"], "model_not_found");
    // A huge id is not echoed back whole.
    let huge = "m".repeat(15_000);
    let (status, body) = send(state(None), "GET", &format!("/v1/models/{huge}"), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.len() < 1_000, "{} bytes", body.len());
    // An id that does not decode to UTF-8 gets the API's error shape too.
    let (status, body) = send(state(None), "GET", "/v1/models/%FF", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["param"], "id");

    let body =
        json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, body) = send(state(Some(script())), "POST", "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body)["param"], "model");
}

#[tokio::test]
async fn health_is_503_until_the_model_is_loaded() {
    let (status, body) = send(state(None), "GET", "/health", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body)["code"], "model_loading");
    let (status, _) = send(state(Some(script())), "GET", "/health", "").await;
    assert_eq!(status, StatusCode::OK);
}

/// A body that is not UTF-8, or a string escape that is no Unicode
/// character, is named as such (before: "messages[0].content: has the wrong
/// type").
#[tokio::test]
async fn text_that_is_not_unicode_is_named() {
    let mut body = br#"{"messages": [{"role": "user", "content": "caf"#.to_vec();
    body.extend_from_slice(b"\xe9\"}]}");
    let (status, answer) =
        send_bytes(state(Some(script())), "POST", "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = error_of(&answer);
    assert_eq!(err["code"], "invalid_json");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("not valid UTF-8 (byte 46)"),
        "{err}"
    );

    let (status, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "lone \ud800 half"}]}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = error_of(&body);
    assert_eq!(err["param"], "messages[0].content");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("is not valid Unicode text"),
        "{err}"
    );
}

#[tokio::test]
async fn bad_requests_get_openai_errors_naming_the_field() {
    let cases: &[(&str, StatusCode, &str, Option<&str>)] = &[
        ("{not json", StatusCode::BAD_REQUEST, "invalid_json", None),
        (
            r#"{"messages": [{"role": "user", "content": "q"}]} trailing"#,
            StatusCode::BAD_REQUEST,
            "invalid_json",
            None,
        ),
        ("", StatusCode::BAD_REQUEST, "invalid_json", None),
        ("[1, 2]", StatusCode::BAD_REQUEST, "invalid_json", None),
        // A final assistant message neither continued nor answered (issue 48).
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages[1]"),
        ),
        (
            r#"{"model": "default"}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}], "max_tokens": "ten"}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("max_tokens"),
        ),
        (
            r#"{"messages": [{"role": "wizard", "content": "q"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages[0].role"),
        ),
        (
            r#"{"messages": [{"role": 5, "content": "q"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages[0].role"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}], "temperature": 7}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("temperature"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}], "n": 2}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("n"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("max_tokens"),
        ),
        (
            r#"{"messages": []}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages"),
        ),
        (
            r#"{"messages": [{"role": "system", "content": "only a system prompt"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages"),
        ),
        // A user message without text is named (before: `messages`).
        (
            r#"{"messages": [{"role": "system", "content": "s"}, {"role": "user"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages[1].content"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_value",
            Some("messages[0].content"),
        ),
    ];
    for (body, status, code, param) in cases {
        let (got, text) = send(state(Some(script())), "POST", "/v1/chat/completions", body).await;
        assert_eq!(got, *status, "{body} -> {text}");
        let err = error_of(&text);
        assert_eq!(err["code"], *code, "{body} -> {text}");
        if let Some(param) = param {
            assert_eq!(err["param"], *param, "{body} -> {text}");
        }
    }
}

#[tokio::test]
async fn text_parts_are_accepted_as_content() {
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Who painted "}, {"type": "text", "text": "the Mona Lisa?"}]}]}).to_string();
    let (status, text) = send(state(Some(script())), "POST", "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let (status, body) = send(state(None), "GET", "/v1/nothing", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body)["code"], "unknown_url");
    let (status, body) = send(state(None), "GET", "/v1/chat/completions", "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&body)["code"], "method_not_allowed");
}

#[tokio::test]
async fn oversized_bodies_get_a_json_413() {
    let question = "x".repeat(3 * 1024 * 1024);
    let body = json!({"messages": [{"role": "user", "content": question}]}).to_string();
    let (status, text) = send(state(Some(script())), "POST", "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_of(&text)["code"], "payload_too_large");
}

#[tokio::test]
async fn error_messages_speak_json_not_rust() {
    for (body, param, phrase) in [
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
            "messages[0].content",
            "a text part needs a `text` string",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 42}]}"#,
            "messages[0].content",
            "must be a string or an array",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}], "max_tokens": "ten"}"#,
            "max_tokens",
            "expected a non-negative integer",
        ),
        (
            r#"{"messages": {"role": "user"}}"#,
            "messages",
            "invalid type: object, expected an array",
        ),
    ] {
        let (status, text) =
            send(state(Some(script())), "POST", "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let err = error_of(&text);
        assert_eq!(err["param"], param, "{text}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains(phrase), "{body}: {message}");
        for rust in ["u32", "f64", "untagged", "sequence", "struct"] {
            assert!(!message.contains(rust), "{body}: {message}");
        }
    }
}

#[tokio::test]
async fn include_usage_adds_one_usage_chunk_before_done() {
    let with = json!({
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    });
    let (_, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &with.to_string(),
    )
    .await;
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let usage_chunk: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 4);
    let usage_chunks = data.iter().filter(|d| d.contains("\"usage\"")).count();
    assert_eq!(usage_chunks, 1);

    let (_, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &chat_body(true),
    )
    .await;
    assert!(!body.contains("\"usage\""), "{body}");

    // Streamed and non-streamed usage agree.
    let (_, body) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &chat_body(false),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"], usage_chunk["usage"]);
}

#[tokio::test]
async fn stop_cuts_the_answer_but_never_the_search_rounds() {
    // "Vinci" appears in the reasoning and in the document too: only the
    // answer is cut.
    let engine = ScriptedEngine::new([
        vec![
            "<think>da Vinci? check</think>",
            "<search> Mona Lisa painter </search>",
        ],
        vec!["<answer> Leonardo da", " Vinci, the painter </answer>"],
    ]);
    let body = json!({
        "stop": [" Vinci", "zzz"],
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    });
    let (status, text) = send(
        state(Some(engine)),
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Leonardo da");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let reasoning = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    assert!(
        reasoning.contains("<think>da Vinci? check</think>"),
        "{reasoning}"
    );
    assert!(reasoning.contains("Leonardo da Vinci."), "{reasoning}");
    assert_eq!(v["seeker"]["searches"], 1);

    // Streamed: the same answer, and no piece of the stop string is sent.
    let engine = ScriptedEngine::new([
        vec!["<search> Mona Lisa painter </search>"],
        vec!["<answer> Leonardo da V", "inci </answer>"],
    ]);
    let body = json!({
        "stream": true,
        "stop": " Vinci",
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    });
    let (_, text) = send(
        state(Some(engine)),
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await;
    let content: String = sse_data(&text)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(content, "Leonardo da");
}

#[tokio::test]
async fn stop_and_seed_are_validated_like_openai() {
    for (extra, param) in [
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"stop": [""]}), "stop"),
        (json!({"stop": 3}), "stop"),
        (json!({"seed": "x"}), "seed"),
        (json!({"n": 2}), "n"),
    ] {
        let mut body = json!({"messages": [{"role": "user", "content": "q"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, text) = send(
            state(Some(script())),
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert_eq!(error_of(&text)["param"], param, "{text}");
    }
    // A seed is accepted (greedy decoding is the reproducible mode).
    let body = json!({"seed": 7, "user": "u1", "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]});
    let (status, text) = send(
        state(Some(script())),
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn the_committed_openapi_spec_is_the_generated_one() {
    let committed = std::fs::read_to_string(crate::common::root().join("static/openapi.json"))
        .expect("static/openapi.json exists");
    let generated = seeker::server::api_doc::openapi_json();
    assert!(
        committed == generated,
        "static/openapi.json is stale: run `cargo run -- openapi > static/openapi.json`"
    );
    let (status, served) = send(state(None), "GET", "/openapi.json", "").await;
    assert_eq!(status, StatusCode::OK);
    let served: Value = serde_json::from_str(&served).unwrap();
    let generated: Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(served, generated);
    for path in [
        "/v1/chat/completions",
        "/v1/models",
        "/retrieve",
        "/search",
        "/batch_search",
        "/queries",
        "/health",
        "/metrics",
    ] {
        assert!(generated["paths"][path].is_object(), "{path} undocumented");
    }
    // The docs page is served from the binary (no CDN).
    let (status, page) = send(state(None), "GET", "/docs/", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("swagger"), "{page}");
    assert!(
        !page.contains("https://"),
        "the docs page must work offline"
    );
}

#[tokio::test]
async fn arrays_are_not_accepted_where_objects_belong() {
    for (body, param) in [
        (
            json!({"messages": [{"role": "user", "content": "q"}], "search": [null, null]}),
            "search",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"}], "stream_options": [true]}),
            "stream_options",
        ),
        (json!({"messages": [["user", "q"]]}), "messages[0]"),
        (
            json!({"messages": [{"role": "user", "content": [["text", "q"]]}]}),
            "messages[0].content[0]",
        ),
    ] {
        let (status, text) = send(
            state(Some(script())),
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert_eq!(error_of(&text)["param"], param, "{text}");
    }
}

/// A continued message with a search call nothing answered, followed by more
/// text, is refused up front with a 400 naming the message — streamed or not —
/// before any search or generation: the client's text would otherwise be
/// dropped (the rollout restarts from the call) or trusted without documents.
#[tokio::test]
async fn a_continued_message_with_an_unanswered_call_then_text_is_a_400() {
    for stream in [false, true] {
        let engine = script();
        let prompts = engine.clone();
        let body = json!({
            "stream": stream,
            "continue_final_message": true,
            "messages": [
                {"role": "user", "content": "Who painted the Mona Lisa?"},
                {"role": "assistant", "content":
                    "<think>look</think><search> Mona Lisa painter </search> I think it was Leonardo."}
            ]
        })
        .to_string();
        let (status, text) = send(state(Some(engine)), "POST", "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "stream {stream}: {text}");
        let err = error_of(&text);
        assert_eq!(err["param"], "messages[1].content", "{text}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains("Mona Lisa painter"), "{message}");
        assert!(message.contains("<information>"), "{message}");
        assert!(
            prompts.prompts().is_empty(),
            "the engine ran: {:?}",
            prompts.prompts()
        );
    }
    // A tool-calling policy's message with a tool response inline would be
    // cut at the response: refused, pointing at `tool` messages.
    let body = json!({
        "policy": "tool-search",
        "continue_final_message": true,
        "messages": [
            {"role": "user", "content": "Who painted the Mona Lisa?"},
            {"role": "assistant", "content": "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Mona Lisa\"}}\n</tool_call>\n<tool_response>\nDoc 1 x\n</tool_response>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Leonardo\"}}\n</tool_call>"}
        ]
    })
    .to_string();
    let engine = script();
    let prompts = engine.clone();
    let (status, text) = send(state(Some(engine)), "POST", "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let err = error_of(&text);
    assert_eq!(err["param"], "messages[1].content", "{text}");
    assert!(
        err["message"].as_str().unwrap().contains("`tool` message"),
        "{text}"
    );
    assert!(prompts.prompts().is_empty());
}
