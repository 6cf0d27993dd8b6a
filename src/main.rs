//! The `seeker` command line: `serve`, `index`, `search`, `policies`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use seeker::config::Config;
use seeker::profile::Profile;
use seeker::search::bm25::{build_index, Bm25Index};

/// seeker: an OpenAI-compatible server for search-augmented reasoning policies.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (default 127.0.0.1:8080).
    Serve {
        /// Config file (default: config/seeker.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to bind; overrides server.host.
        #[arg(long)]
        host: Option<String>,
        /// Port to bind (0 picks a free one); overrides server.port.
        #[arg(long)]
        port: Option<u16>,
    },
    /// Build a BM25 index from a JSONL corpus ({"id", "title", "text"} per line).
    Index {
        /// The corpus, one JSON object per line.
        #[arg(long)]
        corpus: PathBuf,
        /// Directory to write the index to (replaced if it exists).
        #[arg(long)]
        index: PathBuf,
    },
    /// Search an index and print the top-k documents with their BM25 scores.
    Search {
        /// Index directory built by `seeker index`.
        #[arg(long, default_value = "data/wiki/index")]
        index: PathBuf,
        /// Number of documents.
        #[arg(short = 'k', long, default_value_t = 3)]
        top_k: usize,
        /// The query (any text).
        #[arg(required = true, num_args = 1..)]
        query: Vec<String>,
    },
    /// List the policy profiles.
    Policies {
        /// Profile directory.
        #[arg(long, default_value = "config/policies")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "seeker=info,tower_http=warn,warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { config, host, port } => cmd_serve(config.as_deref(), host, port),
        Command::Index { corpus, index } => cmd_index(&corpus, &index),
        Command::Search {
            index,
            top_k,
            query,
        } => cmd_search(&index, top_k, &query.join(" ")),
        Command::Policies { dir } => cmd_policies(&dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seeker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_serve(config: Option<&Path>, host: Option<String>, port: Option<u16>) -> anyhow::Result<()> {
    let mut config = Config::load(config, std::env::vars())?;
    if let Some(host) = host {
        config.server.host = host;
    }
    if let Some(port) = port {
        config.server.port = port;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(seeker::server::serve(config))
}

fn cmd_index(corpus: &Path, index: &Path) -> anyhow::Result<()> {
    let total = std::fs::metadata(corpus)
        .map_err(|e| anyhow::anyhow!("{}: {e}", corpus.display()))?
        .len();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("indexing {bar:40} {bytes}/{total_bytes} ({eta})")
            .expect("valid progress template"),
    );
    let stats = build_index(corpus, index, |bytes| bar.set_position(bytes))?;
    bar.finish_and_clear();
    println!(
        "indexed {} documents ({:.1} MB) from {} in {:.1} s -> {}",
        stats.documents,
        stats.bytes as f64 / 1e6,
        corpus.display(),
        stats.seconds,
        index.display()
    );
    Ok(())
}

fn cmd_search(index: &Path, top_k: usize, query: &str) -> anyhow::Result<()> {
    let index = Bm25Index::open(index)?;
    let hits = index.search(query, top_k)?;
    if hits.is_empty() {
        println!("no results");
    }
    for (rank, doc) in hits.iter().enumerate() {
        let mut text: String = doc.text.chars().take(160).collect();
        if text.len() < doc.text.len() {
            text.push('…');
        }
        println!(
            "{}. [{:.3}] {} (id {})\n   {}",
            rank + 1,
            doc.score,
            doc.title,
            doc.id,
            text
        );
    }
    Ok(())
}

fn cmd_policies(dir: &Path) -> anyhow::Result<()> {
    for (name, p) in Profile::load_dir(dir)? {
        println!(
            "{name:22} top-k {}, {} searches, {}\n{:22} {}",
            p.top_k,
            p.max_searches,
            p.source.display(),
            "",
            p.description
        );
        if let Some(why) = &p.unconfirmed {
            println!("{:22} unconfirmed: {why}", "");
        }
    }
    Ok(())
}
