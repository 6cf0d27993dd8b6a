//! Request bodies: one extractor, [`ApiJson`], for every JSON route. It
//! checks the content type (415), reads the body within
//! `server.max_body_bytes` (413), runs the body type's shape check and parses
//! it, naming the field at fault (400); every rejection is an [`ApiError`]
//! in OpenAI's error shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};
use super::AppState;

/// A request body type: one JSON object.
pub(crate) trait RequestBody: DeserializeOwned {
    /// Checks the raw body before it is parsed (serde's derives accept
    /// shapes an OpenAI client must not send); default: none.
    ///
    /// # Errors
    /// The 400 to answer.
    fn check_shape(_body: &[u8]) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A JSON body parsed into `T`; see the module documentation.
pub(crate) struct ApiJson<T>(pub T);

impl<T: RequestBody + Send> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        require_json(request.headers())?;
        let body = body_bytes(
            Bytes::from_request(request, state).await,
            state.ops.max_body_bytes,
        )?;
        require_utf8(&body)?;
        T::check_shape(&body)?;
        Ok(Self(parse(&body)?))
    }
}

/// JSON text is UTF-8 (RFC 8259 §8.1): other bytes are an `invalid_json`
/// error naming the first bad byte's offset, before anything looks at the
/// fields (serde would name the field as "the wrong type").
fn require_utf8(body: &[u8]) -> Result<(), ApiError> {
    std::str::from_utf8(body).map(|_| ()).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!(
                "the request body is not valid UTF-8 (byte {}); JSON text must be UTF-8",
                e.valid_up_to()
            ),
        )
    })
}

/// Parses a JSON object body into `T`, naming the field at fault in the error.
///
/// # Errors
/// An `invalid_json` 400 for a body that is not UTF-8, not one JSON object,
/// or has text after it; otherwise the 400 of [`field_error`].
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    require_utf8(body)?;
    // serde would also accept a struct written as an array.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            ErrorCode::InvalidJson,
            "the request body must be a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let request = serde_path_to_error::deserialize(&mut de).map_err(|e| field_error(e, body))?;
    // Nothing but whitespace may follow the object.
    de.end().map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("the request body has text after the JSON object: {e}"),
        )
    })?;
    Ok(request)
}

/// The 400 for a body serde could not read as `T`: a missing field is
/// `required`, a syntax error in an otherwise readable place names its field
/// (bad Unicode escapes and wrong types told apart), a body that is not JSON
/// at all is `invalid_json`, and any other error names the field with
/// serde's message in JSON terms ([`plain_serde_message`]).
fn field_error(e: serde_path_to_error::Error<serde_json::Error>, body: &[u8]) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let message = inner.to_string();
    // serde names a missing top-level field only in its message.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        let param = if path == "." {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        return ApiError::invalid_field(&param, format!("{param} is required"));
    }
    let malformed = inner.is_syntax() || inner.is_eof();
    if path == "." || malformed && !is_json(body) {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("the request body is not a valid JSON object: {inner}"),
        )
    } else if malformed && (message.contains("surrogate") || message.contains("hex escape")) {
        // `"\ud800"`: an escape that is no Unicode character (serde_json:
        // "unexpected end of hex escape", "lone leading surrogate …").
        ApiError::invalid_field(
            &path,
            format!("{path}: is not valid Unicode text ({message})"),
        )
    } else if malformed {
        // serde_json reports a number or array where an enum's string
        // belongs (`"role": 5`) as a syntax error ("expected value").
        ApiError::invalid_field(&path, format!("{path}: has the wrong type"))
    } else {
        ApiError::invalid_field(
            &path,
            format!("{path}: {}", plain_serde_message(&path, &message)),
        )
    }
}

/// Whether `body` is well-formed JSON, whatever its shape.
fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// serde's message with Rust type names put in JSON terms. serde writes
/// `invalid type: UNEXPECTED, expected EXPECTED` (or `invalid value`,
/// `unknown variant`, ...): only serde's own words are replaced — the type
/// named as unexpected and the expectation — never the client's text that
/// serde quotes (`unknown variant `bitmap`` stays as sent).
fn plain_serde_message(path: &str, message: &str) -> String {
    if path.ends_with(".content") && message.contains("untagged enum MessageContent") {
        return "must be a string or an array of {\"type\": \"text\", \"text\": ...} parts"
            .to_string();
    }
    let message = message.split(" at line ").next().unwrap_or(message);
    let (found, expected) = match message.rsplit_once(", expected ") {
        Some((found, expected)) => (found, Some(expected)),
        None => (message, None),
    };
    let found = match found {
        "invalid type: map" => "invalid type: object",
        "invalid type: sequence" => "invalid type: array",
        other => other,
    };
    let Some(expected) = expected else {
        return found.to_string();
    };
    let expected = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a sequence" => "an array",
        "a map" => "an object",
        e if e.starts_with("struct ") => "an object",
        e => e,
    };
    format!("{found}, expected {expected}")
}

/// The body, or the error for one over `limit` bytes or unreadable.
fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the request body is larger than {limit} bytes"),
            )
        } else {
            ApiError::new(ErrorCode::InvalidJson, format!("cannot read the body: {e}"))
        }
    })
}

/// A 415 unless the body is declared `application/json` (parameters such as
/// `charset` allowed).
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match declared.as_deref() {
        Some("application/json") => Ok(()),
        Some(other) => Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("the body must be sent as application/json, not {other}"),
        )),
        None => Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be sent with Content-Type: application/json",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_terms_become_json_terms_but_the_clients_text_stays() {
        let plain = |path, message| plain_serde_message(path, message);
        // Before, "map" was replaced everywhere: `bitobject`.
        assert_eq!(
            plain(
                "messages[0].role",
                "unknown variant `bitmap`, expected one of `system`, `user`, `assistant`"
            ),
            "unknown variant `bitmap`, expected one of `system`, `user`, `assistant`"
        );
        assert_eq!(
            plain("max_tokens", "invalid type: string \"a map\", expected u32"),
            "invalid type: string \"a map\", expected a non-negative integer"
        );
        assert_eq!(
            plain(
                "search",
                "invalid type: sequence, expected struct SearchOptions"
            ),
            "invalid type: array, expected an object"
        );
        assert_eq!(
            plain(
                "stop",
                "invalid type: map, expected a sequence at line 1 column 9"
            ),
            "invalid type: object, expected an array"
        );
        assert_eq!(
            plain("stream", "invalid type: integer `1`, expected a boolean"),
            "invalid type: integer `1`, expected true or false"
        );
    }
}
