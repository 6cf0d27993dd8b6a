//! `POST /retrieve`: seeker's search as a Search-R1-style retriever, so other
//! projects' rollout loops (Search-R1, RAG-R1 and their forks) can use it
//! unchanged. Protocol: `docs/protocols.md` §1 and [`crate::search::retriever`].
//!
//! The queries go to the server's default backend through the dispatcher
//! (limits, deadlines, shared cache). Documents come back as
//! `{"id", "title", "text", "contents"}` with `contents` = `"{title}"\n{text}`,
//! Search-R1's corpus format. A query that fails gets an empty list, and the
//! response then carries `"errors"`: one message or `null` per query (an
//! addition that Search-R1 clients ignore).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::error::{ApiError, ErrorBody};
use super::json::{ApiJson, RequestBody};
use super::validate::MAX_TOP_K;
use super::AppState;
use crate::search::retriever::{RetrieveRequest, RetrievedItem, WireDocument};

/// Documents per query when the request's `topk` is null (Search-R1's
/// `retrieval_topk` default).
pub const DEFAULT_TOPK: usize = 3;

/// Queries one request may carry.
pub const MAX_QUERIES: usize = 64;

impl RequestBody for RetrieveRequest {}

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
    if request.queries.len() > MAX_QUERIES {
        return ApiError::invalid_field("queries", format!("at most {MAX_QUERIES} queries"))
            .into_response();
    }
    let k = request.topk.unwrap_or(DEFAULT_TOPK);
    if !(1..=MAX_TOP_K as usize).contains(&k) {
        return ApiError::invalid_field("topk", format!("topk must be between 1 and {MAX_TOP_K}"))
            .into_response();
    }
    let results = state.search.search_round(None, &request.queries, k).await;
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
