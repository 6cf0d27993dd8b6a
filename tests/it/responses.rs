//! `POST /v1/responses` through the router with a scripted engine: the
//! output items of a search rollout, the streamed event sequence and its
//! agreement with the non-streamed object, citations, and errors naming the
//! Responses request's own fields.

use axum::http::StatusCode;
use seeker::engine::scripted::ScriptedEngine;
use serde_json::{json, Value};

use crate::http::{error_of, script, send, state};

fn body(extra: Value) -> String {
    let mut b = json!({
        "model": "test-model",
        "input": "Who painted the Mona Lisa?",
        "tools": [{"type": "web_search"}],
        "include": ["web_search_call.action.sources"],
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

async fn respond(engine: ScriptedEngine, extra: Value) -> (StatusCode, String) {
    send(state(Some(engine)), "POST", "/v1/responses", &body(extra)).await
}

/// The `event:` name and `data:` JSON of each SSE frame.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        .map(|frame| {
            let mut name = String::new();
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {frame}"));
            (name, v)
        })
        .collect()
}

/// A response with its ids blanked, to compare two runs.
fn without_ids(mut v: Value) -> Value {
    v["id"] = json!("");
    v["created_at"] = json!(0);
    if let Some(items) = v["output"].as_array_mut() {
        for item in items {
            item["id"] = json!("");
        }
    }
    v
}

#[tokio::test]
async fn a_response_holds_reasoning_one_search_call_per_round_and_a_cited_message() {
    let (status, body) = respond(script(), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(v["status"], "completed");
    assert_eq!(v["store"], false);
    assert_eq!(v["model"], "test-model");
    assert_eq!(v["tools"], json!([{"type": "web_search"}]));
    let output = v["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"reasoning"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message"), "{kinds:?}");
    let searches: Vec<&Value> = output
        .iter()
        .filter(|i| i["type"] == "web_search_call")
        .collect();
    assert_eq!(searches.len(), 1, "{kinds:?}");
    let call = searches[0];
    assert_eq!(call["status"], "completed");
    assert!(call["id"].as_str().unwrap().starts_with("ws_"));
    assert_eq!(
        call["action"],
        json!({"type": "search", "query": "Mona Lisa painter",
            "queries": ["Mona Lisa painter"],
            "sources": [{"type": "url", "url": "seeker://static/7"}]})
    );
    assert!(output[0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("<search> Mona Lisa painter </search>"));
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    let message = output.last().unwrap();
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    let text = &message["content"][0];
    assert_eq!(text["type"], "output_text");
    assert_eq!(text["text"], "Leonardo da Vinci");
    // The only document holds the answer: it is cited over the whole answer.
    assert_eq!(
        text["annotations"],
        json!([{"type": "url_citation", "start_index": 0, "end_index": 17,
            "title": "Mona Lisa", "url": "seeker://static/7"}])
    );
    let usage = &v["usage"];
    assert_eq!(usage["output_tokens"], 4);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + 4
    );
    // Round 1 (2 tokens) led to the answer; round 2's tokens are output.
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 2);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v["seeker"]["searches"], 1);
}

#[tokio::test]
async fn sources_are_only_listed_when_included() {
    let (_, body) = respond(script(), json!({"include": []})).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "web_search_call")
        .unwrap()
        .clone();
    assert!(call["action"].get("sources").is_none(), "{call}");
}

#[tokio::test]
async fn the_stream_is_the_documented_event_sequence_and_ends_in_the_same_response() {
    let (status, body) = respond(script(), json!({"stream": true})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains("[DONE]"));
    let events = events(&body);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "event name and type agree");
        assert_eq!(data["sequence_number"], i, "sequence numbers count from 0");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], &["response.created", "response.in_progress"]);
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(names.last(), Some(&"response.completed"));

    // Every item: added, its own events, done; indices in output order.
    let mut open: Option<(usize, String)> = None;
    let mut done = 0;
    for (name, data) in &events {
        match name.as_str() {
            "response.output_item.added" => {
                assert!(open.is_none(), "one item at a time");
                assert_eq!(data["output_index"], done);
                open = Some((done, data["item"]["id"].as_str().unwrap().to_string()));
            }
            "response.output_item.done" => {
                let (index, id) = open.take().expect("done after added");
                assert_eq!(data["output_index"], index);
                assert_eq!(data["item"]["id"], id.as_str());
                done += 1;
            }
            "response.created" | "response.in_progress" | "response.completed" => {
                assert!(open.is_none())
            }
            _ => {
                let (index, id) = open.as_ref().expect("item events inside an item");
                assert_eq!(data["output_index"], *index, "{name}");
                assert_eq!(data["item_id"], id.as_str(), "{name}");
            }
        }
    }
    let search: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("response.web_search_call."))
        .collect();
    assert_eq!(
        search,
        [
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed"
        ]
    );
    let answer: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(answer, "Leonardo da Vinci");
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("response.output_text.annotation.added") < at("response.output_text.done"));
    let added = &events[at("response.output_text.annotation.added")].1;
    assert_eq!(added["annotation_index"], 0);
    assert_eq!(added["annotation"]["type"], "url_citation");

    // The last event's response is what the non-streamed request returns,
    // to the digit (document scores are f32).
    let (_, body) = respond(script(), json!({"stream": true, "return_transcript": true})).await;
    let streamed = crate::responses::events(&body).last().unwrap().1["response"].clone();
    let (_, body) = respond(script(), json!({"return_transcript": true})).await;
    let plain: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(without_ids(streamed), without_ids(plain));
}

#[tokio::test]
async fn a_spent_budget_is_an_incomplete_response() {
    let (status, body) = respond(script(), json!({"max_output_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(
        v["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(v["max_output_tokens"], 1);
    let message = v["output"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(message["type"], "message");
    assert_eq!(message["status"], "incomplete");

    let (_, body) = respond(script(), json!({"max_output_tokens": 1, "stream": true})).await;
    let events = events(&body);
    assert_eq!(events.last().unwrap().0, "response.incomplete");
}

#[tokio::test]
async fn conversations_come_as_items_and_earlier_output_items_are_skipped() {
    let input = json!([
        {"role": "user", "content": "Who painted it?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
            "action": {"type": "search", "query": "q"}},
        {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Which painting?", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "The Mona Lisa."}]},
    ]);
    let (status, body) = respond(
        script(),
        json!({"input": input, "instructions": "Be brief.", "return_transcript": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["status"], "completed");
}

#[tokio::test]
async fn bad_requests_name_the_responses_field() {
    let cases = [
        (
            json!({"previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"tools": [{"type": "file_search"}]}), "tools[0]"),
        (json!({"tool_choice": "none"}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"include": ["bogus"]}), "include[0]"),
        (json!({"input": 42}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": [7]}), "input[0]"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image",
            "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": [{"role": "wizard", "content": "hi"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"type": "computer_call_output", "output": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"role": "assistant", "content": "hi"}]}),
            "input",
        ),
        (
            json!({"instructions": "x", "input": [{"role": "user", "content": " "}]}),
            "input[0].content",
        ),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (json!({"model": "other"}), "model"),
        (json!({"search": [1]}), "search"),
    ];
    for (extra, param) in cases {
        let (status, body) = respond(script(), extra.clone()).await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{extra}: {status} {body}"
        );
        let err = error_of(&body);
        assert_eq!(err["param"], param, "{extra}: {body}");
        let message = err["message"].as_str().unwrap();
        assert!(!message.contains("messages"), "{extra}: {message}");
        assert!(
            !message.contains("max_completion_tokens"),
            "{extra}: {message}"
        );
    }
}

fn weather() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Current weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

#[tokio::test]
async fn a_function_call_ends_the_response_and_its_output_comes_back_as_input() {
    let call = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
    let tools = json!([{"type": "web_search"}, weather()]);
    let (status, body) = respond(
        ScriptedEngine::new([vec![call]]),
        json!({"input": "Weather in Paris?", "tools": tools}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "completed");
    let output = v["output"].as_array().unwrap();
    let last = output.last().unwrap();
    assert_eq!(last["type"], "function_call", "{body}");
    assert_eq!(last["name"], "get_weather");
    assert_eq!(last["status"], "completed");
    assert!(last["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = last["call_id"].as_str().unwrap().to_string();
    assert!(call_id.starts_with("call_"));
    let arguments: Value = serde_json::from_str(last["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert!(output.iter().all(|i| i["type"] != "message"));

    // The client runs it and sends the call and its output back.
    let engine = ScriptedEngine::new([vec!["It is 18 degrees in Paris."]]);
    let input = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call_id, "name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": call_id, "output": "18 degrees"},
    ]);
    let (status, body) = respond(engine.clone(), json!({"input": input, "tools": tools})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let message = v["output"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(message["content"][0]["text"], "It is 18 degrees in Paris.");
    let prompt = &engine.prompts()[0];
    assert!(
        prompt.contains("<|im_start|>tool\n18 degrees<|im_end|>"),
        "{prompt}"
    );

    // Streamed: the call's arguments come as their own events.
    let (_, body) = respond(
        ScriptedEngine::new([vec![call]]),
        json!({"input": "Weather in Paris?", "tools": tools, "stream": true}),
    )
    .await;
    let names: Vec<String> = events(&body).into_iter().map(|(n, _)| n).collect();
    let at = |name: &str| names.iter().position(|n| n == name).unwrap();
    assert!(
        at("response.function_call_arguments.delta") < at("response.function_call_arguments.done")
    );
    assert_eq!(names.last().unwrap(), "response.completed");
}

#[tokio::test]
async fn function_tool_errors_name_the_responses_fields() {
    let cases = [
        (
            json!({"tools": [{"type": "web_search"}, {"type": "function"}]}),
            "tools[1].name",
        ),
        (
            json!({"tools": [{"type": "web_search"}, {"type": "function", "name": "search"}]}),
            "tools[1].name",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "name": "nope"}}),
            "tool_choice",
        ),
        (
            json!({"input": [{"role": "user", "content": "q"},
            {"type": "function_call_output", "output": "x"}]}),
            "input[1].call_id",
        ),
        // Calls and outputs pair up, named in the Responses request's terms
        // (issue 48: they were named as chat messages' `tool_calls`).
        (
            json!({"input": [{"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x"}]}),
            "input[2]",
        ),
        (
            json!({"input": [{"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c9", "output": "x"}]}),
            "input[2].call_id",
        ),
        (
            json!({"input": [{"role": "user", "content": "q"},
            {"type": "function_call_output", "call_id": "c1", "output": "x"}]}),
            "input[1]",
        ),
    ];
    for (extra, param) in cases {
        let (status, body) = respond(script(), extra.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {body}");
        assert_eq!(error_of(&body)["param"], param, "{extra}: {body}");
        let message = error_of(&body)["message"].as_str().unwrap().to_string();
        assert!(
            !message.contains("tool_call") && !message.contains("messages["),
            "chat words in a Responses error: {message}"
        );
    }
}
