//! The HTTP surface (axum). Each endpoint parses, calls the core through a
//! trait, and renders; the core never sees HTTP types.
//!
//! Routes: `POST /v1/chat/completions` ([`chat`]), `GET /v1/models`,
//! `GET /v1/models/{id}`, `GET /health` (503 while the model loads), `GET /`
//! (the web UI from `static/`). Anything else is a JSON 404/405.

pub mod chat;
pub mod error;
pub mod openai;
pub mod retrieve;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::config::{Config, GenerationConfig};
use crate::engine::mistral::{MistralConfig, MistralEngine};
use crate::engine::Engine;
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
        Self {
            engine: OnceLock::new(),
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

/// The router, without a listener (tests call it directly).
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(INDEX_HTML) }))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions).layer(DefaultBodyLimit::max(chat::MAX_BODY_BYTES)),
        )
        .route(
            "/retrieve",
            post(retrieve::retrieve).layer(DefaultBodyLimit::max(chat::MAX_BODY_BYTES)),
        )
        .fallback(|| async {
            ApiError::new(
                ErrorCode::UnknownRoute,
                "no such route; see the README for the API",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        // One INFO line per response (method, path, status, latency). Failures
        // are logged where they happen, with their cause; a 503 while the model
        // loads is not one.
        .layer(
            TraceLayer::new_for_http()
                .on_response(DefaultOnResponse::new().level(Level::INFO))
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        .with_state(state)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine() {
        Some(_) => Json(serde_json::json!({"status": "ok"})).into_response(),
        None => ApiError::new(ErrorCode::ModelLoading, "the model is loading").into_response(),
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![state.model_object()],
    })
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
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
/// the background (`/health` is 503 until it is ready) and serves until SIGINT or
/// SIGTERM.
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
    let search =
        crate::search::dispatcher_from_config(&config.search, |var| std::env::var(var).ok())?;
    tracing::info!(
        backends = %search.backend_names().join(", "),
        default = search.default_backend(),
        policy = %config.policy.default,
        "search ready"
    );
    let state = Arc::new(AppState::new(
        config.model.id.clone(),
        Arc::new(search),
        profiles,
        config.policy.default.clone(),
        config.generation.clone(),
    ));

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
    println!("seeker listening on http://{addr}");

    let mistral = MistralConfig {
        model_id: config.model.id.clone(),
        gguf: config.model.gguf.clone(),
        dtype: config.model.dtype,
        max_num_seqs: config.model.max_num_seqs,
    };
    let loading = Arc::clone(&state);
    let load = async move {
        let started = std::time::Instant::now();
        let engine = MistralEngine::load(&mistral).await?;
        tracing::info!(
            model = %mistral.gguf.display(),
            dtype = ?mistral.dtype,
            context = ?engine.max_seq_len(),
            seconds = started.elapsed().as_secs_f64(),
            "model loaded"
        );
        loading.set_engine(Arc::new(engine));
        anyhow::Ok(())
    };
    let server = axum::serve(listener, app(state)).with_graceful_shutdown(shutdown_signal());
    tokio::select! {
        result = server => result?,
        result = async { load.await?; std::future::pending::<anyhow::Result<()>>().await } => result?,
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}
