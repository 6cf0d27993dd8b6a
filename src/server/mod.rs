//! The HTTP surface (axum). Each endpoint parses, calls the core through a
//! trait, and renders; the core never sees HTTP types.
//!
//! Routes: `POST /v1/chat/completions` ([`chat`]), `GET /v1/models`,
//! `GET /v1/models/{id}`, `POST /retrieve` ([`retrieve`]), `GET /health` (503
//! while the model loads), `GET /metrics` (Prometheus), `GET /openapi.json`
//! and `GET /docs` (Swagger UI, served from the binary), `GET /` (the web UI
//! from `static/`). Anything else is a JSON 404/405.
//!
//! Every response carries `x-request-id` (the client's, or a new UUID), which
//! also tags the request's log lines. Middleware ([`ops`]) checks API keys,
//! limits concurrent chat/`/retrieve` requests, and counts requests per route.

pub mod api_doc;
pub mod chat;
pub mod error;
pub mod openai;
pub mod ops;
pub mod retrieve;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderName, HeaderValue, Method, Request};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa::OpenApi;

use crate::config::{Config, GenerationConfig};
use crate::engine::mistral::{MistralConfig, MistralEngine};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::profile::Profile;
use crate::search::dispatch::Dispatcher;
use error::{ApiError, ErrorCode};
use openai::{ModelList, ModelObject};

/// The web UI, embedded so the binary serves it from any working directory.
const INDEX_HTML: &str = include_str!("../../static/index.html");

/// Shared state of all handlers.
pub struct AppState {
    /// Set once the model has loaded; `None` until then (`/health` is 503).
    engine: OnceLock<Arc<dyn Engine>>,
    /// Every configured search backend, behind one dispatcher.
    pub search: Arc<Dispatcher>,
    /// Every loaded policy profile, by name.
    pub profiles: BTreeMap<String, Arc<Profile>>,
    /// The profile used when a request names none.
    pub default_policy: String,
    /// The served model id (`/v1/models`).
    pub model_id: String,
    pub generation: GenerationConfig,
    /// Every metric (`GET /metrics`); shared with the dispatcher.
    pub metrics: Arc<Metrics>,
    /// API keys, limits, deadline and the shutdown signal.
    pub ops: ops::Ops,
    /// Browser origins allowed by CORS; empty = no CORS headers.
    cors_origins: Vec<String>,
    started: u64,
}

impl AppState {
    /// State whose engine is set later with [`AppState::set_engine`].
    ///
    /// # Panics
    /// When `default_policy` is not in `profiles` (checked at startup).
    pub fn new(
        model_id: String,
        search: Arc<Dispatcher>,
        profiles: BTreeMap<String, Profile>,
        default_policy: String,
        generation: GenerationConfig,
    ) -> Self {
        assert!(
            profiles.contains_key(&default_policy),
            "default policy {default_policy:?} is not loaded"
        );
        let metrics = Arc::clone(search.metrics());
        Self {
            engine: OnceLock::new(),
            metrics,
            ops: ops::Ops::default(),
            cors_origins: Vec::new(),
            search,
            profiles: profiles
                .into_iter()
                .map(|(name, p)| (name, Arc::new(p)))
                .collect(),
            default_policy,
            model_id,
            generation,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// With the `[server]` settings (keys, limits, deadline, CORS) instead of
    /// the defaults; `keys` are the accepted API keys.
    pub fn with_server_config(
        mut self,
        config: &crate::config::ServerConfig,
        keys: &[String],
    ) -> Self {
        self.ops = ops::Ops::new(config, keys);
        self.cors_origins = config.cors_origins.clone();
        self
    }

    /// Marks the model as loaded. A second call is ignored.
    pub fn set_engine(&self, engine: Arc<dyn Engine>) {
        let _ = self.engine.set(engine);
    }

    /// The profile named `name`, or the default one.
    pub fn profile(&self, name: Option<&str>) -> Option<Arc<Profile>> {
        self.profiles
            .get(name.unwrap_or(&self.default_policy))
            .cloned()
    }

    /// The engine, once loaded.
    pub fn engine(&self) -> Option<Arc<dyn Engine>> {
        self.engine.get().cloned()
    }

    fn model_object(&self) -> ModelObject {
        ModelObject {
            id: self.model_id.clone(),
            object: "model".into(),
            created: self.started,
            owned_by: "seeker".into(),
            policy: self.default_policy.clone(),
            policies: self.profiles.keys().cloned().collect(),
        }
    }
}

/// The `x-request-id` header.
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The router, without a listener (tests call it directly).
pub fn app(state: Arc<AppState>) -> Router {
    let body_limit = DefaultBodyLimit::max(state.ops.max_body_bytes);
    let limited = middleware::from_fn_with_state(Arc::clone(&state), ops::limit);
    let router = Router::new()
        .route("/", get(|| async { Html(INDEX_HTML) }))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions)
                .layer(body_limit)
                .layer(limited.clone()),
        )
        .route(
            "/retrieve",
            post(retrieve::retrieve).layer(body_limit).layer(limited),
        )
        .merge(
            utoipa_swagger_ui::SwaggerUi::new("/docs")
                .url("/openapi.json", api_doc::ApiDoc::openapi()),
        )
        .fallback(|| async {
            ApiError::new(
                ErrorCode::UnknownRoute,
                "no such route; see /docs for the API",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            ops::authenticate,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            ops::track,
        ));
    let router = match cors(&state.cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router
        // Layers run bottom-up: the id is set first, logged by the trace span,
        // and copied onto the response.
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        // One INFO line per response (method, path, status, latency) inside a
        // span with the request id. Failures are logged where they happen,
        // with their cause; a 503 while the model loads is not one.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<axum::body::Body>| {
                    let id = request
                        .headers()
                        .get(&REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!(
                        "request",
                        id = %id,
                        method = %request.method(),
                        path = %request.uri().path(),
                    )
                })
                // Time to the headers only; `ops::track` logs the time to
                // the end of the body (`response finished`) at INFO.
                .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}

/// The CORS layer for `origins` (`*` = any), or none when the list is empty.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .expose_headers([REQUEST_ID, header::RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    )
}

/// Prometheus text format (version 0.0.4) of every `seeker_*` metric.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", content_type = "text/plain")))]
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// Readiness: 200 `{"status": "ok"}` once the model is loaded, 503 before.
#[utoipa::path(get, path = "/health", tag = "operations", responses(
    (status = 200, description = "Ready", body = openai::Health),
    (status = 503, description = "The model is loading", body = error::ErrorBody)))]
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine() {
        Some(_) => Json(openai::Health {
            status: "ok".into(),
        })
        .into_response(),
        None => ApiError::new(ErrorCode::ModelLoading, "the model is loading").into_response(),
    }
}

/// The served model (one), with the policies a request may name.
#[utoipa::path(get, path = "/v1/models", tag = "openai", security(("bearer" = [])),
    responses((status = 200, body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = error::ErrorBody)))]
async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![state.model_object()],
    })
}

/// One model by id (the served id or `default`).
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai", security(("bearer" = [])),
    params(("id" = String, Path, description = "Served model id or `default`")),
    responses((status = 200, body = ModelObject),
        (status = 400, description = "The id is not valid UTF-8", body = error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = error::ErrorBody),
        (status = 404, description = "No such model", body = error::ErrorBody)))]
async fn model(
    State(state): State<Arc<AppState>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    // axum answers a path it cannot decode (`%FF`: not UTF-8) in plain text.
    let Ok(Path(id)) = id else {
        return ApiError::invalid_field("id", "the model id in the path is not valid UTF-8")
            .into_response();
    };
    if id == state.model_id || id == "default" {
        Json(state.model_object()).into_response()
    } else {
        ApiError {
            code: ErrorCode::ModelNotFound,
            message: format!("the model `{id}` does not exist"),
            param: Some("model".into()),
        }
        .into_response()
    }
}

/// Starts the server from `config`: opens the index and profiles (failing fast),
/// binds, prints `seeker listening on http://ADDR` to stdout, loads the model in
/// the background (`/health` is 503 until it is ready, every connection is
/// served meanwhile) and serves until SIGINT or SIGTERM. A signal during the
/// model load returns at once; one while serving starts the graceful shutdown
/// of [`run`], and a second one returns without waiting for open requests.
///
/// # Errors
/// Missing index or profile, bind failure, model load failure.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let profiles = Profile::load_dir(&config.policy.dir)?;
    if !profiles.contains_key(&config.policy.default) {
        anyhow::bail!(
            "policy.default = {:?} is not a profile in {} (have: {})",
            config.policy.default,
            config.policy.dir.display(),
            profiles.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    // Fail before listening when the model file is missing, not after.
    anyhow::ensure!(
        config.model.gguf.is_file(),
        "model.gguf = {} is not a file (run scripts/fetch-defaults.sh, or set \
         SEEKER_MODEL__GGUF)",
        config.model.gguf.display()
    );
    let gguf = config.model.gguf.clone();
    tokio::task::spawn_blocking(move || crate::engine::prepare::check_gguf(&gguf))
        .await?
        .map_err(|e| e.context("model.gguf is not a usable model"))?;
    let search =
        crate::search::dispatcher_from_config(&config.search, |var| std::env::var(var).ok())?;
    tracing::info!(
        backends = %search.backend_names().join(", "),
        default = search.default_backend(),
        policy = %config.policy.default,
        "search ready"
    );
    let keys = config.server.keys(|var| std::env::var(var).ok());
    let metrics = Arc::new(Metrics::new());
    let state = Arc::new(
        AppState::new(
            config.model.id.clone(),
            Arc::new(search.with_metrics(metrics)),
            profiles,
            config.policy.default.clone(),
            config.generation.clone(),
        )
        .with_server_config(&config.server, &keys),
    );
    tracing::info!(
        api_keys = keys.len(),
        cors = %config.server.cors_origins.join(", "),
        max_concurrent_requests = config.server.max_concurrent_requests,
        request_timeout_s = config.server.request_timeout_s,
        "server settings"
    );

    let listener = tokio::net::TcpListener::bind((config.server.host.as_str(), config.server.port))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {}:{}: {e}",
                config.server.host,
                config.server.port
            )
        })?;
    let addr: SocketAddr = listener.local_addr()?;
    // Caught before anyone can know the address: a signal from a supervisor
    // that saw the line below is always handled as a shutdown.
    let mut signals = Signals::new()?;
    println!("seeker listening on http://{addr}");

    let mistral = MistralConfig {
        model_id: config.model.id.clone(),
        gguf: config.model.gguf.clone(),
        dtype: config.model.dtype,
        max_num_seqs: config.model.max_num_seqs,
        weights: config.model.weights,
        prefix_cache: config.model.prefix_cache,
    };
    // Three independent pieces, none polled inside another (seeker issue 12):
    // the HTTP server and the model load are tasks of their own on the
    // runtime's workers, and this function only watches them and the signals.
    // Before, the accept loop and the load were polled together in one
    // `select!` on the `block_on` thread, and mistral.rs's warm-up run, which
    // parks that thread with a nested blocking wait, could swallow the accept
    // loop's wake-up for good (see `engine::mistral::build_off_runtime`).
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let grace = Duration::from_secs(config.server.shutdown_grace_s);
    let mut server = tokio::spawn(run(
        listener,
        Arc::clone(&state),
        async move {
            let _ = server_stopped.await;
        },
        grace,
    ));
    let (gguf, weights) = (mistral.gguf.clone(), mistral.weights);
    let mut load = tokio::spawn(load_engine(mistral, Arc::clone(&state)));

    // Until the model is loaded (or fails to): a signal stops the server at
    // once, without waiting for the load (weight preparation and loading are
    // not interruptible: the process exits under them, and a half-written
    // weight copy is removed here, or swept on the next start after a kill).
    tokio::select! {
        () = signals.recv() => {
            tracing::info!("signal received while the model loads: stopping");
            let _ = stop_server.send(());
            load.abort();
            crate::engine::prepare::discard_own_partial(&gguf, weights);
            // Nothing but `/health`-style answers runs before the model is
            // loaded: a connection still open after a moment (a client that
            // sent half its headers or body) is not waited for.
            return match tokio::time::timeout(LOADING_SHUTDOWN, finish_server(server, signals)).await {
                Ok(ended) => ended,
                Err(_) => {
                    tracing::warn!("connections still open; exiting without them");
                    Ok(())
                }
            };
        }
        loaded = &mut load => {
            let failure = match loaded {
                Ok(Ok(())) => None,
                // `EngineError::Load` says "model load failed: …" itself.
                Ok(Err(e)) => Some(anyhow::Error::new(e)),
                Err(e) => Some(anyhow::anyhow!("model load task failed: {e}")),
            };
            if let Some(e) = failure {
                let _ = stop_server.send(());
                server.abort();
                return Err(e);
            }
        }
        ended = &mut server => return server_result(ended),
    }
    tokio::select! {
        () = signals.recv() => {
            let _ = stop_server.send(());
            finish_server(server, signals).await
        }
        ended = &mut server => server_result(ended),
    }
}

/// How long a signal during the model load waits for open connections.
const LOADING_SHUTDOWN: Duration = Duration::from_secs(1);

/// How long connections may take to close after the grace period ended the
/// requests still running (their streams send a last error event and
/// `[DONE]`); a connection still open then (half-sent headers or body) is
/// not waited for.
const AFTER_GRACE: Duration = Duration::from_secs(1);

/// Loads the embedded model and hands it to `state` (`/health` turns 200).
async fn load_engine(
    mistral: MistralConfig,
    state: Arc<AppState>,
) -> Result<(), crate::engine::EngineError> {
    let started = std::time::Instant::now();
    let engine = MistralEngine::load(&mistral).await?;
    tracing::info!(
        model = %mistral.gguf.display(),
        dtype = ?mistral.dtype,
        context = ?engine.max_seq_len(),
        seconds = started.elapsed().as_secs_f64(),
        "model loaded"
    );
    state.set_engine(Arc::new(crate::engine::gate::Gated::new(
        engine,
        mistral.max_num_seqs,
    )));
    Ok(())
}

/// Waits for the server task after it was told to stop (graceful shutdown:
/// open requests get `shutdown_grace_s`); a second signal ends the wait at once.
async fn finish_server(
    mut server: tokio::task::JoinHandle<std::io::Result<()>>,
    mut signals: Signals,
) -> anyhow::Result<()> {
    tokio::select! {
        ended = &mut server => server_result(ended),
        () = signals.recv() => {
            tracing::warn!("second signal: exiting without waiting for open requests");
            server.abort();
            Ok(())
        }
    }
}

fn server_result(ended: Result<std::io::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    match ended {
        Ok(result) => Ok(result?),
        Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
    }
}

/// Serves `app(state)` on `listener` until `shutdown` resolves; then refuses
/// new connections, lets open requests run for `grace`, ends the ones still
/// running (streams get a `server_shutting_down` error event and `[DONE]`,
/// others a 503), and returns once every connection has closed, or at the
/// latest a second after that (a client that sent half its headers or body
/// is not waited for).
///
/// Each connection (HTTP/1.1, or HTTP/2 with prior knowledge) gets
/// `server.header_timeout_s` to send a request's headers, on a new
/// connection and between requests on a kept-alive one: a client that
/// connects and sends nothing, or trickles its headers, or idles, is closed
/// then. (axum's own `serve` runs hyper without a timer, so with no such
/// timeout: idle connections piled up until the process ran out of file
/// descriptors — seeker issue 18.)
///
/// # Errors
/// None today: accept errors are logged and retried (a full descriptor
/// table is waited out, not fatal).
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;

    let header_timeout = state.ops.header_timeout;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let (stopping, stopping_rx) = tokio::sync::watch::channel(false);
    let ending = Arc::clone(&state);
    let router = app(state);
    let connections = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                // EMFILE/ENFILE and the like: wait for descriptors to free up.
                tracing::error!(error = %e, "accepting a connection failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // Taken now, before a shutdown can start: it then waits for this one.
        let watcher = connections.watcher();
        let (builder, router, mut stopping) =
            (builder.clone(), router.clone(), stopping_rx.clone());
        tokio::spawn(async move {
            // hyper-util reads the first bytes to tell HTTP/1 from HTTP/2
            // before hyper's header timer starts: a connection that sends
            // nothing would wait there for good, so its first line gets the
            // same deadline (and a shutdown drops it at once).
            let first_line = async {
                match header_timeout {
                    Some(limit) => tokio::time::timeout(limit, peek_request_line(&stream))
                        .await
                        .unwrap_or(FirstLine::Missing),
                    None => peek_request_line(&stream).await,
                }
            };
            let first_line = tokio::select! {
                line = first_line => line,
                _ = stopping.wait_for(|stop| *stop) => FirstLine::Missing,
            };
            match first_line {
                FirstLine::Missing => return,
                FirstLine::TooLong => return refuse_long_request_line(stream).await,
                FirstLine::Fits => {}
            }
            let service = hyper_util::service::TowerToHyperService::new(router);
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    stopping.send_replace(true);
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutting down: refusing new connections, letting open requests finish"
    );
    let closed = connections.shutdown();
    let grace_over = async {
        tokio::time::sleep(grace).await;
        tracing::info!("grace period over: ending the requests still running");
        ending.ops.end_running_requests();
        tokio::time::sleep(AFTER_GRACE).await;
    };
    tokio::select! {
        () = closed => {}
        () = grace_over => {
            // A client that sent half its headers or body keeps its
            // connection open until `header_timeout_s`/`body_timeout_s`:
            // the server does not wait for it.
            tracing::warn!("connections still open after the grace period; not waiting for them");
        }
    }
    Ok(())
}

/// Longest request line (`GET /path?query HTTP/1.1`) answered with a JSON
/// error: a longer first line gets a `uri_too_long` 414 in the API's error
/// shape. hyper itself refuses targets over 64 KiB, but with a bodyless 414,
/// and does so for every request on a connection; seeker checks the first
/// request of each connection (later requests on a kept-alive connection
/// still get hyper's bodyless 414 above 64 KiB). No route takes a long URI.
const MAX_REQUEST_LINE: usize = 16 * 1024;

/// What the first bytes of a connection were.
enum FirstLine {
    /// Nothing arrived (the peer closed, failed, or the deadline passed).
    Missing,
    /// A request line shorter than [`MAX_REQUEST_LINE`] (or HTTP/2's preface).
    Fits,
    /// [`MAX_REQUEST_LINE`] bytes without a line end.
    TooLong,
}

/// Waits for a connection's first line without consuming it (hyper reads it
/// next). Data that arrives in pieces is peeked again with a growing pause
/// (1 to 64 ms): a socket stays readable while unread bytes wait, so there is
/// no wake-up for "more bytes".
async fn peek_request_line(stream: &tokio::net::TcpStream) -> FirstLine {
    let mut buf = vec![0u8; MAX_REQUEST_LINE];
    let (mut seen, mut pause) = (0, Duration::from_millis(1));
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return FirstLine::Missing,
            Ok(n) => n,
        };
        if buf[..n].contains(&b'\n') {
            return FirstLine::Fits;
        }
        if n >= MAX_REQUEST_LINE {
            return FirstLine::TooLong;
        }
        if n == seen {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(64));
        } else {
            (seen, pause) = (n, Duration::from_millis(1));
        }
    }
}

/// Answers a connection whose request line is over [`MAX_REQUEST_LINE`] with
/// a JSON `uri_too_long` 414 and closes it, after reading (for up to a
/// second, at most 1 MiB) what the client still sends, so that the kernel
/// does not reset the connection before the client has read the answer.
async fn refuse_long_request_line(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = ApiError::new(
        ErrorCode::UriTooLong,
        format!(
            "the request line is longer than {} KiB; send parameters in a JSON body",
            MAX_REQUEST_LINE / 1024
        ),
    )
    .to_json();
    let response = format!(
        "HTTP/1.1 414 URI Too Long\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-request-id: {}\r\nconnection: close\r\n\r\n{body}",
        body.len(),
        uuid::Uuid::new_v4(),
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = vec![0u8; 64 * 1024];
        let mut total = 0;
        while total < 1024 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Accept errors that concern one connection only (the peer gave up before
/// it was accepted): the next accept goes on at once.
fn is_per_connection(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from the moment this is created: from
/// then on they no longer end the process by their default action but are
/// reported by [`Signals::recv`], so create it before telling anyone the
/// server listens.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next SIGINT or SIGTERM (Ctrl-C elsewhere).
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
