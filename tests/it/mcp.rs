//! `/mcp` through the router with a scripted engine: the JSON-RPC exchange an
//! MCP client makes (initialize, tools/list, tools/call of `search` and
//! `research`), and every refusal in the API's error shape (another host, a
//! GET, a body that is not JSON, a missing `Accept`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use seeker::server::{app, AppState};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::http::{error_of, script, state};

const ACCEPT: &str = "application/json, text/event-stream";

async fn call(
    state: Arc<AppState>,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::builder().method(method).uri("/mcp");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = app(state)
        .oneshot(request.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

/// One JSON-RPC request as an MCP client sends it; the `result` (or the
/// whole body when there is none).
async fn rpc(state: Arc<AppState>, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let (status, _, text) = call(
        state,
        "POST",
        &[
            ("host", "localhost:8080"),
            ("content-type", "application/json"),
            ("accept", ACCEPT),
        ],
        &body.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["id"], 1);
    v.get("result").cloned().unwrap_or(v)
}

#[tokio::test]
async fn a_client_initializes_lists_the_tools_and_calls_both() {
    let state = state(Some(script()));
    let init = rpc(
        Arc::clone(&state),
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}),
    )
    .await;
    assert_eq!(init["serverInfo"]["name"], "seeker");
    assert!(init["capabilities"]["tools"].is_object());

    let tools = rpc(Arc::clone(&state), "tools/list", json!({})).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"search") && names.contains(&"research"));

    let found = rpc(
        Arc::clone(&state),
        "tools/call",
        json!({"name": "search", "arguments": {"queries": ["Mona Lisa painter", "nothing"]}}),
    )
    .await;
    assert_eq!(found["isError"], false, "{found}");
    let results = &found["structuredContent"]["results"];
    assert_eq!(results[0]["query"], "Mona Lisa painter");
    assert_eq!(results[0]["documents"][0]["title"], "Mona Lisa");
    assert_eq!(results[0]["documents"][0]["url"], "seeker://static/7");
    assert_eq!(results[1]["documents"], json!([]));
    // The same as JSON text, for clients that read only `content`.
    let text: Value = serde_json::from_str(found["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, found["structuredContent"]);

    let answer = rpc(
        Arc::clone(&state),
        "tools/call",
        json!({"name": "research", "arguments": {"question": "Who painted the Mona Lisa?"}}),
    )
    .await;
    let out = &answer["structuredContent"];
    assert_eq!(out["answer"], "Leonardo da Vinci", "{answer}");
    assert_eq!(out["finish_reason"], "stop");
    assert_eq!(out["searches"], 1);
    assert_eq!(
        out["citations"],
        json!([{"start_index": 0, "end_index": 17, "title": "Mona Lisa",
            "url": "seeker://static/7"}])
    );
}

#[tokio::test]
async fn bad_arguments_are_tool_errors_that_say_what_is_wrong() {
    let state = state(Some(script()));
    let cases = [
        ("search", json!({"queries": []}), "queries"),
        ("search", json!({"queries": ["a"], "top_k": 0}), "top_k"),
        (
            "search",
            json!({"queries": ["a"], "backend": "nope"}),
            "unknown search backend",
        ),
        ("search", json!({"queries": "a"}), "expected a sequence"),
        ("research", json!({"question": " "}), "question"),
        (
            "research",
            json!({"question": "q", "policy": "nope"}),
            "unknown policy",
        ),
        (
            "research",
            json!({"question": "q", "max_tokens": 0}),
            "max_tokens",
        ),
    ];
    for (tool, arguments, says) in cases {
        let r = rpc(
            Arc::clone(&state),
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
        .await;
        assert_eq!(r["isError"], true, "{tool} {arguments}: {r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{tool} {arguments}: {text}");
    }
    let unknown = rpc(
        state,
        "tools/call",
        json!({"name": "nope", "arguments": {}}),
    )
    .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}

#[tokio::test]
async fn the_transports_refusals_come_in_the_apis_error_shape() {
    let state = state(Some(script()));
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let json_headers = [
        ("host", "127.0.0.1:9"),
        ("content-type", "application/json"),
        ("accept", ACCEPT),
    ];

    // A page on another site that rebinds its name to 127.0.0.1.
    let (status, _, body) = call(
        Arc::clone(&state),
        "POST",
        &[
            ("host", "attacker.example"),
            ("content-type", "application/json"),
            ("accept", ACCEPT),
        ],
        &list,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(error_of(&body)["code"], "host_not_allowed");

    let (status, headers, body) = call(
        Arc::clone(&state),
        "GET",
        &[("host", "localhost"), ("accept", ACCEPT)],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST");
    assert_eq!(error_of(&body)["code"], "method_not_allowed");

    let (status, _, body) = call(Arc::clone(&state), "POST", &json_headers, "{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], -32700, "{body}");
    assert_eq!(v["id"], Value::Null);

    let (status, _, body) = call(
        Arc::clone(&state),
        "POST",
        &[("host", "[::1]:8080"), ("content-type", "application/json")],
        &list,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(error_of(&body)["code"], "not_acceptable");

    // `Accept` split over two headers is the same list.
    let (status, _, body) = call(
        Arc::clone(&state),
        "POST",
        &[
            ("host", "localhost"),
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("accept", "text/event-stream"),
        ],
        &list,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, _, body) = call(
        state,
        "POST",
        &[
            ("host", "localhost"),
            ("content-type", "text/plain"),
            ("accept", ACCEPT),
        ],
        &list,
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(error_of(&body)["code"], "unsupported_media_type");
}

/// Issue 48: ids that are not request ids and non-object arguments get the
/// JSON-RPC errors they call for, not an empty 202 or "method not found".
#[tokio::test]
async fn malformed_ids_and_arguments_get_json_rpc_errors() {
    let state = state(Some(script()));
    let headers = [
        ("host", "localhost:8080"),
        ("content-type", "application/json"),
        ("accept", ACCEPT),
    ];
    for id in [
        json!({"a": 1}),
        json!(null),
        json!([1]),
        json!(1.5),
        json!(true),
        json!(9_223_372_036_854_775_808_u64),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        let (status, _, text) = call(Arc::clone(&state), "POST", &headers, &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], -32600, "{id}: {text}");
        assert_eq!(v["id"], Value::Null);
    }
    for arguments in [json!(["a"]), json!("a"), json!(3)] {
        let body = json!({"jsonrpc": "2.0", "id": "x7", "method": "tools/call",
            "params": {"name": "search", "arguments": arguments}});
        let (status, _, text) = call(Arc::clone(&state), "POST", &headers, &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], -32602, "{arguments}: {text}");
        assert_eq!(v["id"], "x7");
    }
    // Messages that are JSON but no valid request: -32600 (they got
    // -32700, "not JSON", or an empty 202), with the id when it is valid.
    for (body, id) in [
        (
            r#"[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]"#,
            Value::Null,
        ),
        (r#""tools/list""#, Value::Null),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "tools/list"}"#,
            Value::Null,
        ),
        (
            r#"{"jsonrpc": "1.0", "id": 5, "method": "tools/list"}"#,
            json!(5),
        ),
        (r#"{"id": 5, "method": "tools/list"}"#, json!(5)),
        (r#"{"jsonrpc": "2.0", "id": 5}"#, json!(5)),
        (r#"{"jsonrpc": "2.0", "id": 5, "method": 3}"#, json!(5)),
        // A repeated key inside params too; a response without an id.
        (
            r#"{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "search", "name": "research"}}"#,
            Value::Null,
        ),
        (r#"{"jsonrpc": "2.0", "result": {}}"#, Value::Null),
    ] {
        let (status, _, text) = call(Arc::clone(&state), "POST", &headers, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], -32600, "{body}: {text}");
        assert_eq!(v["id"], id, "{body}: {text}");
    }
    // tools/call without a tool name: -32602 (it was -32601, "method not found").
    let nameless = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"arguments": {"queries": ["x"]}}});
    let (status, _, text) = call(Arc::clone(&state), "POST", &headers, &nameless.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], -32602, "{text}");
    for params in [json!("x"), json!([1])] {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": params});
        let (status, _, text) = call(Arc::clone(&state), "POST", &headers, &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], -32602, "{params}: {text}");
        assert_eq!(v["id"], 9);
    }
    // A response to the server (result, no method) is passed on.
    let response = json!({"jsonrpc": "2.0", "id": 3, "result": {}});
    let (status, _, text) = call(Arc::clone(&state), "POST", &headers, &response.to_string()).await;
    assert!(status.is_success(), "{status}: {text}");
    // A notification (no id) is still a 202, a string id still answered.
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, _) = call(Arc::clone(&state), "POST", &headers, &note.to_string()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let list = json!({"jsonrpc": "2.0", "id": "req-1", "method": "tools/list"});
    let (status, _, text) = call(state, "POST", &headers, &list.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("\"id\":\"req-1\""), "{text}");
}
