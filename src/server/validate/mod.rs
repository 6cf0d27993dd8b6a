//! Chat request validation: a [`ChatCompletionRequest`] as sent becomes a
//! `Validated` request for this server, its defaults resolved (policy,
//! search backend, token budget) once, here. [`validate`] checks one field
//! group per helper, in the order the errors have always been reported; the
//! client-function checks (`tools`, `tool_choice`, earlier calls) are in
//! `tools`.

mod tools;

use std::sync::Arc;

use super::error::{ApiError, ErrorCode};
use super::json::RequestBody;
use super::openai::{
    ChatCompletionRequest, ChatMessage, MessageRole, SearchOptions, StopSequences,
};
use super::AppState;
use crate::chat::{ChatTurn, Role};
use crate::profile::Profile;
use crate::rollout::{ClientTools, RolloutRequest, ToolChoice};
use tools::{check_own_names, check_profile_calls, client_functions, template_calls, tool_choice};

/// Stop strings one request may give (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Largest `search.top_k` (and `/retrieve` `topk`) a request may ask for.
pub const MAX_TOP_K: u32 = 50;

/// A chat request that passed validation.
pub(crate) struct Validated {
    /// What the rollout runs; `backend` is the one the client named, checked
    /// (`None`: the server's default, applied by the dispatcher).
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
    check_model(state, req.model.as_deref())?;
    check_sampling(&req)?;
    let stop = stop_sequences(req.stop)?;
    let max_tokens = max_tokens(state, req.max_completion_tokens, req.max_tokens)?;
    let messages = chat_turns(&req.messages)?;
    let continue_final_message = continuation(req.continue_final_message, &messages)?;
    let functions = client_functions(req.tools.as_deref().unwrap_or_default())?;
    let tool_turn = messages.iter().position(ChatTurn::is_tool_turn);
    let wants_tools = !functions.is_empty() || tool_turn.is_some();
    let profile = policy_profile(state, req.policy.as_deref(), wants_tools)?;
    if wants_tools {
        check_profile_calls(state, &profile, functions.is_empty(), tool_turn)?;
    }
    check_own_names(&profile, &functions)?;
    let choice = tool_choice(req.tool_choice.as_ref(), &functions)?;
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) && continue_final_message {
        return Err(ApiError::invalid_field(
            "tool_choice",
            "a required or named tool_choice cannot be combined with continue_final_message",
        ));
    }
    if continue_final_message {
        check_continued_text(&profile, &messages)?;
    }
    let client_tools = ClientTools {
        functions,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    };
    let (top_k, backend) = search_options(state, req.search.as_ref())?;
    Ok(Validated {
        rollout: RolloutRequest {
            messages,
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            continue_final_message,
            top_k,
            backend,
            stop,
            client_tools,
        },
        profile,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        return_transcript: req.return_transcript.unwrap_or(false),
    })
}

/// Checks the request's `model` (absent, the served id or `default`).
///
/// # Errors
/// A 404 `model_not_found` naming `model` for any other id.
fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    if let Some(model) = model {
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
    Ok(())
}

/// Checks the sampling fields: `n` (only 1), `temperature` (0 to 2) and
/// `top_p` (above 0, at most 1).
///
/// # Errors
/// A 400 naming the first field out of range, in that order.
fn check_sampling(req: &ChatCompletionRequest) -> Result<(), ApiError> {
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
    Ok(())
}

/// The request's `stop` strings as a list (none when absent).
///
/// # Errors
/// A 400 naming `stop`: more than [`MAX_STOP_SEQUENCES`] strings, or an
/// empty one.
fn stop_sequences(stop: Option<StopSequences>) -> Result<Vec<String>, ApiError> {
    let stop = stop.map(|s| s.into_vec()).unwrap_or_default();
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
    Ok(stop)
}

/// The token budget: `max_completion_tokens`, else `max_tokens`, else the
/// server's default.
///
/// # Errors
/// A 400 naming the field given: 0, or over the server's
/// `max_tokens_limit`.
fn max_tokens(
    state: &AppState,
    max_completion_tokens: Option<u32>,
    max_tokens: Option<u32>,
) -> Result<usize, ApiError> {
    let (param, requested) = match (max_completion_tokens, max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, Some(n)) => ("max_tokens", Some(n)),
        (None, None) => ("max_tokens", None),
    };
    let limit = state.generation.max_tokens_limit;
    match requested {
        None => Ok(state.generation.max_tokens),
        Some(0) => Err(ApiError::invalid_field(
            param,
            format!("{param} must be at least 1"),
        )),
        Some(n) if n as usize > limit => Err(ApiError::invalid_field(
            param,
            format!("{param} must be at most {limit} on this server"),
        )),
        Some(n) => Ok(n as usize),
    }
}

/// The request's messages as the conversation the template renders.
///
/// # Errors
/// A 400 naming the field at fault: no messages, a message [`chat_turn`]
/// refuses, no user message with text, or a tool message that answers no
/// call ([`tools::check_tool_answers`]).
fn chat_turns(messages: &[ChatMessage]) -> Result<Vec<ChatTurn>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "messages must not be empty",
        ));
    }
    let turns = messages
        .iter()
        .enumerate()
        .map(|(i, m)| chat_turn(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    require_question(&turns)?;
    tools::check_tool_answers(&turns)?;
    Ok(turns)
}

/// Message `i` as a chat turn: its text, and the calls it makes (an
/// assistant message) or the call it answers (a tool message).
///
/// # Errors
/// A 400 naming `messages[i]`'s field: content that is not text,
/// `tool_calls` on a message that is not the assistant's or not well
/// formed, a tool message without `tool_call_id`.
fn chat_turn(i: usize, m: &ChatMessage) -> Result<ChatTurn, ApiError> {
    let content = match &m.content {
        None => String::new(),
        Some(c) => c.text().map_err(|e| {
            ApiError::invalid_field(&format!("messages[{i}].content"), e.to_string())
        })?,
    };
    let mut turn = ChatTurn::new(m.role.into(), content);
    if let Some(calls) = &m.tool_calls {
        if m.role != MessageRole::Assistant {
            return Err(ApiError::invalid_field(
                &format!("messages[{i}].tool_calls"),
                "only assistant messages carry tool_calls",
            ));
        }
        turn.tool_calls = template_calls(i, calls)?;
    }
    if m.role == MessageRole::Tool {
        match m.tool_call_id.as_deref() {
            Some(id) if !id.trim().is_empty() => turn.tool_call_id = Some(id.to_string()),
            _ => {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].tool_call_id"),
                    format!(
                        "messages[{i}] is a tool message: it needs the `tool_call_id` of \
                         the call it answers"
                    ),
                ))
            }
        }
    }
    Ok(turn)
}

/// Checks that some user message asks something (has text).
///
/// # Errors
/// A 400 naming the last user message when every one is empty, or
/// `messages` when there is none.
fn require_question(messages: &[ChatTurn]) -> Result<(), ApiError> {
    if messages
        .iter()
        .any(|m| m.role == Role::User && !m.content.trim().is_empty())
    {
        return Ok(());
    }
    // Name the user message that is there but empty, if one is.
    Err(match messages.iter().rposition(|m| m.role == Role::User) {
        Some(i) => ApiError::invalid_field(
            &format!("messages[{i}].content"),
            format!("messages[{i}] is a user message without text: it needs the question"),
        ),
        None => ApiError::invalid_field(
            "messages",
            "messages must contain a user message with the question",
        ),
    })
}

/// `continue_final_message` (default false).
///
/// # Errors
/// A 400 naming it when it is true and the last message is not the
/// assistant's.
fn continuation(flag: Option<bool>, messages: &[ChatTurn]) -> Result<bool, ApiError> {
    let continue_final_message = flag.unwrap_or(false);
    let last = messages.last();
    if continue_final_message && last.map(|m| m.role) != Some(Role::Assistant) {
        return Err(ApiError::invalid_field(
            "continue_final_message",
            "continue_final_message needs the last message to be an assistant message",
        ));
    }
    // A final assistant message is either continued or an error: the
    // policies answer the last user message, and would drop it unread.
    if !continue_final_message
        && last.is_some_and(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
    {
        let i = messages.len() - 1;
        return Err(ApiError::invalid_field(
            &format!("messages[{i}]"),
            format!(
                "messages[{i}] is an assistant message: end with a user or tool message, or \
                 set continue_final_message: true to continue it"
            ),
        ));
    }
    Ok(continue_final_message)
}

/// The policy profile the request runs: the one it names, else (when it
/// `wants_tools` and the default policy cannot call functions) the
/// server's tools policy, else the default.
///
/// # Errors
/// A 400 naming `policy` when no profile has that name.
fn policy_profile(
    state: &AppState,
    requested: Option<&str>,
    wants_tools: bool,
) -> Result<Arc<Profile>, ApiError> {
    // A request with tools and no policy runs the tools policy when the
    // default one cannot call functions.
    let policy = match requested {
        Some(name) => Some(name),
        None if wants_tools
            && state
                .profile(None)
                .is_some_and(|p| p.template_tools().is_empty()) =>
        {
            state.tools_policy.as_deref()
        }
        None => None,
    };
    state.profile(policy).ok_or_else(|| {
        ApiError::invalid_field(
            "policy",
            format!(
                "unknown policy `{}`; this server has: {}",
                requested.unwrap_or(""),
                state
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// Checks that the last message's text is one `profile` can go on from
/// (`continue_final_message`).
///
/// # Errors
/// A 400 naming the last message's content, with the rollout's reason.
fn check_continued_text(profile: &Profile, messages: &[ChatTurn]) -> Result<(), ApiError> {
    let last = messages.len() - 1;
    crate::rollout::check_continuation(profile, &messages[last].content)
        .map_err(|e| ApiError::invalid_field(&format!("messages[{last}].content"), e.to_string()))
}

/// The request's `search` options: the documents per query (none: the
/// profile's) and the backend the client named (checked to be configured).
///
/// # Errors
/// A 400 naming `search.backend` (not configured) or `search.top_k`
/// (outside 1 to [`MAX_TOP_K`]).
fn search_options(
    state: &AppState,
    search: Option<&SearchOptions>,
) -> Result<(Option<usize>, Option<String>), ApiError> {
    let mut top_k = None;
    let mut backend_choice = None;
    if let Some(search) = search {
        if let Some(backend) = &search.backend {
            state
                .search
                .check_backend(backend)
                .map_err(|message| ApiError::invalid_field("search.backend", message))?;
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
    Ok((top_k, backend_choice))
}
