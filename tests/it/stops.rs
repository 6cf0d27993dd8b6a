//! Servers asked to stop at the round's stop strings (issue 26): the remote
//! engine sends them so the server stops at once, and each server hands the
//! matched stop string back its own way. In-test servers script one model
//! and stream it as llama-server (the stop string's tokens come as ids with
//! empty text and the text is dropped; `/detokenize` reads them back), vLLM
//! (`include_stop_str_in_output`: the text is kept but cut after the stop,
//! with `token_ids` and `stop_reason`) and SGLang (the text dropped, no ids,
//! `matched_stop`) do. Through the real binary, each gives the same
//! transcript, and the next round's token prompt holds every generated id
//! with its text, once. A server whose `/detokenize` fails costs one round
//! and gets no stop strings after; one that writes past `max_tokens` is cut.

use std::sync::{Arc, Mutex};

use axum::routing::{get, post};
use serde_json::{json, Value};

use crate::common::post_json;
use crate::remote::{seeker_on, serve};

/// How a server streams a round that reaches a stop string.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flavour {
    Llama,
    Vllm,
    Sglang,
    /// llama-server's stream, and a `/detokenize` that fails.
    LlamaUnreadable,
}

/// The scripted model's tokens for the first round (the stop string ends
/// inside the token `>\n\n`, and its first part shares a token with `?`)...
const SEARCH: &[&str] = &[
    "<think>",
    "I will search.",
    "</think>\n",
    "<",
    "search",
    "> capital of France",
    "?</",
    "search",
    ">\n\n",
    "more",
];
/// ...and for the round after the splice.
const ANSWER: &[&str] = &["<answer>", " Paris", "</", "answer", ">", "<|im_end|>"];

/// A token's id: [`TOKEN`] + its place in `SEARCH` then `ANSWER`; smaller
/// ids are single characters, by code point (what `/tokenize` gives).
const TOKEN: u64 = 2_000_000;

fn vocabulary() -> Vec<&'static str> {
    SEARCH.iter().chain(ANSWER).copied().collect()
}

fn detokenize(ids: &[u64]) -> String {
    let vocabulary = vocabulary();
    ids.iter()
        .map(|&id| match id {
            TOKEN.. => vocabulary[(id - TOKEN) as usize].to_string(),
            _ => char::from_u32(id as u32).unwrap().to_string(),
        })
        .collect()
}

/// One `data:` line of a completions stream.
fn chunk(flavour: Flavour, text: &str, id: Option<u64>, finish: Option<&str>) -> String {
    let mut choice = json!({"text": text, "index": 0, "finish_reason": finish});
    match (flavour, id) {
        (Flavour::Llama | Flavour::LlamaUnreadable, Some(id)) => {
            choice["logprobs"] = json!({"content": [{"id": id, "token": text, "logprob": 0.0}]})
        }
        (Flavour::Vllm, Some(id)) => choice["token_ids"] = json!([id]),
        _ => {}
    }
    format!("data: {}\n\n", json!({"choices": [choice]}))
}

/// The SSE body of `script` (its ids start at `first`) as `flavour` streams
/// it when asked to stop at `stops`.
fn stream(flavour: Flavour, script: &[&str], first: u64, stops: &[String]) -> String {
    let mut out = String::new();
    let (mut text, mut sent) = (String::new(), 0);
    for (k, token) in script.iter().enumerate() {
        let id = Some(first + k as u64);
        text.push_str(token);
        let hit = stops
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
            .min();
        if let Some((at, stop)) = hit {
            let named = |mut line: String, key: &str| {
                let mut v: Value = serde_json::from_str(&line[6..]).unwrap();
                v["choices"][0][key] = json!(stop);
                line = format!("data: {v}\n\n");
                line
            };
            match flavour {
                Flavour::Llama | Flavour::LlamaUnreadable => {
                    out += &chunk(flavour, &text[sent..at], id, None);
                    out += &chunk(flavour, "", None, Some("stop"));
                }
                Flavour::Vllm => {
                    let end = at + stop.len();
                    let last = chunk(flavour, &text[sent..end], id, Some("stop"));
                    out += &named(last, "stop_reason");
                }
                Flavour::Sglang => {
                    let last = chunk(flavour, &text[sent.min(at)..at], None, Some("stop"));
                    out += &named(last, "matched_stop");
                }
            }
            return out + "data: [DONE]\n\n";
        }
        let unsent = &text[sent..];
        let partial = stops
            .iter()
            .any(|s| (1..s.len()).any(|n| unsent.ends_with(&s[..n])));
        match flavour {
            // llama-server holds back text that may become a stop string.
            Flavour::Llama | Flavour::LlamaUnreadable if partial => {
                out += &chunk(flavour, "", id, None);
                continue;
            }
            Flavour::Sglang => out += &chunk(flavour, unsent, None, None),
            _ => out += &chunk(flavour, unsent, id, None),
        }
        sent = text.len();
    }
    out + &chunk(flavour, "", None, Some("stop")) + "data: [DONE]\n\n"
}

/// A server that streams the scripted model as `flavour` does; the
/// completion requests it was sent.
async fn scripted(flavour: Flavour) -> (String, Arc<Mutex<Vec<Value>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "scripted"}]})) }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/tokenize",
            post(|axum::Json(body): axum::Json<Value>| async move {
                let text = body["content"].as_str().unwrap_or_default();
                let ids: Vec<u32> = text.chars().map(u32::from).collect();
                axum::Json(json!({"tokens": ids}))
            }),
        )
        .route(
            "/detokenize",
            post(move |axum::Json(body): axum::Json<Value>| async move {
                let ids: Vec<u64> = serde_json::from_value(body["tokens"].clone()).unwrap();
                let text = detokenize(&ids);
                // Only llama-server and vLLM answer it.
                match flavour {
                    Flavour::Sglang | Flavour::LlamaUnreadable => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        axum::Json(json!({"error": "not found"})),
                    ),
                    _ => (
                        axum::http::StatusCode::OK,
                        axum::Json(json!({"content": text, "prompt": text})),
                    ),
                }
            }),
        )
        .route(
            "/v1/completions",
            post(move |axum::Json(body): axum::Json<Value>| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(body.clone());
                    let prompt = match &body["prompt"] {
                        Value::Array(ids) => {
                            detokenize(&ids.iter().map(|i| i.as_u64().unwrap()).collect::<Vec<_>>())
                        }
                        other => other.as_str().unwrap_or_default().to_string(),
                    };
                    let stops: Vec<String> =
                        serde_json::from_value(body["stop"].clone()).unwrap_or_default();
                    let (script, first) = if prompt.contains("France?</search>") {
                        (ANSWER, TOKEN + SEARCH.len() as u64)
                    } else {
                        (SEARCH, TOKEN)
                    };
                    (
                        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                        stream(flavour, script, first, &stops),
                    )
                }
            }),
        );
    (serve(app).await, asked)
}

/// Whichever way the server hands back the stop string it stopped at, the
/// rollout searches once with the query the model wrote, the transcript
/// holds each closing tag once, the stop strings went to the server, and
/// the second round's token prompt reads back as the transcript (every id
/// the model generated, paired with its text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn a_stop_string_the_server_drops_keeps_or_names_is_read_back() {
    for flavour in [Flavour::Llama, Flavour::Vllm, Flavour::Sglang] {
        let (url, asked) = scripted(flavour).await;
        let (_server, client, chat) = seeker_on(&[&url], &[]).await;
        let ask = json!({"max_tokens": 64, "policy": "search-r1", "return_transcript": true,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]});
        let answer: Value = post_json(&client, &chat, &ask).await;
        let transcript = answer["seeker"]["transcript"].as_str().unwrap_or_default();
        let rounds = answer["seeker"]["rounds"].as_array().unwrap();
        assert_eq!(rounds[0]["outcome"], "search", "{flavour:?}: {answer}");
        assert_eq!(answer["seeker"]["searches"], 1, "{flavour:?}: {answer}");
        assert_eq!(
            rounds[0]["queries"][0], "capital of France?",
            "{flavour:?}: {answer}"
        );
        assert_eq!(
            answer["choices"][0]["message"]["content"], "Paris",
            "{flavour:?}: {answer}"
        );
        let call = "<search> capital of France?</search>\n\n<information>";
        assert_eq!(
            transcript.matches(call).count(),
            1,
            "{flavour:?}: {transcript}"
        );
        assert!(
            transcript.ends_with(" Paris</answer>"),
            "{flavour:?}: {transcript}"
        );
        assert!(!transcript.contains("more"), "{flavour:?}: {transcript}");

        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 2, "{flavour:?}");
        for body in &asked {
            let stops = body["stop"].as_array().unwrap();
            assert!(
                stops.starts_with(&[json!("</search>"), json!("</answer>")]),
                "{body}"
            );
        }
        let second = &asked[1]["prompt"];
        if flavour == Flavour::Sglang {
            // No ids in its stream: the generated text is tokenized again.
            let ids: Vec<u64> = serde_json::from_value(second.clone()).unwrap();
            assert!(ids.iter().all(|&id| id < TOKEN), "{second}");
            assert!(detokenize(&ids).contains(call), "{second}");
            continue;
        }
        let ids: Vec<u64> = serde_json::from_value(second.clone())
            .unwrap_or_else(|_| panic!("{flavour:?}: no token prompt: {second}"));
        let text = detokenize(&ids);
        assert_eq!(text.matches(call).count(), 1, "{flavour:?}: {text:?}");
        // Every token the first round generated through the stop string,
        // as the ids the server sent.
        let generated: Vec<u64> = (TOKEN..TOKEN + 9).collect();
        assert!(
            ids.windows(9).any(|w| w == generated.as_slice()),
            "{flavour:?}: {ids:?}"
        );
    }
}

/// A server that cannot read back the ids it held back costs one round: the
/// first rollout's search call ends without its tag (an end of sequence),
/// and from then on no stop strings are sent and seeker cuts at the tags
/// itself, so the next request searches and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn a_server_that_cannot_read_back_its_ids_gets_no_stop_strings_after_one_round() {
    let (url, asked) = scripted(Flavour::LlamaUnreadable).await;
    let (_server, client, chat) = seeker_on(&[&url], &[]).await;
    let ask = json!({"max_tokens": 64, "policy": "search-r1", "return_transcript": true,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let first: Value = post_json(&client, &chat, &ask).await;
    assert_eq!(first["seeker"]["searches"], 0, "{first}");
    let second: Value = post_json(&client, &chat, &ask).await;
    assert_eq!(second["seeker"]["searches"], 1, "{second}");
    assert_eq!(
        second["choices"][0]["message"]["content"], "Paris",
        "{second}"
    );
    let asked = asked.lock().unwrap().clone();
    assert!(asked[0]["stop"].is_array(), "{}", asked[0]);
    assert!(
        asked[1..].iter().all(|b| b.get("stop").is_none()),
        "{asked:?}"
    );
}

/// A server that ignores `max_tokens` and writes on (here forever, one
/// token every 5 ms) is cut once the round has its tokens: the request ends
/// with `length` instead of waiting for the request deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn a_server_that_writes_past_max_tokens_is_cut() {
    let endless = || async {
        let tokens = futures::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let line = format!(
                "data: {}\n\n",
                json!({"choices": [{"text": " a", "finish_reason": null}]})
            );
            Some((Ok::<_, std::convert::Infallible>(line), ()))
        });
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(tokens),
        )
    };
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "endless"}]})) }),
        )
        .route("/health", get(|| async { "ok" }))
        .route("/v1/completions", post(endless));
    let url = serve(app).await;
    let (_server, client, chat) = seeker_on(&[&url], &[]).await;
    let ask = json!({"max_tokens": 20, "policy": "search-r1",
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let answer: Value = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        post_json(&client, &chat, &ask),
    )
    .await
    .expect("the request waited on the endless stream");
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    assert!(
        answer["usage"]["completion_tokens"].as_u64().unwrap() <= 21,
        "{answer}"
    );
}

/// The binary as a user without the model's files starts it for a remote
/// server (and the only way a build without the `embedded` feature serves):
/// `model.engine = "remote"`, the chat template from a `tokenizer_config.json`,
/// a two-document index of its own. The rollout searches and answers; a
/// build without the embedded engine also refuses the default (embedded)
/// config with one line saying what to set. Needs no fetched data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_config_serves_with_no_model_files_here() {
    let tmp = tempfile::tempdir().unwrap();
    let index = crate::e2e::small_index(
        tmp.path(),
        &[
            ("France", "Paris is the capital of France."),
            ("Spain", "Madrid is the capital of Spain."),
        ],
    );
    // ChatML, as Qwen2.5's tokenizer_config.json writes it (shortened).
    let tokenizer_config = tmp.path().join("tokenizer_config.json");
    std::fs::write(
        &tokenizer_config,
        json!({
            "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "eos_token": "<|im_end|>",
            "added_tokens_decoder": {
                "151644": {"content": "<|im_start|>", "special": true},
                "151645": {"content": "<|im_end|>", "special": true}
            }
        })
        .to_string(),
    )
    .unwrap();

    #[cfg(not(feature = "embedded"))]
    {
        let refused = std::process::Command::new(crate::e2e::seeker_bin())
            .args(["serve", "--port", "0"])
            .env("SEEKER_SEARCH__INDEX", &index)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(
            stderr.contains("built without the embedded engine")
                && stderr.contains("model.engine = \"remote\""),
            "{stderr}"
        );
    }

    let (url, asked) = scripted(Flavour::Llama).await;
    let server = crate::e2e::start_default_model(
        &index,
        &[
            ("SEEKER_MODEL__ENGINE", "remote"),
            ("SEEKER_MODEL__REMOTE_URLS", url.as_str()),
            (
                "SEEKER_MODEL__TOKENIZER_CONFIG",
                tokenizer_config.to_str().unwrap(),
            ),
            // No model file exists at this path: nothing reads it.
            ("SEEKER_MODEL__GGUF", "models/none.gguf"),
        ],
        &[],
    );
    let client = reqwest::Client::new();
    crate::e2e::wait_healthy(&client, &server.base).await;
    let ask = json!({"max_tokens": 64, "policy": "search-r1", "return_transcript": true,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let chat = format!("{}/v1/chat/completions", server.base);
    let answer: Value = post_json(&client, &chat, &ask).await;
    assert_eq!(answer["seeker"]["searches"], 1, "{answer}");
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Paris",
        "{answer}"
    );
    let transcript = answer["seeker"]["transcript"].as_str().unwrap_or_default();
    assert!(
        transcript
            .contains("<information>Doc 1(Title: \"France\") Paris is the capital of France."),
        "{transcript}"
    );
    // The prompt went out rendered by the tokenizer_config's template.
    let asked = asked.lock().unwrap().clone();
    let first = asked[0]["prompt"].as_str().unwrap_or_default();
    assert!(first.starts_with("<|im_start|>user\n"), "{}", asked[0]);
}
