//! The Responses request as a chat request: [`to_chat`], called by
//! [`super::create_response`], maps the request's tools, `tool_choice`,
//! `include`, `instructions` and `input` onto a [`ChatCompletionRequest`]
//! (the input items themselves are read by [`super::input`]), with the
//! [`Params`] that put chat validation's errors back in the Responses
//! request's field names.

use serde_json::{json, Value};

use super::super::error::{clip, ApiError};
use super::super::openai::{ChatCompletionRequest, FunctionSpec, ToolSpec};
use super::input::conversation;
use super::types::{Params, ResponsesRequest};

/// `include` values OpenAI defines (openai-python 3.57 `ResponseIncludable`).
const INCLUDABLE: &[&str] = &[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
];

/// Tool types that name web search (OpenAI's current and dated names).
const WEB_SEARCH_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
];

/// The chat request a Responses request runs as.
///
/// # Errors
/// 400 naming the field: an input that is neither a string nor an array of
/// items, an item or content part seeker cannot run (files, images, function
/// calls), a tool other than web search, `tool_choice: "none"`, an unknown
/// `include` value, or `previous_response_id`.
pub(super) fn to_chat(
    request: ResponsesRequest,
) -> Result<(ChatCompletionRequest, Params), ApiError> {
    if request.previous_response_id.is_some() {
        return Err(ApiError::invalid_field(
            "previous_response_id",
            "this server stores no responses; send the whole conversation as `input`",
        ));
    }
    let (functions, function_at) = function_tools(request.tools.as_deref().unwrap_or_default())?;
    let tool_choice = chat_tool_choice(request.tool_choice.as_ref(), functions.is_empty())?;
    check_include(request.include.as_deref().unwrap_or_default())?;
    let mut params = Params {
        messages: Vec::new(),
        tools: function_at,
    };
    let messages = conversation(request.instructions, request.input, &mut params)?;
    let chat = ChatCompletionRequest {
        model: request.model,
        messages,
        stream: request.stream,
        stream_options: None,
        max_tokens: None,
        max_completion_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        n: None,
        stop: None,
        seed: None,
        user: request.user,
        policy: request.policy,
        continue_final_message: None,
        return_transcript: request.return_transcript,
        search: request.search,
        tools: (!functions.is_empty()).then_some(functions),
        tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
    };
    Ok((chat, params))
}

/// The request's `tools` that the client runs, as chat tools, with each
/// one's index in `tools`; web search tools are left out (web search is
/// what the policy does).
///
/// # Errors
/// A 400 naming `tools[i]`: a type other than web search or `function`, or
/// a function without a name ([`function_tool`]).
fn function_tools(tools: &[Value]) -> Result<(Vec<ToolSpec>, Vec<usize>), ApiError> {
    let mut functions = Vec::new();
    let mut function_at = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if WEB_SEARCH_TOOLS.contains(&kind) {
            continue;
        }
        if kind != "function" {
            return Err(ApiError::invalid_field(
                &format!("tools[{i}]"),
                format!(
                    "tools of type `{}` are not supported here; give web search \
                     (`{{\"type\": \"web_search\"}}`, run by the policy) or functions",
                    clip(kind)
                ),
            ));
        }
        functions.push(function_tool(i, tool)?);
        function_at.push(i);
    }
    Ok((functions, function_at))
}

/// The Responses `tool_choice` as the chat request's: none for web search
/// alone (the policy decides when to search) or a web search choice, the
/// string as given over function tools, a named function in chat's shape.
///
/// # Errors
/// A 400 naming `tool_choice`: `required` or `none` without function
/// tools, a function choice without `name`, or any other value.
fn chat_tool_choice(choice: Option<&Value>, no_functions: bool) -> Result<Option<Value>, ApiError> {
    match choice {
        None => Ok(None),
        Some(Value::String(s)) if s == "auto" || s == "required" || s == "none" => {
            if !no_functions {
                return Ok(Some(Value::String(s.clone())));
            }
            // Only web search: the policy decides when to search.
            if s != "auto" {
                return Err(ApiError::invalid_field(
                    "tool_choice",
                    format!(
                        "tool_choice `{s}` needs function tools: with web search \
                         alone the policy decides when to search"
                    ),
                ));
            }
            Ok(None)
        }
        Some(Value::Object(o))
            if o.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| WEB_SEARCH_TOOLS.contains(&t)) =>
        {
            Ok(None)
        }
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(Some(
                    json!({"type": "function", "function": {"name": name}}),
                )),
                None => Err(ApiError::invalid_field(
                    "tool_choice",
                    "a function tool_choice needs `name`",
                )),
            }
        }
        Some(_) => Err(ApiError::invalid_field(
            "tool_choice",
            "tool_choice must be `auto`, `required`, `none` (functions only), a web_search \
             tool or {\"type\": \"function\", \"name\"}",
        )),
    }
}

/// Checks the request's `include` values against [`INCLUDABLE`].
///
/// # Errors
/// A 400 naming the first unknown `include[i]`.
fn check_include(include: &[String]) -> Result<(), ApiError> {
    for (i, value) in include.iter().enumerate() {
        if !INCLUDABLE.contains(&value.as_str()) {
            return Err(ApiError::invalid_field(
                &format!("include[{i}]"),
                format!(
                    "unknown include value `{}`; known: {}",
                    clip(value),
                    INCLUDABLE.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// A Responses `function` tool (`{"type": "function", "name",
/// "description", "parameters", "strict"}`) as a chat tool.
///
/// # Errors
/// A 400 naming `tools[i].name` when it has no name.
fn function_tool(i: usize, tool: &Value) -> Result<ToolSpec, ApiError> {
    let Some(name) = tool.get("name").and_then(Value::as_str) else {
        return Err(ApiError::invalid_field(
            &format!("tools[{i}].name"),
            "a function tool needs a `name`",
        ));
    };
    Ok(ToolSpec {
        kind: "function".into(),
        function: Some(FunctionSpec {
            name: name.to_string(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters: tool.get("parameters").cloned(),
            strict: tool.get("strict").and_then(Value::as_bool),
        }),
    })
}
