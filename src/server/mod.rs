//! The HTTP surface (axum). Each endpoint parses, calls the core through a
//! trait, and renders; the core never sees HTTP types. The files follow a
//! request's path: [`listen`] (connections) → [`ops`] (keys, limits,
//! metrics) → `json` (the body) → [`validate`] → [`chat`] (the rollout,
//! observed by `observe`) → `render` (chunks or one response); [`state`]
//! is what every handler shares, [`error`] the error shape, [`openai`] the
//! wire types, [`api_doc`] the OpenAPI document.
//!
//! Routes: `POST /v1/chat/completions` ([`chat`]), `POST /v1/responses`
//! ([`responses`], OpenAI's Responses API), `POST /mcp` ([`mcp`], a Model
//! Context Protocol server with `search` and `research` tools), `GET /v1/models`,
//! `GET /v1/models/{id}`, `POST /retrieve` ([`retrieve`]), `GET /health` (503
//! while the model loads), `GET /metrics` (Prometheus), `GET /openapi.json`
//! and `GET /docs` (Swagger UI, served from the binary), `GET /` (the web UI
//! from `static/`). Anything else is a JSON 404/405.
//!
//! Every response carries `x-request-id` (the client's, or a new UUID), which
//! also tags the request's log lines, and (unless `server.security_headers`
//! is off) the security headers of [`headers`]. Middleware ([`ops`]) checks API keys,
//! limits concurrent chat/`/retrieve` requests, and counts requests per route.

pub mod api_doc;
pub(crate) mod chat;
pub mod citations;
pub mod error;
pub(crate) mod headers;
pub(crate) mod hosts;
pub(crate) mod json;
pub(crate) mod listen;
pub(crate) mod mcp;
pub(crate) mod observe;
pub mod openai;
pub(crate) mod ops;
pub(crate) mod render;
pub mod responses;
pub(crate) mod retrieve;
pub(crate) mod state;
pub(crate) mod validate;

pub use listen::run;
pub use state::AppState;
pub use validate::MAX_TOP_K;

use std::sync::Arc;
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

use error::{ApiError, ErrorCode};
use openai::{ModelList, ModelObject};

/// The web UI, embedded so the binary serves it from any working directory.
const INDEX_HTML: &str = include_str!("../../static/index.html");

/// The `x-request-id` header.
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The router, without a listener (tests call it directly): the routes of
/// each area merged, JSON fallbacks for unknown routes and methods, then,
/// from the inside out, the API key check, the `Host` and `Origin` check,
/// request tracking, CORS, security
/// headers and the request log, inside the request-id layers (the id is set
/// outermost and copied onto the response).
pub fn app(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .merge(page_routes())
        .merge(ops_routes())
        .merge(openai_routes(&state))
        .merge(retrieval_routes(&state))
        .merge(mcp_routes(&state))
        .merge(docs_routes())
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
            hosts::check,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            ops::track,
        ));
    let router = match cors(&state.cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    // Outside CORS, so preflight answers carry them too.
    let router = if state.security_headers {
        router.layer(middleware::from_fn(headers::secure))
    } else {
        router
    };
    with_request_log(router).with_state(state)
}

/// `GET /` (the web UI) and `GET /favicon.ico` (a 204).
fn page_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| async { Html(INDEX_HTML) }))
        // No icon: a 204 instead of a 404 (or a 401 when keys are set) in
        // every browser's log.
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
}

/// `GET /health` and `GET /metrics`.
fn ops_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
}

/// The OpenAI routes: `GET /v1/models`, `GET /v1/models/{id}`, and `POST
/// /v1/chat/completions` and `POST /v1/responses` under the body limit and
/// the concurrency limit.
fn openai_routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let body_limit = DefaultBodyLimit::max(state.ops.max_body_bytes);
    let limited = middleware::from_fn_with_state(Arc::clone(state), ops::limit);
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions)
                .layer(body_limit)
                .layer(limited.clone()),
        )
        .route(
            "/v1/responses",
            post(responses::create_response)
                .layer(body_limit)
                .layer(limited),
        )
}

/// The retriever protocols ([`retrieve`]): `POST /retrieve`, `/search`,
/// `/batch_search` and `/queries`, under the body limit and the concurrency
/// limit.
fn retrieval_routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let body_limit = DefaultBodyLimit::max(state.ops.max_body_bytes);
    let limited = middleware::from_fn_with_state(Arc::clone(state), ops::limit);
    Router::new()
        .route(
            "/retrieve",
            post(retrieve::retrieve)
                .layer(body_limit)
                .layer(limited.clone()),
        )
        .route(
            "/search",
            post(retrieve::search)
                .layer(body_limit)
                .layer(limited.clone()),
        )
        .route(
            "/batch_search",
            post(retrieve::batch_search)
                .layer(body_limit)
                .layer(limited.clone()),
        )
        .route(
            "/queries",
            post(retrieve::queries).layer(body_limit).layer(limited),
        )
}

/// `POST /mcp` ([`mcp`]): the host check runs first, then the concurrency
/// limit.
fn mcp_routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let limited = middleware::from_fn_with_state(Arc::clone(state), ops::limit);
    Router::new()
        .route_service("/mcp", mcp::service(Arc::clone(state)))
        .layer(limited)
        .layer(middleware::from_fn_with_state(
            Arc::clone(state),
            mcp::guard,
        ))
}

/// `GET /openapi.json` and `GET /docs` (Swagger UI).
fn docs_routes() -> Router<Arc<AppState>> {
    // No validator badge: Swagger UI would load an image from
    // validator.swagger.io, which the page's CSP (rightly) refuses.
    utoipa_swagger_ui::SwaggerUi::new("/docs")
        .url("/openapi.json", api_doc::ApiDoc::openapi())
        .config(utoipa_swagger_ui::Config::from("/openapi.json").validator_url("none"))
        .into()
}

/// `router` with request ids (`x-request-id`: the client's, or a new UUID)
/// and the request log (a span per request, a line per response).
fn with_request_log(router: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
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
    let (entries, bytes) = state.search.cache_usage().await;
    state
        .metrics
        .search_cache_entries
        .set(i64::try_from(entries).unwrap_or(i64::MAX));
    state
        .metrics
        .search_cache_bytes
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// Readiness: 200 `{"status": "ok"}` once the model is loaded, 503 before
/// (and while every remote engine replica is marked down).
#[utoipa::path(get, path = "/health", tag = "operations", responses(
    (status = 200, description = "Ready", body = openai::Health),
    (status = 503, description = "The model is loading, or every remote engine replica is down", body = error::ErrorBody)))]
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine() {
        Some(engine) if engine.healthy() => Json(openai::Health {
            status: "ok".into(),
        })
        .into_response(),
        Some(_) => ApiError::new(
            ErrorCode::EngineUnavailable,
            "every engine replica is marked down; see the server log",
        )
        .into_response(),
        None => ApiError::new(ErrorCode::ModelLoading, state.loading_message()).into_response(),
    }
}

/// The served model (one), with the policies a request may name.
#[utoipa::path(get, path = "/v1/models", tag = "openai", security(("bearer" = [])),
    responses((status = 200, body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = error::ErrorBody)))]
async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: openai::ListTag::Tag,
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
            message: format!("the model `{}` does not exist", error::clip(&id)),
            param: Some("model".into()),
        }
        .into_response()
    }
}
