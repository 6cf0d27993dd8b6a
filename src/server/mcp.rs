//! `POST /mcp`: seeker as a Model Context Protocol server (the streamable
//! HTTP transport, JSON-RPC 2.0; MCP specification 2025-06-18), built on the
//! official Rust SDK (`rmcp`). Two tools:
//! - `search`: queries → documents, every query at once, from any configured
//!   backend (the same dispatcher, limits and cache as chat rollouts);
//! - `research`: a question → the policy's answer, its `url_citation`s
//!   ([`super::citations`]) and the documents it read: one whole rollout of
//!   the default policy (or the one named), under the request deadline.
//!
//! Stateless: no session is kept between HTTP requests, each answer is one
//! `application/json` body, and a `GET` (a server-to-client stream) is a
//! 405. The API keys, the concurrency limit and the request deadline apply as
//! on every other route. The `Host` header must name one of
//! `server.mcp_allowed_hosts` (loopback names by default): the MCP
//! specification's guard against DNS rebinding, since a browser page could
//! otherwise reach a local server without a key.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{Implementation, ServerCapabilities, ServerInfo};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};
use serde::{Deserialize, Serialize};

use super::chat::{context, run_collecting};
use super::citations::{self, document_url, UrlCitation};
use super::error::{ApiError, ErrorCode};
use super::openai::{ChatCompletionRequest, ChatMessage, MessageContent, MessageRole};
use super::validate::{validate, MAX_TOP_K};
use super::AppState;

/// Queries one `search` call may carry (as `/retrieve`).
pub const MAX_QUERIES: usize = super::retrieve::MAX_QUERIES;

/// The MCP service mounted at `/mcp`.
pub(crate) fn service(state: Arc<AppState>) -> StreamableHttpService<Tools, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_stateful_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        // `Host` is checked by [`guard`], in the API's error shape.
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(Tools::new(Arc::clone(&state))),
        Arc::default(),
        config,
    )
}

/// Refuses a `Host` not in `server.mcp_allowed_hosts` (403
/// `host_not_allowed`; `*` in the list allows any), and gives the
/// transport's refusals (a method other than POST, a missing `Accept`, a body
/// that is not JSON) in the API's error shape, a body that is not JSON as
/// JSON-RPC's parse error (-32700, HTTP 400).
pub(crate) async fn guard(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    // HTTP/1.1 names the host in `Host`; HTTP/2 in `:authority`, which
    // hyper puts in the URI. /mcp wants one (every route checks it against
    // server.allowed_hosts when there is one; /mcp's list is its own).
    let host = super::hosts::host_of(&request)
        .map(super::hosts::host_name)
        .unwrap_or_default();
    if let Err(e) = super::hosts::check_host(
        &host,
        &state.mcp_allowed_hosts,
        "/mcp",
        "server.mcp_allowed_hosts",
    ) {
        return e.into_response();
    }
    let sent_json = is_json(request.headers());
    // The message's shape where the SDK reads past it (ids that are not
    // request ids, non-object arguments): checked on the body, then passed on.
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, state.ops.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the request body is over server.max_body_bytes ({} bytes)",
                    state.ops.max_body_bytes
                ),
            )
            .into_response()
        }
    };
    if let Some(refusal) = malformed(&bytes) {
        return refusal;
    }
    let mut request = Request::from_parts(parts, axum::body::Body::from(bytes));
    // `Accept` sent as several headers is one list (RFC 9110 §5.3).
    let accepts: Vec<String> = request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    if accepts.len() > 1 {
        if let Ok(joined) = header::HeaderValue::from_str(&accepts.join(", ")) {
            request.headers_mut().insert(header::ACCEPT, joined);
        }
    }
    let response = next.run(request).await;
    if response.status().is_success() || is_json(response.headers()) {
        return response;
    }
    let status = response.status();
    let reason = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let error = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let mut r = ApiError::new(
                ErrorCode::MethodNotAllowed,
                "/mcp takes POST with a JSON-RPC message; it keeps no sessions, so there \
                 is no server stream (GET) or session to end (DELETE)",
            )
            .into_response();
            r.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
            return r;
        }
        StatusCode::NOT_ACCEPTABLE => ApiError::new(
            ErrorCode::NotAcceptable,
            "send `Accept: application/json, text/event-stream`, as MCP's streamable HTTP \
             transport requires",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE if sent_json => {
            let body = serde_json::json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32700, "message": format!("parse error: {reason}")}});
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send the JSON-RPC message with `Content-Type: application/json`",
        ),
        s if s.is_client_error() => ApiError::new(ErrorCode::InvalidMcpRequest, reason),
        _ => ApiError::new(ErrorCode::EngineFailure, reason),
    };
    error.into_response()
}

/// The answer to a JSON-RPC message the SDK would misread, or `None` to
/// pass it on (JSON-RPC 2.0 §4–5, MCP 2025-06-18 "Base Protocol"):
/// - -32600 Invalid Request (HTTP 400, `id` null unless the message's own
///   is valid): a batch (an array: MCP 2025-06-18 removed JSON-RPC
///   batching), a message that is not an object or names a key twice (the
///   SDK answered a repeated `id` with an empty 202), `jsonrpc` other than
///   `"2.0"`, a `method` that is not a string, neither a `method` nor a
///   `result`/`error` (not a request, a notification or a response), an
///   `id` that is not a string or an integer within i64 (MCP's `RequestId`;
///   an object, array, fraction, null or larger id was taken for a
///   notification and answered with an empty 202);
/// - -32602 Invalid params (HTTP 200, with the request's id): `params` that
///   is not an object, or a `tools/call` whose `arguments` is not an object
///   (it was -32601, "method not found").
///
/// Before these, every such message got -32700 "parse error", which says
/// the body was not JSON.
fn malformed(body: &[u8]) -> Option<Response> {
    let message: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = |id: &serde_json::Value, code: i32, message: &str| {
        let status = if code == -32600 {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": code, "message": message}});
        Some((status, axum::Json(body)).into_response())
    };
    let null = serde_json::Value::Null;
    let Some(object) = message.as_object() else {
        let why = if message.is_array() {
            "invalid request: batches are not supported (MCP 2025-06-18 removed JSON-RPC \
             batching); send one message per request"
        } else {
            "invalid request: a JSON-RPC message is an object"
        };
        return error(&null, -32600, why);
    };
    if let Some(key) = repeated_key(body) {
        return error(
            &null,
            -32600,
            &format!("invalid request: the message names `{key}` twice"),
        );
    }
    // rmcp reads integer ids as i64: a larger one was taken for a
    // notification too.
    let id = object.get("id");
    let valid_id = id.filter(|id| id.is_string() || id.is_i64());
    let reply_id = valid_id.unwrap_or(&null);
    if object.get("jsonrpc").and_then(|v| v.as_str()) != Some("2.0") {
        return error(
            reply_id,
            -32600,
            "invalid request: `jsonrpc` must be \"2.0\"",
        );
    }
    match object.get("method") {
        Some(method) if !method.is_string() => {
            return error(
                reply_id,
                -32600,
                "invalid request: `method` must be a string",
            )
        }
        Some(_) => {}
        // A response to the server (it has the id of the request it
        // answers): passed on.
        None if (object.contains_key("result") || object.contains_key("error"))
            && valid_id.is_some() =>
        {
            return None
        }
        None if object.contains_key("result") || object.contains_key("error") => {
            return error(
                &null,
                -32600,
                "invalid request: a response carries the `id` (a string or an integer) of the \
                 request it answers",
            )
        }
        None => {
            return error(
                reply_id,
                -32600,
                "invalid request: `method` is missing (a request or notification names its \
                 method; a response carries `result` or `error`)",
            )
        }
    }
    let Some(id) = id else {
        // A notification: nothing is answered, whatever its params.
        return None;
    };
    if valid_id.is_none() {
        return error(
            &null,
            -32600,
            "invalid request: `id` must be a string or an integer (a message without `id` is a \
             notification)",
        );
    }
    let params = object.get("params").filter(|p| !p.is_null());
    if params.is_some_and(|p| !p.is_object()) {
        return error(id, -32602, "invalid params: `params` must be an object");
    }
    let arguments = params
        .and_then(|p| p.get("arguments"))
        .filter(|a| !a.is_object() && !a.is_null());
    let tools_call = object.get("method").and_then(|m| m.as_str()) == Some("tools/call");
    if tools_call
        && !params
            .and_then(|p| p.get("name"))
            .is_some_and(|n| n.is_string())
    {
        return error(
            id,
            -32602,
            "invalid params: tools/call needs `name`, the tool to call (`search` or `research`)",
        );
    }
    if tools_call && arguments.is_some() {
        return error(
            id,
            -32602,
            "invalid params: `arguments` must be an object of the tool's parameters",
        );
    }
    None
}

/// The first key an object of the message names twice, at any depth, as
/// a path (`id`, `params.name`); `serde_json` keeps the last silently, and
/// the SDK would read one where seeker checked another. `None` for none, or
/// for a body that is not JSON.
fn repeated_key(body: &[u8]) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    /// Walks a value; yields the path of the first repeated key under it.
    struct Walk(String);
    impl<'de> DeserializeSeed<'de> for Walk {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                let path = if self.0.is_empty() {
                    key.clone()
                } else {
                    format!("{}.{key}", self.0)
                };
                if found.is_some() {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                if !seen.insert(key) {
                    map.next_value::<IgnoredAny>()?;
                    found = Some(path);
                    continue;
                }
                found = map.next_value_seed(Walk(path))?;
            }
            Ok(found)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            let mut i = 0;
            while let Some(f) = seq.next_element_seed(Walk(format!("{}[{i}]", self.0)))? {
                found = found.or(f);
                i += 1;
            }
            Ok(found)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    Walk(String::new()).deserialize(&mut de).ok().flatten()
}

/// Whether `headers` declare a JSON body.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// The tools, over the server's state.
#[derive(Clone)]
pub(crate) struct Tools {
    state: Arc<AppState>,
    tool_router: ToolRouter<Self>,
}

/// `search`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SearchArgs {
    /// Queries, searched all at once (1 to 64).
    pub queries: Vec<String>,
    /// Documents per query, 1 to 50 (default 3).
    #[serde(default)]
    pub top_k: Option<u32>,
    /// A configured backend's name (default: the server's default backend).
    #[serde(default)]
    pub backend: Option<String>,
}

/// `search`'s result.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SearchOutput {
    /// One entry per query, in order.
    pub results: Vec<QueryResults>,
}

/// The documents of one query.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct QueryResults {
    pub query: String,
    pub documents: Vec<FoundDocument>,
    /// Why the query failed (the other queries are unaffected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A document.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FoundDocument {
    pub id: String,
    pub title: String,
    pub text: String,
    /// The document's URL, or `seeker://BACKEND/ID` for a corpus passage.
    pub url: String,
    /// The backend's score; higher is better.
    pub score: f32,
    /// The backend that returned it.
    pub backend: String,
}

impl From<&crate::search::Document> for FoundDocument {
    fn from(d: &crate::search::Document) -> Self {
        Self {
            id: d.id.clone(),
            title: d.title.clone(),
            text: d.text.clone(),
            url: document_url(d),
            score: d.score,
            backend: d.backend.clone(),
        }
    }
}

/// `research`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ResearchArgs {
    /// The question to research and answer.
    pub question: String,
    /// A policy profile (default: the server's default policy).
    #[serde(default)]
    pub policy: Option<String>,
    /// Budget for all generated tokens (default: the server's).
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

/// `research`'s result.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ResearchOutput {
    /// The policy's answer.
    pub answer: String,
    /// `stop`, or `length` when the budget, context or round cap ended it.
    pub finish_reason: String,
    /// Search calls the policy made.
    pub searches: usize,
    /// Spans of the answer and the documents they cite.
    pub citations: Vec<UrlCitation>,
    /// Every document the policy read, in order.
    pub documents: Vec<FoundDocument>,
}

#[tool_router]
impl Tools {
    fn new(state: Arc<AppState>) -> Self {
        Self {
            state,
            tool_router: Self::tool_router(),
        }
    }

    /// Searches every query at once and returns each query's documents.
    #[tool(
        name = "search",
        description = "Search seeker's configured backends (a local BM25 index, the web or a \
                       retriever). All queries run at once; returns each query's documents \
                       with title, text, URL and score."
    )]
    async fn search(
        &self,
        Parameters(args): Parameters<SearchArgs>,
    ) -> Result<Json<SearchOutput>, String> {
        if args.queries.is_empty() || args.queries.len() > MAX_QUERIES {
            return Err(format!("queries: give 1 to {MAX_QUERIES} queries"));
        }
        if args.queries.iter().any(|q| q.trim().is_empty()) {
            return Err("queries: a query is empty".into());
        }
        let k = args.top_k.unwrap_or(super::retrieve::DEFAULT_TOPK as u32);
        if !(1..=MAX_TOP_K).contains(&k) {
            return Err(format!("top_k must be between 1 and {MAX_TOP_K}"));
        }
        let search = &self.state.search;
        if let Some(b) = &args.backend {
            search.check_backend(b)?;
        }
        let found = search
            .search_round(args.backend.as_deref(), &args.queries, k as usize)
            .await;
        let results = args
            .queries
            .into_iter()
            .zip(found)
            .map(|(query, r)| match r.result {
                Ok(docs) => QueryResults {
                    query,
                    documents: docs.iter().map(FoundDocument::from).collect(),
                    error: None,
                },
                Err(e) => QueryResults {
                    query,
                    documents: Vec::new(),
                    error: Some(e.to_string()),
                },
            })
            .collect();
        Ok(Json(SearchOutput { results }))
    }

    /// Runs the policy on a question: it searches, reads and answers.
    #[tool(
        name = "research",
        description = "Research a question with seeker's search-reasoning policy: it writes \
                       search queries, reads the documents and answers. Returns the answer, \
                       its citations (spans of the answer and the cited documents' URLs) and \
                       every document read. Takes seconds to minutes."
    )]
    async fn research(
        &self,
        Parameters(args): Parameters<ResearchArgs>,
    ) -> Result<Json<ResearchOutput>, String> {
        let started = Instant::now();
        let state = &self.state;
        let chat = ChatCompletionRequest {
            model: None,
            messages: vec![ChatMessage {
                role: MessageRole::User,
                content: Some(MessageContent::Text(args.question)),
                ..ChatMessage::default()
            }],
            max_tokens: args.max_tokens,
            policy: args.policy,
            ..ChatCompletionRequest::default()
        };
        let explain = |e: ApiError| {
            let message = e
                .message
                .replace("messages[0] is a user message", "the question");
            match e.param {
                Some(p) if p.starts_with("messages") => format!("question: {message}"),
                Some(p) => format!("{p}: {message}"),
                None => message,
            }
        };
        let validated = validate(state, chat).map_err(explain)?;
        let ctx = context(state, &validated).map_err(explain)?;
        let outcome = run_collecting(state, started, &ctx, &validated.rollout, |_| {})
            .await
            .map_err(explain)?;
        Ok(Json(ResearchOutput {
            citations: citations::annotate(&outcome),
            answer: outcome.answer.clone(),
            finish_reason: outcome.finish_reason.as_str().to_string(),
            searches: outcome.searches,
            documents: outcome.documents.iter().map(FoundDocument::from).collect(),
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerInfo {
        ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("seeker", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "seeker serves search-augmented reasoning policies. `search` returns documents \
                 for queries; `research` answers a question with citations.",
            )
    }
}
