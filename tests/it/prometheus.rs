//! The dashboard and rules under `ops/` on a real Prometheus (issue 52):
//! Debian's `prometheus` scrapes the real binary (over a scripted remote
//! engine, with one replica down, the in-test web search providers of
//! `web.rs`, one of them failing every request) while requests search,
//! fail, open a page, are refused and are abandoned; then every expression
//! of `ops/grafana/seeker.json` and every rule of
//! `ops/prometheus/seeker-rules.yml` evaluates without error and returns
//! series, and `promtool` accepts the rules and the example config.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{get_json, root};
use crate::web::{ask_for, over_stubs, OverStubs};

/// A Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    base: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name` on the PATH, or a panic saying how to install it.
fn tool(name: &str) -> String {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(
        found.status.success() && !path.is_empty(),
        "{name} is missing: install Debian's prometheus package \
         (apt-get install -y --no-install-recommends prometheus; scripts/test.sh does)"
    );
    path
}

/// `promtool ARGS` succeeds (its output in the panic otherwise).
fn promtool(args: &[&str], dir: &Path) {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Prometheus scraping `target` (`host:port`) every second with the
/// repository's rules, evaluated every second.
async fn start_prometheus(target: &str, dir: &Path) -> Prometheus {
    let rules = root().join("ops/prometheus/seeker-rules.yml");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: seeker\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rules.display()
        ),
    )
    .unwrap();
    promtool(&["check", "config", config.to_str().unwrap()], dir);
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let prometheus = Prometheus {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("{}/-/ready", prometheus.base))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return prometheus;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not start: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An instant query's result, or the error Prometheus gave.
async fn query(client: &reqwest::Client, base: &str, expr: &str) -> Result<Vec<Value>, String> {
    let answer: Value = client
        .get(format!("{base}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    if answer["status"] != "success" {
        return Err(answer.to_string());
    }
    Ok(answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Every expression of the dashboard, with Grafana's variables given values
/// (`$instance`: every instance; `$__rate_interval`: one minute).
fn dashboard_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("ops/grafana/seeker.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            out.push((
                format!("{} / {}", panel["title"], target["refId"]),
                expr.replace("$instance", ".+")
                    .replace("$__rate_interval", "1m"),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "embedded"),
    ignore = "needs data, the model or a server"
)]
async fn every_dashboard_expression_and_rule_evaluates_on_a_real_prometheus() {
    let rules_dir = root().join("ops/prometheus");
    promtool(&["check", "rules", "seeker-rules.yml"], &rules_dir);
    promtool(&["check", "config", "prometheus.yml"], &rules_dir);

    // A second replica that refuses connections: replica errors and health.
    let OverStubs {
        server,
        client,
        chat,
        dir,
        ..
    } = over_stubs("http://127.0.0.1:9").await;
    let prometheus = start_prometheus(server.base.trim_start_matches("http://"), dir.path()).await;

    // Traffic: searches (one repeated: a cache hit), a backend that fails
    // every request, a fallback, a page opened, a refused request, a client
    // that leaves during a search, a stream.
    for (policy, backend, query) in [
        ("search-r1", "brave", "ok capital of France"),
        ("search-r1", "brave", "ok capital of France"),
        ("tool-search", "serper", "ok river of Paris"),
        ("search-r1", "broken", "ok anything"),
        ("search-r1", "fallback", "ok Louvre"),
        ("search-r1", "limited", "ok Seine"),
    ] {
        let answer: Value =
            crate::common::post_json(&client, &chat, &ask_for(policy, backend, query)).await;
        assert!(answer["choices"].is_array(), "{answer}");
    }
    let open = json!({"max_tokens": 64, "policy": "asearcher",
        "messages": [{"role": "user", "content": "OPEN: Mona Lisa"}]});
    let answer: Value = crate::common::post_json(&client, &chat, &open).await;
    assert!(answer["choices"].is_array(), "{answer}");
    let mut streamed = ask_for("search-r1", "google", "ok Eiffel");
    streamed["stream"] = json!(true);
    let text = client
        .post(&chat)
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let refused = client
        .get(format!("{}/health", server.base))
        .header("host", "rebind.attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    // Leaves while its query waits on the slow provider.
    let leaving = client
        .post(&chat)
        .json(&ask_for("search-r1", "exa", "slow query"))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(leaving.is_err(), "the slow search answered");

    // Every label seen in /metrics is scraped a few times over (the server
    // counts the client that left once it notices).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut metrics = String::new();
    while Instant::now() < deadline && !metrics.contains("seeker_client_disconnects_total{") {
        metrics = crate::common::metrics_of(&client, &server.base).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for line in [
        "seeker_page_fetches_total{outcome=\"corpus\"}",
        "seeker_client_disconnects_total{phase=",
        "seeker_requests_rejected_total{reason=\"host\"}",
        "seeker_engine_errors_total{kind=\"connection\"",
        "seeker_search_cache_hits_total{backend=\"brave\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing in {metrics}");
    }
    // Three more scrapes after the traffic (a rate needs two samples).
    let scrapes = || async {
        query(&client, &prometheus.base, "count_over_time(up[10m])")
            .await
            .unwrap()
            .first()
            .and_then(|s| s["value"][1].as_str().and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0)
    };
    let before = scrapes().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    while scrapes().await < before + 3 {
        assert!(Instant::now() < deadline, "prometheus stopped scraping");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let mut failures = Vec::new();
    let expressions = dashboard_expressions();
    assert!(expressions.len() >= 40, "{} expressions", expressions.len());
    for (name, expr) in &expressions {
        match query(&client, &prometheus.base, expr).await {
            Ok(series) if series.is_empty() => failures.push(format!("{name}: no series: {expr}")),
            Ok(_) => {}
            Err(e) => failures.push(format!("{name}: {e}: {expr}")),
        }
    }

    // Every rule evaluated without error; every recorded series exists.
    let rules: Value = get_json(&client, &format!("{}/api/v1/rules", prometheus.base)).await;
    let mut count = 0;
    for group in rules["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            count += 1;
            let name = rule["name"].as_str().unwrap();
            if rule["health"] != "ok" {
                failures.push(format!(
                    "rule {name}: {} {}",
                    rule["health"], rule["lastError"]
                ));
            }
            if rule["type"] == "recording" {
                match query(&client, &prometheus.base, name).await {
                    Ok(series) if series.is_empty() => {
                        failures.push(format!("rule {name}: no series"))
                    }
                    Ok(_) => {}
                    Err(e) => failures.push(format!("rule {name}: {e}")),
                }
            }
        }
    }
    assert_eq!(count, 17, "every rule of the file is loaded: {rules}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
