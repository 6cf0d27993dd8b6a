//! The Responses request's `instructions` and `input` as a chat
//! conversation: [`conversation`], called by [`super::convert::to_chat`],
//! reads a string input or each input item (messages, the function calls
//! the model made and their outputs; the `reasoning` and `web_search_call`
//! items of earlier responses are skipped) into chat messages.

use serde_json::{Map, Value};

use super::super::error::{clip, ApiError};
use super::super::openai::{
    ChatMessage, FunctionCall, MessageContent, MessageRole, ToolCallObject,
};
use super::types::Params;

/// The chat messages of `instructions` (a system message) and `input` (a
/// string: one user message; an array: its items), each one's source
/// recorded in `params`. Function calls the model made in a row are one
/// assistant turn.
///
/// # Errors
/// A 400 naming `input` when it is neither a string nor an array, or the
/// item at fault ([`input_item`]).
pub(super) fn conversation(
    instructions: Option<String>,
    input: Value,
    params: &mut Params,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::new();
    if let Some(instructions) = instructions {
        messages.push(text_message(MessageRole::System, instructions));
        params.push("instructions", "instructions");
    }
    match input {
        Value::String(question) => {
            messages.push(text_message(MessageRole::User, question));
            params.push("input", "input");
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match input_item(i, item)? {
                    Some(Input::Message(m)) => {
                        messages.push(m);
                        params.push(format!("input[{i}]"), format!("input[{i}].content"));
                    }
                    // Calls the model made in a row are one assistant turn.
                    Some(Input::Call(call)) => match messages.last_mut() {
                        Some(ChatMessage {
                            role: MessageRole::Assistant,
                            tool_calls: Some(calls),
                            ..
                        }) => calls.push(call),
                        _ => {
                            messages.push(ChatMessage {
                                role: MessageRole::Assistant,
                                tool_calls: Some(vec![call]),
                                ..ChatMessage::default()
                            });
                            params.push(format!("input[{i}]"), format!("input[{i}]"));
                        }
                    },
                    None => {}
                }
            }
            check_call_outputs(&items)?;
        }
        _ => {
            return Err(ApiError::invalid_field(
                "input",
                "input must be a string or an array of input items",
            ))
        }
    }
    Ok(messages)
}

/// A chat message of `role` with `text` as its content.
fn text_message(role: MessageRole, text: String) -> ChatMessage {
    ChatMessage {
        role,
        content: Some(MessageContent::Text(text)),
        ..ChatMessage::default()
    }
}

/// An input item, as the chat conversation holds it.
enum Input {
    /// A message, or a function's output (a `tool` message).
    Message(ChatMessage),
    /// A function call the model made (part of an assistant turn).
    Call(ToolCallObject),
}

/// Checks that function calls and their outputs pair up, in the Responses
/// request's own terms (the chat check behind it would name chat fields):
/// a `function_call_output` answers a `function_call` of the calls before it
/// (since the last message), by `call_id`, and every such call is answered
/// before the next message or the end — OpenAI's API refuses an unanswered
/// call ("No tool output found for function call …").
///
/// # Errors
/// A 400 naming `input[i]` (an output with no call before it, or a call no
/// output answers) or `input[i].call_id` (an id of no open call).
fn check_call_outputs(items: &[Value]) -> Result<(), ApiError> {
    // The calls of the current assistant turn: (item index, call_id, answered).
    let mut open: Vec<(usize, &str, bool)> = Vec::new();
    let mut answering = false;
    let unanswered = |open: &[(usize, &str, bool)]| match open.iter().find(|c| !c.2) {
        Some((j, id, _)) => Err(ApiError::invalid_field(
            &format!("input[{j}]"),
            format!(
                "the function_call `{}` (input[{j}]) has no function_call_output answering \
                 it: send its output after it, or leave the call out",
                clip(id)
            ),
        )),
        None => Ok(()),
    };
    for (i, item) in items.iter().enumerate() {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
        match kind {
            "function_call" => {
                if answering {
                    unanswered(&open)?;
                    open.clear();
                    answering = false;
                }
                open.push((i, call_id, false));
            }
            "function_call_output" => {
                if open.is_empty() {
                    return Err(ApiError::invalid_field(
                        &format!("input[{i}]"),
                        format!(
                            "input[{i}] is a function_call_output, but no function_call comes \
                             before it"
                        ),
                    ));
                }
                match open.iter_mut().find(|c| c.1 == call_id) {
                    Some(call) => call.2 = true,
                    None => {
                        let ids: Vec<&str> = open.iter().map(|c| c.1).collect();
                        return Err(ApiError::invalid_field(
                            &format!("input[{i}].call_id"),
                            format!(
                                "`{}` is the call_id of no function_call before it (those \
                                 open: {})",
                                clip(call_id),
                                ids.join(", ")
                            ),
                        ));
                    }
                }
                answering = true;
            }
            "reasoning" | "web_search_call" => {}
            _ => {
                unanswered(&open)?;
                open.clear();
                answering = false;
            }
        }
    }
    unanswered(&open)
}

/// One input item; `None` for the items of an earlier response that are
/// skipped (`reasoning`, `web_search_call`).
///
/// # Errors
/// A 400 naming `input[i]` or its field: not an object, a `type` that is
/// not a string or not one seeker runs, or an item its kind's reader
/// refuses.
fn input_item(i: usize, item: &Value) -> Result<Option<Input>, ApiError> {
    let Value::Object(item) = item else {
        return Err(ApiError::invalid_field(
            &format!("input[{i}]"),
            format!("input[{i}] must be an object (an input item)"),
        ));
    };
    let kind = match item.get("type") {
        None => "message",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                &format!("input[{i}].type"),
                format!("input[{i}].type must be a string"),
            ))
        }
    };
    match kind {
        "message" => message_item(i, item).map(|m| Some(Input::Message(m))),
        "reasoning" | "web_search_call" => Ok(None),
        "function_call" => function_call_item(i, item).map(|c| Some(Input::Call(c))),
        "function_call_output" => function_output_item(i, item).map(|m| Some(Input::Message(m))),
        other => Err(ApiError::invalid_field(
            &format!("input[{i}].type"),
            format!(
                "input items of type `{}` are not supported; send `message` items",
                clip(other)
            ),
        )),
    }
}

/// The text of `item`'s string field `key`, if it has one.
fn text_of(item: &Map<String, Value>, key: &str) -> Option<String> {
    item.get(key).and_then(Value::as_str).map(str::to_string)
}

/// A `function_call` item (`call_id`, `name`, `arguments`) as the call it
/// records; absent arguments are `{}`.
///
/// # Errors
/// A 400 naming `input[i]` when `call_id` or `name` is missing.
fn function_call_item(i: usize, item: &Map<String, Value>) -> Result<ToolCallObject, ApiError> {
    let (Some(call_id), Some(name)) = (text_of(item, "call_id"), text_of(item, "name")) else {
        return Err(ApiError::invalid_field(
            &format!("input[{i}]"),
            format!("input[{i}] is a function_call: it needs `call_id` and `name`"),
        ));
    };
    Ok(ToolCallObject {
        id: call_id,
        kind: "function".into(),
        function: FunctionCall {
            name,
            arguments: text_of(item, "arguments").unwrap_or_else(|| "{}".into()),
        },
    })
}

/// A `function_call_output` item as the `tool` message answering its
/// `call_id`; an output of text parts is their text run together.
///
/// # Errors
/// A 400 naming `input[i].call_id` when it is missing, or
/// `input[i].output` when that is neither a string nor an array of parts.
fn function_output_item(i: usize, item: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    let Some(call_id) = text_of(item, "call_id") else {
        return Err(ApiError::invalid_field(
            &format!("input[{i}].call_id"),
            format!("input[{i}] is a function_call_output: it needs the `call_id` it answers"),
        ));
    };
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => {
            return Err(ApiError::invalid_field(
                &format!("input[{i}].output"),
                format!("input[{i}].output must be a string or text parts"),
            ))
        }
    };
    Ok(ChatMessage {
        role: MessageRole::Tool,
        content: Some(MessageContent::Text(output)),
        tool_call_id: Some(call_id),
        ..ChatMessage::default()
    })
}

/// A `message` item (`role`: user, assistant, system or developer;
/// `content`: a string or text parts) as a chat message.
///
/// # Errors
/// A 400 naming `input[i].role` for any other role, or the content's
/// field ([`content_text`]).
fn message_item(i: usize, item: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("user") => MessageRole::User,
        Some("assistant") => MessageRole::Assistant,
        Some("system") => MessageRole::System,
        Some("developer") => MessageRole::Developer,
        _ => {
            return Err(ApiError::invalid_field(
                &format!("input[{i}].role"),
                format!("input[{i}].role must be user, assistant, system or developer"),
            ))
        }
    };
    Ok(text_message(role, content_text(i, item.get("content"))?))
}

/// The text of message item `i`'s `content`: the string, or its text parts
/// (`input_text`, `output_text`, `text`) run together.
///
/// # Errors
/// A 400 naming `input[i].content` (neither a string nor an array),
/// `input[i].content[j].text` (a text part without text) or
/// `input[i].content[j]` (a part that is not text).
fn content_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(ApiError::invalid_field(
                &format!("input[{i}].content"),
                format!("input[{i}].content must be a string or an array of text parts"),
            ))
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        let body = part.get("text").and_then(Value::as_str);
        match (kind, body) {
            ("input_text" | "output_text" | "text", Some(t)) => text.push_str(t),
            ("input_text" | "output_text" | "text", None) => {
                return Err(ApiError::invalid_field(
                    &format!("input[{i}].content[{j}].text"),
                    "a text part needs a `text` string",
                ))
            }
            (other, _) => {
                return Err(ApiError::invalid_field(
                    &format!("input[{i}].content[{j}]"),
                    format!(
                        "content parts of type `{}` are not supported; send text",
                        clip(other)
                    ),
                ))
            }
        }
    }
    Ok(text)
}
