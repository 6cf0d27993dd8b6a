//! Chat request validation: a [`ChatCompletionRequest`] as sent becomes a
//! `Validated` request for this server, its defaults resolved (policy,
//! search backend, token budget) once, here.

use std::sync::Arc;

use super::error::{ApiError, ErrorCode};
use super::json::RequestBody;
use super::openai::{ChatCompletionRequest, MessageRole, ToolCallObject, ToolSpec};
use super::AppState;
use crate::engine::{ChatTurn, Role};
use crate::profile::Profile;
use crate::rollout::{ClientTools, RolloutRequest, ToolChoice};

/// Client functions one request may give.
pub const MAX_TOOLS: usize = 64;

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
        messages.push(turn);
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
    let functions = client_functions(req.tools.as_deref().unwrap_or_default())?;
    let tool_turn = messages.iter().position(ChatTurn::is_tool_turn);
    let wants_tools = !functions.is_empty() || tool_turn.is_some();
    // A request with tools and no policy runs the tools policy when the
    // default one cannot call functions.
    let policy = match req.policy.as_deref() {
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
    let profile = state.profile(policy).ok_or_else(|| {
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
    if wants_tools && profile.template_tools().is_empty() {
        let param = match tool_turn {
            Some(i) if functions.is_empty() => format!("messages[{i}]"),
            _ => "tools".to_string(),
        };
        let callers: Vec<&str> = state
            .profiles
            .iter()
            .filter(|(_, p)| !p.template_tools().is_empty())
            .map(|(name, _)| name.as_str())
            .collect();
        return Err(ApiError::invalid_field(
            &param,
            format!(
                "the policy `{}` does not call functions; name one that does in `policy` \
                 (this server has: {})",
                profile.name,
                if callers.is_empty() {
                    "none".to_string()
                } else {
                    callers.join(", ")
                }
            ),
        ));
    }
    let own: Vec<&str> = profile
        .template_tools()
        .iter()
        .filter_map(|f| f["function"]["name"].as_str())
        .collect();
    if let Some(i) = functions
        .iter()
        .position(|f| own.contains(&f["function"]["name"].as_str().unwrap_or_default()))
    {
        return Err(ApiError::invalid_field(
            &format!("tools[{i}].function.name"),
            format!(
                "`{}` is the policy's own function (run by seeker); name yours differently",
                functions[i]["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
            ),
        ));
    }
    let choice = tool_choice(req.tool_choice.as_ref(), &functions)?;
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) && continue_final_message {
        return Err(ApiError::invalid_field(
            "tool_choice",
            "a required or named tool_choice cannot be combined with continue_final_message",
        ));
    }
    if continue_final_message {
        let last = messages.len() - 1;
        crate::rollout::check_continuation(&profile, &messages[last].content).map_err(|e| {
            ApiError::invalid_field(&format!("messages[{last}].content"), e.to_string())
        })?;
    }
    let client_tools = ClientTools {
        functions,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    };
    let mut top_k = None;
    let mut backend_choice = None;
    if let Some(search) = &req.search {
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
            client_tools,
        },
        profile,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        return_transcript: req.return_transcript.unwrap_or(false),
    })
}

/// The client's functions in the shape the chat template receives
/// (`{"type": "function", "function": {"name", "description",
/// "parameters"}}`, keys in that order, absent ones left out).
///
/// # Errors
/// A 400 naming the tool at fault: not a function, a name outside
/// `[A-Za-z0-9_-]{1,64}` or given twice, parameters that are not an object,
/// more than [`MAX_TOOLS`].
fn client_functions(tools: &[ToolSpec]) -> Result<Vec<serde_json::Value>, ApiError> {
    use serde_json::{Map, Value};
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid_field(
            "tools",
            format!("at most {MAX_TOOLS} tools"),
        ));
    }
    let mut out: Vec<Value> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}].type"),
                "only tools of type `function` are supported",
            ));
        }
        let Some(f) = &tool.function else {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}].function"),
                "a function tool needs `function`: {\"name\", \"description\", \"parameters\"}",
            ));
        };
        let good = (1..=64).contains(&f.name.len())
            && f.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !good {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}].function.name"),
                "a function name is 1 to 64 of a-z, A-Z, 0-9, _ and -",
            ));
        }
        if out.iter().any(|o| o["function"]["name"] == f.name.as_str()) {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}].function.name"),
                format!("the function `{}` is given twice", f.name),
            ));
        }
        let mut function = Map::new();
        function.insert("name".into(), Value::String(f.name.clone()));
        if let Some(d) = &f.description {
            function.insert("description".into(), Value::String(d.clone()));
        }
        match &f.parameters {
            None | Some(Value::Null) => {}
            Some(p @ Value::Object(_)) => {
                function.insert("parameters".into(), p.clone());
            }
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &format!("tools[{i}].function.parameters"),
                    "parameters must be a JSON schema object",
                ))
            }
        }
        let mut tool = Map::new();
        tool.insert("type".into(), Value::String("function".into()));
        tool.insert("function".into(), Value::Object(function));
        out.push(Value::Object(tool));
    }
    Ok(out)
}

/// OpenAI's `tool_choice` over the client's `functions`.
///
/// # Errors
/// A 400 naming `tool_choice`: an unknown value, a function that is not in
/// `tools`, or `required` / a function without tools.
fn tool_choice(
    choice: Option<&serde_json::Value>,
    functions: &[serde_json::Value],
) -> Result<ToolChoice, ApiError> {
    use serde_json::Value;
    let bad = |message: String| Err(ApiError::invalid_field("tool_choice", message));
    let choice = match choice {
        None | Some(Value::Null) => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "auto" => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => return Ok(ToolChoice::None),
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(name) => ToolChoice::Named(name.to_string()),
                None => return bad("a function tool_choice needs `function.name`".into()),
            }
        }
        Some(_) => {
            return bad(
                "tool_choice is `none`, `auto`, `required` or {\"type\": \"function\", \
                 \"function\": {\"name\": …}}"
                    .into(),
            )
        }
    };
    if functions.is_empty() {
        return bad("tool_choice `required` or a named function needs `tools`".into());
    }
    if let ToolChoice::Named(name) = &choice {
        if !functions
            .iter()
            .any(|f| f["function"]["name"] == name.as_str())
        {
            return bad(format!(
                "tool_choice names `{}`, which is not in tools",
                super::error::clip(name)
            ));
        }
    }
    Ok(choice)
}

/// An assistant message's calls as the chat template receives them: the
/// arguments as a JSON value where they parse (Hugging Face templates write
/// `arguments | tojson`), else the text as sent.
///
/// # Errors
/// A 400 naming the call: not of type `function`, or without a name.
fn template_calls(i: usize, calls: &[ToolCallObject]) -> Result<Vec<serde_json::Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            if call.kind != "function" || call.function.name.is_empty() {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].tool_calls[{j}]"),
                    "a tool call is {\"id\", \"type\": \"function\", \"function\": \
                     {\"name\", \"arguments\"}}",
                ));
            }
            let arguments = serde_json::from_str(&call.function.arguments)
                .unwrap_or_else(|_| serde_json::Value::String(call.function.arguments.clone()));
            Ok(serde_json::json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": arguments},
            }))
        })
        .collect()
}
