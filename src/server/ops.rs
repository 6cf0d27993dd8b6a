//! Operations middleware: API keys, the concurrency limit, per-route HTTP
//! metrics with the in-flight gauge, and the shutdown signal shared by every
//! running request.
//!
//! Guards that must last as long as a response (a concurrency slot, the
//! in-flight count, the latency timer) ride inside the response body: they
//! are released when the body is finished or dropped, so a streamed response
//! holds its slot until its last event and a client that leaves releases it at
//! once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ErrorCode};
use super::AppState;
use crate::config::ServerConfig;
use crate::metrics::Metrics;

/// Seconds a client is told to wait after a 429 (`Retry-After`).
pub const RETRY_AFTER_S: u64 = 1;

/// Paths that never need a key: liveness, the web UI shell and the API docs.
const OPEN_PATHS: &[&str] = &["/health", "/", "/favicon.ico", "/openapi.json"];

/// Operational settings of a running server (from `[server]`).
#[derive(Debug)]
pub struct Ops {
    /// SHA-256 of each accepted key; empty means no authentication.
    key_digests: Vec<[u8; 32]>,
    /// Slots for chat and `/retrieve` requests; `None` = no limit.
    slots: Option<Arc<Semaphore>>,
    /// Deadline of one chat request.
    pub request_timeout: Option<Duration>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Time to send a limited route's body.
    body_timeout: Option<Duration>,
    /// Time to send a request's headers (and idle time of a kept-alive
    /// connection); applied by [`super::run`].
    pub header_timeout: Option<Duration>,
    /// Connections open at once; `None` = no cap. Applied by [`super::run`].
    pub max_connections: Option<usize>,
    /// `true` once running requests must end (after the shutdown grace period).
    shutdown: watch::Sender<bool>,
}

impl Ops {
    /// From `[server]` and the API keys (already read from config and env).
    pub fn new(config: &ServerConfig, keys: &[String]) -> Self {
        Self {
            key_digests: keys.iter().map(|k| digest(k)).collect(),
            slots: (config.max_concurrent_requests > 0)
                .then(|| Arc::new(Semaphore::new(config.max_concurrent_requests))),
            request_timeout: (config.request_timeout_s > 0)
                .then(|| Duration::from_secs(config.request_timeout_s)),
            max_body_bytes: config.max_body_bytes,
            body_timeout: (config.body_timeout_s > 0)
                .then(|| Duration::from_secs(config.body_timeout_s)),
            header_timeout: (config.header_timeout_s > 0)
                .then(|| Duration::from_secs(config.header_timeout_s)),
            max_connections: (config.max_connections > 0).then_some(config.max_connections),
            shutdown: watch::channel(false).0,
        }
    }

    /// Whether requests need a key.
    pub fn auth_enabled(&self) -> bool {
        !self.key_digests.is_empty()
    }

    /// Tells every running request to end now (the grace period is over).
    pub fn end_running_requests(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves once [`Ops::end_running_requests`] was called.
    pub async fn ending(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|ending| *ending).await;
    }

    /// Whether [`Ops::end_running_requests`] was called.
    pub fn is_ending(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn key_accepted(&self, presented: &str) -> bool {
        let d = digest(presented);
        // Compare digests in full every time, so timing says nothing about
        // how much of a key matched.
        self.key_digests
            .iter()
            .fold(false, |ok, k| ok | constant_time_eq(k, &d))
    }
}

impl Default for Ops {
    fn default() -> Self {
        Self::new(&ServerConfig::default(), &[])
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Keeps `guard` alive until `response`'s body is finished or dropped.
fn hold_until_body_ends<G: Send + Unpin + 'static>(response: Response, guard: G) -> Response {
    response.map(|inner| {
        Body::new(Guarded {
            inner,
            _guard: guard,
        })
    })
}

/// A body that carries a guard; frames, end of stream and size hint (so
/// `Content-Length`) are the inner body's.
struct Guarded<G> {
    inner: Body,
    _guard: G,
}

impl<G: Unpin> http_body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `status` label of a request whose client closed the connection
/// before the response started (nginx's 499 convention).
pub const CLIENT_CLOSED: u16 = 499;

/// Counts one request in flight, and on drop its status and duration, and
/// logs one `response finished` line with the time to the end of the body
/// (tower-http's own line gives the time to the response headers only).
struct RequestRecord {
    metrics: Arc<Metrics>,
    route: String,
    status: u16,
    started: Instant,
    in_flight: bool,
    /// The request's span (`id`, `method`, `path`), for the log line.
    span: tracing::Span,
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if self.in_flight {
            self.metrics.requests_in_flight.dec();
        }
        self.metrics
            .http_requests
            .with_label_values(&[self.route.as_str(), &self.status.to_string()])
            .inc();
        self.metrics
            .http_request_duration
            .with_label_values(&[self.route.as_str()])
            .observe(self.started.elapsed().as_secs_f64());
        let _in_request = self.span.enter();
        tracing::info!(
            status = self.status,
            latency_ms = self.started.elapsed().as_millis() as u64,
            "response finished"
        );
    }
}

/// Middleware: the in-flight gauge and `seeker_http_*` per route template.
/// Scrapes of `/metrics` are counted per route but not in flight, so an idle
/// server reads 0.
pub async fn track(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let metrics = Arc::clone(&state.metrics);
    let in_flight = route != "/metrics";
    if in_flight {
        metrics.requests_in_flight.inc();
    }
    let mut record = RequestRecord {
        metrics,
        route,
        status: CLIENT_CLOSED,
        started: Instant::now(),
        in_flight,
        span: tracing::Span::current(),
    };
    let response = next.run(request).await;
    record.status = response.status().as_u16();
    hold_until_body_ends(response, record)
}

/// Middleware: `Authorization: Bearer KEY` on every path but `OPEN_PATHS`
/// and the docs, when keys are configured; 401 otherwise.
pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if !state.ops.auth_enabled()
        || OPEN_PATHS.contains(&path)
        || path == "/docs"
        || path.starts_with("/docs/")
    {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, key) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        });
    let message = match presented {
        Some(key) if state.ops.key_accepted(key) => return next.run(request).await,
        Some(_) => "the API key is not valid",
        None => "this server needs an API key: send `Authorization: Bearer KEY`",
    };
    state
        .metrics
        .requests_rejected
        .with_label_values(&["unauthorized"])
        .inc();
    let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Reads the whole body of `request` (at most `max_body_bytes + 1` bytes are
/// kept) within `body_timeout`.
///
/// # Errors
/// 408 `body_timeout` when it does not arrive in time; 413 when it is larger
/// than `max_body_bytes`; 400 `invalid_json` when the connection fails.
async fn buffer_body(ops: &Ops, request: Request) -> Result<Request, ApiError> {
    use futures::StreamExt;
    let (parts, body) = request.into_parts();
    let limit = ops.max_body_bytes;
    // A declared length over the limit is not refused before reading: a
    // client still sending gets a broken pipe instead of the 413 (Python's
    // urllib does). Reading stops at the limit.
    let read = async move {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(ErrorCode::InvalidJson, format!("cannot read the body: {e}"))
            })?;
            if bytes.len() + chunk.len() > limit {
                return Err(ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("the request body is larger than {limit} bytes"),
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    let bytes = match ops.body_timeout {
        Some(limit) => tokio::time::timeout(limit, read).await.map_err(|_| {
            ApiError::new(
                ErrorCode::BodyTimeout,
                format!(
                    "the request body did not arrive within {} s (server.body_timeout_s)",
                    limit.as_secs()
                ),
            )
        })??,
        None => read.await?,
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Route middleware: reads the body first (within `body_timeout_s`, so a
/// client that trickles it holds no slot), then takes one slot per running
/// chat or `/retrieve` request, held until its response ends; none free → 429
/// with `Retry-After`.
pub async fn limit(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let request = match buffer_body(&state.ops, request).await {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    let Some(slots) = &state.ops.slots else {
        return next.run(request).await;
    };
    let permit: OwnedSemaphorePermit = match Arc::clone(slots).try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            state
                .metrics
                .requests_rejected
                .with_label_values(&["overloaded"])
                .inc();
            let mut response = ApiError::new(
                ErrorCode::Overloaded,
                format!(
                    "the server is running as many requests as it takes \
                     (server.max_concurrent_requests); retry after {RETRY_AFTER_S} s"
                ),
            )
            .into_response();
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&RETRY_AFTER_S.to_string()).expect("digits"),
            );
            return response;
        }
    };
    let response = next.run(request).await;
    hold_until_body_ends(response, permit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let ops = Ops::new(
            &ServerConfig::default(),
            &["sk-one".into(), "sk-two".into()],
        );
        assert!(ops.auth_enabled());
        assert!(ops.key_accepted("sk-one"));
        assert!(ops.key_accepted("sk-two"));
        assert!(!ops.key_accepted("sk-on"));
        assert!(!ops.key_accepted("sk-one "));
        assert!(!ops.key_accepted(""));
        assert!(!Ops::default().auth_enabled());
    }
}
