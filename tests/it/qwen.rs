//! The default model, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): the architecture,
//! chat template and tokenizer of the Qwen2.5-based policies (Search-R1,
//! RAG-R1 and R1-Searcher are Qwen2.5 fine-tunes).
//!
//! - Faithfulness against llama.cpp on the same GGUF (the pinned xllamacpp
//!   server): the rendered Search-R1 prompt, the token ids of every shipped
//!   profile's prompt and golden splice, and the next-token log-probabilities.
//! - End to end through the real binary on the default config: the model
//!   writes its own search call, the documents are spliced, the answer is
//!   the same streamed and not; the round cap; the end-of-turn tokens.
//!
//! Each real-model request costs seconds of CPU: the questions are few and
//! their token budgets small. The fast suites use the small model.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::{default_data, get_json, post_json, root};
use crate::e2e::{shared_index, start_default_model, wait_healthy};
use crate::http::sse_data;
use crate::remote::Llama;
use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::prepare::resolve;
use seeker::engine::{Engine, EngineEvent, GenerationParams};
use seeker::profile::{Profile, PromptText};

/// Qwen2.5's chat template adds this system turn when a conversation has
/// none (the stock `tokenizer_config.json` of every Qwen2.5 instruct model;
/// Search-R1's `infer.py` applies it through `apply_chat_template`).
const QWEN_DEFAULT_SYSTEM: &str =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

/// Largest difference allowed between seeker's and llama.cpp's next-token
/// log-probabilities (natural log) on the same token ids, for each of
/// llama.cpp's top 5. Both run the same Q4_K/Q6_K weights with activations
/// quantized to Q8_K in their own kernels, so values differ at the level of
/// that quantization: measured, llama.cpp vs seeker up to 0.22 (at
/// log-prob -3.4), and seeker on the file vs seeker on its exact F32
/// dequantization (no activation quantization) up to 0.13 on its top 5
/// (0.17 further down the top 10) on the same prompts (`cargo run --release
/// --example logprob_probe -- weights`). Which activations round up moves
/// with the last digits of every kernel before them: over the 10 prompts of
/// `bench/kernels.py`, seeker with mistral.rs's flash attention was 0.10–0.27
/// from llama.cpp (mean 0.20) and with its grouped-matmul attention
/// (scripts/patches/cpu_attention.rs, which agrees with the flash loop to
/// 1e-4 where nothing is quantized) 0.11–0.34 (mean 0.18); on this test's
/// second prompt 0.33. A wrong template, token or KV row moves log-probs by
/// whole nats.
const LOGPROB_TOLERANCE: f64 = 0.4;

/// The same for the most likely token, whose log-prob is near 0: measured
/// 0.003 with mistral.rs's flash attention loop and 0.026 with seeker's
/// grouped-matmul attention (scripts/patches/cpu_attention.rs), which computes
/// the same attention (the F32 small model's log-probs agree to 1e-4 under
/// both: `logprob_probe splice`) but moves which activations round up in the
/// next layer's Q8_K quantization.
const TOP1_TOLERANCE: f64 = 0.05;

fn qwen() -> PathBuf {
    default_data(seeker::config::DEFAULT_GGUF)
}

fn search_r1() -> Profile {
    Profile::load(&root().join("config/policies/search-r1.toml")).unwrap()
}

fn user(content: &str) -> ChatTurn {
    ChatTurn::new(Role::User, content)
}

/// Search-R1's round-2 prompt after round-1 `prompt`: a search call and
/// the golden two-document splice.
pub(crate) fn round2_prompt(prompt: &str) -> String {
    format!(
        "{prompt}<think>\nI need to find where the Mekong starts.\n</think>\n<search> Mekong River origin </search>{}",
        std::fs::read_to_string(root().join("tests/fixtures/splices/search-r1.two-docs.txt"))
            .unwrap()
    )
}

/// The largest |log-prob difference| between `ours` and `theirs` over the
/// top 5 of `theirs` (`whose` names them); panics when one of those is not
/// in `ours` (a top 10).
pub(crate) fn top5_gap(ours: &[(u32, f64)], theirs: &[(u32, f64)], whose: &str) -> f64 {
    theirs
        .iter()
        .take(5)
        .map(|(id, theirs_lp)| {
            let ours_lp = ours
                .iter()
                .find(|(i, _)| i == id)
                .unwrap_or_else(|| panic!("{whose} token {id} not in our top 10: {ours:?}"))
                .1;
            (ours_lp - theirs_lp).abs()
        })
        .fold(0.0, f64::max)
}

/// Every shipped profile's first prompt for `question`, rendered by `engine`,
/// and the same prompt followed by each of the profile's golden splices
/// (`tests/fixtures/splices`): the texts the tokenizer must agree on.
pub(crate) async fn golden_prompts(engine: &MistralEngine, question: &str) -> Vec<String> {
    let mut texts = Vec::new();
    let fixtures = root().join("tests/fixtures/splices");
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(root().join("config/policies"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    profiles.sort();
    for path in profiles {
        let profile = Profile::load(&path).unwrap();
        let prompt = match profile.prompt(&[user(question)], 0, None) {
            // Tool profiles with their functions in the template.
            PromptText::Chat(turns) => engine
                .render_chat_with_tools(&turns, profile.template_tools())
                .await
                .unwrap(),
            PromptText::Raw(text) => text,
        };
        for splice in std::fs::read_dir(&fixtures).unwrap() {
            let splice = splice.unwrap().path();
            let name = splice.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with(".txt") && name.starts_with(&format!("{}.", profile.name)) {
                texts.push(format!(
                    "{prompt}{}",
                    std::fs::read_to_string(&splice).unwrap()
                ));
            }
        }
        texts.push(prompt);
    }
    texts
}

async fn llama_tokens(client: &reqwest::Client, llama: &Llama, text: &str) -> Vec<u32> {
    let v: Value = post_json(
        client,
        &format!("{}/tokenize", llama.url),
        &json!({"content": text, "add_special": false, "parse_special": true}),
    )
    .await;
    serde_json::from_value(v["tokens"].clone()).unwrap()
}

/// llama.cpp's `top` most likely next tokens after `ids`, as (id, natural
/// log-probability) of the unmodified distribution (`n_probs` with
/// `post_sampling_probs: false`).
async fn llama_logprobs(
    client: &reqwest::Client,
    llama: &Llama,
    ids: &[u32],
    top: usize,
) -> Vec<(u32, f64)> {
    let v: Value = post_json(
        client,
        &format!("{}/completion", llama.url),
        &json!({
            "prompt": ids, "n_predict": 1, "n_probs": top, "temperature": 0,
            "cache_prompt": false, "post_sampling_probs": false,
        }),
    )
    .await;
    v["completion_probabilities"][0]["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no top_logprobs: {v}"))
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as u32,
                t["logprob"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The prompt Search-R1 renders, the token ids of every shipped profile's
/// prompts, and the next-token log-probabilities on a round-1 and a round-2
/// prompt, all as llama.cpp gives them on the same GGUF; and the weights
/// `auto` picks for this model are the file as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_renders_tokenizes_and_predicts_as_llama_cpp_does() {
    let gguf = qwen();
    assert_eq!(
        resolve(&gguf, WeightFormat::Auto).unwrap(),
        WeightFormat::AsIs,
        "auto runs the Q4_K/Q6_K file as it is (bench/README.md)"
    );
    let engine = MistralEngine::load(&MistralConfig {
        gguf: gguf.clone(),
        checkpoint: None,
        isq: Default::default(),
        dtype: ActivationDtype::F32,
        max_num_seqs: 1,
        weights: WeightFormat::AsIs,
        prefix_cache: false,
        prefix_cache_mib: 2048,
        naive_prefix_cache: false,
        token_continuation: true,
    })
    .await
    .unwrap();
    let llama = Llama::serve(&gguf, 1, 2, &["--kv-f32"]);
    let client = reqwest::Client::new();

    // 1. Search-R1's prompt: its instruction as the one user turn, after
    //    Qwen2.5's default system turn, then the generation prompt.
    let question = "Where does the Mekong River originate?";
    let instruction = search_r1().user_message(question);
    let prompt = engine.render_chat(&[user(&instruction)]).await.unwrap();
    assert_eq!(
        prompt,
        format!("{QWEN_DEFAULT_SYSTEM}<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n")
    );
    let theirs: Value = post_json(
        &client,
        &format!("{}/apply-template", llama.url),
        &json!({"messages": [{"role": "user", "content": instruction}]}),
    )
    .await;
    assert_eq!(prompt, theirs["prompt"], "llama-server's template");
    let remote = seeker::engine::chat_template::ChatTemplate::from_gguf(&gguf).unwrap();
    assert_eq!(
        prompt,
        remote.render(&[user(&instruction)]).unwrap(),
        "the remote engine's template"
    );

    // 2. Token ids: every profile's prompt and golden splices, and text
    //    that trips pre-tokenizers (digit runs, CJK, emoji, whitespace runs,
    //    contractions, special tokens written out).
    let mut texts = golden_prompts(&engine, question).await;
    texts.extend(
        [
            "It has a land area of 7,688,287 km2 (2,968,464 sq mi).",
            "木星 (Jupiter) 🪐 — naïve café, İstanbul; don't you'll I'M",
            "  two  spaces,\ttab,\n\n\nthree newlines\r\n and trailing   ",
            "<think>\nx\n</think>\n<search> q </search><|im_end|>\n<|endoftext|>",
        ]
        .map(String::from),
    );
    assert!(texts.len() >= 20, "{} texts", texts.len());
    for text in &texts {
        let ours = engine.tokenize(text).await.unwrap();
        let theirs = llama_tokens(&client, &llama, text).await;
        assert_eq!(ours, theirs, "token ids of {text:?}");
    }

    // 3. Next-token log-probabilities on the same ids: the round-1 prompt,
    //    and a round-2 prompt (a search call and Search-R1's splice).
    let round2 = round2_prompt(&prompt);
    let mut worst: f64 = 0.0;
    for text in [&prompt, &round2] {
        let ids = engine.tokenize(text).await.unwrap();
        let ours = engine.next_token_logprobs(text, 10).await.unwrap();
        let theirs = llama_logprobs(&client, &llama, &ids, 10).await;
        assert_eq!(ours.len(), 10);
        // The same greedy token, with the same log-prob.
        assert_eq!(
            ours[0].0, theirs[0].0,
            "greedy token:\n{ours:?}\n{theirs:?}"
        );
        assert!(
            (ours[0].1 - theirs[0].1).abs() <= TOP1_TOLERANCE,
            "{ours:?}\n{theirs:?}"
        );
        worst = worst.max(top5_gap(&ours, &theirs, "llama.cpp's"));
    }
    eprintln!("largest top-5 next-token log-prob difference vs llama.cpp: {worst:.4}");
    assert!(
        worst <= LOGPROB_TOLERANCE,
        "log-probs differ by {worst} (> {LOGPROB_TOLERANCE})"
    );

    // 4. `<|endoftext|>` ends a round as `<|im_end|>` does (the GGUF's EOS;
    //    the end-to-end test below): both are Qwen2.5 end ids, and an EOS
    //    that does not match lets Search-R1 on Qwen run on into new turns.
    //    After a finished turn (`<|im_end|>\n`) the model's next token is
    //    `<|endoftext|>`: Search-R1's profile stops there, after one token;
    //    without the profile's stop list the model runs on.
    let finished =
        format!("{prompt}<think>\nI know it.\n</think>\n<answer> Tibet </answer><|im_end|>\n");
    let next = engine.next_token_logprobs(&finished, 1).await.unwrap();
    let endoftext = engine.tokenize("<|endoftext|>").await.unwrap();
    assert_eq!(vec![next[0].0], endoftext, "{next:?}");
    let run = |stop: Vec<String>| {
        let engine = &engine;
        let finished = &finished;
        async move {
            let params = GenerationParams {
                max_tokens: 8,
                temperature: None,
                top_p: None,
                stop,
                session: None,
            };
            let mut generation = engine.generate(finished, &params).await.unwrap();
            let mut tokens = 0;
            while let Some(event) = generation.events.recv().await {
                match event.unwrap() {
                    EngineEvent::Text { tokens: n, .. } => tokens += n,
                    EngineEvent::Done(_) => break,
                    EngineEvent::Prompt { .. } => {}
                }
            }
            tokens
        }
    };
    assert_eq!(
        run(search_r1().stop.clone()).await,
        1,
        "stopped at <|endoftext|>"
    );
    assert!(
        run(Vec::new()).await > 1,
        "without the stop list it runs on"
    );
}

/// A copy of the shipped profiles plus `search-r1-capped`: Search-R1 with
/// `max_searches = 0`, so that the model's first search call meets the cap.
fn profiles_with_a_capped_one(dir: &Path) -> PathBuf {
    let out = dir.join("policies");
    std::fs::create_dir(&out).unwrap();
    for entry in std::fs::read_dir(root().join("config/policies")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, out.join(path.file_name().unwrap())).unwrap();
    }
    let capped = std::fs::read_to_string(out.join("search-r1.toml"))
        .unwrap()
        .replace("name = \"search-r1\"", "name = \"search-r1-capped\"")
        .replace("max_searches = 4", "max_searches = 0");
    assert!(capped.contains("max_searches = 0"));
    std::fs::write(out.join("search-r1-capped.toml"), capped).unwrap();
    out
}

/// The web UI's default question (the `#question` box in `static/index.html`),
/// which is also the README's first example: the default model (greedy)
/// searches for it before it answers.
fn ui_default_question() -> String {
    let page = std::fs::read_to_string(root().join("static/index.html")).unwrap();
    let start = page.find("<textarea id=\"question\"").unwrap();
    let text = &page[start..];
    let text = &text[text.find('>').unwrap() + 1..];
    text[..text.find("</textarea>").unwrap()].to_string()
}

fn ask(question: &str, stream: bool) -> Value {
    json!({
        "model": "default",
        "stream": stream,
        "max_tokens": 320,
        "return_transcript": true,
        "messages": [{"role": "user", "content": question}],
    })
}

/// The default model under Search-R1's text protocol (`search-r1`): the
/// model writes its own search call, seeker searches and splices Search-R1's
/// block, the model answers; the stream says what the non-streamed answer says. The round cap
/// ends a rollout whose search call comes after it. A turn that ends in the
/// end-of-turn token ends the rollout there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_searches_by_itself_and_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let policies = profiles_with_a_capped_one(tmp.path());
    let server = start_default_model(
        shared_index(),
        &[("SEEKER_POLICY__DIR", policies.to_str().unwrap())],
        &[],
    );
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    let url = format!("{}/v1/chat/completions", server.base);
    let models: Value = get_json(&client, &format!("{}/v1/models", server.base)).await;
    assert_eq!(models["data"][0]["id"], seeker::config::DEFAULT_MODEL_ID);

    // 1. A question the model searches for: the web UI's default.
    let question = ui_default_question();
    assert!(question.ends_with('?'), "{question:?}");
    let search_r1 = |stream: bool| {
        let mut body = ask(&question, stream);
        body["policy"] = json!("search-r1");
        body
    };
    let answer: Value = post_json(&client, &url, &search_r1(false)).await;
    let seeker_info = &answer["seeker"];
    assert_eq!(seeker_info["policy"], "search-r1", "{answer}");
    assert!(seeker_info["searches"].as_u64().unwrap() >= 1, "{answer}");
    let rounds = seeker_info["rounds"].as_array().unwrap();
    assert_eq!(rounds[0]["outcome"], "search", "{answer}");
    // The query is the model's: written by it inside the tags, not the question.
    let query = rounds[0]["queries"][0].as_str().unwrap().to_string();
    assert_ne!(query.trim_end_matches('?'), question.trim_end_matches('?'));
    let transcript = seeker_info["transcript"].as_str().unwrap();
    let call = &transcript[transcript.find("<search>").expect("a search call") + 8..];
    assert_eq!(
        call[..call.find("</search>").unwrap()].trim(),
        query,
        "{transcript}"
    );
    // Search-R1's splice, right after the closing tag.
    assert!(
        transcript.contains("</search>\n\n<information>Doc 1(Title: \""),
        "{transcript}"
    );
    assert!(!seeker_info["documents"].as_array().unwrap().is_empty());
    // Round 2 continues round 1 by token ids: it reads from the prefix cache
    // every token round 1 read and kept (the token that ran past the
    // closing tag is discarded, so one may be missing). Before, the text was
    // tokenized again and `\n<` merged: 152 of 191.
    let (first, second) = (&rounds[0], &rounds[1]);
    let read_and_written =
        first["prompt_tokens"].as_u64().unwrap() + first["tokens_generated"].as_u64().unwrap();
    let cached = second["prompt_tokens_cached"].as_u64().unwrap();
    assert!(
        cached + 1 >= read_and_written,
        "round 2 read {cached} tokens from the cache of the {read_and_written} round 1 read and wrote: {answer}"
    );
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");

    // 2. Streamed: the same reasoning and answer.
    let body = client
        .post(&url)
        .json(&search_r1(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (mut streamed, mut streamed_reasoning) = (String::new(), String::new());
    for data in sse_data(&body) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        streamed.push_str(delta["content"].as_str().unwrap_or(""));
        streamed_reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, content);
    assert_eq!(
        streamed_reasoning,
        answer["choices"][0]["message"]["reasoning_content"]
    );

    // 3. The round cap: with max_searches = 0 the model's search call is not
    //    run, and the rollout ends there with `length`.
    let mut capped = ask(&question, false);
    capped["policy"] = json!("search-r1-capped");
    let answer: Value = post_json(&client, &url, &capped).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    assert_eq!(answer["seeker"]["searches"], 0, "{answer}");
    let transcript = answer["seeker"]["transcript"].as_str().unwrap();
    assert!(transcript.trim_end().ends_with("</search>"), "{transcript}");
    assert!(!transcript.contains("<information>"), "{transcript}");

    // 4. End of turn: an answer written without tags ends at the model's
    //    `<|im_end|>` (round outcome `eos`), never running on into a new turn.
    let mut eos = ask("What is the capital of Australia?", false);
    eos["continue_final_message"] = json!(true);
    eos["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "<think>\nI know this.\n</think>\nThe capital of Australia is Canberra."}));
    let answer: Value = post_json(&client, &url, &eos).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    let rounds = answer["seeker"]["rounds"].as_array().unwrap();
    assert_eq!(rounds.last().unwrap()["outcome"], "eos", "{answer}");
    let transcript = answer["seeker"]["transcript"].as_str().unwrap();
    for turn_marker in ["<|im_start|>", "<|im_end|>", "\nuser\n", "\nassistant\n"] {
        assert!(!transcript.contains(turn_marker), "{transcript}");
    }
    assert!(
        answer["usage"]["completion_tokens"].as_u64().unwrap() < 64,
        "{answer}"
    );
}

/// The `tool-search` profile on the default model's own template: the prompt
/// with the `search` function, and the tool-response turn seeker splices after
/// a turn of two calls, byte for byte as transformers renders the same
/// conversation with `tool` messages (`tests/fixtures/tools/make_fixtures.py`
/// renders the GGUF's template with jinja2 and Python's `json.dumps`).
#[test]
fn tool_search_prompt_and_splice_match_the_template_rendered_by_transformers() {
    use seeker::engine::chat_template::ChatTemplate;
    use seeker::profile::{QueryOutcome, ToolResult};
    use seeker::toolcall::{parse_turn, ToolCall};

    const CALL: &str = "I will look it up.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": [\"Kiichiro Toyoda\"]}}\n</tool_call>";
    let fixtures = root().join("tests/fixtures/tools");
    let read = |name: &str| std::fs::read_to_string(fixtures.join(name)).unwrap();
    let template = ChatTemplate::from_gguf(&qwen()).unwrap();
    let p = Profile::load(&root().join("config/policies/tool-search.toml")).unwrap();
    let tools = p.template_tools();
    assert_eq!(tools.len(), 1);

    let prompt = template
        .render_with_tools(&[user("When was Toyota founded?")], tools)
        .unwrap();
    assert_eq!(prompt, read("tool-search.prompt.txt"));

    let two_turns = read("tool-search.two-turns.txt");
    let theirs = template
        .render_json(
            &[
                json!({"role": "user", "content": "When was Toyota founded?"}),
                json!({"role": "assistant", "content": CALL}),
                json!({"role": "tool", "content": "Doc 1(Title: \"Toyota\") Toyota was founded in 1937."}),
                json!({"role": "tool", "content": "Doc 1(Title: \"Kiichiro Toyoda\") A Japanese businessman."}),
            ],
            tools,
        )
        .unwrap();
    assert_eq!(theirs, two_turns, "seeker's template with tool messages");

    let calls = parse_turn(CALL, &p.query_open, &p.query_close);
    let refs: Vec<&ToolCall> = calls.iter().collect();
    let toyota = [crate::common::doc(
        "1",
        "Toyota",
        "Toyota was founded in 1937.",
    )];
    let kiichiro = [crate::common::doc(
        "2",
        "Kiichiro Toyoda",
        "A Japanese businessman.",
    )];
    let splice = p.render_tool_splice(
        &refs,
        &[
            ToolResult::Search(vec![(
                "Toyota founding year",
                QueryOutcome::Documents(&toyota),
            )]),
            ToolResult::Search(vec![(
                "Kiichiro Toyoda",
                QueryOutcome::Documents(&kiichiro),
            )]),
        ],
        &[],
    );
    // The template's part of the splice; the turn prefix is seeker's.
    let turn_prefix = &p.tools.as_ref().unwrap().turn_prefix;
    let splice = splice.strip_suffix(turn_prefix.as_str()).unwrap();
    assert_eq!(format!("{prompt}{CALL}{splice}"), two_turns);
}

/// The default model with the `tool-search` profile through the real binary:
/// it calls the `search` function offered by its chat template with its own
/// query, seeker searches and splices the tool-response turn as the template
/// renders it, the model answers in plain text; the next turn reuses the
/// cached prefix (the splice ends the model's turn with `<|im_end|>`, a
/// control token, so nothing the model wrote is re-tokenized differently);
/// streamed and not, the same reasoning and answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_calls_the_search_tool_and_answers() {
    let server = start_default_model(shared_index(), &[], &[]);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    let url = format!("{}/v1/chat/completions", server.base);
    let question = ui_default_question();
    let body = |stream: bool| {
        let mut body = ask(&question, stream);
        body["policy"] = json!("tool-search");
        body
    };
    let answer: Value = post_json(&client, &url, &body(false)).await;
    let seeker_info = &answer["seeker"];
    assert_eq!(seeker_info["policy"], "tool-search", "{answer}");
    assert!(seeker_info["searches"].as_u64().unwrap() >= 1, "{answer}");
    let rounds = seeker_info["rounds"].as_array().unwrap();
    assert_eq!(rounds[0]["outcome"], "search", "{answer}");
    let query = rounds[0]["queries"][0].as_str().unwrap().to_string();
    let transcript = seeker_info["transcript"].as_str().unwrap();
    // The model's call, as it wrote it, holds the query it chose.
    let at = transcript
        .find("<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: \"")
        .unwrap_or_else(|| panic!("no tool response in {transcript}"));
    assert!(transcript[..at].contains(&query), "{transcript}");
    assert!(transcript[..at].contains("\"search\""), "{transcript}");
    assert!(
        transcript[at..].contains("</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        "{transcript}"
    );
    // The turn after the tool response continued from the cache.
    let cached = rounds
        .iter()
        .rev()
        .find(|r| r["round"] == 2)
        .and_then(|r| r["prompt_tokens_cached"].as_u64())
        .unwrap_or_else(|| panic!("{answer}"));
    assert!(cached > 200, "round 2 reused {cached} tokens: {answer}");
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{answer}");
    assert!(!content.contains("<tool_call>"), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");

    let streamed_body = client
        .post(&url)
        .json(&body(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (mut streamed, mut reasoning, mut searched) = (String::new(), String::new(), 0);
    for data in sse_data(&streamed_body) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        streamed.push_str(delta["content"].as_str().unwrap_or(""));
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        if chunk["seeker"]["event"]["type"] == "search" {
            searched += 1;
            assert_eq!(chunk["seeker"]["event"]["queries"][0], query.as_str());
        }
    }
    assert_eq!(streamed, content);
    assert_eq!(
        reasoning,
        answer["choices"][0]["message"]["reasoning_content"]
    );
    assert!(searched >= 1, "{streamed_body}");
}

/// Chained resumes on the default model through the real binary, as an eval
/// harness or an RL trainer drives a rollout from outside: each request
/// continues the previous one's transcript plus one new search call. Each
/// runs only its new call, says what it resumed from, and reads the previous
/// request's prompt from the prefix cache (its first round's
/// `prompt_tokens_cached`, and `seeker_prompt_tokens_cached_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_resumes_run_only_the_new_call_and_read_the_previous_prompt_from_the_cache() {
    let server = start_default_model(shared_index(), &[], &[]);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    let url = format!("{}/v1/chat/completions", server.base);
    let question = "Where was the painter of the Mona Lisa born?";
    let cached_total = || async {
        let text = crate::common::metrics_of(&client, &server.base).await;
        text.lines()
            .find_map(|l| l.strip_prefix("seeker_prompt_tokens_cached_total "))
            .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
    };

    let mut transcript = String::new();
    let mut previous_prompt_tokens = 0;
    let queries = [
        "Mona Lisa painter",
        "Leonardo da Vinci birthplace",
        "Vinci Italy",
    ];
    for (i, query) in queries.iter().enumerate() {
        let message = format!("{transcript}<search> {query} </search>");
        let body = json!({
            "policy": "search-r1", "max_tokens": 6, "return_transcript": true,
            "continue_final_message": true,
            "messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": message}]});
        let before = cached_total().await;
        let answer: Value = post_json(&client, &url, &body).await;
        let info = &answer["seeker"];
        let rounds = info["rounds"].as_array().unwrap();
        // Only the new call was searched, and it was searched first.
        assert_eq!(rounds[0]["queries"], json!([query]), "{answer}");
        assert_eq!(
            info["searches"].as_u64(),
            Some(
                1 + rounds
                    .iter()
                    .skip(1)
                    .filter(|r| r["outcome"] == "search")
                    .count() as u64
            ),
            "{answer}"
        );
        let next = info["transcript"].as_str().unwrap();
        assert!(next.starts_with(&message), "{next}");
        if i == 0 {
            assert!(info.get("resumed").is_none(), "{answer}");
        } else {
            // The previous transcript was taken as written, with its calls.
            assert_eq!(
                info["resumed"]["bytes"].as_u64(),
                Some(transcript.len() as u64),
                "{answer}"
            );
            assert_eq!(
                info["resumed"]["calls"].as_u64(),
                Some(transcript.matches("</search>").count() as u64),
                "{answer}"
            );
            // The first generation (the round after the new call's splice)
            // read every token of the previous request's prompt but the last
            // (the text re-tokenized at the seam may merge it with what
            // follows) from the cache.
            let cached = rounds
                .iter()
                .find_map(|r| r["prompt_tokens_cached"].as_u64())
                .unwrap_or_else(|| panic!("no round was generated: {answer}"));
            assert!(
                cached + 1 >= previous_prompt_tokens,
                "request {i}: {cached} cached of the previous {previous_prompt_tokens}: {answer}"
            );
            assert!(cached_total().await - before >= cached as f64);
        }
        previous_prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
        // The next request continues this transcript with one more call. A
        // harness does not call inside an answer the model has opened (seeker
        // does not search such a call: the answer ends at it, as it does while
        // generating), so a generated tail that opens one is replaced by the
        // new call.
        let spliced = next.rfind("</information>").unwrap() + "</information>".len();
        transcript = if next[spliced..].contains("<answer>") {
            format!("{}\n\n", &next[..spliced])
        } else {
            format!("{}\n", next.trim_end())
        };
    }
}

/// The default model on llama-server (`model.engine = "remote"`): round 2 of
/// a rollout where the model wrote its own search goes out as token ids and
/// reads from the server's prefix cache every token round 1 read and wrote
/// (the token that ran past the closing tag aside). Sent as text (token
/// continuation off), the server tokenizes the transcript whole, Qwen's
/// tokenizer merges the prompt's last `\n` with the model's first `<`, and
/// the cache match ends before round 1's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_on_llama_server_continue_by_token_ids() {
    let mut body = ask(&ui_default_question(), false);
    body["policy"] = json!("search-r1");
    // Round 1 (~40 tokens) and the start of round 2 are all that is read.
    body["max_tokens"] = json!(48);
    let mut reuse = Vec::new();
    for continuation in ["true", "false"] {
        // A fresh server each time: round 1 is prefilled cold and written
        // the same way (llama.cpp's greedy output depends on what it took
        // from its cache).
        let llama = Llama::serve(&qwen(), 1, 2, &[]);
        let (_server, client, url) = crate::remote::seeker_on(
            &[&llama.url],
            &[("SEEKER_MODEL__TOKEN_CONTINUATION", continuation)],
        )
        .await;
        let answer: Value = post_json(&client, &url, &body).await;
        let rounds = answer["seeker"]["rounds"].as_array().unwrap();
        assert_eq!(rounds[0]["outcome"], "search", "{answer}");
        let transcript = answer["seeker"]["transcript"].as_str().unwrap();
        assert!(transcript.starts_with("<think>"), "{transcript}");
        let read_and_written = rounds[0]["prompt_tokens"].as_u64().unwrap()
            + rounds[0]["tokens_generated"].as_u64().unwrap();
        let cached = rounds[1]["prompt_tokens_cached"].as_u64().unwrap();
        reuse.push((cached, read_and_written, answer));
    }
    let (cached, read_and_written, answer) = &reuse[0];
    assert!(
        cached + 1 >= *read_and_written,
        "token ids: round 2 read {cached} tokens from the cache of the {read_and_written} \
         round 1 read and wrote: {answer}"
    );
    let (cached, read_and_written, answer) = &reuse[1];
    assert!(
        cached + 1 < *read_and_written,
        "text: round 2 read {cached} of {read_and_written}; the test no longer shows the \
         merge it guards against: {answer}"
    );
}
