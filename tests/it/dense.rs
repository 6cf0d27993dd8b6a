//! Dense and hybrid retrieval with the real encoder (all-MiniLM-L6-v2, fetched
//! by `scripts/fetch-defaults.sh`): the embeddings against sentence-transformers'
//! published figures, and `seeker index --dense` then the `dense` and `hybrid`
//! backends through the real binary.

use seeker::search::embed::{dot, EmbedOptions, Embedder, Pooling};

use crate::common::{default_data, root};

fn minilm() -> Embedder {
    default_data("models/all-MiniLM-L6-v2/model.safetensors");
    Embedder::load(
        &root().join(seeker::config::DEFAULT_ENCODER),
        &EmbedOptions::default(),
    )
    .expect("the default encoder loads")
}

/// sentence-transformers' quickstart (sbert.net, "Usage"), with this model:
/// `model.similarity(embeddings, embeddings)` prints 0.6660, 0.1046 and
/// 0.1411 for these three sentences. Reproducing them to 3 decimals checks
/// the tokenizer, the encoder, mean pooling over the mask and normalisation
/// at once; a batch padded to its longest text must give the same vectors as
/// each text alone.
#[test]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
fn minilm_reproduces_the_sentence_transformers_quickstart() {
    let e = minilm();
    let spec = e.spec();
    assert_eq!(
        (spec.dim, spec.pooling, spec.max_length),
        (384, Pooling::Mean, 256)
    );
    assert_eq!(
        (spec.query_prefix.as_str(), spec.passage_prefix.as_str()),
        ("", "")
    );
    let sentences = [
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
    ];
    let v = e.embed_passages(&sentences).unwrap();
    let sim = |a: usize, b: usize| dot(&v[a], &v[b]);
    for (a, b, want) in [(0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411)] {
        assert!(
            (sim(a, b) - want).abs() < 5e-4,
            "similarity {a}-{b}: {} (sentence-transformers: {want})",
            sim(a, b)
        );
    }
    assert!((sim(0, 0) - 1.0).abs() < 1e-5, "unit norm");
    for (i, s) in sentences.iter().enumerate() {
        let alone = e.embed_queries(&[s]).unwrap();
        assert!(
            dot(&alone[0], &v[i]) > 0.99999,
            "padding changed sentence {i}"
        );
    }
}

/// `seeker index --dense` on the shipped corpus's first 500 documents, then the
/// real binary serving `dense` and `hybrid`: every retriever route, and a
/// rollout on the small model whose search runs on `hybrid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn index_dense_then_serve_dense_and_hybrid_through_the_real_binary() {
    use std::process::Command;

    use serde_json::{json, Value};

    use crate::common::post_json;
    use crate::e2e::{start_server_with, wait_healthy, SEEKER};

    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus.jsonl");
    let text = std::fs::read_to_string(default_data("data/wiki/corpus.jsonl")).unwrap();
    let first: String = text.lines().take(500).map(|l| format!("{l}\n")).collect();
    std::fs::write(&corpus, first).unwrap();
    let index = tmp.path().join("index");
    let model = root().join(seeker::config::DEFAULT_ENCODER);
    let out = Command::new(SEEKER)
        .args(["index", "--corpus"])
        .arg(&corpus)
        .arg("--index")
        .arg(&index)
        .arg("--dense")
        .arg(&model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("indexed 500 documents"), "{stdout}");
    assert!(stdout.contains("embedded 500 documents (384-d"), "{stdout}");
    assert!(index.join("dense/vectors.f32").is_file());
    assert_eq!(
        std::fs::metadata(index.join("dense/vectors.f32"))
            .unwrap()
            .len(),
        500 * 384 * 4
    );

    let server = start_server_with(&index, &[]);
    let client = reqwest::Client::new();
    wait_healthy(&client, &server.base).await;
    let base = &server.base;

    // A query that shares no stem with its document ("drunk" is not
    // "drunkenness" to BM25's stemmer): dense ranks it first, BM25's top 3
    // does not hold it. Hybrid is the reciprocal-rank fusion (k = 60, weights
    // 1) of both top-20 lists, which the test recomputes from them.
    let query = "how it feels to be drunk";
    let mut found = std::collections::BTreeMap::new();
    for backend in ["tantivy", "dense", "hybrid"] {
        let topk = if backend == "hybrid" { 3 } else { 20 };
        let v = post_json(
            &client,
            &format!("{base}/retrieve"),
            &json!({"queries": [query], "topk": topk, "backend": backend, "return_scores": true}),
        )
        .await;
        assert!(v.get("errors").is_none(), "{backend}: {v}");
        let docs: Vec<(String, String, f64)> = v["result"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["document"]["id"].as_str().unwrap().to_string(),
                    d["document"]["title"].as_str().unwrap().to_string(),
                    d["score"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(docs.len(), topk, "{backend}: {v}");
        found.insert(backend, docs);
    }
    let titles = |b: &str| -> Vec<&str> { found[b].iter().map(|d| d.1.as_str()).collect() };
    assert_eq!(titles("dense")[0], "Alcohol intoxication", "{found:?}");
    assert!(
        !titles("tantivy")[..3].contains(&"Alcohol intoxication"),
        "{found:?}"
    );
    let mut fused: Vec<(String, f64)> = Vec::new();
    for list in [&found["tantivy"], &found["dense"]] {
        for (rank, (id, _, _)) in list.iter().enumerate() {
            let add = 1.0 / (60.0 + rank as f64 + 1.0);
            match fused.iter_mut().find(|(i, _)| i == id) {
                Some((_, s)) => *s += add,
                None => fused.push((id.clone(), add)),
            }
        }
    }
    fused.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (got, want) in found["hybrid"].iter().zip(&fused) {
        assert!(
            (got.2 - want.1).abs() < 1e-6,
            "hybrid {got:?} vs RRF {want:?}"
        );
    }
    let hybrid_ids: Vec<&str> = found["hybrid"].iter().map(|d| d.0.as_str()).collect();
    let best = fused[0].1;
    assert!(
        fused
            .iter()
            .filter(|f| (f.1 - best).abs() < 1e-9)
            .any(|f| f.0 == hybrid_ids[0]),
        "hybrid's first is RRF's best: {found:?}"
    );

    // The other projects' shapes on the dense backend.
    let search: Value = post_json(
        &client,
        &format!("{base}/search"),
        &json!({"query": query, "top_n": 2, "return_score": true, "backend": "dense"}),
    )
    .await;
    assert_eq!(search[0][0]["title"], "Alcohol intoxication", "{search}");
    let cosine = search[1][0].as_f64().unwrap();
    assert!(
        cosine > 0.0 && cosine <= 1.0,
        "a cosine similarity: {search}"
    );
    let batch: Value = post_json(
        &client,
        &format!("{base}/batch_search"),
        &json!({"query": [query, "capital of Ghana"], "top_n": 1, "backend": "hybrid"}),
    )
    .await;
    assert_eq!(batch[1][0]["title"], "Accra", "{batch}");
    let r1: Value = post_json(
        &client,
        &format!("{base}/queries"),
        &json!({"queries": ["capital of Ghana"], "k": 1, "backend": "dense"}),
    )
    .await;
    assert!(
        r1["answers"][0][0]
            .as_str()
            .unwrap()
            .starts_with("\"Accra\"\n"),
        "{r1}"
    );

    // A rollout whose search runs on hybrid (the small model's profile
    // searches the question first).
    let v: Value = post_json(
        &client,
        &format!("{base}/v1/chat/completions"),
        &json!({
            "model": "default",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the capital of Ghana?"}],
            "search": {"backend": "hybrid"}
        }),
    )
    .await;
    let docs = v["seeker"]["documents"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!docs.is_empty(), "{v}");
    assert!(docs.iter().all(|d| d["backend"] == "hybrid"), "{v}");
    assert!(docs.iter().any(|d| d["title"] == "Accra"), "{v}");

    drop(server);

    // `seeker eval --retrieval-only` scores a backend, with the question as
    // query and with queries a model wrote in an earlier run's output.
    let dataset = tmp.path().join("qa.jsonl");
    std::fs::write(
        &dataset,
        "{\"id\": \"a\", \"question\": \"how it feels to be drunk\", \"answers\": [\"intoxication\"]}\n\
         {\"id\": \"b\", \"question\": \"What is the capital of Ghana?\", \"answers\": [\"Accra\"]}\n\
         {\"id\": \"c\", \"question\": \"Which city hosts the Acropolis?\", \"answers\": [\"Athens\"]}\n",
    )
    .unwrap();
    let eval = |extra: &[&str]| {
        let out = Command::new(SEEKER)
            .args(["eval", "--retrieval-only", "--top-k", "3", "--dataset"])
            .arg(&dataset)
            .arg("--index")
            .arg(&index)
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let report = eval(&["--backend", "dense", "--concurrency", "2"]);
    assert!(report.contains("questions 3\nbackend dense"), "{report}");
    assert!(
        report.contains("answer recall@1: 1.000 (3 of 3)"),
        "{report}"
    );
    assert!(report.contains("(2 clients)"), "{report}");
    let earlier = tmp.path().join("earlier.jsonl");
    std::fs::write(
        &earlier,
        "{\"id\": \"a\", \"search_queries\": [\"Ghana capital\", \"alcohol intoxication\"]}\n\
         {\"id\": \"b\", \"search_queries\": []}\n",
    )
    .unwrap();
    let report = eval(&[
        "--backend",
        "hybrid",
        "--queries-from",
        earlier.to_str().unwrap(),
    ]);
    assert!(report.contains("questions 1\n"), "{report}");
    assert!(report.contains("query: the model's queries"), "{report}");
    assert!(report.contains("left out: 2 questions"), "{report}");
    assert!(
        report.contains("answer recall@3: 1.000 (1 of 1)"),
        "{report}"
    );
    let out = Command::new(SEEKER)
        .args([
            "eval",
            "--retrieval-only",
            "--backend",
            "dense",
            "--dataset",
        ])
        .arg(&dataset)
        .arg("--index")
        .arg(tmp.path().join("no-index"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no index here"), "{stderr}");
    // A dense index beside a BM25 index of another corpus is not used, and
    // the error names the command that rebuilds it, with the encoder's
    // directory (not a placeholder).
    let other_corpus = tmp.path().join("other.jsonl");
    let other: String = text
        .lines()
        .skip(500)
        .take(50)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&other_corpus, other).unwrap();
    let other_index = tmp.path().join("other-index");
    let status = Command::new(SEEKER)
        .args(["index", "--corpus"])
        .arg(&other_corpus)
        .arg("--index")
        .arg(&other_index)
        .output()
        .unwrap()
        .status;
    assert!(status.success());
    std::fs::create_dir_all(other_index.join("dense")).unwrap();
    for file in ["seeker-dense.json", "vectors.f32"] {
        std::fs::copy(
            index.join("dense").join(file),
            other_index.join("dense").join(file),
        )
        .unwrap();
    }
    let out = Command::new(SEEKER)
        .args([
            "eval",
            "--retrieval-only",
            "--backend",
            "dense",
            "--dataset",
        ])
        .arg(&dataset)
        .arg("--index")
        .arg(&other_index)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let rebuild = format!(
        "seeker index --dense {} --index {}",
        seeker::config::DEFAULT_ENCODER,
        other_index.display()
    );
    assert!(
        stderr.contains("another corpus") && stderr.contains(&rebuild),
        "{stderr}"
    );

    // A top-k outside what the server allows, or a generation flag a
    // retrieval-only run would ignore, is refused before anything runs.
    for (extra, says) in [
        (&["--top-k", "0"][..], "0 is not in 1..=50"),
        (&["--top-k", "1000000"][..], "1000000 is not in 1..=50"),
        (
            &["--max-tokens", "5"][..],
            "cannot be used with '--max-tokens",
        ),
        (
            &["--temperature", "0.7"][..],
            "cannot be used with '--temperature",
        ),
    ] {
        let out = Command::new(SEEKER)
            .args(["eval", "--retrieval-only", "--dataset"])
            .arg(&dataset)
            .arg("--index")
            .arg(&index)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }

    // Past search.dense.approximate_above the dense backend searches the
    // same index by its sign-bit codes, scoring only the `rescore` nearest
    // codes exactly: with 50 of the 500 rows rescored it finds what exact
    // search finds, and says which search it runs.
    let documents = |approximate_above: &str, out: &std::path::Path| -> (Vec<Value>, String) {
        let run = Command::new(SEEKER)
            .args([
                "eval",
                "--retrieval-only",
                "--backend",
                "dense",
                "--top-k",
                "3",
                "--dataset",
            ])
            .arg(&dataset)
            .arg("--index")
            .arg(&index)
            .arg("--out")
            .arg(out)
            .env("SEEKER_SEARCH__DENSE__APPROXIMATE_ABOVE", approximate_above)
            .env("SEEKER_SEARCH__DENSE__RESCORE", "50")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "{stderr}");
        let documents = std::fs::read_to_string(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["documents"].clone())
            .collect();
        (documents, stderr)
    };
    let (exact, said) = documents("100000", &tmp.path().join("exact.jsonl"));
    assert!(said.contains("search=\"exact\""), "{said}");
    let (binary, said) = documents("100", &tmp.path().join("binary.jsonl"));
    assert!(said.contains("search=\"binary\""), "{said}");
    assert_eq!(exact.len(), 3);
    assert_eq!(
        binary, exact,
        "the sign-bit search's top 3 are exact search's"
    );

    // A vector that is not a number (a damaged file, a broken encoder) makes
    // the index unusable with the row and the rebuild command, instead of
    // codes that silently rank every row alike.
    let vectors = index.join("dense/vectors.f32");
    let mut bytes = std::fs::read(&vectors).unwrap();
    bytes[3 * 384 * 4..3 * 384 * 4 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&vectors, bytes).unwrap();
    let out = Command::new(SEEKER)
        .args([
            "eval",
            "--retrieval-only",
            "--backend",
            "dense",
            "--dataset",
        ])
        .arg(&dataset)
        .arg("--index")
        .arg(&index)
        .env("SEEKER_SEARCH__DENSE__APPROXIMATE_ABOVE", "100")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("row 3 holds a value that is not a finite number")
            && stderr.contains("seeker index --dense"),
        "{stderr}"
    );
}
