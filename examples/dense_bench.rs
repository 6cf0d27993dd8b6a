//! Dense search at scale for `bench/README.md` (run by `bench/dense.sh`):
//! seeker's exact search against its sign-bit search with exact rescoring
//! (`seeker::search::signbits`, what a large index serves) and an HNSW graph
//! (the `hnsw_rs` crate) on synthetic vectors, with real queries.
//!
//! ```text
//! dense_bench [--n 1000000] [--queries 200] [--k 10] [--data copies|gaussian]
//!             [--index binary,hnsw] [--rescore 500,1000,2000,4000,8000]
//!             [--m 16] [--ef-construction 100] [--ef 32,64,128,256]
//! ```
//!
//! Vectors, from the default index's MiniLM vectors (`data/wiki/index/dense`,
//! 10,033 × 384), all unit length, seeded, `--n` of them:
//! - `copies` (default): the real vectors, then each repeated with Gaussian
//!   noise (σ `--sigma` per coordinate): clusters of near-duplicates around
//!   real documents, as a large corpus of overlapping passages has;
//! - `gaussian`: the real vectors, then draws from a Gaussian with their
//!   mean and covariance (the mean plus a sum of `MIX` centred real vectors
//!   with standard normal weights, scaled by 1/√`MIX`): the corpus's spread
//!   and its intrinsic dimensionality, with no near-duplicates.
//!
//! Queries: the first `--queries` FanOutQA dev sub-questions embedded by the
//! same encoder. Exact search is [`DenseIndex::search`] (one matrix-vector
//! product and a heap); HNSW uses inner-product distance. Prints one JSON
//! line per measurement: build seconds and RSS, p50/p99 query latency (one
//! query at a time), and each approximate index's recall@k against exact two ways: by id (the
//! share of exact search's top k it returns) and by distance as
//! ann-benchmarks counts it (`knn` metric: the share of its hits whose
//! cosine distance is at most exact search's k-th plus [`EPSILON`], so
//! near-duplicates that tie count).

use std::time::Instant;

use clap::Parser;
use hnsw_rs::prelude::*;
use seeker::search::dense::DenseIndex;
use seeker::search::embed::{EmbedOptions, Embedder};
use serde_json::json;

/// ann-benchmarks' distance slack for its `knn` recall (`get_recall_values`,
/// `epsilon=1e-3`, in `ann_benchmarks/plotting/metrics.py`), in cosine
/// distance.
const EPSILON: f32 = 1e-3;

/// Centred real vectors summed per `gaussian` vector.
const MIX: usize = 32;

/// How the synthetic vectors are made (see the module documentation).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Data {
    Copies,
    Gaussian,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "copies")]
    data: Data,
    #[arg(long, default_value_t = 1_000_000)]
    n: usize,
    #[arg(long, default_value_t = 200)]
    queries: usize,
    #[arg(long, default_value_t = 0.05)]
    sigma: f32,
    #[arg(long, default_value_t = 16)]
    m: usize,
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256")]
    ef: Vec<usize>,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Which approximate indexes to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "binary,hnsw")]
    index: Vec<Approx>,
    /// Candidates the binary codes keep for exact rescoring.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000,4000,8000")]
    rescore: Vec<usize>,
}

/// An approximate index under test.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Approx {
    /// Sign-bit codes and exact rescoring (`seeker::search::signbits`).
    Binary,
    /// `hnsw_rs`'s graph.
    Hnsw,
}

/// Recall@k of `got` against exact search's `want`, by id and by distance
/// (module documentation); `got` and `want` are `(row, inner product)`.
fn recall(got: &[(usize, f32)], want: &[(usize, f32)]) -> (usize, usize) {
    let found = got
        .iter()
        .filter(|g| want.iter().any(|w| w.0 == g.0))
        .count();
    // ann-benchmarks' `knn` recall: a hit at most EPSILON farther than exact
    // search's k-th counts (1 - dot is the cosine distance of unit vectors).
    let kth = want.last().map_or(f32::MIN, |w| w.1);
    let as_good = got
        .iter()
        .filter(|g| (1.0 - g.1) <= (1.0 - kth) + EPSILON)
        .count();
    (found, as_good)
}

/// Resident set size in MiB (`/proc/self/status` VmRSS).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// p50 and p99 (nearest rank) of `ms`, in milliseconds.
fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    (rank(0.5), rank(0.99))
}

/// A seeded standard normal sampler (xorshift64* and Box-Muller).
struct Gauss(u64);

impl Gauss {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn next(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let embedder = Embedder::load(
        std::path::Path::new(seeker::config::DEFAULT_ENCODER),
        &EmbedOptions::default(),
    )?;
    let dim = embedder.spec().dim;
    let raw = std::fs::read("data/wiki/index/dense/vectors.f32")?;
    let base: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let base_rows = base.len() / dim;
    let mut gauss = Gauss(0x5eed_5eed);
    let mut vectors = Vec::with_capacity(args.n * dim);
    let started = Instant::now();
    let mean: Vec<f32> = (0..dim)
        .map(|j| base.chunks_exact(dim).map(|r| r[j]).sum::<f32>() / base_rows as f32)
        .collect();
    for i in 0..args.n {
        let row = &base[(i % base_rows) * dim..][..dim];
        let synthetic: Vec<f32> = if i < base_rows {
            row.to_vec()
        } else {
            match args.data {
                Data::Copies => row.iter().map(|x| x + args.sigma * gauss.next()).collect(),
                Data::Gaussian => {
                    let mut v = mean.clone();
                    let scale = 1.0 / (MIX as f32).sqrt();
                    for _ in 0..MIX {
                        let pick = (gauss.uniform() * base_rows as f64) as usize % base_rows;
                        let w = gauss.next() * scale;
                        let other = &base[pick * dim..][..dim];
                        for ((x, o), m) in v.iter_mut().zip(other).zip(&mean) {
                            *x += w * (o - m);
                        }
                    }
                    v
                }
            }
        };
        let norm = synthetic.iter().map(|x| x * x).sum::<f32>().sqrt();
        vectors.extend(synthetic.iter().map(|x| x / norm));
    }
    eprintln!(
        "synthesised {} vectors in {:.1} s",
        args.n,
        started.elapsed().as_secs_f64()
    );

    let items = seeker::eval::dataset::load(
        std::path::Path::new("data/fanoutqa/dev.json"),
        seeker::eval::dataset::FanoutMode::Subquestions,
    )?;
    let questions: Vec<&str> = items
        .iter()
        .take(args.queries)
        .map(|i| i.question.as_str())
        .collect();
    let queries = embedder.embed_queries(&questions)?;

    let before = rss_mib();
    let exact = DenseIndex::in_memory(vectors.clone(), embedder.spec().clone())?;
    println!(
        "{}",
        json!({"index": "exact", "data": format!("{:?}", args.data), "n": args.n, "dim": dim, "build_s": 0.0,
               "rss_mib": rss_mib() - before})
    );
    let mut truth = Vec::with_capacity(queries.len());
    let mut ms = Vec::with_capacity(queries.len());
    for q in &queries {
        let t = Instant::now();
        let hits = exact.search(q, args.k)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        truth.push(hits);
    }
    let (p50, p99) = percentiles(ms);
    println!(
        "{}",
        json!({"index": "exact", "n": args.n, "k": args.k, "p50_ms": p50, "p99_ms": p99, "recall": 1.0})
    );
    drop(exact);

    if args.index.contains(&Approx::Binary) {
        let started = Instant::now();
        let codes = seeker::search::signbits::SignCodes::new(&vectors, dim);
        // Its memory is the codes (the vectors are exact search's too).
        println!(
            "{}",
            json!({"index": "binary", "n": args.n, "build_s": started.elapsed().as_secs_f64(),
                   "code_bytes": codes.bytes()})
        );
        for &rescore in &args.rescore {
            let mut ms = Vec::with_capacity(queries.len());
            let (mut found, mut as_good) = (0usize, 0usize);
            for (q, want) in queries.iter().zip(&truth) {
                let t = Instant::now();
                let got = codes.search(&vectors, q, args.k, rescore);
                ms.push(t.elapsed().as_secs_f64() * 1e3);
                let (f, a) = recall(&got, want);
                found += f;
                as_good += a;
            }
            let (p50, p99) = percentiles(ms);
            println!(
                "{}",
                json!({"index": "binary", "n": args.n, "k": args.k, "rescore": rescore,
                       "p50_ms": p50, "p99_ms": p99,
                       "recall": found as f64 / (truth.len() * args.k) as f64,
                       "recall_by_distance": as_good as f64 / (truth.len() * args.k) as f64})
            );
        }
    }
    if !args.index.contains(&Approx::Hnsw) {
        return Ok(());
    }

    let before = rss_mib();
    let started = Instant::now();
    let layers = 16.min((args.n as f32).ln().trunc() as usize);
    let hnsw = Hnsw::<f32, DistDot>::new(args.m, args.n, layers, args.ef_construction, DistDot {});
    let rows: Vec<(&[f32], usize)> = vectors
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, v)| (v, i))
        .collect();
    for chunk in rows.chunks(50_000) {
        hnsw.parallel_insert_slice(&chunk.to_vec());
        eprintln!(
            "hnsw: {} inserted, {:.0} s",
            chunk[chunk.len() - 1].1 + 1,
            started.elapsed().as_secs_f64()
        );
    }
    let build_s = started.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"index": "hnsw", "n": args.n, "m": args.m, "ef_construction": args.ef_construction,
               "build_s": build_s, "rss_mib": rss_mib() - before})
    );
    let mut hnsw = hnsw;
    hnsw.set_searching_mode(true);
    for &ef in &args.ef {
        let mut ms = Vec::with_capacity(queries.len());
        let (mut found, mut as_good) = (0usize, 0usize);
        for (q, want) in queries.iter().zip(&truth) {
            let t = Instant::now();
            let got = hnsw.search(q, args.k, ef.max(args.k));
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            // DistDot's distance is 1 - dot.
            let got: Vec<(usize, f32)> = got.iter().map(|n| (n.d_id, 1.0 - n.distance)).collect();
            let (f, a) = recall(&got, want);
            found += f;
            as_good += a;
        }
        let (p50, p99) = percentiles(ms);
        println!(
            "{}",
            json!({"index": "hnsw", "n": args.n, "k": args.k, "ef": ef, "p50_ms": p50, "p99_ms": p99,
                   "recall": found as f64 / (truth.len() * args.k) as f64,
                   "recall_by_distance": as_good as f64 / (truth.len() * args.k) as f64})
        );
    }
    Ok(())
}
