//! Operating the server over real TCP: API keys, CORS, limits, the
//! per-request deadline, graceful shutdown, cancellation in each phase of a
//! rollout, and the metrics that report them. The engine is scripted (slow
//! where a test needs time to act); search backends are in-memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use seeker::config::{GenerationConfig, ServerConfig};
use seeker::engine::scripted::ScriptedEngine;
use seeker::search::dispatch::Dispatcher;
use seeker::search::{Document, SearchBackend, SearchError};
use seeker::server::{run, AppState};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::common::{doc, profiles, StaticBackend};

/// A running server and what its tests look at.
struct Server {
    url: String,
    state: Arc<AppState>,
    engine: ScriptedEngine,
    shutdown: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(
        engine: ScriptedEngine,
        backend: Arc<dyn SearchBackend>,
        config: ServerConfig,
        keys: &[&str],
        grace: Duration,
    ) -> Self {
        let serving = Arc::new(engine.clone());
        Self::start_serving(engine, serving, backend, config, keys, grace).await
    }

    /// A server whose engine is `serving` (`engine` itself, or a wrapper of it).
    async fn start_serving(
        engine: ScriptedEngine,
        serving: Arc<dyn seeker::engine::Engine>,
        backend: Arc<dyn SearchBackend>,
        config: ServerConfig,
        keys: &[&str],
        grace: Duration,
    ) -> Self {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let state = AppState::new(
            "test-model".into(),
            Arc::new(Dispatcher::single("static", backend)),
            profiles(),
            "search-r1".into(),
            GenerationConfig::default(),
        )
        .with_server_config(&config, &keys);
        state.set_engine(serving, engine.text());
        let state = Arc::new(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(run(
            listener,
            Arc::clone(&state),
            async {
                let _ = rx.await;
            },
            grace,
        ));
        Self {
            url,
            state,
            engine,
            shutdown: Some(tx),
            handle,
        }
    }

    async fn simple(engine: ScriptedEngine, config: ServerConfig) -> Self {
        Self::start(engine, mona_lisa(), config, &[], Duration::from_secs(5)).await
    }

    fn in_flight(&self) -> i64 {
        self.state.metrics.requests_in_flight.get()
    }

    fn disconnects(&self, phase: &str) -> u64 {
        self.state
            .metrics
            .client_disconnects
            .with_label_values(&[phase])
            .get()
    }

    /// Waits up to `limit` for `done`; returns how long it took.
    async fn within(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if done() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        done().then(|| started.elapsed())
    }
}

fn mona_lisa() -> Arc<StaticBackend> {
    StaticBackend::with(&[(
        "Mona Lisa painter",
        vec![doc("7", "Mona Lisa", "A portrait by Leonardo da Vinci.")],
    )])
}

/// The usual two rounds: a search call, then the answer.
fn script() -> Vec<Vec<&'static str>> {
    vec![
        vec![
            "<think>look it up</think>",
            "<search> Mona Lisa painter </search>",
        ],
        vec!["<answer> Leonardo", " da Vinci </answer>"],
    ]
}

/// A long first round: `pieces` reasoning tokens, no search.
fn long_reasoning(pieces: usize) -> Vec<Vec<String>> {
    vec![(0..pieces).map(|i| format!(" step{i}")).collect()]
}

fn chat(stream: bool) -> Value {
    json!({
        "stream": stream,
        "messages": [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    })
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn error_code(response: reqwest::Response) -> String {
    let v: Value = response.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    v["error"]["code"].as_str().unwrap().to_string()
}

/// Reads an SSE body to its end; returns the `data:` payloads.
async fn read_stream(response: reqwest::Response) -> Vec<String> {
    let body = response.text().await.unwrap();
    crate::http::sse_data(&body)
}

#[tokio::test]
async fn api_keys_guard_everything_but_health_and_docs() {
    let server = Server::start(
        ScriptedEngine::new(script()),
        mona_lisa(),
        ServerConfig::default(),
        &["sk-first", "sk-second"],
        Duration::from_secs(1),
    )
    .await;
    let client = reqwest::Client::new();
    let url = &server.url;
    for path in ["/v1/models", "/metrics"] {
        let r = client.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        assert_eq!(error_code(r).await, "invalid_api_key");
        let r = client
            .get(format!("{url}{path}"))
            .bearer_auth("sk-wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    for key in ["sk-first", "sk-second"] {
        let r = client
            .get(format!("{url}/v1/models"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{key}");
    }
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth("sk-second")
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for open in ["/health", "/openapi.json", "/docs/", "/"] {
        let r = client.get(format!("{url}{open}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{open}");
    }
    // Browsers ask for an icon without the page's key: an empty answer.
    let r = client
        .get(format!("{url}/favicon.ico"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(
        server
            .state
            .metrics
            .requests_rejected
            .with_label_values(&["unauthorized"])
            .get(),
        5
    );
}

/// Every route of the server, as `(method, path)`.
pub const ROUTES: [(&str, &str); 16] = [
    ("GET", "/"),
    ("GET", "/favicon.ico"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/test-model"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/retrieve"),
    ("POST", "/search"),
    ("POST", "/batch_search"),
    ("POST", "/queries"),
    ("POST", "/mcp"),
    ("GET", "/docs/"),
    ("GET", "/openapi.json"),
    ("GET", "/no-such-route"),
];

/// Sends `method path` to `base` with `Host: host` and, if given, `Origin`;
/// the status and the error code of the body (if any).
pub async fn with_host(
    client: &reqwest::Client,
    base: &str,
    (method, path): (&str, &str),
    host: &str,
    origin: Option<&str>,
) -> (u16, String) {
    let mut request = client
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    if method == "POST" {
        request = request.body("{}");
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or("").to_string();
    (status, code)
}

/// Issue 48: on a loopback-bound server (the default), a `Host` other than
/// the loopback names — what a page whose name an attacker rebound to
/// 127.0.0.1 sends — gets 403 on every route, and so does a browser
/// `Origin` that is not the server's own; the server's own names and
/// origin pass. `allowed_hosts` and `cors_origins` change both.
#[tokio::test]
async fn a_rebinding_host_or_a_foreign_origin_is_refused_on_every_route() {
    let client = reqwest::Client::new();
    let server = Server::simple(ScriptedEngine::new(script()), ServerConfig::default()).await;
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let own = format!("127.0.0.1:{port}");
    let own_origin = format!("http://{own}");
    for route in ROUTES {
        let send = |host: String, origin: Option<&str>| {
            let (client, base) = (&client, &server.url);
            let origin = origin.map(str::to_string);
            async move { with_host(client, base, route, &host, origin.as_deref()).await }
        };
        let (status, code) = send(format!("rebind.attacker.example:{port}"), None).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "host_not_allowed"),
            "{route:?}"
        );
        for host in [
            own.clone(),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ] {
            let (status, _) = send(host.clone(), None).await;
            assert_ne!(status, 403, "{route:?} {host}");
        }
        let (status, code) = send(own.clone(), Some("https://attacker.example")).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "origin_not_allowed"),
            "{route:?}"
        );
        let (status, _) = send(own.clone(), Some(&own_origin)).await;
        assert_ne!(status, 403, "{route:?} from its own origin");
    }
    let rejected = |reason: &str| {
        server
            .state
            .metrics
            .requests_rejected
            .with_label_values(&[reason])
            .get()
    };
    assert_eq!(rejected("host"), ROUTES.len() as u64);
    assert_eq!(rejected("origin"), ROUTES.len() as u64);

    // Configured names replace the default; a listed origin passes.
    let named = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            allowed_hosts: vec!["Seeker.LAN".into()],
            cors_origins: vec!["https://ui.example".into()],
            ..ServerConfig::default()
        },
    )
    .await;
    let health = ("GET", "/health");
    let status = |host: &str, origin: Option<&str>| {
        let (client, base) = (&client, &named.url);
        let (host, origin) = (host.to_string(), origin.map(str::to_string));
        async move {
            with_host(client, base, health, &host, origin.as_deref())
                .await
                .0
        }
    };
    assert_eq!(status("seeker.lan:8080", None).await, 200);
    assert_eq!(status("localhost", None).await, 403);
    assert_eq!(status("seeker.lan", Some("https://ui.example")).await, 200);
    assert_eq!(
        status("seeker.lan", Some("https://evil.example")).await,
        403
    );
    let any = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            allowed_hosts: vec!["*".into()],
            ..ServerConfig::default()
        },
    )
    .await;
    let (status, _) = with_host(&client, &any.url, health, "anything.example", None).await;
    assert_eq!(status, 200);
}

/// What a server answers a raw HTTP/1.1 request: its status line's code.
async fn raw_status(url: &str, request: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

/// Issue 48: a request with two `Host` headers is a 400 (RFC 9112 §3.2: a
/// check and a proxy could read different ones), and an absolute-form
/// request target's authority is the host checked, whatever `Host` says
/// (RFC 9112 §3.2.2).
#[tokio::test]
async fn two_hosts_are_refused_and_an_absolute_target_names_the_host() {
    let server = Server::simple(ScriptedEngine::new(script()), ServerConfig::default()).await;
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let two = format!(
        "GET /health HTTP/1.1\r\nHost: localhost:{port}\r\nHost: rebind.attacker.example\r\n\r\n"
    );
    assert_eq!(raw_status(&server.url, &two).await, 400);
    let absolute = format!(
        "GET http://rebind.attacker.example:{port}/health HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"
    );
    assert_eq!(raw_status(&server.url, &absolute).await, 403);
    let own =
        format!("GET http://localhost:{port}/health HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n");
    assert_eq!(raw_status(&server.url, &own).await, 200);
}

#[tokio::test]
async fn cors_is_off_by_default_and_allows_only_configured_origins() {
    let client = reqwest::Client::new();
    let preflight = |url: String, origin: &'static str| {
        client
            .request(reqwest::Method::OPTIONS, url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let off = Server::simple(ScriptedEngine::new(script()), ServerConfig::default()).await;
    let r = preflight(
        format!("{}/v1/chat/completions", off.url),
        "https://ui.example",
    )
    .await
    .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let on = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            cors_origins: vec!["https://ui.example".into()],
            ..ServerConfig::default()
        },
    )
    .await;
    let url = format!("{}/v1/chat/completions", on.url);
    let r = preflight(url.clone(), "https://ui.example").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://ui.example"
    );
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(allowed.contains("authorization"), "{allowed}");
    let r = preflight(url, "https://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// The security headers of issue 28 on every kind of response (the UI, Swagger
/// UI, JSON, Prometheus text, errors, a refused key, a CORS preflight), and none
/// with `security_headers = false`. That the policies let the UI and Swagger UI
/// work is checked in a browser (tests/python/test_web_ui.py).
#[tokio::test]
async fn every_response_carries_security_headers_unless_turned_off() {
    let client = reqwest::Client::new();
    let on = Server::start(
        ScriptedEngine::new(script()),
        mona_lisa(),
        ServerConfig {
            cors_origins: vec!["https://ui.example".into()],
            ..ServerConfig::default()
        },
        &["k1"],
        Duration::from_secs(5),
    )
    .await;
    let get = |path: &str| {
        client
            .get(format!("{}{path}", on.url))
            .bearer_auth("k1")
            .send()
    };
    let mut responses = Vec::new();
    for path in [
        "/",
        "/docs/",
        "/docs/swagger-ui.css",
        "/openapi.json",
        "/metrics",
        "/v1/models",
        "/health",
        "/no/such/route",
    ] {
        let r = get(path).await.unwrap();
        responses.push((path.to_string(), r.status(), r.headers().clone()));
    }
    let r = client
        .get(format!("{}/v1/models", on.url))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    responses.push((
        "/v1/models (bad key)".into(),
        r.status(),
        r.headers().clone(),
    ));
    let r = client
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/chat/completions", on.url),
        )
        .header("origin", "https://ui.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    responses.push(("preflight".into(), r.status(), r.headers().clone()));

    for (path, status, headers) in &responses {
        let header = |name: &str| {
            headers
                .get(name)
                .unwrap_or_else(|| panic!("{path} ({status}) has no {name}"))
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
        let csp = header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        match path.as_str() {
            "/" => {
                // Only hashed inline code, only its own origin.
                assert!(csp.contains("default-src 'none'"), "{csp}");
                assert!(csp.contains("script-src 'sha256-"), "{csp}");
                assert!(csp.contains("style-src 'sha256-"), "{csp}");
                assert!(csp.contains("connect-src 'self'"), "{csp}");
                assert!(!csp.contains("unsafe"), "{csp}");
            }
            p if p.starts_with("/docs/") => {
                assert!(csp.contains("script-src 'self'"), "{csp}");
                assert!(!csp.contains("unsafe-eval"), "{csp}");
            }
            _ => assert_eq!(csp, "default-src 'none'; frame-ancestors 'none'", "{path}"),
        }
    }
    assert_eq!(responses[0].1, 200);
    assert_eq!(responses[1].1, 200);

    let off = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            security_headers: false,
            ..ServerConfig::default()
        },
    )
    .await;
    for path in ["/", "/docs/", "/v1/models"] {
        let r = client
            .get(format!("{}{path}", off.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        for name in [
            "content-security-policy",
            "x-content-type-options",
            "x-frame-options",
            "referrer-policy",
        ] {
            assert!(r.headers().get(name).is_none(), "{path}: {name}");
        }
    }
}

/// `server.max_connections`: at the cap, a new connection is not served
/// until an open one closes; then it is, without the client doing anything.
#[tokio::test]
async fn connections_beyond_the_cap_wait_for_one_to_close() {
    use tokio::io::AsyncWriteExt;
    let server = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            max_connections: 2,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();
    // Two connections that send nothing hold both places (for up to
    // header_timeout_s, 30 s).
    let idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    let _idle2 = tokio::net::TcpStream::connect(&address).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = tokio::net::TcpStream::connect(&address).await.unwrap();
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let waiting = tokio::time::timeout(
        Duration::from_millis(500),
        read_until(&mut third, "\r\n\r\n"),
    )
    .await;
    assert!(waiting.is_err(), "served beyond the cap: {waiting:?}");
    drop(idle);
    let answer = read_until(&mut third, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

/// HTTP/2 connections are closed after `header_timeout_s` without a byte
/// while no request is open — one that sent only its preface, one that
/// stays after its request — so idle clients cannot hold the places of
/// `max_connections` (before, they held them for good: a new user's attack,
/// issue 28); a stream that is slower than the timeout is not cut.
#[tokio::test]
async fn idle_http2_connections_are_closed_and_slow_streams_are_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::simple(
        ScriptedEngine::new(long_reasoning(30))
            .cycling()
            .with_delay(Duration::from_millis(1500)),
        ServerConfig {
            header_timeout_s: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();

    // The preface and an empty SETTINGS frame, then nothing.
    let mut preface_only = tokio::net::TcpStream::connect(&address).await.unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // A client that made one request and stays.
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let request = http::Request::get(format!("{}/health", server.url))
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);

    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buffer = [0u8; 1024];
        while preface_only.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    assert!(closed.is_ok(), "the preface-only connection is still open");
    tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("the connection that stayed after its request is still open")
        .unwrap()
        .ok();
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // A streamed answer over HTTP/2 whose pieces come 1.5 s apart (longer
    // than the timeout, no keep-alive comment before 5 s) ends whole.
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut body = chat(true);
    body["max_tokens"] = json!(3);
    let request = http::Request::post(format!("{}/v1/chat/completions", server.url))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut send) = h2.send_request(request, false).unwrap();
    send.send_data(serde_json::to_vec(&body).unwrap().into(), true)
        .unwrap();
    let mut stream = response.await.unwrap().into_body();
    let mut text = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.expect("the slow stream was cut");
        let _ = stream.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

/// An HTTP/2 connection that sends PING frames and no request is closed
/// after `header_timeout_s` like a silent one: control frames do not count
/// as a request (before, each byte reset the deadline and such a client held
/// its `max_connections` place for good: a second attack, issue 28).
#[tokio::test]
async fn an_http2_connection_that_only_pings_is_closed() {
    let server = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            header_timeout_s: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();
    // Before the connection exists, so before its idle clock starts.
    let started = Instant::now();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    // The request handle stays alive: without one h2 closes its side itself.
    let (_requests, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut ping_pong = connection
        .ping_pong()
        .expect("the connection's ping handle");
    let connection = tokio::spawn(connection);
    let pings = tokio::spawn(async move {
        let mut answered = 0;
        while ping_pong.ping(h2::Ping::opaque()).await.is_ok() {
            answered += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answered
    });
    tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("a connection that only sends PINGs is still open after 5 s")
        .unwrap()
        .ok();
    let answered = tokio::time::timeout(Duration::from_secs(1), pings)
        .await
        .expect("the pings go on after the connection closed")
        .unwrap();
    // PINGs went back and forth while the connection was open (100 ms
    // apart, a 1 s limit): each would have reset a byte-based deadline.
    assert!(answered >= 2, "{answered} PINGs answered");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bodies_over_the_limit_and_non_json_bodies_are_refused() {
    let server = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            max_body_bytes: 4096,
            ..ServerConfig::default()
        },
    )
    .await;
    let client = reqwest::Client::new();
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let r = post(&server.url, &big).await;
    assert_eq!(r.status(), 413);
    assert_eq!(error_code(r).await, "payload_too_large");
    let r = client
        .post(format!("{}/v1/chat/completions", server.url))
        .header("content-type", "text/plain")
        .body(chat(false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(error_code(r).await, "unsupported_media_type");
    let r = client
        .post(format!("{}/retrieve", server.url))
        .body(r#"{"queries": ["q"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    // Nothing was lost: the next request is served.
    assert_eq!(post(&server.url, &chat(false)).await.status(), 200);
}

#[tokio::test]
async fn a_full_server_answers_429_with_retry_after_then_recovers() {
    let engine = ScriptedEngine::new(long_reasoning(10)).with_delay(Duration::from_millis(100));
    let server = Server::simple(
        engine,
        ServerConfig {
            max_concurrent_requests: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    // The first request holds the only slot for its whole stream.
    let first = post(&server.url, &chat(true)).await;
    assert_eq!(first.status(), 200);
    let second = post(&server.url, &chat(true)).await;
    assert_eq!(second.status(), 429);
    assert_eq!(second.headers()["retry-after"], "1");
    assert_eq!(error_code(second).await, "rate_limit_exceeded");
    // Health and metrics are never limited.
    let health = reqwest::get(format!("{}/health", server.url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let data = read_stream(first).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(post(&server.url, &chat(false)).await.status(), 200);
    assert_eq!(
        server
            .state
            .metrics
            .requests_rejected
            .with_label_values(&["overloaded"])
            .get(),
        1
    );
}

/// Clients that send headers and then trickle (or never finish) their bodies
/// hold no concurrency slot: a real request is served meanwhile, and each of
/// them gets a 408 `body_timeout` once `body_timeout_s` has passed. (Before,
/// 16 such connections held every slot for good: all chat got 429.)
#[tokio::test]
async fn slow_bodies_hold_no_slot_and_time_out() {
    use tokio::io::AsyncWriteExt;
    let server = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            max_concurrent_requests: 2,
            body_timeout_s: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();
    let mut slow = Vec::new();
    for path in ["/v1/chat/completions", "/v1/chat/completions", "/retrieve"] {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: \
                     application/json\r\nContent-Length: 1000\r\n\r\n{{"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        slow.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served = post(&server.url, &chat(false)).await;
    assert_eq!(served.status(), 200, "slow bodies held the slots");
    for mut stream in slow {
        let answer = read_until(&mut stream, "body_timeout").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
}

/// Connections that send nothing, trickle their headers, or idle after a
/// request are closed after `header_timeout_s` (before, axum's `serve` ran
/// hyper without a timer: they stayed open for good, and about a thousand of
/// them exhausted the descriptors and stopped all service).
#[tokio::test]
async fn silent_slow_and_idle_connections_are_closed() {
    use tokio::io::AsyncWriteExt;
    let server = Server::simple(
        ScriptedEngine::new(script()),
        ServerConfig {
            header_timeout_s: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();
    let silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(&address).await.unwrap();
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until(&mut idle, "\"ok\"").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let started = Instant::now();
    for (name, mut stream) in [("silent", silent), ("partial", partial), ("idle", idle)] {
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            use tokio::io::AsyncReadExt;
            let mut buffer = [0u8; 1024];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "the {name} connection is still open after {:?}",
            started.elapsed()
        );
    }
    // And the server still serves.
    assert_eq!(post(&server.url, &chat(false)).await.status(), 200);
}

/// Behind the engine gate (the embedded engine's wiring: one slot), streams
/// that their clients close while they wait for the engine never reach it;
/// only the request that held the slot generated. (Before, each closed
/// stream's request was sent to the engine and queued there; mistral.rs then
/// prefilled it when its turn came — seeker issue 18.)
#[tokio::test]
async fn streams_closed_while_they_wait_never_reach_the_engine() {
    let engine = ScriptedEngine::new(long_reasoning(20))
        .cycling()
        .with_delay(Duration::from_millis(50));
    let gated = Arc::new(seeker::engine::gate::Gated::new(engine.clone(), 1));
    let server = Server::start_serving(
        engine.clone(),
        gated,
        mona_lisa(),
        ServerConfig::default(),
        &[],
        Duration::from_secs(5),
    )
    .await;
    let mut body = chat(true);
    body["max_tokens"] = json!(20);
    let first = post(&server.url, &body).await;
    assert_eq!(first.status(), 200);
    // Five clients that give up as soon as their stream opened.
    for _ in 0..5 {
        let response = post(&server.url, &body).await;
        assert_eq!(response.status(), 200);
        drop(response);
    }
    let data = read_stream(first).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    // Give a queued request time to reach the engine, were it still queued.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        engine.prompts().len(),
        1,
        "only the first request generated"
    );
    assert_eq!(engine.running(), 0);
    // The slot is free again: the next request is served.
    let mut body = chat(false);
    body["max_tokens"] = json!(3);
    assert_eq!(post(&server.url, &body).await.status(), 200);
    assert_eq!(engine.prompts().len(), 2);
}

/// What `stream` receives until it contains `needle`, the peer closes, or 5 s
/// pass.
async fn read_until(stream: &mut tokio::net::TcpStream, needle: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buffer[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_request_deadline_ends_slow_requests_with_an_error() {
    let engine = ScriptedEngine::new(long_reasoning(100))
        .cycling()
        .with_delay(Duration::from_millis(100));
    let server = Server::simple(
        engine,
        ServerConfig {
            request_timeout_s: 1,
            ..ServerConfig::default()
        },
    )
    .await;
    let started = Instant::now();
    let r = post(&server.url, &chat(false)).await;
    assert_eq!(r.status(), 504);
    assert_eq!(error_code(r).await, "request_timeout");
    assert!(started.elapsed() < Duration::from_secs(3));

    let data = read_stream(post(&server.url, &chat(true)).await).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_timeout", "{error}");
    // Both generations were cancelled, and neither counts as a client leaving.
    assert!(
        Server::within(Duration::from_secs(1), || server.engine.running() == 0)
            .await
            .is_some()
    );
    assert_eq!(server.state.metrics.request_timeouts.get(), 2);
    assert_eq!(server.disconnects("decode"), 0);
}

#[tokio::test]
async fn shutdown_lets_short_streams_finish_and_ends_long_ones_cleanly() {
    let engine = ScriptedEngine::new(long_reasoning(300)).with_delay(Duration::from_millis(50));
    let mut server = Server::start(
        engine,
        mona_lisa(),
        ServerConfig::default(),
        &[],
        Duration::from_millis(500),
    )
    .await;
    let stream = post(&server.url, &chat(true)).await;
    assert_eq!(stream.status(), 200);
    let started = Instant::now();
    server.shutdown.take().unwrap().send(()).unwrap();
    // The open stream runs through the grace period, then ends with an error
    // event and [DONE], not a cut connection.
    let data = read_stream(stream).await;
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "server_shutting_down", "{error}");
    // The server has stopped: the task returns and new connections fail.
    tokio::time::timeout(Duration::from_secs(5), &mut server.handle)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert!(reqwest::get(format!("{}/health", server.url))
        .await
        .is_err());

    // A stream that ends within the grace period ends normally.
    let mut server = Server::start(
        ScriptedEngine::new(script()).with_delay(Duration::from_millis(100)),
        mona_lisa(),
        ServerConfig::default(),
        &[],
        Duration::from_secs(10),
    )
    .await;
    let stream = post(&server.url, &chat(true)).await;
    server.shutdown.take().unwrap().send(()).unwrap();
    let data = read_stream(stream).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{last}");
    tokio::time::timeout(Duration::from_secs(5), &mut server.handle)
        .await
        .expect("the server stops once the stream ended")
        .unwrap()
        .unwrap();
}

/// A backend that never answers and counts calls dropped before finishing.
#[derive(Default)]
struct HangingBackend {
    started: AtomicUsize,
    dropped: Arc<AtomicUsize>,
}

struct CountDrop(Arc<AtomicUsize>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl SearchBackend for HangingBackend {
    async fn search(&self, _query: &str, _k: usize) -> Result<Vec<Document>, SearchError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let _guard = CountDrop(Arc::clone(&self.dropped));
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(Vec::new())
    }
}

/// Opens a stream, reads until `seen` says stop, then drops the connection.
async fn leave_when(url: &str, mut seen: impl FnMut(&str) -> bool) {
    let response = post(url, &chat(true)).await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if seen(&text) {
            return;
        }
    }
    panic!("the stream ended before the test could leave: {text}");
}

async fn assert_cancelled(server: &Server, phase: &str) {
    let took = Server::within(Duration::from_secs(1), || {
        server.engine.running() == 0 && server.in_flight() == 0 && server.disconnects(phase) == 1
    })
    .await;
    assert!(
        took.is_some(),
        "{phase}: running {} in flight {} disconnects {}",
        server.engine.running(),
        server.in_flight(),
        server.disconnects(phase)
    );
}

#[tokio::test]
async fn a_client_leaving_before_the_first_token_cancels_generation() {
    // A slow "prefill": the first token is 30 s away.
    let engine = ScriptedEngine::new(vec![vec!["<answer> x </answer>".to_string()]])
        .with_delay(Duration::from_secs(30));
    let server = Server::simple(engine, ServerConfig::default()).await;
    // Leave once the role chunk arrived (the rollout is waiting on the engine).
    leave_when(&server.url, |t| t.contains("\"role\":\"assistant\"")).await;
    assert_cancelled(&server, "before_first_token").await;
    assert_eq!(server.disconnects("decode"), 0);
}

/// A prefetch policy's question search comes before any token: a client that
/// leaves after its splice, while the engine prefills, left before the first
/// token (before, the phase stayed `search`).
#[tokio::test]
async fn a_client_leaving_after_the_question_search_left_before_the_first_token() {
    let engine = ScriptedEngine::new(vec![vec!["<answer> x </answer>".to_string()]])
        .with_delay(Duration::from_secs(30));
    let server = Server::simple(engine, ServerConfig::default()).await;
    let mut body = chat(true);
    body["policy"] = json!("search-r1-prefetch");
    let response = post(&server.url, &body).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("\"type\":\"splice\"") {
        let chunk = stream.next().await.expect("a splice event").unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(stream);
    assert_cancelled(&server, "before_first_token").await;
    assert_eq!(server.disconnects("search"), 0);
}

/// A non-streamed request whose client leaves before the response is counted
/// with status 499 (before: `status="0"`).
#[tokio::test]
async fn a_request_abandoned_before_its_response_is_counted_as_499() {
    let engine = ScriptedEngine::new(vec![vec!["<answer> x </answer>".to_string()]])
        .with_delay(Duration::from_secs(30));
    let server = Server::simple(engine, ServerConfig::default()).await;
    let abandoned =
        tokio::time::timeout(Duration::from_millis(300), post(&server.url, &chat(false))).await;
    assert!(abandoned.is_err(), "the engine is slow: no response yet");
    let counted = |status: &str| {
        server
            .state
            .metrics
            .http_requests
            .with_label_values(&["/v1/chat/completions", status])
            .get()
    };
    let took = Server::within(Duration::from_secs(2), || counted("499") == 1).await;
    assert!(took.is_some(), "499 count {}", counted("499"));
    assert_eq!(counted("0"), 0);
}

/// A request line over 16 KiB gets a 414 in the API's JSON error shape (before:
/// hyper's bodyless 414 for targets over 64 KiB); a request line that arrives
/// in pieces is still served.
#[tokio::test]
async fn a_long_request_line_gets_a_json_414_and_a_split_one_is_served() {
    use tokio::io::AsyncWriteExt;
    let server = Server::simple(ScriptedEngine::new(script()), ServerConfig::default()).await;
    let address = server.url.strip_prefix("http://").unwrap().to_string();

    let mut long = tokio::net::TcpStream::connect(&address).await.unwrap();
    let target = format!("/v1/models/{}", "a".repeat(70_000));
    long.write_all(format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_until(&mut long, "}}").await;
    assert!(answer.starts_with("HTTP/1.1 414"), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(head.contains("x-request-id: "), "{head}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "uri_too_long");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let mut split = tokio::net::TcpStream::connect(&address).await.unwrap();
    split.write_all(b"GET /hea").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    split
        .write_all(b"lth HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until(&mut split, "\"ok\"").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_client_leaving_during_decoding_cancels_generation() {
    let engine = ScriptedEngine::new(long_reasoning(1000)).with_delay(Duration::from_millis(20));
    let server = Server::simple(engine, ServerConfig::default()).await;
    leave_when(&server.url, |t| t.contains("step3")).await;
    assert_cancelled(&server, "decode").await;
    // The next request is served (the script is used up: it ends at once).
    let r = post(&server.url, &chat(false)).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_client_leaving_during_a_search_round_cancels_the_search() {
    let backend = Arc::new(HangingBackend::default());
    let server = Server::start(
        ScriptedEngine::new(script()),
        Arc::clone(&backend) as Arc<dyn SearchBackend>,
        ServerConfig::default(),
        &[],
        Duration::from_secs(1),
    )
    .await;
    // The search event comes out as the round starts.
    leave_when(&server.url, |t| t.contains("\"type\":\"search\"")).await;
    assert_cancelled(&server, "search").await;
    assert!(
        Server::within(Duration::from_secs(1), || backend
            .dropped
            .load(Ordering::SeqCst)
            == 1)
        .await
        .is_some(),
        "the backend call is dropped"
    );
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn metrics_report_a_served_request_and_responses_carry_a_request_id() {
    let server = Server::simple(ScriptedEngine::new(script()), ServerConfig::default()).await;
    let r = post(&server.url, &chat(false)).await;
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 36, "{id}");
    let r = reqwest::Client::new()
        .get(format!("{}/health", server.url))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-me-42");
    // Guards riding in the body keep the exact length.
    assert!(r.headers().get("content-length").is_some());

    let r = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    for expected in [
        "seeker_time_to_first_token_seconds_count 1",
        "seeker_time_to_first_answer_token_seconds_count 1",
        "seeker_requests_in_flight 0",
        "seeker_search_duration_seconds_count{backend=\"static\"} 1",
        "seeker_search_queries_total{backend=\"static\"} 1",
        "seeker_search_queries_per_round_count 1",
        "seeker_rollout_rounds_sum 2",
        "seeker_generated_tokens_total 4",
        "seeker_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "seeker_http_requests_total{route=\"/health\",status=\"200\"} 1",
    ] {
        assert!(text.contains(expected), "{expected} missing in:\n{text}");
    }
    assert!(
        !text.contains("Mona Lisa"),
        "query text must never be a label"
    );
}
