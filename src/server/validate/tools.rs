//! The client-function side of chat request validation, called by
//! [`super::validate`]: the request's `tools` in the shape the chat
//! template receives, its `tool_choice`, the calls of earlier assistant
//! turns, and whether the policy can call functions at all (and leaves the
//! client its names).

use super::super::error::ApiError;
use super::super::openai::{ToolCallObject, ToolSpec};
use super::AppState;
use crate::chat::{ChatTurn, Role};
use crate::profile::Profile;
use crate::rollout::ToolChoice;

/// Client functions one request may give.
pub const MAX_TOOLS: usize = 64;

/// Checks that `profile` can call functions, for a request that gives
/// functions or holds a tool turn (message `tool_turn`).
///
/// # Errors
/// A 400 naming `tools` (or, with no functions given, the tool turn's
/// message) and listing the policies that do call functions.
pub(super) fn check_profile_calls(
    state: &AppState,
    profile: &Profile,
    no_functions: bool,
    tool_turn: Option<usize>,
) -> Result<(), ApiError> {
    if !profile.template_tools().is_empty() {
        return Ok(());
    }
    let param = match tool_turn {
        Some(i) if no_functions => format!("messages[{i}]"),
        _ => "tools".to_string(),
    };
    let callers: Vec<&str> = state
        .profiles
        .iter()
        .filter(|(_, p)| !p.template_tools().is_empty())
        .map(|(name, _)| name.as_str())
        .collect();
    Err(ApiError::invalid_field(
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
    ))
}

/// Checks that no client function takes the name of one of the policy's
/// own functions (which seeker runs).
///
/// # Errors
/// A 400 naming the first such `tools[i].function.name`.
pub(super) fn check_own_names(
    profile: &Profile,
    functions: &[serde_json::Value],
) -> Result<(), ApiError> {
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
    Ok(())
}

/// The client's functions in the shape the chat template receives
/// (`{"type": "function", "function": {"name", "description",
/// "parameters"}}`, keys in that order, absent ones left out).
///
/// # Errors
/// A 400 naming the tool at fault: not a function, a name outside
/// `[A-Za-z0-9_-]{1,64}` or given twice, parameters that are not an object,
/// more than [`MAX_TOOLS`].
pub(super) fn client_functions(tools: &[ToolSpec]) -> Result<Vec<serde_json::Value>, ApiError> {
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
pub(super) fn tool_choice(
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
                super::super::error::clip(name)
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
pub(super) fn template_calls(
    i: usize,
    calls: &[ToolCallObject],
) -> Result<Vec<serde_json::Value>, ApiError> {
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

/// Checks that every tool message answers a call and every call is
/// answered: a tool message follows an assistant message with `tool_calls`
/// (other tool messages between them allowed), its `tool_call_id` is the
/// `id` of one of that message's calls (when the calls carry ids), and each
/// such id has its tool message before the next message of another role or
/// the end. OpenAI's API refuses all three mistakes alike ("An assistant
/// message with 'tool_calls' must be followed by tool messages responding to
/// each 'tool_call_id'"); a template would otherwise render a result under
/// the wrong call, and an unanswered call would be dropped with its message.
///
/// # Errors
/// A 400 naming `messages[i]` (no call before it),
/// `messages[i].tool_call_id` (an id of no call), with the ids it could be,
/// or `messages[j].tool_calls` (a call no tool message answers).
pub(super) fn check_tool_answers(turns: &[ChatTurn]) -> Result<(), ApiError> {
    // The assistant message whose calls the tool messages answer, its call
    // ids, and which of them are answered.
    let mut open: Option<(usize, Vec<&str>, Vec<bool>)> = None;
    let unanswered = |open: &Option<(usize, Vec<&str>, Vec<bool>)>| -> Result<(), ApiError> {
        let Some((j, ids, answered)) = open else {
            return Ok(());
        };
        match ids.iter().zip(answered).find(|(_, a)| !**a) {
            Some((id, _)) => Err(ApiError::invalid_field(
                &format!("messages[{j}].tool_calls"),
                format!(
                    "the call `{}` of messages[{j}] has no tool message answering it: each \
                     call needs a `tool` message with its `tool_call_id` after the assistant \
                     message (or send the assistant message without the call)",
                    super::super::error::clip(id)
                ),
            )),
            None => Ok(()),
        }
    };
    for (i, turn) in turns.iter().enumerate() {
        match turn.role {
            Role::Assistant => {
                unanswered(&open)?;
                open = (!turn.tool_calls.is_empty()).then(|| {
                    let ids: Vec<&str> = turn
                        .tool_calls
                        .iter()
                        .filter_map(|c| c["id"].as_str())
                        .filter(|id| !id.is_empty())
                        .collect();
                    let answered = vec![false; ids.len()];
                    (i, ids, answered)
                });
            }
            Role::Tool => {
                let Some((j, ids, answered)) = &mut open else {
                    return Err(ApiError::invalid_field(
                        &format!("messages[{i}]"),
                        format!(
                            "messages[{i}] is a tool message, but no assistant message with \
                             `tool_calls` comes before it"
                        ),
                    ));
                };
                let id = turn.tool_call_id.as_deref().unwrap_or_default();
                if ids.is_empty() {
                    continue;
                }
                match ids.iter().position(|c| *c == id) {
                    Some(k) => answered[k] = true,
                    None => {
                        return Err(ApiError::invalid_field(
                            &format!("messages[{i}].tool_call_id"),
                            format!(
                                "`{}` is the id of no call of messages[{j}] (its calls: {})",
                                super::super::error::clip(id),
                                ids.join(", ")
                            ),
                        ));
                    }
                }
            }
            _ => {
                unanswered(&open)?;
                open = None;
            }
        }
    }
    unanswered(&open)
}
