//! The `seeker` command line: `serve`, `index`, `search`, `policies`, `eval`,
//! `openapi`.

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
        /// The policy model: a GGUF file (sets model.gguf) or a Hugging Face
        /// checkpoint directory (sets model.checkpoint: config.json,
        /// *.safetensors, tokenizer.json, tokenizer_config.json). The served
        /// id becomes its name (the directory's, or the file's without
        /// `.gguf`) unless model.id is set.
        #[arg(long, value_name = "GGUF_OR_DIR")]
        model: Option<PathBuf>,
        /// In-situ quantization of a checkpoint's weights while loading;
        /// overrides model.isq: auto (= q4k), none, q4_0, q4_1, q5_0, q5_1,
        /// q8_0, q2k, q3k, q4k, q5k, q6k.
        #[arg(long)]
        isq: Option<seeker::config::Isq>,
    },
    /// Build a BM25 index from a JSONL corpus ({"id", "title", "text"} per
    /// line), and/or its dense index with a sentence encoder (`--dense`).
    #[command(group(clap::ArgGroup::new("what").args(["corpus", "dense"]).required(true).multiple(true)))]
    Index {
        /// The corpus, one JSON object per line (builds the BM25 index).
        #[arg(long)]
        corpus: Option<PathBuf>,
        /// Directory of the index (replaced if it exists; with only --dense,
        /// an index built before).
        #[arg(long)]
        index: PathBuf,
        /// Also embed every document with the sentence encoder in this Hugging
        /// Face directory into `<index>/dense` (the `dense` and `hybrid`
        /// backends).
        #[arg(long, value_name = "MODEL_DIR")]
        dense: Option<PathBuf>,
        /// Config file whose [search.dense] settings (prefixes, pooling,
        /// max_length, batch_size) the encoder uses; default:
        /// config/seeker.toml when it exists.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Search an index and print the top-k documents with their BM25 scores.
    Search {
        /// Index directory built by `seeker index`.
        #[arg(long, default_value = seeker::config::DEFAULT_INDEX)]
        index: PathBuf,
        /// Number of documents (at least 1).
        #[arg(short = 'k', long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        top_k: u32,
        /// The query (any text).
        #[arg(required = true, num_args = 1..)]
        query: Vec<String>,
    },
    /// Evaluate a QA dataset against a running server (EM, cover-EM, F1, set
    /// F1 for set answers, answer and support recall, searches, latency).
    Eval(Box<EvalArgs>),
    /// Plots of `seeker eval` runs: report.html (self-contained) and one SVG
    /// per plot (scores, score by hops, searches per question, seconds per
    /// question; two runs are also compared question by question).
    Report {
        /// Per-question JSONL files written by `seeker eval --out` (each
        /// one's `.summary.json` beside it names its policy and backend).
        #[arg(required = true, num_args = 1..)]
        runs: Vec<PathBuf>,
        /// Directory for report.html and the SVG files (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// List the policy profiles.
    Policies {
        /// Config file (default: config/seeker.toml when it exists): gives the
        /// profile directory and the default policy.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Profile directory instead of the config's `policy.dir`.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the OpenAPI document the server serves at /openapi.json.
    Openapi,
    /// Model files.
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Rewrite a GGUF into the weight format the embedded engine runs fastest
    /// (F32 for small models, Q8_0 for larger ones whose weights have no SIMD
    /// kernel; nothing for the default model, which runs fastest as it is).
    /// The server does this itself on first load unless model.weights = "as_is".
    Prepare {
        /// The GGUF to rewrite.
        #[arg(long, default_value = seeker::config::DEFAULT_GGUF)]
        gguf: PathBuf,
        /// Output file (default: STEM.FORMAT.gguf next to the input, where the
        /// server looks for it).
        #[arg(long)]
        out: Option<PathBuf>,
        /// auto (f32 up to 2 GiB of F32 weights; else q8_0 if some weight has
        /// no SIMD kernel, else nothing to do), q8_0 (re-quantize every
        /// quantized weight to Q8_0) or f32 (dequantize everything: dense
        /// matmuls).
        #[arg(long, value_enum, default_value_t = PrepareFormat::Auto)]
        format: PrepareFormat,
    },
}

/// `seeker model prepare --format`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PrepareFormat {
    Auto,
    #[value(name = "q8_0")]
    Q8_0,
    F32,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// JSONL with `question` and `answers`/`golden_answers`, or FanOutQA JSON.
    #[arg(long)]
    dataset: PathBuf,
    /// Server base URL (seeker or any OpenAI-compatible server).
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080",
        conflicts_with = "retrieval_only"
    )]
    url: String,
    /// Model id to request.
    #[arg(long, default_value = "default", conflicts_with = "retrieval_only")]
    model: String,
    /// seeker policy profile (default: the server's).
    #[arg(long, conflicts_with = "retrieval_only")]
    policy: Option<String>,
    /// seeker search backend (default: the server's); with
    /// --retrieval-only: `tantivy` (BM25), `dense`, `hybrid` or a backend of
    /// the config (default: its search.default).
    #[arg(long)]
    backend: Option<String>,
    /// Documents per query, 1 to 50 as the server allows (default: the
    /// profile's; with --retrieval-only: 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(seeker::server::MAX_TOP_K)))]
    top_k: Option<u32>,
    /// Generated-token budget per question, all rounds together.
    #[arg(long, default_value_t = 256, conflicts_with = "retrieval_only")]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy and reproducible.
    #[arg(long, default_value_t = 0.0, conflicts_with = "retrieval_only")]
    temperature: f64,
    /// Questions in flight at once (with --retrieval-only: search rounds in
    /// flight, for latency under load).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Skip the first N questions (after the evidence filter): held-out
    /// questions after a set used for tuning.
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Evaluate only the first N questions (after --skip).
    #[arg(long)]
    limit: Option<usize>,
    /// FanOutQA: evaluate the single-hop sub-questions instead of the top-level ones.
    #[arg(long)]
    fanoutqa_subquestions: bool,
    /// Keep only questions whose evidence article's title is in this corpus (JSONL).
    #[arg(long)]
    evidence_in: Option<PathBuf>,
    /// Keep only questions of at most N hops (datasets with a `difficulty`,
    /// such as PhantomWiki's; questions without one are dropped).
    #[arg(long, value_name = "N")]
    max_difficulty: Option<u32>,
    /// Leave out aggregation questions ("How many …", `"aggregation": true`).
    #[arg(long)]
    no_aggregation: bool,
    /// Text put before every question, after a space: an answer format, as a
    /// user writes one (PhantomWiki's agents are asked for names separated by
    /// commas). With --retrieval-only it is searched with the question, as a
    /// question search would.
    #[arg(long, value_name = "TEXT")]
    instruction: Option<String>,
    /// Keep only questions with a gold answer that occurs in a document of
    /// this corpus (JSONL; normalised as answer recall is): the questions a
    /// retriever can answer at all.
    #[arg(long)]
    answer_in: Option<PathBuf>,
    /// Per-question JSONL output; the summary goes to the same name with
    /// `.summary.json`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// After the run, write its report (report.html and SVG plots, as
    /// `seeker report` does) into this directory.
    #[arg(long, requires = "out", conflicts_with = "retrieval_only")]
    report: Option<PathBuf>,
    /// Seconds allowed per question.
    #[arg(long, default_value_t = 600, conflicts_with = "retrieval_only")]
    timeout: u64,
    /// Ask each question without streaming (`stream: false`), as a Python
    /// loop does: one JSON answer a question, no time to first token.
    #[arg(long, conflicts_with = "retrieval_only")]
    no_stream: bool,
    /// Bearer key for the server.
    #[arg(long, env = "SEEKER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// No server and no model: search each question in the local index and
    /// report the answer recall of its top-k (what a question search splices).
    #[arg(long)]
    retrieval_only: bool,
    /// With --retrieval-only: search each question with the queries the
    /// model wrote in an earlier run (that run's --out JSONL) instead of its
    /// text.
    #[arg(long, requires = "retrieval_only")]
    queries_from: Option<PathBuf>,
    /// Index for --retrieval-only.
    #[arg(long, default_value = seeker::config::DEFAULT_INDEX, requires = "retrieval_only")]
    index: PathBuf,
    /// Config file for --retrieval-only ([search]: backends, [search.dense],
    /// [search.hybrid]); default: config/seeker.toml when it exists.
    #[arg(long, requires = "retrieval_only")]
    config: Option<PathBuf>,
}

fn cmd_prepare(gguf: &Path, out: Option<PathBuf>, format: PrepareFormat) -> anyhow::Result<()> {
    use seeker::config::WeightFormat;
    use seeker::engine::prepare::{prepare, prepared_path};
    let format = match format {
        PrepareFormat::Q8_0 => WeightFormat::Q8_0,
        PrepareFormat::F32 => WeightFormat::F32,
        PrepareFormat::Auto => WeightFormat::Auto,
    };
    let format = seeker::engine::prepare::resolve(gguf, format)?;
    if format == WeightFormat::AsIs {
        println!(
            "{}: runs fastest as it is (every quantized weight has a SIMD kernel and an F32 \
             copy would exceed 2 GiB); nothing to prepare",
            gguf.display()
        );
        return Ok(());
    }
    let out = match out {
        Some(o) => o,
        None => prepared_path(gguf, format)
            .ok_or_else(|| anyhow::anyhow!("{} has no file name", gguf.display()))?,
    };
    let report = prepare(gguf, &out, format)?;
    println!(
        "{} -> {}: {} of {} tensors converted to {format:?}, {:.1} MB -> {:.1} MB in {:.1} s",
        gguf.display(),
        out.display(),
        report.converted,
        report.tensors,
        report.bytes_in as f64 / 1e6,
        report.bytes_out as f64 / 1e6,
        report.millis as f64 / 1000.0
    );
    Ok(())
}

fn main() -> ExitCode {
    // Before any thread starts (the engine's CPU thread pool settings).
    seeker::engine::set_cpu_defaults();
    seeker::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            config,
            host,
            port,
            model,
            isq,
        } => cmd_serve(config.as_deref(), host, port, model, isq),
        Command::Index {
            corpus,
            index,
            dense,
            config,
        } => cmd_index(
            corpus.as_deref(),
            &index,
            dense.as_deref(),
            config.as_deref(),
        ),
        Command::Search {
            index,
            top_k,
            query,
        } => cmd_search(&index, top_k as usize, &query.join(" ")),
        Command::Policies { config, dir } => cmd_policies(config.as_deref(), dir),
        Command::Eval(args) => cmd_eval(*args),
        Command::Model(ModelCommand::Prepare { gguf, out, format }) => {
            cmd_prepare(&gguf, out, format)
        }
        Command::Report { runs, out } => cmd_report(&runs, &out),
        Command::Openapi => {
            print!("{}", seeker::server::api_doc::openapi_json());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seeker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_serve(
    config: Option<&Path>,
    host: Option<String>,
    port: Option<u16>,
    model: Option<PathBuf>,
    isq: Option<seeker::config::Isq>,
) -> anyhow::Result<()> {
    let mut config = Config::load(config, env_vars()?)?;
    if let Some(host) = host {
        config.server.host = host;
    }
    if let Some(port) = port {
        config.server.port = port;
    }
    if let Some(model) = model {
        config.model.serve(&model)?;
    }
    if let Some(isq) = isq {
        config.model.isq = isq;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(seeker::startup::serve(config));
    // Dropping a runtime waits for its blocking threads; a model load that a
    // signal interrupted may still be preparing or reading weights there (not
    // interruptible), so leave them to the process exit instead.
    runtime.shutdown_background();
    result
}

fn cmd_index(
    corpus: Option<&Path>,
    index: &Path,
    dense: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<()> {
    // The encoder settings are checked before a long BM25 build.
    let dense_config = match dense {
        Some(_) => Some(Config::load(config, env_vars()?)?.search.dense),
        None => None,
    };
    if let Some(corpus) = corpus {
        cmd_index_bm25(corpus, index)?;
    }
    if let (Some(model), Some(settings)) = (dense, dense_config) {
        cmd_index_dense(model, index, &settings)?;
    }
    Ok(())
}

fn cmd_index_dense(
    model: &Path,
    index: &Path,
    settings: &seeker::config::DenseConfig,
) -> anyhow::Result<()> {
    use seeker::search::dense::build_dense;
    use seeker::search::embed::Embedder;
    // build_dense runs one batch per core; candle's own threads on top of
    // that made the build slower (bench/README.md). No other thread exists
    // yet, so setting the variable races with nothing.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let embedder = Embedder::load(model, &settings.options())
        .map_err(|e| anyhow::anyhow!("--dense {}: {e}", model.display()))?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} ({eta})")
            .expect("valid progress template"),
    );
    bar.set_message("embedding documents");
    let stats = build_dense(index, &embedder, settings.batch_size, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    println!(
        "embedded {} documents ({}-d, {}) in {:.1} s -> {}",
        stats.rows,
        stats.dim,
        model.display(),
        stats.seconds,
        index.join(seeker::search::dense::DENSE_DIR).display()
    );
    Ok(())
}

fn cmd_index_bm25(corpus: &Path, index: &Path) -> anyhow::Result<()> {
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

fn cmd_policies(config: Option<&Path>, dir: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::load(config, env_vars()?)?;
    let default = config.policy.default;
    let dir = dir.unwrap_or(config.policy.dir);
    for (name, p) in Profile::load_dir(&dir)? {
        let marker = if name == default { " (default)" } else { "" };
        println!(
            "{:30} top-k {}, {} searches, {}\n{:30} {}",
            format!("{name}{marker}"),
            p.top_k,
            p.max_searches,
            p.source.display(),
            "",
            p.description
        );
        if let Some(why) = &p.unconfirmed {
            println!("{:30} unconfirmed: {why}", "");
        }
    }
    Ok(())
}

fn cmd_eval(args: EvalArgs) -> anyhow::Result<()> {
    use seeker::eval::dataset::FanoutMode;
    use seeker::eval::job::{run_job, Job, Target};

    let job = Job {
        dataset: args.dataset,
        mode: if args.fanoutqa_subquestions {
            FanoutMode::Subquestions
        } else {
            FanoutMode::Questions
        },
        evidence_in: args.evidence_in,
        answer_in: args.answer_in,
        max_difficulty: args.max_difficulty,
        no_aggregation: args.no_aggregation,
        skip: args.skip,
        limit: args.limit,
        instruction: args.instruction,
        out: args.out,
    };
    let target = if args.retrieval_only {
        let mut search = Config::load(args.config.as_deref(), env_vars()?)?.search;
        search.index = args.index;
        Target::Retrieval(seeker::eval::job::Retrieval {
            backend: args
                .backend
                .clone()
                .unwrap_or_else(|| search.default.clone()),
            search,
            k: args.top_k.map_or(3, |k| k as usize),
            clients: args.concurrency as usize,
            queries_from: args.queries_from,
        })
    } else {
        Target::Server(seeker::eval::EvalConfig {
            url: args.url.trim_end_matches('/').to_string(),
            model: args.model,
            policy: args.policy,
            backend: args.backend,
            top_k: args.top_k.map(|k| k as usize),
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            concurrency: args.concurrency as usize,
            timeout: std::time::Duration::from_secs(args.timeout),
            stream: !args.no_stream,
            api_key: args.api_key.map(seeker::secret::Secret::from),
        })
    };
    // A report directory that cannot be one fails now, not after the run.
    if let Some(dir) = &args.report {
        seeker::eval::report::check_dir(dir)?;
    }
    let out = job.out.clone();
    run_job(&job, target)?;
    if let (Some(dir), Some(out)) = (args.report, out) {
        cmd_report(&[out], &dir)?;
    }
    Ok(())
}

/// The environment as UTF-8 pairs, for [`Config::load`]: a `SEEKER_`
/// variable whose name or value is not UTF-8 is an error naming it (never
/// its value, which may be a key); other such variables are not seeker's
/// and are left out (`std::env::vars` would panic on them).
fn env_vars() -> anyhow::Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        match (name.to_str(), value.into_string()) {
            (Some(n), Ok(v)) => vars.push((n.to_string(), v)),
            _ if name_text.starts_with("SEEKER_") => anyhow::bail!(
                "the environment variable {name_text} holds bytes that are not UTF-8; set it to text"
            ),
            _ => {}
        }
    }
    Ok(vars)
}

fn cmd_report(runs: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    use seeker::eval::report;
    let runs = runs
        .iter()
        .map(|p| report::read_run(p))
        .collect::<Result<Vec<_>, _>>()?;
    for path in report::write(&runs, out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
