//! JSON written exactly as Python's `json.dumps(obj, indent=2)` writes it, for
//! policies trained on such text (RAG-R1's multi-query splice,
//! arXiv 2507.02962, inclusionAI/AgenticLearning): two-space indent, item separator `","` then a
//! newline, key separator `": "`, keys in insertion order, and `ensure_ascii`:
//! every character outside ASCII `' '..='~'` as `\uXXXX` in lower-case hex (a
//! surrogate pair outside the BMP), except `\n`, `\r`, `\t`, `\b`, `\f`.
//!
//! Only what the protocols need: strings, lists of strings and objects of those.
//! Golden fixtures made by Python itself are in `tests/fixtures/pyjson/`.

/// A JSON value of the shapes the protocols use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PyValue {
    Str(String),
    List(Vec<PyValue>),
    /// Keys in the order given (Python dicts keep insertion order).
    Object(Vec<(String, PyValue)>),
}

/// `json.dumps(value, indent=2)` (ensure_ascii on, the default).
pub fn dumps_indent2(value: &PyValue) -> String {
    let mut out = String::new();
    write_value(value, 0, &mut out);
    out
}

fn write_value(value: &PyValue, depth: usize, out: &mut String) {
    match value {
        PyValue::Str(s) => write_str(s, out),
        PyValue::List(items) if items.is_empty() => out.push_str("[]"),
        PyValue::Object(items) if items.is_empty() => out.push_str("{}"),
        PyValue::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(depth + 1, out);
                write_value(item, depth + 1, out);
            }
            newline(depth, out);
            out.push(']');
        }
        PyValue::Object(items) => {
            out.push('{');
            for (i, (key, item)) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(depth + 1, out);
                write_str(key, out);
                out.push_str(": ");
                write_value(item, depth + 1, out);
            }
            newline(depth, out);
            out.push('}');
        }
    }
}

fn newline(depth: usize, out: &mut String) {
    out.push('\n');
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// A JSON string with Python's `ensure_ascii` escaping.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            // Python escapes everything outside ' '..='~' (`ESCAPE_ASCII`).
            c if !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> PyValue {
        PyValue::Str(x.into())
    }

    #[test]
    fn matches_python_layout_and_escapes() {
        let v = PyValue::Object(vec![
            ("query".into(), PyValue::List(vec![s("a"), s("b\"c")])),
            ("documents".into(), PyValue::List(vec![])),
        ]);
        assert_eq!(
            dumps_indent2(&v),
            "{\n  \"query\": [\n    \"a\",\n    \"b\\\"c\"\n  ],\n  \"documents\": []\n}"
        );
        assert_eq!(
            dumps_indent2(&s("é\n東🦀\u{1f}\u{7f}\\")),
            "\"\\u00e9\\n\\u6771\\ud83e\\udd80\\u001f\\u007f\\\\\""
        );
    }
}
