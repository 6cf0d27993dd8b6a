//! seeker's HTTP server with a scripted policy instead of the model, for API
//! contract tests (the `openai` Python client and schemathesis in
//! `tests/python/`): every route, middleware and wire type is the real one,
//! and answers come back in milliseconds.
//!
//! The policy plays two rounds in turn, forever: a reasoning step with a
//! search call, then an answer. Search runs on the real default index.
//!
//! ```text
//! cargo run --example api_server -- --port 8090 [--api-key KEY]
//! ```
//! Prints `seeker listening on http://ADDR` once it accepts connections.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use seeker::config::{Config, ServerConfig};
use seeker::engine::scripted::ScriptedEngine;
use seeker::metrics::Metrics;
use seeker::profile::Profile;
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
    let search =
        seeker::search::dispatcher_from_config(&config.search, |_| None)?.with_metrics(metrics);
    let profiles = Profile::load_dir(&config.policy.dir)?;
    let engine = ScriptedEngine::new([
        vec![
            "<think>",
            "I should look this up.",
            "</think>\n",
            "<search> Mona Lisa painter </search>",
        ],
        vec![
            "<think>",
            "The documents say Leonardo.",
            "</think>\n",
            "<answer> Leonardo",
            " da Vinci </answer>",
        ],
    ])
    .cycling();
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
    state.set_engine(Arc::new(engine));
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
