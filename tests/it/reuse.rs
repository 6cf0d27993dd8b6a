//! Prefix reuse in the embedded engine (issue 13, `src/engine/reuse.rs`), on
//! the real small model. Its default weights are F32 (`weights = auto`),
//! where a reused row equals a recomputed one to rounding: reuse must give
//! the same next-token log-probabilities as a full prefill within 1e-4.
//!
//! Needs `scripts/fetch-defaults.sh --no-index` (SmolLM2).

use std::time::Duration;

use seeker::chat::{ChatTurn, Role};
use seeker::config::ActivationDtype;
use seeker::config::WeightFormat;
use seeker::engine::mistral::{MistralConfig, MistralEngine};
use seeker::engine::{Engine, EngineEvent, GenerationParams};

use crate::common::{default_data, metrics_of, profile};

/// Log-prob agreement asked of reuse against a full prefill (F32 weights).
const EXACT: f64 = 1e-4;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// No prefix cache: every prompt is prefilled whole.
    Off,
    /// mistral.rs's prefix cache as it is (no sentinels).
    Naive,
    /// seeker's reuse (the default).
    Sentinel,
}

async fn small(mode: Mode) -> MistralEngine {
    MistralEngine::load(&MistralConfig {
        gguf: default_data(seeker::config::SMALL_GGUF),
        checkpoint: None,
        isq: Default::default(),
        dtype: ActivationDtype::F32,
        max_num_seqs: 1,
        weights: WeightFormat::Auto,
        prefix_cache: mode != Mode::Off,
        prefix_cache_mib: 2048,
        naive_prefix_cache: mode == Mode::Naive,
        token_continuation: true,
    })
    .await
    .expect("small model (scripts/fetch-defaults.sh --no-index)")
}

/// Greedy text after `prompt` up to `</search>` (at most `max_tokens`), and
/// the prompt tokens the engine said it took from its cache.
async fn until_close(engine: &MistralEngine, prompt: &str, max_tokens: usize) -> (String, usize) {
    let params = GenerationParams {
        max_tokens,
        temperature: None,
        top_p: None,
        stop: vec!["</search>".into()],
        session: None,
    };
    let mut generation = engine.generate(prompt, &params).await.unwrap();
    let (mut text, mut cached) = (String::new(), 0);
    while let Some(event) = generation.events.recv().await {
        match event.unwrap() {
            EngineEvent::Text { text: t, .. } => text.push_str(&t),
            EngineEvent::Prompt { cached: c, .. } => cached = c.unwrap_or(0),
            EngineEvent::Done(_) => break,
        }
    }
    (text, cached)
}

/// Search-R1's first prompt for `question` on `engine`'s template, the
/// assistant turn opened with a search call left open.
async fn round_one(engine: &MistralEngine, question: &str, query: &str) -> String {
    let instruction = profile("search-r1").user_message(question);
    let rendered = engine
        .render_chat(&[ChatTurn::new(Role::User, instruction)])
        .await
        .unwrap();
    format!("{rendered}<think>\nI should look this up.\n</think>\n<search> {query}")
}

/// The largest difference between `a` and `b` over `a`'s top tokens; a token
/// missing from `b`'s list counts as infinite.
fn max_diff(a: &[(u32, f64)], b: &[(u32, f64)]) -> f64 {
    a.iter()
        .take(5)
        .map(|(id, lp)| {
            b.iter()
                .find(|(i, _)| i == id)
                .map_or(f64::INFINITY, |(_, other)| (lp - other).abs())
        })
        .fold(0.0, f64::max)
}

const SPLICE: &str = "<information>Doc 1(Title: \"Mekong\") The Mekong rises on the Tibetan Plateau in Qinghai, China.\nDoc 2(Title: \"Lancang\") In China the river is called the Lancang.\n</information>\n\n";

/// Issue 13's bug case: round 1 stops at `</search>`, and round 2's splice
/// starts with exactly what the model wrote after the tag (the token that
/// found the stop string, which mistral.rs caches with no KV row).
#[tokio::test(flavor = "multi_thread")]
async fn a_round_after_a_splice_reads_as_a_full_prefill_and_naive_reuse_does_not() {
    let off = small(Mode::Off).await;
    let r1 = round_one(
        &off,
        "Where does the Mekong River originate?",
        "Mekong origin",
    )
    .await;
    let (written, _) = until_close(&off, &r1, 16).await;
    let (kept, late) = written
        .split_once("</search>")
        .expect("the model closes the search call");
    assert!(!late.is_empty(), "the token after the tag is in the text");
    let r2 = format!("{r1}{kept}</search>{late}{SPLICE}");
    let full = off.next_token_logprobs(&r2, 10).await.unwrap();

    let mut diffs = Vec::new();
    for mode in [Mode::Naive, Mode::Sentinel] {
        let engine = small(mode).await;
        let (again, _) = until_close(&engine, &r1, 16).await;
        if mode == Mode::Naive {
            assert_eq!(again, written, "same greedy round 1");
        }
        let hits = engine.prefix_cache_hits();
        let reused = engine.next_token_logprobs(&r2, 10).await.unwrap();
        assert_eq!(
            engine.prefix_cache_hits(),
            hits + 1,
            "round 2 took round 1's rows from the cache"
        );
        diffs.push(max_diff(&full, &reused));
    }
    eprintln!(
        "naive reuse differs by {:.6}, seeker's by {:.2e}",
        diffs[0], diffs[1]
    );
    assert!(
        diffs[1] <= EXACT,
        "reuse must read as a full prefill: {:.2e} > {EXACT:e}",
        diffs[1]
    );
    assert!(
        diffs[0] > 100.0 * EXACT,
        "naive reuse was expected to read a zero row here ({:.2e}): the test lost its bug case",
        diffs[0]
    );
}

/// Four search rounds, each reusing the one before: per round, the
/// next-token log-probabilities equal a full prefill's and mistral.rs counts
/// a hit (from round 2 on).
#[tokio::test(flavor = "multi_thread")]
async fn four_rounds_each_reuse_the_last_and_match_full_prefills() {
    let off = small(Mode::Off).await;
    let reuse = small(Mode::Sentinel).await;
    let queries = [
        "Mekong origin",
        "Lancang river",
        "Qinghai plateau",
        "Mekong length",
    ];
    let mut transcript =
        round_one(&reuse, "Where does the Mekong River originate?", queries[0]).await;
    for (round, query) in queries.iter().enumerate() {
        if round > 0 {
            transcript.push_str(&format!("<search> {query}"));
        }
        // The next-token distribution, reusing the last round's sequence.
        let expected = off.next_token_logprobs(&transcript, 10).await.unwrap();
        let hits = reuse.prefix_cache_hits();
        let got = reuse.next_token_logprobs(&transcript, 10).await.unwrap();
        let diff = max_diff(&expected, &got);
        assert!(diff <= EXACT, "round {}: {diff:.2e}", round + 1);
        if round > 0 {
            assert_eq!(reuse.prefix_cache_hits(), hits + 1, "round {}", round + 1);
        }
        // The round itself. Its prompt is the whole key of the probe just
        // cached, which mistral.rs does not reuse (a match must leave a
        // token to prefill): it reuses nothing, and says so.
        let (written, cached) = until_close(&reuse, &transcript, 24).await;
        assert_eq!(cached, 0, "round {}", round + 1);
        let kept = written.split("</search>").next().unwrap();
        transcript.push_str(&format!("{kept}</search>\n\n{SPLICE}"));
    }
    assert!(reuse.prefix_cache_bytes() > 0);
}

/// The warm-up run's entry and a prompt holding a sentinel: the tracker
/// flushes instead of letting a prompt cover a whole key; generations that
/// end by EOS, length and stop string all end in a sentinel (no flush for an
/// unknown end).
#[tokio::test(flavor = "multi_thread")]
async fn every_way_a_sequence_ends_leaves_a_known_key() {
    let engine = small(Mode::Sentinel).await;
    let prompt = round_one(&engine, "Who wrote Hamlet?", "Hamlet author").await;
    let ask = |max_tokens: usize, stop: Vec<String>| GenerationParams {
        max_tokens,
        temperature: None,
        top_p: None,
        stop,
        session: None,
    };
    // Length, stop string, end of turn.
    for params in [
        ask(3, vec![]),
        ask(32, vec!["</search>".into()]),
        ask(200, vec![]),
    ] {
        let mut generation = engine.generate(&prompt, &params).await.unwrap();
        let mut tokens = 0;
        let mut finish = None;
        while let Some(event) = generation.events.recv().await {
            match event.unwrap() {
                EngineEvent::Text { tokens: n, .. } => tokens += n,
                EngineEvent::Done(f) => finish = Some(f),
                EngineEvent::Prompt { .. } => {}
            }
        }
        assert!(finish.is_some());
        assert_eq!(
            engine.prefix_cache_flushes(),
            1,
            "no flush for an unknown end"
        );
        assert!(
            tokens <= params.max_tokens,
            "{tokens} > {}",
            params.max_tokens
        );
        if params.max_tokens == 3 {
            assert_eq!(tokens, 3, "the budget is spent exactly");
            assert_eq!(finish, Some(seeker::engine::EngineFinish::Length));
        }
    }
    // A consumer that leaves at once: the sequence is ended at its next
    // step by the sentinel, and recorded.
    let before = engine.prefix_cache_bytes();
    let generation = engine.generate(&prompt, &ask(50, vec![])).await.unwrap();
    drop(generation);
    let waited = std::time::Instant::now();
    while engine.prefix_cache_bytes() == before {
        assert!(waited.elapsed() < Duration::from_secs(30), "never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A longer prompt reuses the shared one; the only flush was the one at
    // startup (none for an unknown end).
    let (text, cached) = until_close(&engine, &format!("{prompt} of the play"), 8).await;
    assert!(!text.is_empty());
    assert!(cached > 0, "the shared prompt was reused");
    assert_eq!(engine.prefix_cache_flushes(), 1);

    // A prompt that holds a whole cached key (here: the sentinel a cached
    // sequence ended with, written out) empties the cache first.
    let flushes = engine.prefix_cache_flushes();
    let written = until_close(&engine, &prompt, 32).await.0;
    let kept = written.split("</search>").next().unwrap();
    let sentinel = engine.sentinel_texts().expect("reuse is on").1;
    let covering = format!("{prompt}{kept}</search>{sentinel} and on");
    let hits = engine.prefix_cache_hits();
    let (_, cached) = until_close(&engine, &covering, 4).await;
    assert_eq!(engine.prefix_cache_flushes(), flushes + 1);
    // mistral.rs's cache was really emptied: the prompt, which shares the
    // cached prompt, found nothing in it.
    assert_eq!(cached, 0);
    assert_eq!(
        engine.prefix_cache_hits(),
        hits,
        "the cache was not emptied"
    );
    // And it still serves, reusing again.
    let (text, cached) = until_close(&engine, &format!("{prompt} in the end"), 4).await;
    assert!(!text.is_empty());
    assert!(cached > 0);
}

/// The server as users start it (small model), 100 rollouts one after
/// another with distinct questions and a 64 MiB budget: seeker's count of
/// the cache never passes the budget, the cache is emptied for the budget
/// only (never for an unforeseen end or a covered key), the shared
/// instruction is reused, and resident memory is flat after warm-up (the
/// first 30 rollouts). It ran 200 until 2026-12-07; 100 keep every check at
/// half the time (CI's 60-minute aim).
#[tokio::test(flavor = "multi_thread")]
async fn memory_stays_under_the_budget_over_100_rollouts() {
    const BUDGET_MIB: u64 = 64;
    const ROLLOUTS: usize = 100;
    const WARM: usize = 30;
    let server = crate::e2e::start_server_args(
        crate::e2e::shared_index(),
        &[
            ("SEEKER_MODEL__PREFIX_CACHE_MIB", "64"),
            ("SEEKER_POLICY__DEFAULT", "search-r1"),
        ],
        &[],
    );
    let client = reqwest::Client::new();
    crate::e2e::wait_healthy(&client, &server.base).await;
    let pid = server.child.id();
    let metric = |text: &str, name: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let subjects = [
        "the Nile",
        "Mount Everest",
        "the Eiffel Tower",
        "Marie Curie",
        "the Amazon",
        "Beethoven",
        "the Sahara",
        "Isaac Newton",
        "the Great Wall",
        "Shakespeare",
    ];
    let asks = [
        "Where is",
        "Who built",
        "Why is",
        "When did we learn about",
        "What is special about",
    ];
    let mut rss_after = Vec::new();
    for i in 0..ROLLOUTS {
        let question = format!(
            "{} {} (question {i})?",
            asks[i % asks.len()],
            subjects[(i / asks.len()) % subjects.len()]
        );
        let body = serde_json::json!({
            "model": "default",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 8,
        });
        let answer = crate::common::post_json(
            &client,
            &format!("{}/v1/chat/completions", server.base),
            &body,
        )
        .await;
        assert!(
            answer["choices"][0]["finish_reason"].is_string(),
            "{answer}"
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss_kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap();
        rss_after.push(rss_kib / 1024);
        // The sequence that passes the budget is cached, and the cache
        // emptied as soon as it has ended: wait for that.
        let settled = std::time::Instant::now();
        loop {
            let text = metrics_of(&client, &server.base).await;
            let held = metric(&text, "seeker_prefix_cache_bytes");
            if held <= BUDGET_MIB << 20 {
                break;
            }
            assert!(
                settled.elapsed() < Duration::from_secs(10),
                "rollout {i}: {held} bytes held"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let text = metrics_of(&client, &server.base).await;
    let flushes = |reason: &str| {
        metric(
            &text,
            &format!("seeker_prefix_cache_flushes_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(flushes("budget") >= 10, "{}", flushes("budget"));
    assert_eq!(flushes("unknown_end"), 0);
    assert_eq!(flushes("covered"), 0);
    assert_eq!(flushes("startup"), 1);
    assert!(metric(&text, "seeker_prompt_tokens_cached_total") > 0);
    let warm = rss_after[WARM - 1];
    let peak = *rss_after[WARM..].iter().max().unwrap();
    eprintln!(
        "RSS after rollout 1: {} MiB, {WARM}: {warm} MiB, {ROLLOUTS}: {} MiB, peak after {WARM}: {peak} MiB; {} flushes",
        rss_after[0],
        rss_after[ROLLOUTS - 1],
        flushes("budget")
    );
    assert!(
        peak <= warm + BUDGET_MIB + 32,
        "RSS grew from {warm} MiB to {peak} MiB after warm-up"
    );
}
