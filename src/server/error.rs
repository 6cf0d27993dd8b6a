//! API errors: one table of codes, each with its HTTP status and OpenAI error
//! `type`, rendered as `{"error": {"message", "type", "param", "code"}}` in JSON
//! bodies and inside SSE streams alike.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

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
    MethodNotAllowed => ("method_not_allowed", METHOD_NOT_ALLOWED, "invalid_request_error");
    ModelNotFound => ("model_not_found", NOT_FOUND, "invalid_request_error");
    ContextLengthExceeded => ("context_length_exceeded", BAD_REQUEST, "invalid_request_error");
    ModelLoading => ("model_loading", SERVICE_UNAVAILABLE, "server_error");
    EngineFailure => ("engine_error", INTERNAL_SERVER_ERROR, "server_error");
}

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'static str,
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
}
