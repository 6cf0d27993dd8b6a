//! Search benchmarks for `bench/README.md` (run by `bench/search.sh`).
//!
//! ```text
//! search_bench fanout [--latency-ms 200] [--reps 5]
//! search_bench tantivy --corpus FILE.jsonl --index DIR --queries FILE.txt [--k 3]
//! ```
//!
//! `fanout`: a local `POST /retrieve` stub that answers every query after
//! `--latency-ms` (L); rounds of k = 1, 2, 4, 8 queries through the dispatcher
//! with the `retriever` backend (shared cache off, concurrency 8). Prints one
//! JSON line per k: median round time over `--reps` rounds and its ratio to L
//! (serial would be k).
//!
//! `tantivy`: builds the index from `--corpus` (build seconds, index bytes),
//! then runs every query of `--queries` (one per line) single-threaded (p50,
//! p99 latency) and on all cores (queries per second). Prints one JSON line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use clap::{Parser, Subcommand};
use seeker::search::bm25::{build_index, Bm25Index};
use seeker::search::dispatch::{BackendLimits, DispatchConfig, Dispatcher};
use seeker::search::retriever::RetrieverBackend;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Fanout {
        #[arg(long, default_value_t = 200)]
        latency_ms: u64,
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    Tantivy {
        #[arg(long)]
        corpus: PathBuf,
        #[arg(long)]
        index: PathBuf,
        #[arg(long)]
        queries: PathBuf,
        #[arg(long, default_value_t = 3)]
        k: usize,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Fanout { latency_ms, reps } => fanout(latency_ms, reps),
        Command::Tantivy {
            corpus,
            index,
            queries,
            k,
        } => tantivy(&corpus, &index, &queries, k),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn fanout(latency_ms: u64, reps: usize) -> anyhow::Result<()> {
    let latency = Duration::from_millis(latency_ms);
    let router = Router::new().route(
        "/retrieve",
        post(move |Json(body): Json<Value>| async move {
            tokio::time::sleep(latency).await;
            let q = body["queries"][0].as_str().unwrap_or("").to_string();
            Json(json!({"result": [[{"document": {"id": 0, "contents": format!("\"{q}\"\ntext")}, "score": 1.0}]]}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut d = Dispatcher::new(DispatchConfig {
        cache_ttl: Duration::ZERO,
        ..DispatchConfig::default()
    });
    d.add(
        "remote",
        Arc::new(RetrieverBackend::new(&format!("http://{addr}/retrieve"))),
        BackendLimits {
            concurrency: 8,
            ..BackendLimits::default()
        },
    );
    // Warm the connection pool.
    d.search_round(None, &["warm up".to_string()], 1).await;
    for k in [1usize, 2, 4, 8] {
        let mut times = Vec::with_capacity(reps);
        for rep in 0..reps {
            let queries: Vec<String> = (0..k).map(|i| format!("query {rep} {i}")).collect();
            let started = Instant::now();
            let results = d.search_round(None, &queries, 1).await;
            times.push(started.elapsed().as_secs_f64());
            anyhow::ensure!(results.iter().all(|r| r.result.is_ok()), "a query failed");
        }
        let round = median(times);
        println!(
            "{}",
            json!({"k": k, "latency_s": latency.as_secs_f64(), "round_s": round,
                   "round_over_latency": round / latency.as_secs_f64()})
        );
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

fn tantivy(corpus: &Path, index_dir: &Path, queries: &Path, k: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let stats = build_index(corpus, index_dir, |_| {})?;
    let build_s = started.elapsed().as_secs_f64();
    let index = Arc::new(Bm25Index::open(index_dir)?);
    let queries: Vec<String> = std::fs::read_to_string(queries)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    // Warm the page cache and the reader.
    for q in queries.iter().take(20) {
        index.search(q, k)?;
    }
    let mut latencies = Vec::with_capacity(queries.len());
    for q in &queries {
        let t = Instant::now();
        index.search(q, k)?;
        latencies.push(t.elapsed().as_secs_f64());
    }
    latencies.sort_by(f64::total_cmp);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rounds = 3;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let index = Arc::clone(&index);
            let queries = &queries;
            s.spawn(move || {
                for _ in 0..rounds {
                    for q in queries.iter().skip(t).step_by(threads) {
                        index.search(q, k).expect("search");
                    }
                }
            });
        }
    });
    let qps = (queries.len() * rounds) as f64 / started.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "engine": "tantivy", "documents": stats.documents, "corpus_bytes": stats.bytes,
            "build_s": build_s, "index_bytes": dir_bytes(index_dir)?,
            "queries": queries.len(), "k": k,
            "p50_ms": percentile(&latencies, 0.5) * 1e3, "p99_ms": percentile(&latencies, 0.99) * 1e3,
            "threads": threads, "qps": qps,
        })
    );
    Ok(())
}
