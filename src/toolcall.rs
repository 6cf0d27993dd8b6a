//! Tool calls in a model's turn, in every form the tool-calling policies
//! write them: a pure function over the turn's finished text.
//!
//! Forms, tried in this order (the first that yields a call wins):
//! 1. **Tagged** (Qwen2.5's Hermes format, ReCall, WebSailor, Tongyi
//!    DeepResearch): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
//!    one or several per turn; a last `<tool_call>` left open when the turn
//!    ended counts too. Every tagged block is a call, so bad JSON inside one
//!    is a malformed call (reported to the policy), not free text.
//! 2. **Fenced**: a Markdown code block (```` ```json ````, ```` ``` ````)
//!    holding a call object or an array of them. Measured on
//!    Qwen2.5-Coder-1.5B-Instruct offered tools through its chat template:
//!    12 of 12 first turns wrote their call this way (docs/evaluation.md).
//!    A fenced block that is not a call object is ordinary text.
//! 3. **Bare**: a call object (or an array of them) that ends the turn.
//!
//! A call object is `{"name": str, "arguments": {…}}`; `arguments` may also be
//! a JSON string holding the object (OpenAI's wire form), and `parameters` is
//! accepted for `arguments` (Llama 3.1's form). Doubled braces around it
//! (`{{"name": …}}`, as Qwen2.5-Coder-Instruct's chat template writes its
//! example call, and the model copies) are read as one object.

use serde_json::{Map, Value};

/// One call as the model wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The call's JSON text, trimmed, without tags or fences.
    pub text: String,
    /// The function's name and arguments, or why the call cannot be read.
    pub parsed: Result<Invocation, String>,
}

/// A readable call.
#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    /// The function's name.
    pub name: String,
    /// Its arguments (empty when the call gave none).
    pub arguments: Map<String, Value>,
}

/// Every call in `turn`, in order. `open` and `close` are the tags of the
/// tagged form (`<tool_call>`, `</tool_call>`). Empty when the turn calls
/// nothing (the policy answered).
pub fn parse_turn(turn: &str, open: &str, close: &str) -> Vec<ToolCall> {
    let tagged = tagged(turn, open, close);
    if !tagged.is_empty() {
        return tagged;
    }
    let fenced = fenced(turn);
    if !fenced.is_empty() {
        return fenced;
    }
    bare(turn)
}

fn tagged(turn: &str, open: &str, close: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    if open.is_empty() {
        return calls;
    }
    let mut rest = turn;
    while let Some(at) = rest.find(open) {
        let body = &rest[at + open.len()..];
        let (content, next) = match body.find(close).filter(|_| !close.is_empty()) {
            Some(end) => (&body[..end], &body[end + close.len()..]),
            None => (body, ""),
        };
        let text = content.trim();
        let parsed = match serde_json::from_str::<Value>(text) {
            Ok(value) => invocation(value),
            Err(e) => match braced(text) {
                Some(value) => invocation(value),
                None => Err(format!("the tool call is not valid JSON ({e})")),
            },
        };
        calls.push(ToolCall {
            text: text.to_string(),
            parsed,
        });
        rest = next;
    }
    calls
}

/// ```` ```lang\n…``` ```` blocks, in order.
static FENCE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(r"(?s)```[A-Za-z_]*[ \t]*\r?\n?(.*?)```").expect("valid regex")
});

fn fenced(turn: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for block in FENCE.captures_iter(turn) {
        let text = block[1].trim();
        if let Some(value) = serde_json::from_str::<Value>(text)
            .ok()
            .or_else(|| braced(text))
        {
            calls.extend(call_objects(value, text));
        }
    }
    calls
}

fn bare(turn: &str) -> Vec<ToolCall> {
    let trimmed = turn.trim_end();
    if !(trimmed.ends_with('}') || trimmed.ends_with(']')) {
        return Vec::new();
    }
    // The earliest opening bracket whose value runs exactly to the end.
    for (at, c) in trimmed.char_indices() {
        if c != '{' && c != '[' {
            continue;
        }
        let text = &trimmed[at..];
        if let Some(value) = serde_json::from_str::<Value>(text)
            .ok()
            .or_else(|| braced(text))
        {
            let calls = call_objects(value, text);
            if !calls.is_empty() {
                return calls;
            }
        }
    }
    Vec::new()
}

/// How a call object's text starts: its opening brace and the quote of its
/// first key.
const CALL_OPEN: &str = "{\"";

/// A call object wrapped in extra braces, `{{"name": …}}` (closing braces
/// may be doubled or not): the object that starts at the first `{"`, when
/// nothing but braces and whitespace comes before and after it.
fn braced(text: &str) -> Option<Value> {
    let at = text.find(CALL_OPEN)?;
    if !text[..at].chars().all(|c| c == '{' || c.is_whitespace()) || at == 0 {
        return None;
    }
    let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let rest = &text[at + values.byte_offset()..];
    (looks_like_call(&value) && rest.chars().all(|c| c == '}' || c.is_whitespace()))
        .then_some(value)
}

/// The calls in a parsed fenced or bare value: a call object, or an array
/// whose items are all call objects. Anything else is not a call.
fn call_objects(value: Value, text: &str) -> Vec<ToolCall> {
    match value {
        Value::Object(_) if looks_like_call(&value) => vec![ToolCall {
            text: text.to_string(),
            parsed: invocation(value),
        }],
        Value::Array(items) if !items.is_empty() && items.iter().all(looks_like_call) => items
            .into_iter()
            .map(|item| ToolCall {
                text: item.to_string(),
                parsed: invocation(item),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An object with a string `name`: the shape of a call.
fn looks_like_call(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|o| o.get("name").is_some_and(Value::is_string))
}

/// Reads a call object.
fn invocation(value: Value) -> Result<Invocation, String> {
    let Value::Object(mut object) = value else {
        return Err("a tool call must be a JSON object with \"name\" and \"arguments\"".into());
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        _ => return Err("the tool call has no \"name\"".into()),
    };
    let arguments = object
        .remove("arguments")
        .or_else(|| object.remove("parameters"));
    let arguments = match arguments {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(map)) => map,
            _ => return Err("\"arguments\" must be a JSON object".into()),
        },
        Some(_) => return Err("\"arguments\" must be a JSON object".into()),
    };
    Ok(Invocation { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";

    fn names(calls: &[ToolCall]) -> Vec<String> {
        calls
            .iter()
            .map(|c| match &c.parsed {
                Ok(i) => format!("{}({})", i.name, Value::Object(i.arguments.clone())),
                Err(e) => format!("error: {e}"),
            })
            .collect()
    }

    #[test]
    fn tagged_calls_one_or_several_and_an_unclosed_last_one() {
        let turn = "I will search.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": [\"a\", \"b\"]}}\n</tool_call>";
        let calls = parse_turn(turn, OPEN, CLOSE);
        assert_eq!(
            names(&calls),
            [
                "search({\"query\":\"Toyota founding year\"})",
                "search({\"query\":[\"a\",\"b\"]})"
            ]
        );
        assert_eq!(
            calls[0].text,
            "{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}"
        );
        let open = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n";
        assert_eq!(
            names(&parse_turn(open, OPEN, CLOSE)),
            ["search({\"query\":\"x\"})"]
        );
    }

    #[test]
    fn fenced_and_bare_calls_as_instruct_models_write_them() {
        let fenced_turn = "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"architects of the Eiffel Tower\"}}\n```";
        assert_eq!(
            names(&parse_turn(fenced_turn, OPEN, CLOSE)),
            ["search({\"query\":\"architects of the Eiffel Tower\"})"]
        );
        let bare_turn = "Let me look it up: {\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"MVP\\\"}\"}\n";
        assert_eq!(
            names(&parse_turn(bare_turn, OPEN, CLOSE)),
            ["search({\"query\":\"MVP\"})"]
        );
        let list = "[{\"name\": \"search\", \"parameters\": {\"query\": \"a\"}}, {\"name\": \"visit\", \"arguments\": {\"url\": [\"u\"]}}]";
        assert_eq!(
            names(&parse_turn(list, OPEN, CLOSE)),
            ["search({\"query\":\"a\"})", "visit({\"url\":[\"u\"]})"]
        );
    }

    #[test]
    fn doubled_braces_copied_from_the_coder_template_are_one_call() {
        for turn in [
            "{{\"name\": \"search\", \"arguments\": {\"query\": \"Taj Mahal construction date\"}}}}",
            "{{\"name\": \"search\", \"arguments\": {\"query\": \"Taj Mahal construction date\"}}}",
            "<tool_call>\n{{\"name\": \"search\", \"arguments\": {\"query\": \"Taj Mahal construction date\"}}}}\n</tool_call>",
            "```json\n{{\"name\": \"search\", \"arguments\": {\"query\": \"Taj Mahal construction date\"}}}}\n```",
        ] {
            assert_eq!(
                names(&parse_turn(turn, OPEN, CLOSE)),
                ["search({\"query\":\"Taj Mahal construction date\"})"],
                "{turn}"
            );
        }
        // Braces around something that is not a call stay text.
        assert!(parse_turn("{{\"year\": 1631}}", OPEN, CLOSE).is_empty());
    }

    #[test]
    fn answers_code_and_json_that_is_no_call_are_not_calls() {
        for turn in [
            "The Eiffel Tower was designed by Gustave Eiffel's company.",
            "```python\nprint({'name': 'x'})\n```",
            "```json\n{\"year\": 1937}\n```",
            "The answer is {\"name\": \"x\"} and more text.",
            "{\"name\": 5, \"arguments\": {}}",
            "",
        ] {
            assert!(parse_turn(turn, OPEN, CLOSE).is_empty(), "{turn:?}");
        }
    }

    #[test]
    fn malformed_tagged_calls_are_reported_not_dropped() {
        let turn = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"\n</tool_call><tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\": \"search\", \"arguments\": 3}</tool_call>";
        let calls = parse_turn(turn, OPEN, CLOSE);
        let got = names(&calls);
        assert_eq!(got.len(), 3);
        assert!(
            got[0].starts_with("error: the tool call is not valid JSON"),
            "{got:?}"
        );
        assert_eq!(got[1], "error: the tool call has no \"name\"");
        assert_eq!(got[2], "error: \"arguments\" must be a JSON object");
    }

    #[test]
    fn tagged_wins_over_fenced_and_fenced_over_bare() {
        let turn = "```json\n{\"name\": \"a\", \"arguments\": {}}\n```\n<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
        assert_eq!(names(&parse_turn(turn, OPEN, CLOSE)), ["b({})"]);
        let turn = "```json\n{\"name\": \"a\", \"arguments\": {}}\n```\n{\"name\": \"c\", \"arguments\": {}}";
        assert_eq!(names(&parse_turn(turn, OPEN, CLOSE)), ["a({})"]);
    }
}
