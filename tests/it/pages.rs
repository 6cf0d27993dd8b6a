//! The page reader against a local page server and a test resolver: one
//! allowed fetch, each refusal (schemes, every spelling of loopback, a
//! redirect to 127.0.0.1, names resolving to private addresses, a DNS answer
//! that changes), capped and slow bodies; then ASearcher's `<access>` through
//! the search loop: chunks one per round, the pause, short forms, refusals
//! spliced as the policy's failure text, corpus documents by id.
//!
//! The page server listens on 127.0.0.2, which the reader's config allows
//! explicitly (`allow_networks`); 127.0.0.1 stays refused, so a redirect
//! there proves the address check rather than a closed port.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use seeker::chat::{ChatTurn, Role};
use seeker::engine::scripted::ScriptedEngine;
use seeker::metrics::Metrics;
use seeker::pages::{Lookup, PageError, PageReader, PageSettings, UrlPolicy};
use seeker::profile::Profile;
use seeker::rollout::{FinishReason, RolloutContext, RolloutEvent, RolloutRequest, RoundOutcome};
use seeker::search::bm25::{build_index, Bm25Index};
use seeker::search::dispatch::Dispatcher;

use crate::common::{doc, profile, StaticBackend};

pub const ARTICLE: &str = r#"<!doctype html><html><head><title>Taj Mahal</title></head><body>
<nav><a href="/">Home</a> <a href="/menu">Menu entry</a></nav>
<article><h1>Taj Mahal</h1>
<p>The Taj Mahal is an ivory-white marble mausoleum on the right bank of the river Yamuna in
Agra, India. It was commissioned in 1631 by the fifth Mughal emperor, Shah Jahan, to house the
tomb of his beloved wife, Mumtaz Mahal.</p>
<p>The tomb is the centrepiece of a 17-hectare complex, which includes a mosque and a guest
house, and is set in formal gardens bounded on three sides by a crenellated wall.</p>
</article><footer>Footer links</footer></body></html>"#;

/// A page whose fact is in no corpus: an answer holding 1887 was read here.
pub const LIGHTHOUSE: &str = r#"<!doctype html><html><head><title>The Saltmere Lighthouse</title></head><body>
<nav><a href="/">Home</a> <a href="/menu">Menu entry</a></nav>
<article><h1>The Saltmere Lighthouse</h1>
<p>The Saltmere lighthouse was completed in 1887 by the engineer Tove Lindqvist, who built its
lantern from 240 panes of glass. It guided fishing boats through the strait for a century.</p>
<p>The lighthouse was automated in 1972 and now houses a small museum of its keepers' logbooks.</p>
</article><footer>Footer links</footer></body></html>"#;

/// 100 characters of plain text: 3 chunks of 40.
const LONG: &str = "aaaaaaaaaabbbbbbbbbbccccccccccddddddddddeeeeeeeeeeffffffffffgggggggggghhhhhhhhhhiiiiiiiiiijjjjjjjjjj";

/// A page server on 127.0.0.2 and how often each path was asked for.
pub struct PageServer {
    pub port: u16,
    pub hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl PageServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.2:{}{path}", self.port)
    }

    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

pub async fn page_server() -> PageServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counted = Arc::clone(&hits);
    let redirect = |to: String| {
        move || {
            let to = to.clone();
            async move { (StatusCode::FOUND, [(header::LOCATION, to)]).into_response() }
        }
    };
    let router = Router::new()
        .route(
            "/article",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    ARTICLE,
                )
            }),
        )
        .route(
            "/lighthouse",
            get(|| async { ([(header::CONTENT_TYPE, "text/html")], LIGHTHOUSE) }),
        )
        .route(
            "/long",
            get(|| async { ([(header::CONTENT_TYPE, "text/plain")], LONG) }),
        )
        .route(
            "/to-loopback",
            get(redirect(format!("http://127.0.0.1:{port}/article"))),
        )
        .route("/to-file", get(redirect("file:///etc/passwd".into())))
        .route("/to-article", get(redirect("/article".into())))
        .route("/loop", get(redirect("/loop".into())))
        .route(
            "/huge",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain")],
                    "x".repeat(8 * 1024 * 1024),
                )
            }),
        )
        .route(
            "/endless",
            get(|| async {
                let chunks = futures::stream::repeat_with(|| {
                    Ok::<_, std::io::Error>(axum::body::Bytes::from_static(&[b'y'; 8192]))
                });
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/plain")
                    .body(axum::body::Body::from_stream(chunks))
                    .unwrap()
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        )
        // Pages built to exhaust the extractors (issue 48): 40,000 nested
        // spans overflowed a blocking thread's stack and aborted the
        // process; 2,000 nested divs took 47 s; 110 KB of nesting hours.
        .route(
            "/crash",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html")],
                    nested("span", 40_000),
                )
            }),
        )
        .route(
            "/divs",
            get(|| async { ([(header::CONTENT_TYPE, "text/html")], nested("div", 2_000)) }),
        )
        .route(
            "/nested/{n}",
            get(|| async { ([(header::CONTENT_TYPE, "text/html")], nested("div", 22_000)) }),
        )
        // A compressed body sent although the reader asked for none, and
        // bytes labelled text: ~1 M characters of garbage were spliced.
        .route(
            "/gzip",
            get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/html"),
                        (header::CONTENT_ENCODING, "gzip"),
                    ],
                    vec![
                        0x1f_u8, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48,
                    ],
                )
            }),
        )
        .route(
            "/binary",
            get(|| async {
                let mut body = b"PNG-like".to_vec();
                body.extend((0..4096u32).map(|i| (i * 37 % 256) as u8));
                ([(header::CONTENT_TYPE, "text/plain")], body)
            }),
        )
        .route(
            "/pdf",
            get(|| async { ([(header::CONTENT_TYPE, "application/pdf")], "%PDF-1.4") }),
        )
        .route(
            "/error",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "broken") }),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let counted = Arc::clone(&counted);
                async move {
                    *counted
                        .lock()
                        .unwrap()
                        .entry(req.uri().path().to_string())
                        .or_default() += 1;
                    next.run(req).await
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    PageServer { port, hits }
}

/// `config/seeker.toml` with web pages on for the local page server only
/// (127.0.0.2) and each `(from, to)` of `edits` made (each must apply),
/// written into `dir`; its path.
fn web_config(dir: &std::path::Path, edits: &[(&str, &str)]) -> std::path::PathBuf {
    let mut config =
        std::fs::read_to_string(crate::common::root().join("config/seeker.toml")).unwrap();
    for (from, to) in [
        ("\nweb = false\n", "\nweb = true\n"),
        ("allow_networks = []", "allow_networks = [\"127.0.0.2/32\"]"),
    ]
    .iter()
    .chain(edits)
    {
        assert!(config.contains(from), "config/seeker.toml has no {from:?}");
        config = config.replacen(from, to, 1);
    }
    let path = dir.join("seeker.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// A page of `depth` nested, unclosed `tag` elements around the word
/// "innermost".
pub fn nested(tag: &str, depth: usize) -> String {
    format!("<html><body>{}innermost", format!("<{tag}>").repeat(depth))
}

/// A resolver with fixed answers; `flip.test` answers 127.0.0.2 the first
/// time and 127.0.0.1 after (a DNS answer that changes between lookups).
pub struct TestLookup {
    flips: AtomicUsize,
}

impl Lookup for TestLookup {
    fn lookup(
        &self,
        host: String,
    ) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let flip = if host == "flip.test" {
            self.flips.fetch_add(1, Ordering::SeqCst)
        } else {
            0
        };
        Box::pin(async move {
            let ips: Vec<&str> = match host.as_str() {
                "pages.test" => vec!["127.0.0.2"],
                "intranet.test" => vec!["10.0.0.7"],
                "metadata.test" => vec!["169.254.169.254"],
                "v6private.test" => vec!["fd12::1", "::1"],
                "127.0.0.1.nip.io" => vec!["127.0.0.1"],
                "mixed.test" => vec!["10.0.0.1", "127.0.0.2"],
                "flip.test" if flip == 0 => vec!["127.0.0.2"],
                "flip.test" => vec!["127.0.0.1"],
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no such host",
                    ))
                }
            };
            Ok(ips.into_iter().map(|ip| ip.parse().unwrap()).collect())
        })
    }
}

/// Web pages on, 127.0.0.2 allowed, 1 s deadline, 64 KiB bodies, no cache.
pub fn settings() -> PageSettings {
    PageSettings {
        web: true,
        timeout: Duration::from_secs(1),
        max_bytes: 64 * 1024,
        cache_ttl: Duration::ZERO,
        failure_ttl: Duration::ZERO,
        host_requests_per_second: 0,
        policy: UrlPolicy {
            allow_networks: vec!["127.0.0.2/32".parse().unwrap()],
            ..UrlPolicy::default()
        },
        ..PageSettings::default()
    }
}

fn reader(settings: PageSettings) -> (PageReader, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let reader = PageReader::with_lookup(
        settings,
        Arc::new(TestLookup {
            flips: AtomicUsize::new(0),
        }),
        Arc::clone(&metrics),
    )
    .unwrap();
    (reader, metrics)
}

#[tokio::test]
async fn an_allowed_page_is_read_as_its_article_without_the_menu() {
    let server = page_server().await;
    let (reader, metrics) = reader(settings());
    let page = reader.open(&server.url("/article")).await.unwrap();
    assert_eq!(page.title, "Taj Mahal");
    assert!(page.text.contains("commissioned in 1631"), "{}", page.text);
    assert!(!page.text.contains("Menu entry"), "{}", page.text);
    assert_eq!(page.source, "web");
    // A name resolved by the (test) resolver, and a relative redirect.
    let via_name = reader
        .open(&format!("http://pages.test:{}/to-article", server.port))
        .await
        .unwrap();
    assert_eq!(via_name.text, page.text);
    assert!(via_name.url.ends_with("/article"), "{}", via_name.url);
    let plain = reader.open(&server.url("/long")).await.unwrap();
    assert_eq!(plain.text, LONG);
    assert!(metrics
        .render()
        .contains("seeker_page_fetches_total{outcome=\"ok\"} 3"));
}

#[tokio::test]
async fn hostile_urls_are_refused_before_anything_is_fetched_and_none_hangs() {
    let server = page_server().await;
    let (reader, metrics) = reader(settings());
    let p = server.port;
    let hostile: Vec<(String, &str)> = vec![
        ("file:///etc/passwd".into(), "refused"),
        (format!("gopher://127.0.0.2:{p}/article"), "refused"),
        ("ftp://example.org/file".into(), "refused"),
        ("data:text/html,<h1>hi</h1>".into(), "refused"),
        ("javascript:alert(1)".into(), "refused"),
        (format!("http://127.0.0.1:{p}/article"), "refused"),
        (format!("http://2130706433:{p}/article"), "refused"),
        (format!("http://0x7f000001:{p}/article"), "refused"),
        (format!("http://0177.0.0.1:{p}/article"), "refused"),
        (format!("http://127.1:{p}/article"), "refused"),
        (format!("http://%31%32%37.0.0.1:{p}/article"), "refused"),
        (format!("http://[::1]:{p}/article"), "refused"),
        (format!("http://[::ffff:127.0.0.1]:{p}/article"), "refused"),
        (format!("http://[::ffff:7f00:2]:{p}/article"), "refused"),
        (format!("http://localhost:{p}/metrics"), "refused"),
        ("http://169.254.169.254/latest/meta-data/".into(), "refused"),
        ("http://[fd00:ec2::254]/latest/meta-data/".into(), "refused"),
        (format!("http://0.0.0.0:{p}/article"), "refused"),
        (format!("http://user:pw@127.0.0.2:{p}/article"), "refused"),
        (
            server.url(&format!("/article?{}", "a".repeat(5000))),
            "refused",
        ),
        // Names whose addresses are refused (the test resolver's answers).
        ("http://intranet.test/".into(), "refused"),
        ("http://metadata.test/latest/meta-data/".into(), "refused"),
        (format!("http://v6private.test:{p}/"), "refused"),
        (format!("http://127.0.0.1.nip.io:{p}/article"), "refused"),
        // Redirects, each target checked again.
        (server.url("/to-loopback"), "refused"),
        (server.url("/to-file"), "refused"),
        (server.url("/loop"), "redirect"),
        // Types and servers that cannot be read.
        (server.url("/pdf"), "unsupported"),
        (server.url("/error"), "http_status"),
        (server.url("/slow"), "timeout"),
    ];
    assert!(hostile.len() >= 20);
    let started = std::time::Instant::now();
    let targets: Vec<String> = hostile.iter().map(|(u, _)| u.clone()).collect();
    let results = tokio::time::timeout(Duration::from_secs(10), reader.open_all(&targets))
        .await
        .expect("no page action outlives its deadline");
    for ((url, kind), result) in hostile.iter().zip(&results) {
        match result {
            Err(e) => assert_eq!(e.kind(), *kind, "{url}: {e}"),
            Ok(page) => panic!("{url} was read: {page:?}"),
        }
    }
    // All at once: the slow one costs its deadline, not the sum.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The loopback redirect's target never got a request: only the
    // redirecting pages themselves were asked for.
    assert_eq!(server.hits("/article"), 0);
    assert_eq!(server.hits("/to-loopback"), 1);
    let text = metrics.render();
    assert!(
        text.contains("seeker_page_fetches_total{outcome=\"refused\"} 26"),
        "{text}"
    );
}

#[tokio::test]
async fn a_name_whose_answer_changes_is_checked_at_every_lookup() {
    let server = page_server().await;
    let (reader, _) = reader(settings());
    let url = format!("http://flip.test:{}/article", server.port);
    assert!(reader.open(&url).await.is_ok());
    let second = reader.open(&url).await.unwrap_err();
    assert_eq!(second.kind(), "refused", "{second}");
    // A name with a refused and an allowed address connects to the allowed one.
    let mixed = format!("http://mixed.test:{}/article", server.port);
    assert!(reader.open(&mixed).await.is_ok());
}

#[tokio::test]
async fn huge_and_endless_bodies_are_cut_at_the_byte_cap() {
    let server = page_server().await;
    let (reader, _) = reader(settings());
    for path in ["/huge", "/endless"] {
        let page = tokio::time::timeout(Duration::from_secs(5), reader.open(&server.url(path)))
            .await
            .expect("bounded")
            .unwrap();
        assert!(page.truncated, "{path}");
        assert_eq!(page.text.len(), 64 * 1024, "{path}");
    }
}

#[tokio::test]
async fn pages_too_deep_to_parse_are_read_flat_and_free_their_workers() {
    let server = page_server().await;
    let (reader, metrics) = reader(PageSettings {
        max_bytes: 2 * 1024 * 1024,
        timeout: Duration::from_secs(10),
        ..settings()
    });
    for path in ["/crash", "/divs", "/nested/1"] {
        let page = reader.open(&server.url(path)).await.unwrap();
        assert!(!page.truncated, "{path}");
        // Every word is kept; the structure (and a title) is not.
        assert_eq!(page.text, "innermost", "{path}");
    }
    assert_eq!(metrics.page_flattened.get(), 3);
    assert_eq!(metrics.page_extractions_running.get(), 0);
    // An ordinary page is still read as its article.
    let page = reader.open(&server.url("/article")).await.unwrap();
    assert_eq!(page.title, "Taj Mahal");
    assert_eq!(metrics.page_flattened.get(), 3);
}

#[tokio::test]
async fn compressed_and_binary_bodies_are_refused_with_their_kind() {
    let server = page_server().await;
    let (reader, _) = reader(settings());
    let e = reader.open(&server.url("/gzip")).await.unwrap_err();
    assert_eq!(e, PageError::Unsupported("gzip-encoded".into()));
    let e = reader.open(&server.url("/binary")).await.unwrap_err();
    assert_eq!(e, PageError::Unsupported("binary".into()));
    assert_eq!(e.to_string(), "cannot read binary pages");
}

#[tokio::test]
async fn a_failed_page_is_not_fetched_again_while_its_failure_is_remembered() {
    let server = page_server().await;
    let (remembering, metrics) = reader(PageSettings {
        failure_ttl: Duration::from_secs(30),
        ..settings()
    });
    for _ in 0..3 {
        let e = remembering.open(&server.url("/error")).await.unwrap_err();
        assert_eq!(e, PageError::Status(500));
    }
    assert_eq!(server.hits("/error"), 1);
    // Still counted as what they are.
    assert!(metrics
        .render()
        .contains("seeker_page_fetches_total{outcome=\"http_status\"} 3"));
    // failure_ttl 0: every call fetches again.
    let (forgetting, _) = reader(settings());
    for _ in 0..2 {
        forgetting.open(&server.url("/error")).await.unwrap_err();
    }
    assert_eq!(server.hits("/error"), 3);
}

#[tokio::test]
async fn web_pages_are_off_until_configured_and_lists_apply() {
    let server = page_server().await;
    let (off, _) = reader(PageSettings {
        web: false,
        ..settings()
    });
    assert_eq!(
        off.open(&server.url("/article")).await.unwrap_err(),
        PageError::Disabled
    );
    // Refusals come first: a disabled reader still says why a URL is refused.
    assert_eq!(
        off.open("http://127.0.0.1/").await.unwrap_err().kind(),
        "refused"
    );
    let mut listed = settings();
    listed.policy.allow_hosts = vec!["pages.test".into()];
    let (allow, _) = reader(listed);
    assert_eq!(
        allow
            .open(&server.url("/article"))
            .await
            .unwrap_err()
            .kind(),
        "refused"
    );
    assert!(allow
        .open(&format!("http://pages.test:{}/article", server.port))
        .await
        .is_ok());
    let mut denied = settings();
    denied.policy.deny_hosts = vec!["*.test".into()];
    let (deny, _) = reader(denied);
    assert_eq!(
        deny.open(&format!("http://pages.test:{}/article", server.port))
            .await
            .unwrap_err()
            .kind(),
        "refused"
    );
}

/// A corpus with one document, as `seeker index` builds it.
fn corpus() -> (tempfile::TempDir, Arc<Bm25Index>) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        concat!(
            r#"{"id": "8001", "title": "Taj Mahal", "text": "The Taj Mahal was commissioned in 1631 by Shah Jahan."}"#,
            "\n"
        ),
    )
    .unwrap();
    let index = dir.path().join("index");
    build_index(&corpus, &index, |_| {}).unwrap();
    let opened = Arc::new(Bm25Index::open(&index).unwrap());
    (dir, opened)
}

/// ASearcher with 40-character chunks, so a short page has three.
fn asearcher_small_chunks() -> Profile {
    let text =
        std::fs::read_to_string(crate::common::root().join("config/policies/asearcher.toml"))
            .unwrap()
            .replace("chunk_chars = 25000", "chunk_chars = 40")
            .replace("short_chars = 100", "short_chars = 5");
    Profile::parse(&text, std::path::Path::new("asearcher-small.toml")).unwrap()
}

fn ask(question: &str) -> RolloutRequest {
    RolloutRequest {
        messages: vec![ChatTurn::new(Role::User, question)],
        max_tokens: 512,
        temperature: None,
        top_p: None,
        continue_final_message: false,
        top_k: None,
        backend: None,
        stop: Vec::new(),
        client_tools: Default::default(),
    }
}

async fn run(
    profile: Profile,
    scripts: Vec<Vec<String>>,
    corpus: Arc<Bm25Index>,
) -> (
    seeker::rollout::RolloutOutcome,
    Vec<RolloutEvent>,
    ScriptedEngine,
) {
    let engine = ScriptedEngine::new(scripts);
    let backend = StaticBackend::with(&[(
        "Taj Mahal",
        vec![doc("8001", "Taj Mahal", "The Taj Mahal is in Agra.")],
    )]);
    let mut dispatcher = Dispatcher::single("static", backend);
    let (reader, _) = reader(settings());
    dispatcher.set_pages(reader.with_corpus("tantivy", corpus));
    let ctx = RolloutContext {
        engine: Arc::new(engine.clone()),
        text: engine.text(),
        search: Arc::new(dispatcher),
        profile: Arc::new(profile),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let outcome = seeker::rollout::run(&ctx, &ask("When was the Taj Mahal built?"), &tx)
        .await
        .unwrap();
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (outcome, events, engine)
}

fn chunk(n: usize, text: &str) -> String {
    format!("\n\n<information>\n>>>> Page {n} >>>>\n\n{text}\n</information>\n<think>\n")
}

#[tokio::test]
async fn asearcher_reads_a_page_chunk_by_chunk_and_keeps_short_forms() {
    let server = page_server().await;
    let (_dir, index) = corpus();
    let access = format!(
        "The document links a page.</think>\n<access> {} </access>",
        server.url("/long")
    );
    let scripts = vec![
        vec!["I should search.</think>\n<search> Taj Mahal </search>".to_string()],
        vec![access.clone()],
        vec!["Page 1 read.</think>".to_string()],
        vec!["Page 2 read.</think>".to_string()],
        vec!["All read.</think>\n<answer> 1631 </answer>".to_string()],
    ];
    let (outcome, events, engine) = run(asearcher_small_chunks(), scripts, index).await;
    assert_eq!(outcome.answer, "1631");
    assert_eq!(outcome.finish_reason, FinishReason::Stop);
    let outcomes: Vec<RoundOutcome> = outcome.rounds.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            RoundOutcome::Search,
            RoundOutcome::Page,
            RoundOutcome::Read,
            RoundOutcome::Read,
            RoundOutcome::Answer
        ]
    );
    let page = &outcome.rounds[1].pages[0];
    assert_eq!((page.chunks, page.chars), (3, 100));
    assert!(events.iter().any(|e| matches!(e,
        RolloutEvent::OpenPage(p) if p.chunks == 3 && p.source == "web")));
    let (c1, c2, c3) = (&LONG[..40], &LONG[40..80], &LONG[80..]);
    let prompts = engine.prompts();
    // The search splice: ASearcher's [Doc i](link) with the document's id.
    assert!(prompts[1].ends_with(
        "<search> Taj Mahal </search>\n\n<information>\n[Doc 1](8001):\nThe Taj Mahal is in Agra.\n</information>\n<think>\n"
    ));
    // Round 3 reads chunk 1 in full; round 4 sees chunk 1 short and chunk 2
    // in full; the answer round sees every read chunk short.
    assert!(prompts[2].ends_with(&format!("</access>{}", chunk(1, c1))));
    assert!(prompts[3].contains(&format!(
        "</access>{}Page 1 read.</think>",
        chunk(1, &c1[..5])
    )));
    assert!(prompts[3].ends_with(&format!("Page 1 read.</think>{}", chunk(2, c2))));
    assert!(prompts[4].contains(&format!("Page 2 read.</think>{}", chunk(3, c3))));
    assert!(!prompts[4].contains(c2));
    assert!(outcome.transcript.contains(&format!(
        "Page 2 read.</think>{}All read.",
        chunk(3, &c3[..5])
    )));
    // The full chunks went to the client as splices.
    let spliced: String = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::Splice(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    assert!(spliced.contains(c1) && spliced.contains(c2) && spliced.contains(c3));
}

#[tokio::test]
async fn refused_pages_splice_the_failure_text_and_corpus_documents_open_by_id() {
    let server = page_server().await;
    let (_dir, index) = corpus();
    let scripts = vec![
        vec![format!(
            "<access> http://127.0.0.1:{}/metrics </access>",
            server.port
        )],
        vec!["Not that.</think>\n<access> 8001 </access>".to_string()],
        vec!["<answer> 1631 </answer>".to_string()],
    ];
    let (outcome, events, engine) = run(profile("asearcher"), scripts, index).await;
    assert_eq!(outcome.answer, "1631");
    let prompts = engine.prompts();
    assert!(prompts[1].ends_with(
        "</access>\n\n<information>\nNo More Information is Found for this URL.\n</information>\n<think>\n"
    ));
    assert!(prompts[2].ends_with(
        "</access>\n\n<information>\n>>>> Page 1 >>>>\n\nThe Taj Mahal was commissioned in 1631 by Shah Jahan.\n</information>\n<think>\n"
    ));
    let pages: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::OpenPage(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(pages[0].error_kind, Some("refused"));
    assert_eq!(pages[1].source, "tantivy");
    assert_eq!(pages[1].url.as_deref(), Some("8001"));
    assert_eq!(server.hits("/metrics"), 0);
    assert!(outcome
        .documents
        .iter()
        .any(|d| d.id == "8001" && d.backend == "tantivy"));
}

#[tokio::test]
async fn tongyi_visit_reads_every_page_of_a_call_at_once_and_answers_refusals_with_its_failure_text(
) {
    let server = page_server().await;
    let (_dir, index) = corpus();
    let call = format!(
        "I will read both.\n<tool_call>\n{{\"name\": \"visit\", \"arguments\": {{\"url\": [\"{}\", \"http://127.0.0.1:{}/metrics\", \"8001\"], \"goal\": \"when it was built\"}}}}\n</tool_call>",
        server.url("/article"),
        server.port
    );
    let scripts = vec![vec![call], vec!["<answer>1631</answer>".to_string()]];
    let (outcome, events, engine) = run(profile("tongyi-deepresearch"), scripts, index).await;
    assert_eq!(outcome.answer, "1631");
    let prompt = &engine.prompts()[1];
    let article = format!(
        "<tool_response>\nThe useful information in {} for user goal when it was built as follows: \n\nEvidence in page: \n",
        server.url("/article")
    );
    assert!(prompt.contains(&article), "{prompt}");
    assert!(prompt.contains("commissioned in 1631"));
    assert!(prompt.contains(&format!(
        "\n=======\nThe useful information in http://127.0.0.1:{}/metrics for user goal when it was built as follows: \n\nEvidence in page: \nThe provided webpage content could not be accessed.",
        server.port
    )));
    assert!(prompt.contains(
        "\n=======\nThe useful information in 8001 for user goal when it was built as follows: \n\nEvidence in page: \nThe Taj Mahal was commissioned in 1631 by Shah Jahan.\n\nSummary: \nThe Taj Mahal was commissioned in 1631 by Shah Jahan.\n\n\n</tool_response>"
    ), "{prompt}");
    let kinds: Vec<Option<&str>> = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::OpenPage(p) => Some(p.error_kind),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, [None, Some("refused"), None]);
    assert_eq!(outcome.rounds[0].outcome, RoundOutcome::Page);
    assert_eq!(outcome.rounds[0].pages.len(), 3);
    assert_eq!(server.hits("/article"), 1);
}

/// ASearcher through the real binary on the default model and config, web
/// pages turned on for the local page server only (127.0.0.2): a rollout
/// continued from the client's search call searches the real index in
/// ASearcher's splice; one continued from a page action opens the page and
/// the model answers from it (a fact no corpus document holds); a refused URL
/// gets the policy's failure text, is never fetched, and the server stays
/// healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn asearcher_on_the_default_model_searches_opens_a_local_page_and_refuses_loopback() {
    let pages = page_server().await;
    let tmp = tempfile::tempdir().unwrap();
    let config_path = web_config(tmp.path(), &[]);
    let server = crate::e2e::start_default_model(
        crate::e2e::shared_index(),
        &[],
        &["--config", config_path.to_str().unwrap()],
    );
    let client = reqwest::Client::new();
    crate::e2e::wait_healthy(&client, &server.base).await;
    let url = format!("{}/v1/chat/completions", server.base);
    let body = |assistant: &str, max_tokens: u32, stream: bool| {
        serde_json::json!({
            "model": seeker::config::DEFAULT_MODEL_ID,
            "policy": "asearcher",
            "messages": [
                {"role": "user", "content": "When was the Saltmere lighthouse completed"},
                {"role": "assistant", "content": assistant},
            ],
            "continue_final_message": true,
            // Short prompts: each real-model round costs CPU seconds.
            "search": {"top_k": 2},
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
            "return_transcript": true,
        })
    };

    // 0. The client's search call runs on the real index, in ASearcher's splice.
    let searched = crate::common::post_json(
        &client,
        &url,
        &body(
            "I should look it up.</think>\n<search> Saltmere lighthouse </search>",
            8,
            false,
        ),
    )
    .await;
    assert_eq!(
        searched["seeker"]["rounds"][0]["outcome"], "search",
        "{searched}"
    );
    let transcript = searched["seeker"]["transcript"].as_str().unwrap();
    assert!(
        transcript.contains("</search>\n\n<information>\n[Doc 1]("),
        "{transcript}"
    );

    // 1. A page action: the page is opened and spliced as page 1 (its
    //    article, not its menu) and the model answers from it. Streamed: the
    //    open_page event.
    let access = format!(
        "I will read the page.</think>\n<access> {} </access>",
        pages.url("/lighthouse")
    );
    let stream = client
        .post(&url)
        .json(&body(&access, 96, true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut opened = None;
    let (mut trace, mut answer) = (String::new(), String::new());
    for data in crate::http::sse_data(&stream) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: serde_json::Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        trace.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        answer.push_str(delta["content"].as_str().unwrap_or(""));
        let event = &chunk["seeker"]["event"];
        if event["type"] == "open_page" && opened.is_none() {
            opened = Some(event.clone());
        }
    }
    let opened = opened.unwrap_or_else(|| panic!("no open_page event: {stream}"));
    assert_eq!(opened["source"], "web", "{opened}");
    assert_eq!(opened["chunks"], 1, "{opened}");
    assert_eq!(opened["title"], "The Saltmere Lighthouse", "{opened}");

    let splice_at = trace
        .find("</access>\n\n<information>\n>>>> Page 1 >>>>\n\n")
        .unwrap_or_else(|| panic!("{trace}"));
    let after = &trace[splice_at..];
    assert!(after.contains("completed in 1887"), "{trace}");
    assert!(!after.contains("Menu entry"), "{trace}");
    // The answer is the page's fact, which no corpus document holds.
    assert!(answer.contains("1887"), "answer {answer:?} after {trace}");
    // Opened once: a second read of the same URL comes from the page cache.
    assert_eq!(pages.hits("/lighthouse"), 1);

    // 3. A loopback URL is refused, spliced as ASearcher's failure text,
    //    never fetched; the server stays healthy and counts it.
    let refused = crate::common::post_json(
        &client,
        &url,
        &body(
            &format!(
                "Try the status page.</think>\n<access> http://127.0.0.1:{}/metrics </access>",
                server.base.rsplit(':').next().unwrap()
            ),
            48,
            false,
        ),
    )
    .await;
    let transcript = refused["seeker"]["transcript"].as_str().unwrap();
    assert!(
        transcript.contains(
            "</access>\n\n<information>\nNo More Information is Found for this URL.\n</information>\n<think>\n"
        ),
        "{refused}"
    );
    let health = client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // The model may open more pages by itself in its 48 tokens: at least
    // these two were counted.
    let metrics = crate::common::metrics_of(&client, &server.base).await;
    let count = |outcome: &str| -> u64 {
        let key = format!("seeker_page_fetches_total{{outcome=\"{outcome}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map_or(0, |n| n.parse().unwrap())
    };
    assert!(count("refused") >= 1, "{metrics}");
    assert!(count("ok") >= 1, "{metrics}");
}

/// Pages built to exhaust the extractors, opened through the real binary
/// (the small model, web pages on for the local page server, a 3 s page
/// deadline, no per-host rate): the crash page (40,000 nested spans, which aborted the process)
/// by ASearcher's `<access>`, the 2,000-div page beside a Tongyi `visit` of
/// ten 110 KB nested pages. The server answers `/health` within 1 s all the
/// while, every page is read (as flat text), and when the requests are done
/// no extraction is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn hostile_pages_neither_crash_nor_starve_the_real_server() {
    let pages = page_server().await;
    let tmp = tempfile::tempdir().unwrap();
    let config_path = web_config(
        tmp.path(),
        &[
            ("\ntimeout_ms = 10000\n", "\ntimeout_ms = 3000\n"),
            // All eleven pages are on one host: no politeness wait.
            (
                "\nhost_requests_per_second = 2\n",
                "\nhost_requests_per_second = 0\n",
            ),
        ],
    );
    let server = crate::e2e::start_server_args(
        crate::e2e::shared_index(),
        &[],
        &["--config", config_path.to_str().unwrap()],
    );
    let client = reqwest::Client::new();
    crate::e2e::wait_healthy(&client, &server.base).await;
    let url = format!("{}/v1/chat/completions", server.base);
    let continued = |policy: &str, assistant: String| {
        serde_json::json!({
            "policy": policy,
            "messages": [
                {"role": "user", "content": "What does the page say"},
                {"role": "assistant", "content": assistant},
            ],
            "continue_final_message": true,
            "max_tokens": 1,
            "temperature": 0,
            "return_transcript": true,
        })
    };
    let access = |path: &str| {
        continued(
            "asearcher",
            format!(
                "I will read it.</think>\n<access> {} </access>",
                pages.url(path)
            ),
        )
    };
    let transcript_of = |reply: &serde_json::Value| {
        reply["seeker"]["transcript"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"))
            .to_string()
    };

    // The crash page: read, and the process is still there.
    let crashed = crate::common::post_json(&client, &url, &access("/crash")).await;
    assert!(transcript_of(&crashed).contains("innermost"), "{crashed}");

    // The slow pages together, /health polled meanwhile.
    let urls: Vec<String> = (0..10)
        .map(|i| pages.url(&format!("/nested/{i}")))
        .collect();
    let visit = continued(
        "tongyi-deepresearch",
        format!(
            "<tool_call>\n{{\"name\": \"visit\", \"arguments\": {{\"url\": {}, \"goal\": \"what it says\"}}}}\n</tool_call>",
            serde_json::to_string(&urls).unwrap()
        ),
    );
    let (divs, visited) = {
        let divs_body = access("/divs");
        let divs = crate::common::post_json(&client, &url, &divs_body);
        let visited = crate::common::post_json(&client, &url, &visit);
        let health = async {
            let mut slowest = Duration::ZERO;
            for _ in 0..10 {
                let started = std::time::Instant::now();
                let response = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.get(format!("{}/health", server.base)).send(),
                )
                .await
                .expect("/health answers")
                .unwrap();
                assert_eq!(response.status(), 200);
                slowest = slowest.max(started.elapsed());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            slowest
        };
        let (divs, visited, slowest) = tokio::join!(divs, visited, health);
        assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
        (divs, visited)
    };
    assert!(transcript_of(&divs).contains("innermost"), "{divs}");
    let transcript = transcript_of(&visited);
    for page in &urls {
        let read = format!("The useful information in {page} for user goal what it says as follows: \n\nEvidence in page: \ninnermost");
        assert!(transcript.contains(&read), "{page}: {transcript}");
    }

    // Nothing is left running, and every page was read flat.
    let metrics = crate::common::metrics_of(&client, &server.base).await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name}: {metrics}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("seeker_page_extractions_running"), 0.0);
    assert_eq!(value("seeker_page_flattened_total"), 12.0);
    assert_eq!(value("seeker_page_fetches_total{outcome=\"ok\"}"), 12.0);
}

#[tokio::test]
async fn an_empty_page_action_gets_the_failure_text_and_the_rollout_goes_on() {
    let (_dir, index) = corpus();
    let scripts = vec![
        vec!["<access>   </access>".to_string()],
        vec!["<answer> unknown </answer>".to_string()],
    ];
    let (outcome, _, engine) = run(profile("asearcher"), scripts, index).await;
    assert_eq!(outcome.answer, "unknown");
    assert_eq!(outcome.rounds[0].outcome, RoundOutcome::NoQuery);
    assert!(engine.prompts()[1].ends_with(
        "<access>   </access>\n\n<information>\nNo More Information is Found for this URL.\n</information>\n<think>\n"
    ));
}
