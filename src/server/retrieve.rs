//! seeker's search as the retriever of other projects' rollout loops, in each
//! one's wire shape, so they use it unchanged:
//! - `POST /retrieve`: Search-R1, RAG-R1 and their forks (`docs/protocols.md`
//!   §1, [`crate::search::retriever`]);
//! - `POST /search`, `POST /batch_search`: FlashRAG as ReCall and ReSearch
//!   serve it ([`crate::search::flashrag`]);
//! - `POST /queries`: R1-Searcher ([`crate::search::r1searcher`]).
//!
//! The queries go to the server's default backend, or the one a request's
//! `backend` names (seeker's addition to each shape), through the dispatcher
//! (limits, deadlines, shared cache). For `/retrieve`: Documents come back as
//! `{"id", "title", "text", "contents"}` with `contents` = `"{title}"\n{text}`,
//! Search-R1's corpus format. A query that fails gets an empty list, and the
//! response then carries `"errors"`: one message or `null` per query (an
//! addition that Search-R1 clients ignore).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::error::{ApiError, ErrorBody, ErrorCode};
use super::json::{ApiJson, RequestBody};
use super::validate::MAX_TOP_K;
use super::AppState;
use crate::search::dispatch::QueryResult;
use crate::search::flashrag::{
    BatchSearchRequest, BatchSearchResponse, SearchRequest, SearchResponse,
};
use crate::search::r1searcher::{answer_of, QueriesRequest, QueriesResponse};
use crate::search::retriever::{RetrieveRequest, RetrievedItem, WireDocument};
use crate::search::Document;

/// Documents per query when the request's `topk` is null (Search-R1's
/// `retrieval_topk` default).
pub const DEFAULT_TOPK: usize = 3;

/// Queries one request may carry.
pub const MAX_QUERIES: usize = 64;

impl RequestBody for RetrieveRequest {}
impl RequestBody for SearchRequest {}
impl RequestBody for BatchSearchRequest {}
impl RequestBody for QueriesRequest {}

/// The checks every retriever route makes: at most [`MAX_QUERIES`] queries
/// (`queries_param` names the field), `k` within 1 to [`MAX_TOP_K`], and a
/// configured `backend`. Then the round, searched at once.
async fn search_all(
    state: &AppState,
    queries: &[String],
    queries_param: &str,
    k: usize,
    k_param: &str,
    backend: Option<&str>,
) -> Result<Vec<QueryResult>, ApiError> {
    if queries.len() > MAX_QUERIES {
        return Err(ApiError::invalid_field(
            queries_param,
            format!("at most {MAX_QUERIES} queries"),
        ));
    }
    if !(1..=MAX_TOP_K as usize).contains(&k) {
        return Err(ApiError::invalid_field(
            k_param,
            format!("{k_param} must be between 1 and {MAX_TOP_K}"),
        ));
    }
    if let Some(b) = backend {
        state
            .search
            .check_backend(b)
            .map_err(|message| ApiError::invalid_field("backend", message))?;
    }
    Ok(state.search.search_round(backend, queries, k).await)
}

/// Per query its documents (empty when it failed), and per query its error
/// when any failed.
fn split_results(results: Vec<QueryResult>) -> (Vec<Vec<Document>>, Option<Vec<Option<String>>>) {
    let mut errors = Vec::with_capacity(results.len());
    let lists = results
        .into_iter()
        .map(|r| match r.result {
            Ok(docs) => {
                errors.push(None);
                docs
            }
            Err(e) => {
                errors.push(Some(e.to_string()));
                Vec::new()
            }
        })
        .collect();
    let errors = errors.iter().any(Option::is_some).then_some(errors);
    (lists, errors)
}

/// FlashRAG's `/search`: one query, `[docs]` or `[docs, scores]`
/// ([`crate::search::flashrag`]).
#[utoipa::path(post, path = "/search", tag = "search", security(("bearer" = [])),
    request_body(content = SearchRequest, content_type = "application/json"),
    responses(
        (status = 200, body = SearchResponse),
        (status = 400, description = "Invalid JSON or field, or an empty query", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body not sent as application/json", body = ErrorBody),
        (status = 429, description = "Too many requests running",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
        (status = 502, description = "The query's search backend failed", body = ErrorBody),
    ))]
pub(crate) async fn search(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<SearchRequest>,
) -> Response {
    if request.query.trim().is_empty() {
        return ApiError::invalid_field("query", "Query content cannot be empty").into_response();
    }
    let queries = [request.query];
    let results = match search_all(
        &state,
        &queries,
        "query",
        request.top_n,
        "top_n",
        request.backend.as_deref(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match results.into_iter().next().map(|r| r.result) {
        Some(Ok(docs)) => Json(SearchResponse::of(&docs, request.return_score)).into_response(),
        Some(Err(e)) => ApiError::new(ErrorCode::SearchFailed, e.to_string()).into_response(),
        None => {
            ApiError::new(ErrorCode::SearchFailed, "the search returned nothing").into_response()
        }
    }
}

/// FlashRAG's `/batch_search`: every query at once, `[[docs]...]` or
/// `[[[docs]...], [[scores]...]]`. A query whose backend failed gets an
/// empty list (the shape has no room for an error; the log has it).
#[utoipa::path(post, path = "/batch_search", tag = "search", security(("bearer" = [])),
    request_body(content = BatchSearchRequest, content_type = "application/json"),
    responses(
        (status = 200, body = BatchSearchResponse),
        (status = 400, description = "Invalid JSON or field, or an empty query", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body not sent as application/json", body = ErrorBody),
        (status = 429, description = "Too many requests running",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
    ))]
pub(crate) async fn batch_search(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<BatchSearchRequest>,
) -> Response {
    if let Some(i) = request.query.iter().position(|q| q.trim().is_empty()) {
        return ApiError::invalid_field(&format!("query[{i}]"), "Query content cannot be empty")
            .into_response();
    }
    let results = match search_all(
        &state,
        &request.query,
        "query",
        request.top_n,
        "top_n",
        request.backend.as_deref(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (lists, errors) = split_results(results);
    if let Some(errors) = errors {
        for (i, e) in errors.iter().enumerate() {
            if let Some(e) = e {
                tracing::warn!(query = i, error = %e, "batch_search: a query failed; its list is empty");
            }
        }
    }
    Json(BatchSearchResponse::of(&lists, request.return_score)).into_response()
}

/// R1-Searcher's `/queries`: `{"queries", "answers": [[str]]}`, plus
/// `errors` when a query failed ([`crate::search::r1searcher`]).
#[utoipa::path(post, path = "/queries", tag = "search", security(("bearer" = [])),
    request_body(content = QueriesRequest, content_type = "application/json"),
    responses(
        (status = 200, body = QueriesResponse),
        (status = 400, description = "Invalid JSON or field", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body not sent as application/json", body = ErrorBody),
        (status = 429, description = "Too many requests running",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
    ))]
pub(crate) async fn queries(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<QueriesRequest>,
) -> Response {
    let results = match search_all(
        &state,
        &request.queries,
        "queries",
        request.k,
        "k",
        request.backend.as_deref(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (lists, errors) = split_results(results);
    Json(QueriesResponse {
        answers: lists
            .iter()
            .map(|docs| docs.iter().map(answer_of).collect())
            .collect(),
        queries: request.queries,
        errors,
    })
    .into_response()
}

/// `POST /retrieve` response: Search-R1's `result`, plus `errors` when a
/// query failed.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RetrieveResponseBody {
    /// One list per query, in query order.
    pub result: Vec<Vec<RetrievedItem>>,
    /// Present when a query failed: per query, its error message or `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<Option<String>>>,
}

/// Searches every query at once on the default backend, answering in the
/// Search-R1 retriever protocol (`docs/protocols.md` §1).
#[utoipa::path(post, path = "/retrieve", tag = "search", security(("bearer" = [])),
    request_body(content = RetrieveRequest, content_type = "application/json"),
    responses(
        (status = 200, body = RetrieveResponseBody),
        (status = 400, description = "Invalid JSON or field", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 408, description = "Body not received within `server.body_timeout_s`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body not sent as application/json", body = ErrorBody),
        (status = 429, description = "Too many requests running",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
    ))]
pub(crate) async fn retrieve(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<RetrieveRequest>,
) -> Response {
    let k = request.topk.unwrap_or(DEFAULT_TOPK);
    let results = match search_all(
        &state,
        &request.queries,
        "queries",
        k,
        "topk",
        request.backend.as_deref(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let mut errors = Vec::with_capacity(results.len());
    let result = results
        .into_iter()
        .map(|r| match r.result {
            Ok(docs) => {
                errors.push(None);
                docs.iter()
                    .map(|d| {
                        let document = WireDocument::from_document(d);
                        if request.return_scores {
                            RetrievedItem::Scored {
                                document,
                                score: f64::from(d.score),
                            }
                        } else {
                            RetrievedItem::Plain(document)
                        }
                    })
                    .collect()
            }
            Err(e) => {
                errors.push(Some(e.to_string()));
                Vec::new()
            }
        })
        .collect();
    let errors = errors.iter().any(Option::is_some).then_some(errors);
    Json(RetrieveResponseBody { result, errors }).into_response()
}
