//! API errors: one table of codes, each with its HTTP status and OpenAI error
//! `type`, rendered as `{"error": {"message", "type", "param", "code"}}` in JSON
//! bodies and inside SSE streams alike (a stream that fails after its 200 sends
//! the error as a `data:` event, then `data: [DONE]`). Messages say what the
//! client can do; internal causes go to the log, never into a response.
//!
//! | code | status | type | when |
//! |---|---|---|---|
//! | `invalid_json` | 400 | invalid_request_error | body is not one JSON object |
//! | `payload_too_large` | 413 | invalid_request_error | body over `server.max_body_bytes` |
//! | `invalid_value` | 400 | invalid_request_error | a field has a wrong type or value (`param` names it) |
//! | `unknown_url` | 404 | invalid_request_error | no such route |
//! | `uri_too_long` | 414 | invalid_request_error | a connection's first request line is over 16 KiB |
//! | `method_not_allowed` | 405 | invalid_request_error | wrong method on a route |
//! | `model_not_found` | 404 | invalid_request_error | `model` is not the served one |
//! | `context_length_exceeded` | 400 | invalid_request_error | prompt longer than the model's context |
//! | `unsupported_media_type` | 415 | invalid_request_error | body not sent as `application/json` |
//! | `invalid_api_key` | 401 | invalid_request_error | keys configured and none (or a wrong one) sent |
//! | `rate_limit_exceeded` | 429 | requests | `server.max_concurrent_requests` running; `Retry-After` says when to retry |
//! | `model_loading` | 503 | server_error | the model has not finished loading |
//! | `engine_unavailable` | 503 | server_error | `/health` only: every remote engine replica is marked down |
//! | `server_shutting_down` | 503 | server_error | SIGTERM: the grace period ended the request |
//! | `request_timeout` | 504 | server_error | `server.request_timeout_s` passed |
//! | `body_timeout` | 408 | invalid_request_error | the body did not arrive within `server.body_timeout_s` |
//! | `engine_error` | 500 | server_error | the engine failed (cause in the log) |
//! | `search_failed` | 502 | server_error | `/search` only: its one query's backend failed (the reason in the message) |

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::EngineError;
use crate::rollout::RolloutError;

/// Defines [`ErrorCode`] with one row per error: code, HTTP status, OpenAI type.
macro_rules! error_codes {
    ($($variant:ident => ($code:literal, $status:ident, $kind:literal);)+) => {
        /// Every error seeker's API returns.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum ErrorCode { $($variant),+ }

        impl ErrorCode {
            /// Machine-readable `code`.
            pub fn code(self) -> &'static str {
                match self { $(Self::$variant => $code),+ }
            }
            /// HTTP status.
            pub fn status(self) -> StatusCode {
                match self { $(Self::$variant => StatusCode::$status),+ }
            }
            /// OpenAI error `type`.
            pub fn kind(self) -> &'static str {
                match self { $(Self::$variant => $kind),+ }
            }
        }
    };
}

error_codes! {
    InvalidJson => ("invalid_json", BAD_REQUEST, "invalid_request_error");
    PayloadTooLarge => ("payload_too_large", PAYLOAD_TOO_LARGE, "invalid_request_error");
    InvalidField => ("invalid_value", BAD_REQUEST, "invalid_request_error");
    UnknownRoute => ("unknown_url", NOT_FOUND, "invalid_request_error");
    UriTooLong => ("uri_too_long", URI_TOO_LONG, "invalid_request_error");
    MethodNotAllowed => ("method_not_allowed", METHOD_NOT_ALLOWED, "invalid_request_error");
    ModelNotFound => ("model_not_found", NOT_FOUND, "invalid_request_error");
    ContextLengthExceeded => ("context_length_exceeded", BAD_REQUEST, "invalid_request_error");
    UnsupportedMediaType => ("unsupported_media_type", UNSUPPORTED_MEDIA_TYPE, "invalid_request_error");
    Unauthorized => ("invalid_api_key", UNAUTHORIZED, "invalid_request_error");
    HostNotAllowed => ("host_not_allowed", FORBIDDEN, "invalid_request_error");
    OriginNotAllowed => ("origin_not_allowed", FORBIDDEN, "invalid_request_error");
    NotAcceptable => ("not_acceptable", NOT_ACCEPTABLE, "invalid_request_error");
    InvalidMcpRequest => ("invalid_mcp_request", BAD_REQUEST, "invalid_request_error");
    Overloaded => ("rate_limit_exceeded", TOO_MANY_REQUESTS, "requests");
    ModelLoading => ("model_loading", SERVICE_UNAVAILABLE, "server_error");
    EngineUnavailable => ("engine_unavailable", SERVICE_UNAVAILABLE, "server_error");
    ShuttingDown => ("server_shutting_down", SERVICE_UNAVAILABLE, "server_error");
    RequestTimeout => ("request_timeout", GATEWAY_TIMEOUT, "server_error");
    BodyTimeout => ("body_timeout", REQUEST_TIMEOUT, "invalid_request_error");
    EngineFailure => ("engine_error", INTERNAL_SERVER_ERROR, "server_error");
    SearchFailed => ("search_failed", BAD_GATEWAY, "server_error");
}

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
}

/// The error body's shape, for the OpenAPI document.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorResponse)]
pub struct ErrorBody<'a> {
    pub error: ErrorObject<'a>,
}

/// OpenAI's error object.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorObject<'a> {
    /// What went wrong and what to do about it.
    pub message: &'a str,
    /// OpenAI error type: `invalid_request_error`, `requests`, `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, when there is one (`messages[0].content`).
    pub param: Option<&'a str>,
    /// Machine-readable code from the table in this module's docs.
    pub code: &'static str,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            param: None,
        }
    }

    /// A 400 for a field with a wrong value or type.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidField,
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// The JSON body, `{"error": {...}}`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&ErrorBody {
            error: ErrorObject {
                message: &self.message,
                kind: self.code.kind(),
                param: self.param.as_deref(),
                code: self.code.code(),
            },
        })
        .expect("error body serialises")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response()
    }
}

/// `text` cut to 100 characters (with `…`), for echoing a client's value in
/// an error message without sending a huge one back.
pub(crate) fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &text[..at]).into(),
        None => text.into(),
    }
}

/// A rollout that failed, as the client's error: the context length and the
/// request's own mistakes are 400s naming the field; anything else is a 500
/// `engine_error` whose cause goes to the log only.
impl From<RolloutError> for ApiError {
    fn from(e: RolloutError) -> Self {
        match e {
            RolloutError::Engine(EngineError::ContextLength { .. }) => ApiError {
                code: ErrorCode::ContextLengthExceeded,
                message: format!("{e}; shorten the messages"),
                param: Some("messages".into()),
            },
            RolloutError::NoQuestion => ApiError::invalid_field("messages", e.to_string()),
            RolloutError::Continuation(_) => ApiError::invalid_field("messages", e.to_string()),
            RolloutError::NothingToContinue => {
                ApiError::invalid_field("continue_final_message", e.to_string())
            }
            other => {
                tracing::error!(error = %other, "rollout failed");
                ApiError::new(
                    ErrorCode::EngineFailure,
                    "the engine failed while generating; see the server log",
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_error_shape() {
        let e = ApiError::invalid_field("temperature", "must be between 0 and 2");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {
                "message": "must be between 0 and 2",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": "invalid_value"
            }})
        );
        assert_eq!(e.code.status(), StatusCode::BAD_REQUEST);
        assert_eq!(ErrorCode::ModelNotFound.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn echoed_values_are_clipped() {
        assert_eq!(clip("gpt-4"), "gpt-4");
        let long = "é".repeat(15_000);
        let clipped = clip(&long);
        assert_eq!(clipped.chars().count(), 101);
        assert!(clipped.ends_with('…'));
    }
}
