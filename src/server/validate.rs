//! Chat request validation: a [`ChatCompletionRequest`] as sent becomes a
//! `Validated` request for this server, its defaults resolved (policy,
//! search backend, token budget) once, here.

use std::sync::Arc;

use super::error::{ApiError, ErrorCode};
use super::json::RequestBody;
use super::openai::ChatCompletionRequest;
use super::AppState;
use crate::engine::{ChatTurn, Role};
use crate::profile::Profile;
use crate::rollout::RolloutRequest;

/// Stop strings one request may give (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Largest `search.top_k` (and `/retrieve` `topk`) a request may ask for.
pub const MAX_TOP_K: u32 = 50;

/// A chat request that passed validation.
pub(crate) struct Validated {
    /// What the rollout runs; `backend` is the resolved backend name.
    pub rollout: RolloutRequest,
    /// The policy profile (the request's `policy`, or the server's default).
    pub profile: Arc<Profile>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `return_transcript` (seeker's extension).
    pub return_transcript: bool,
}

impl RequestBody for ChatCompletionRequest {
    fn check_shape(body: &[u8]) -> Result<(), ApiError> {
        objects_are_objects(body)
    }
}

/// serde's derived structs also accept arrays (`"search": [null, null]` would
/// read as an empty object); an OpenAI object must be a JSON object. Checks
/// every place the request holds an object and names the first that is not.
fn objects_are_objects(body: &[u8]) -> Result<(), ApiError> {
    use serde_json::Value;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Ok(()); // `parse` reports what is wrong with it
    };
    let wrong = |param: String| {
        Err(ApiError::invalid_field(
            &param,
            format!("{param}: invalid type: expected an object"),
        ))
    };
    for key in ["search", "stream_options"] {
        if body
            .get(key)
            .is_some_and(|v| !(v.is_object() || v.is_null()))
        {
            return wrong(key.to_string());
        }
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            if !m.is_object() {
                return wrong(format!("messages[{i}]"));
            }
            if let Some(Value::Array(parts)) = m.get("content") {
                if let Some(j) = parts.iter().position(|p| !p.is_object()) {
                    return wrong(format!("messages[{i}].content[{j}]"));
                }
            }
        }
    }
    Ok(())
}

/// Checks every field of a chat request against this server (model id,
/// limits, policy, search backend) and resolves the defaults.
///
/// # Errors
/// The 400 (or 404 for an unknown model) naming the field at fault.
pub(crate) fn validate(
    state: &AppState,
    req: ChatCompletionRequest,
) -> Result<Validated, ApiError> {
    if let Some(model) = req.model.as_deref() {
        if model != state.model_id && model != "default" {
            return Err(ApiError {
                code: ErrorCode::ModelNotFound,
                message: format!(
                    "the model `{}` does not exist; this server serves `{}` (alias `default`)",
                    super::error::clip(model),
                    state.model_id
                ),
                param: Some("model".into()),
            });
        }
    }
    if let Some(n) = req.n {
        if n != 1 {
            return Err(ApiError::invalid_field(
                "n",
                "only n = 1 is supported: one rollout per request",
            ));
        }
    }
    if let Some(t) = req.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid_field(
                "temperature",
                "temperature must be between 0 and 2",
            ));
        }
    }
    if let Some(p) = req.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_field("top_p", "top_p must be in (0, 1]"));
        }
    }
    let stop = req.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_field(
            "stop",
            format!("stop takes at most {MAX_STOP_SEQUENCES} strings"),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_field(
            "stop",
            "stop strings must not be empty",
        ));
    }
    let (param, requested) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, Some(n)) => ("max_tokens", Some(n)),
        (None, None) => ("max_tokens", None),
    };
    let limit = state.generation.max_tokens_limit;
    let max_tokens = match requested {
        None => state.generation.max_tokens,
        Some(0) => {
            return Err(ApiError::invalid_field(
                param,
                format!("{param} must be at least 1"),
            ))
        }
        Some(n) if n as usize > limit => {
            return Err(ApiError::invalid_field(
                param,
                format!("{param} must be at most {limit} on this server"),
            ))
        }
        Some(n) => n as usize,
    };
    if req.messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(c) => c.text().map_err(|kind| {
                let message = if kind == "text" {
                    "a text part needs a `text` string".to_string()
                } else {
                    format!("content parts of type `{kind}` are not supported; send text")
                };
                ApiError::invalid_field(&format!("messages[{i}].content"), message)
            })?,
        };
        messages.push(ChatTurn {
            role: m.role.into(),
            content,
        });
    }
    if !messages
        .iter()
        .any(|m| m.role == Role::User && !m.content.trim().is_empty())
    {
        // Name the user message that is there but empty, if one is.
        return Err(match messages.iter().rposition(|m| m.role == Role::User) {
            Some(i) => ApiError::invalid_field(
                &format!("messages[{i}].content"),
                format!("messages[{i}] is a user message without text: it needs the question"),
            ),
            None => ApiError::invalid_field(
                "messages",
                "messages must contain a user message with the question",
            ),
        });
    }
    let continue_final_message = req.continue_final_message.unwrap_or(false);
    if continue_final_message && messages.last().map(|m| m.role) != Some(Role::Assistant) {
        return Err(ApiError::invalid_field(
            "continue_final_message",
            "continue_final_message needs the last message to be an assistant message",
        ));
    }
    let profile = state.profile(req.policy.as_deref()).ok_or_else(|| {
        ApiError::invalid_field(
            "policy",
            format!(
                "unknown policy `{}`; this server has: {}",
                req.policy.as_deref().unwrap_or(""),
                state
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    let mut top_k = None;
    let mut backend_choice = None;
    if let Some(search) = &req.search {
        if let Some(backend) = &search.backend {
            if !state.search.has_backend(backend) {
                return Err(ApiError::invalid_field(
                    "search.backend",
                    format!(
                        "unknown search backend `{backend}`; this server has: {}",
                        state.search.backend_names().join(", ")
                    ),
                ));
            }
            backend_choice = Some(backend.clone());
        }
        if let Some(k) = search.top_k {
            if !(1..=MAX_TOP_K).contains(&k) {
                return Err(ApiError::invalid_field(
                    "search.top_k",
                    format!("search.top_k must be between 1 and {MAX_TOP_K}"),
                ));
            }
            top_k = Some(k as usize);
        }
    }
    Ok(Validated {
        rollout: RolloutRequest {
            messages,
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            continue_final_message,
            top_k,
            backend: Some(
                backend_choice.unwrap_or_else(|| state.search.default_backend().to_string()),
            ),
            stop,
        },
        profile,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        return_transcript: req.return_transcript.unwrap_or(false),
    })
}
