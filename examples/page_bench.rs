//! What a page action's reads cost when a call names several pages: one read
//! against four at once, from a local page server that answers after 200 ms.
//!
//! `cargo run --example page_bench` prints, for each case, the
//! median and the slowest of 7 runs (cache off, so every run fetches):
//! - one read;
//! - four reads of four hosts (127.0.0.2–127.0.0.5) at once: the reader fetches
//!   them in parallel, so this should cost about one read;
//! - four reads of one host at once, under the default per-host rate limit
//!   (2 per second, a burst of 2): the third and fourth wait their turn.
//!
//! Results and the machine they were measured on: bench/README.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use seeker::metrics::Metrics;
use seeker::pages::{PageReader, PageSettings, UrlPolicy};

const LATENCY: Duration = Duration::from_millis(200);
const RUNS: usize = 7;

const PAGE: &str = "<html><head><title>Bench page</title></head><body><article><h1>Bench</h1>\
<p>The Taj Mahal is an ivory-white marble mausoleum on the right bank of the river Yamuna in \
Agra, India. It was commissioned in 1631 by the fifth Mughal emperor, Shah Jahan.</p>\
<p>Construction was essentially completed in 1643.</p></article></body></html>";

async fn serve(ip: &str) -> u16 {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = Router::new().route(
        "/page",
        get(|| async {
            tokio::time::sleep(LATENCY).await;
            (
                [(axum::http::header::CONTENT_TYPE, "text/html")],
                PAGE.to_string(),
            )
        }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

fn reader(host_rate: u32) -> PageReader {
    PageReader::new(
        PageSettings {
            web: true,
            cache_ttl: Duration::ZERO,
            host_requests_per_second: host_rate,
            policy: UrlPolicy {
                allow_networks: vec!["127.0.0.0/8".parse().unwrap()],
                ..UrlPolicy::default()
            },
            ..PageSettings::default()
        },
        Arc::new(Metrics::new()),
    )
    .unwrap()
}

/// Median and slowest of `RUNS` timings of `urls` read at once; a fresh
/// reader per run, so rate limits start full each time.
async fn time(urls: &[String], host_rate: u32) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let reader = reader(host_rate);
        let started = Instant::now();
        let pages = reader.open_all(urls).await;
        times.push(started.elapsed());
        assert!(pages.iter().all(Result::is_ok), "{pages:?}");
    }
    times.sort();
    (times[RUNS / 2], times[RUNS - 1])
}

#[tokio::main]
async fn main() {
    let mut urls = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"] {
        let port = serve(ip).await;
        urls.push(format!("http://{ip}:{port}/page"));
    }
    let one = time(&urls[..1], 2).await;
    let four_hosts = time(&urls, 2).await;
    let same: Vec<String> = vec![urls[0].clone(); 4];
    let four_same = time(&same, 2).await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "page server latency {} ms, {RUNS} runs each",
        LATENCY.as_millis()
    );
    println!("| case | median ms | slowest ms | median / one read |");
    println!("|---|---|---|---|");
    for (name, (median, slowest)) in [
        ("1 read", one),
        ("4 reads, 4 hosts, at once", four_hosts),
        ("4 reads, 1 host, at once (2/s per host)", four_same),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2}x |",
            ms(median),
            ms(slowest),
            median.as_secs_f64() / one.0.as_secs_f64()
        );
    }
}
