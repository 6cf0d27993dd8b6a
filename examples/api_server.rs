//! seeker's HTTP server with a scripted policy instead of the model, for API
//! contract tests (the `openai` Python client and schemathesis in
//! `tests/python/`) and the web UI's browser tests: every route, middleware
//! and wire type is the real one, and answers come back in milliseconds.
//!
//! The policy plays two rounds: a reasoning step with a search call, then an
//! answer ("Leonardo da Vinci"). Which script a round plays is read from its
//! prompt, so every request gets the same two rounds whatever ran before or
//! at the same time (a request cancelled half-way leaves nothing behind):
//! - the conversation says "search for nothing" and the prompt holds no
//!   search call yet: the search call `<search> zzqxv </search>` (a word the
//!   index does not hold), then the scripts below;
//! - the conversation says "think slowly": reasoning that streams one piece
//!   every 100 ms for 30 s (for the web UI's Stop test and what it shows
//!   while a rollout runs);
//! - the prompt already holds the search call: the answer; when the
//!   conversation asks to "cite your sources", the answer carries a citation
//!   marker (`Leonardo da Vinci [1]`);
//! - the conversation says "search widely": the search call
//!   `<search> Mona Lisa painter, zzqxv, Louvre museum, Leonardo da Vinci </search>`
//!   (four queries for profiles that split on `,`, such as `rag-r1-mq`);
//! - otherwise: the search call `<search> Mona Lisa painter </search>`.
//!
//! With a client function `get_weather` offered (`tools`, which runs the
//! `tool-search` policy): a call `get_weather({"city": "Paris"})` as a fenced
//! JSON block; when seeker wrote the call's opening (a named `tool_choice`),
//! its arguments; once the conversation holds a `tool` message, the answer
//! "It is 18 degrees and sunny in Paris.".
//!
//! Search runs on the real default index (`tantivy`, the default backend).
//! Three more backends, for the web UI tests, answer every query the same way:
//! `fixture` with documents full of HTML and script markup and links (one
//! `https:`, one `javascript:`), `broken` with a failure, `empty` with no
//! documents.
//!
//! ```text
//! cargo run --example api_server -- --port 8090 [--api-key KEY]
//! ```
//! Prints `seeker listening on http://ADDR` once it accepts connections.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clap::Parser;
use seeker::config::{Config, ServerConfig};
use seeker::engine::scripted::ScriptedEngine;
use seeker::engine::{Engine, EngineError, Generation, GenerationParams};
use seeker::metrics::Metrics;
use seeker::profile::Profile;
use seeker::search::dispatch::BackendLimits;
use seeker::search::{Document, SearchBackend, SearchError};
use seeker::server::{run, AppState};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 8090)]
    port: u16,
    /// Require this bearer key (repeatable).
    #[arg(long)]
    api_key: Vec<String>,
    /// Index of the `tantivy` backend.
    #[arg(long, default_value = "data/wiki/index")]
    index: std::path::PathBuf,
}

/// The search call of the first round; its presence in a prompt means the
/// search round has been played.
const SEARCH_CALL: &str = "<search> Mona Lisa painter </search>";
/// The same for the "search widely" variant.
const WIDE_SEARCH_CALL: &str =
    "<search> Mona Lisa painter, zzqxv, Louvre museum, Leonardo da Vinci </search>";
/// The same for the "search for nothing" variant: no document matches.
const NOTHING_SEARCH_CALL: &str = "<search> zzqxv </search>";

/// The scripted policy: one [`ScriptedEngine`] per script, picked by prompt.
struct ScriptedPolicy {
    search: ScriptedEngine,
    wide_search: ScriptedEngine,
    nothing_search: ScriptedEngine,
    answer: ScriptedEngine,
    cited_answer: ScriptedEngine,
    slow: ScriptedEngine,
    weather_call: ScriptedEngine,
    weather_arguments: ScriptedEngine,
    weather_answer: ScriptedEngine,
}

impl ScriptedPolicy {
    fn new() -> Self {
        let once = |pieces: Vec<String>| ScriptedEngine::new([pieces]).cycling();
        let texts = |pieces: &[&str]| pieces.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let mut slow = texts(&["<think>", "Thinking slowly."]);
        slow.extend((1..=300).map(|i| format!(" Step {i}.")));
        slow.extend(texts(&["</think>\n", "<answer> I do not know </answer>"]));
        Self {
            search: once(texts(&[
                "<think>",
                "I should look this up.",
                "</think>\n",
                SEARCH_CALL,
            ])),
            wide_search: once(texts(&[
                "<think>",
                "I should look this up from several sides.",
                "</think>\n",
                WIDE_SEARCH_CALL,
            ])),
            nothing_search: once(texts(&[
                "<think>",
                "I should search for nothing.",
                "</think>\n",
                NOTHING_SEARCH_CALL,
            ])),
            answer: once(texts(&[
                "<think>",
                "The documents say Leonardo.",
                "</think>\n",
                "<answer> Leonardo",
                " da Vinci </answer>",
            ])),
            cited_answer: once(texts(&[
                "<think>",
                "Doc 1 says Leonardo.",
                "</think>\n",
                "<answer> Leonardo",
                " da Vinci [1] </answer>",
            ])),
            slow: ScriptedEngine::new([slow])
                .cycling()
                .with_delay(Duration::from_millis(100)),
            weather_call: once(texts(&[
                "```json\n",
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
                "\n```",
            ])),
            weather_arguments: once(texts(&[" {\"city\": \"Paris\"}}", "\n</tool_call>"])),
            weather_answer: once(texts(&["It is 18 degrees", " and sunny in Paris."])),
        }
    }

    fn pick(&self, prompt: &str) -> &ScriptedEngine {
        let lower = prompt.to_lowercase();
        if prompt.contains("<|im_start|>tool\n") {
            return &self.weather_answer;
        }
        if prompt.contains("\"name\":\"get_weather\"") {
            return if prompt.ends_with("\"arguments\":") {
                &self.weather_arguments
            } else {
                &self.weather_call
            };
        }
        if lower.contains("search for nothing") && !prompt.contains(NOTHING_SEARCH_CALL) {
            &self.nothing_search
        } else if lower.contains("think slowly") {
            &self.slow
        } else if ![SEARCH_CALL, WIDE_SEARCH_CALL, NOTHING_SEARCH_CALL]
            .iter()
            .any(|call| prompt.contains(call))
        {
            if lower.contains("search widely") {
                &self.wide_search
            } else {
                &self.search
            }
        } else if lower.contains("cite your sources") {
            &self.cited_answer
        } else {
            &self.answer
        }
    }
}

#[async_trait]
impl Engine for ScriptedPolicy {
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        self.pick(prompt).generate(prompt, params).await
    }
}

/// A backend that answers every query with the same outcome.
struct Fixed(Result<Vec<Document>, SearchError>);

#[async_trait]
impl SearchBackend for Fixed {
    async fn search(&self, _query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        self.0.clone().map(|mut docs| {
            docs.truncate(k);
            docs
        })
    }
}

/// Documents whose every field a page could mistake for HTML.
fn markup_documents() -> Vec<Document> {
    let doc = |id: &str, title: &str, text: &str, url: Option<&str>, score: f32| Document {
        id: id.into(),
        title: title.into(),
        text: text.into(),
        url: url.map(Into::into),
        score,
        backend: "fixture".into(),
    };
    vec![
        doc(
            "fixture-1",
            "<script>window.__seekerXss = 'script'; alert(1)</script>Mona Lisa <b>(markup)</b>",
            "Leonardo da Vinci painted it. <img src=x onerror=\"window.__seekerXss = 'img'\"> \
             &lt;escaped&gt; & <a href=\"javascript:window.__seekerXss = 'a'\">a link</a>",
            Some("https://example.org/mona-lisa?a=1&b=<x>"),
            3.5,
        ),
        doc(
            "fixture-2",
            "A javascript: URL",
            "This document's URL runs script if it is made a link.",
            Some("javascript:window.__seekerXss = 'url'"),
            2.25,
        ),
        doc(
            "fixture-3",
            "\"><svg onload=\"window.__seekerXss = 'svg'\"></svg>",
            "</p></div><iframe src=\"javascript:window.__seekerXss = 'iframe'\"></iframe>",
            None,
            1.0,
        ),
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("seeker=warn")
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let mut config = Config::default();
    config.search.index = args.index;
    let metrics = Arc::new(Metrics::new());
    let mut search =
        seeker::search::dispatcher_from_config(&config.search, &config.pages, |_| None)?;
    let fixed = BackendLimits {
        retries: 0,
        ..BackendLimits::default()
    };
    search.add(
        "fixture",
        Arc::new(Fixed(Ok(markup_documents()))),
        fixed.clone(),
    );
    search.add(
        "broken",
        Arc::new(Fixed(Err(SearchError::Backend(
            "the scripted backend always fails".into(),
        )))),
        fixed.clone(),
    );
    search.add("empty", Arc::new(Fixed(Ok(Vec::new()))), fixed);
    let search = search.with_metrics(metrics);
    let profiles = Profile::load_dir(&config.policy.dir)?;
    let server = ServerConfig {
        port: args.port,
        ..ServerConfig::default()
    };
    let state = AppState::new(
        "scripted".into(),
        Arc::new(search),
        profiles,
        "search-r1".into(),
        config.generation.clone(),
    )
    .with_server_config(&server, &args.api_key);
    let policy = ScriptedPolicy::new();
    let text = policy.search.text();
    state.set_engine(Arc::new(policy), text);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("seeker listening on http://{}", listener.local_addr()?);
    run(
        listener,
        Arc::new(state),
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
        Duration::from_secs(1),
    )
    .await?;
    Ok(())
}
