//! `seeker index` killed with SIGKILL at random instants while it replaces an
//! index (BM25, then the dense index), through the real binary: after every
//! kill the index directory serves the old or the new index, whole, and a
//! finished build leaves nothing beside it. The disk states a kill can leave
//! between the replacement's renames are enumerated one by one in
//! `src/tempfiles.rs`'s tests; here the kills fall wherever they fall.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{default_data, root};

/// A corpus of `n` documents titled "`word` {i}".
fn corpus(dir: &Path, word: &str, n: usize) -> PathBuf {
    let path = dir.join(format!("{word}.jsonl"));
    let lines: String = (0..n)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({
                    "id": format!("{word}-{i}"),
                    "title": format!("{word} {i}"),
                    "text": format!("{word} document number {i} about the river, the mountain and the {word} town of entry {}.", i * 7),
                })
            )
        })
        .collect();
    std::fs::write(&path, lines).unwrap();
    path
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(crate::e2e::seeker_bin())
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// The title `seeker search` finds first for "document river" in `index`;
/// panics (with what it said) when the index cannot be served.
fn served_title(index: &Path, after: &str) -> String {
    let out = run(&[
        "search".as_ref(),
        "-k".as_ref(),
        "1".as_ref(),
        "--index".as_ref(),
        index.as_os_str(),
        "document river".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{after}: the index is not served: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// When [`kill`] sends SIGKILL.
enum When<'a> {
    /// This long after the start.
    After(Duration),
    /// This long after the finished build's manifest appears in its
    /// temporary directory (`{dir}/{prefix}{pid}/{manifest}`): the moment
    /// the replacement starts.
    Replacing {
        dir: &'a Path,
        prefix: &'a str,
        manifest: &'a str,
        delay: Duration,
    },
}

/// Starts `seeker index` with `args` and kills it with SIGKILL `when` says
/// (or lets it finish first); whether it had finished.
fn kill(args: &[&std::ffi::OsStr], when: When) -> bool {
    let mut child = Command::new(crate::e2e::seeker_bin())
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    match when {
        When::After(delay) => std::thread::sleep(delay),
        When::Replacing {
            dir,
            prefix,
            manifest,
            delay,
        } => {
            let built = dir.join(format!("{prefix}{}", child.id())).join(manifest);
            // Polled, not spun: a spinning loop takes one of a small machine's
            // cores from the build it waits for.
            while !built.exists() && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(delay);
        }
    }
    let finished = child.try_wait().unwrap().is_some();
    let _ = child.kill();
    child.wait().unwrap();
    finished
}

fn args(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    v.iter().map(|a| a.as_os_str()).collect()
}

/// Entries beside `index` in its parent other than the corpora.
fn leftovers(parent: &Path) -> Vec<String> {
    std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "index" && !n.ends_with(".jsonl"))
        .collect()
}

/// 100 SIGKILLs of `seeker index` rebuilding the BM25 index from one corpus
/// or another, half at random instants of the whole run, half within 5 ms
/// of the start of the replacement (its finished manifest seen): the old or
/// the new index is always served.
#[test]
fn sigkill_at_random_instants_of_an_index_rebuild_never_loses_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let (alpha, bravo) = (
        corpus(tmp.path(), "alpha", 3_000),
        corpus(tmp.path(), "bravo", 3_000),
    );
    let index = tmp.path().join("index");
    let build = |corpus: &Path| -> Vec<std::ffi::OsString> {
        vec![
            "index".into(),
            "--corpus".into(),
            corpus.into(),
            "--index".into(),
            index.clone().into(),
        ]
    };
    let started = Instant::now();
    let first = build(&alpha);
    assert!(run(&args(&first)).status.success());
    let mut full = started.elapsed();
    assert!(served_title(&index, "first build").contains("alpha"));
    // The kills interrupt rebuilds: two are timed too and the fastest run sets the range, so
    // that a first build slowed by other work (tests in threads of one process) does not
    // spread the kills past the end of most builds (76 of 100 finished once).
    for corpus in [&bravo, &alpha] {
        let started = Instant::now();
        assert!(run(&args(&build(corpus))).status.success());
        full = full.min(started.elapsed());
    }
    assert!(served_title(&index, "timed rebuilds").contains("alpha"));

    let mut finished = 0;
    for n in 0..100 {
        let corpus = if n % 2 == 0 { &bravo } else { &alpha };
        let when = if n < 50 {
            // Uniform over the length of a whole run.
            When::After(full.mul_f64(fastrand::f64()))
        } else {
            When::Replacing {
                dir: tmp.path(),
                prefix: ".index.tmp-",
                manifest: "seeker-index.json",
                delay: Duration::from_micros(fastrand::u64(0..5_000)),
            }
        };
        let what = match &when {
            When::After(d) => format!("kill {n} {d:?} after the start"),
            When::Replacing { delay, .. } => format!("kill {n} {delay:?} into the replacement"),
        };
        finished += usize::from(kill(&args(&build(corpus)), when));
        let title = served_title(&index, &what);
        assert!(
            title.contains("alpha") || title.contains("bravo"),
            "{what}: {title}"
        );
    }
    // The kills did interrupt builds (a loaded machine slows them unevenly).
    assert!(
        finished <= 75,
        "{finished} of 100 builds finished before their kill"
    );
    // A build after all that finishes and leaves nothing beside the index.
    assert!(run(&args(&build(&bravo))).status.success());
    assert!(served_title(&index, "last build").contains("bravo"));
    assert_eq!(leftovers(tmp.path()), Vec::<String>::new());
}

/// 60 SIGKILLs of `seeker index --dense` rebuilding the dense index of 200
/// documents with the real encoder, half at random instants, half within
/// 5 ms of the start of the replacement: after every kill the dense index
/// opens as the server opens it at start (`DenseIndex::open`, with the
/// encoder loaded once here), and every tenth kill a whole `seeker eval
/// --retrieval-only --backend dense` serves it. (100 kills until 2026-12-07:
/// about 3.5 s each, the suite's third-longest test, for CI's 60-minute aim.)
#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn sigkill_at_random_instants_of_a_dense_rebuild_never_loses_the_dense_index() {
    const KILLS: usize = 60;
    let model = root().join(seeker::config::DEFAULT_ENCODER);
    default_data("models/all-MiniLM-L6-v2/model.safetensors");
    let tmp = tempfile::tempdir().unwrap();
    let alpha = corpus(tmp.path(), "alpha", 200);
    let index = tmp.path().join("index");
    let dataset = tmp.path().join("q.jsonl");
    std::fs::write(
        &dataset,
        "{\"question\": \"alpha document river\", \"answers\": [\"alpha\"]}\n",
    )
    .unwrap();
    let dense: Vec<&std::ffi::OsStr> = vec![
        "index".as_ref(),
        "--index".as_ref(),
        index.as_os_str(),
        "--dense".as_ref(),
        model.as_os_str(),
    ];
    let mut first = vec!["index".as_ref(), "--corpus".as_ref(), alpha.as_os_str()];
    first.extend_from_slice(&dense[1..]);
    let out = run(&first);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = |after: &str| {
        let out = run(&[
            "eval".as_ref(),
            "--retrieval-only".as_ref(),
            "--backend".as_ref(),
            "dense".as_ref(),
            "--index".as_ref(),
            index.as_os_str(),
            "--dataset".as_ref(),
            dataset.as_os_str(),
        ]);
        assert!(
            out.status.success(),
            "{after}: the dense index is not served: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    served("first build");
    // A dense rebuild alone (the encoder's load included) sets the range.
    let started = Instant::now();
    assert!(run(&dense).status.success());
    let full = started.elapsed();
    served("second build");
    let bm25 = seeker::search::bm25::Bm25Index::open(&index).unwrap();
    let encoder = seeker::config::DenseConfig::default();
    let spec = seeker::search::embed::Embedder::load(&model, &encoder.options())
        .unwrap()
        .spec()
        .clone();
    let opens = |after: &str| {
        if let Err(e) =
            seeker::search::dense::DenseIndex::open(&index, &bm25, &spec, &model, encoder.search())
        {
            panic!("{after}: the dense index does not open: {e}");
        }
    };
    let mut finished = 0;
    for n in 0..KILLS {
        let when = if n < KILLS / 2 {
            When::After(full.mul_f64(fastrand::f64()))
        } else {
            When::Replacing {
                dir: &index,
                prefix: ".dense.tmp-",
                manifest: "seeker-dense.json",
                delay: Duration::from_micros(fastrand::u64(0..5_000)),
            }
        };
        finished += usize::from(kill(&dense, when));
        opens(&format!("kill {n}"));
        if n % 10 == 9 {
            served(&format!("kill {n}"));
        }
    }
    assert!(
        finished <= KILLS * 3 / 4,
        "{finished} of {KILLS} builds finished before their kill"
    );
    assert!(run(&dense).status.success());
    served("last build");
    let beside: Vec<String> = std::fs::read_dir(&index)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".dense."))
        .collect();
    assert_eq!(beside, Vec::<String>::new());
}
