//! JSON written exactly as Python's `json.dumps(obj, indent=2)` writes it, for
//! policies trained on such text (RAG-R1's multi-query splice,
//! arXiv 2507.02962, inclusionAI/AgenticLearning): two-space indent, item separator `","` then a
//! newline, key separator `": "`, keys in insertion order, and `ensure_ascii`:
//! every character outside ASCII `' '..='~'` as `\uXXXX` in lower-case hex (a
//! surrogate pair outside the BMP), except `\n`, `\r`, `\t`, `\b`, `\f`.
//!
//! Only what the protocols need: strings, lists of strings and objects of those.
//! Golden fixtures made by Python itself are in `tests/fixtures/pyjson/`.
//!
//! Also Python's other two renderings the protocols rely on: [`dumps`]
//! (`json.dumps(ensure_ascii=False, indent=…)`, transformers' `tojson` for
//! chat templates with tools) and [`py_repr`] (`repr()` of a string, for
//! tool results printed as Python lists).

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
        PyValue::Str(s) => write_str(s, true, out),
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
                write_str(key, true, out);
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

/// A JSON string as Python's `json.dumps` writes it: `"`, `\\` and control
/// characters escaped; with `ensure_ascii`, every character outside
/// ASCII `' '..='~'` too, as `\uXXXX` (a surrogate pair outside the BMP).
fn write_str(s: &str, ensure_ascii: bool, out: &mut String) {
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
            // `ESCAPE_ASCII` escapes everything outside ' '..='~'; `ESCAPE`
            // only the control characters.
            c if (ensure_ascii && !(' '..='~').contains(&c)) || (c as u32) < 0x20 => {
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

/// `json.dumps(value, ensure_ascii=False, indent=indent)` for any JSON
/// value, keys in the map's order: what Hugging Face `transformers` defines
/// as `tojson` for chat templates. Without `indent` the separators are
/// `", "` and `": "`; with it, `","` then a newline and `indent` spaces per level.
pub fn dumps(value: &serde_json::Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(value, indent, 0, &mut out);
    out
}

fn write_json(value: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |depth: usize, out: &mut String| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match value {
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(depth + 1, out);
                write_json(item, indent, depth + 1, out);
            }
            newline(depth, out);
            out.push(']');
        }
        J::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(depth + 1, out);
                write_str(key, false, out);
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(depth, out);
            out.push('}');
        }
        J::String(s) => write_str(s, false, out),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Null => out.push_str("null"),
        J::Number(n) => out.push_str(&n.to_string()),
    }
}

/// Python's `repr()` of a `str`, as a list or dict of strings prints it
/// (DeepResearcher's tool messages are `str(list_of_dicts)`): single quotes,
/// or double quotes when the text holds `'` and no `"`; `\\`, the quote,
/// `\t`, `\n`, `\r` escaped; other non-printable characters as `\xhh`,
/// `\uhhhh` or `\Uhhhhhhhh`. Printable is approximated as: not a control
/// character, not a line or paragraph separator, not one of the space and
/// format characters Python treats as unprintable (U+00A0, U+00AD,
/// U+1680, U+2000..=U+200F, U+202A..=U+202F, U+205F..=U+2064, U+3000,
/// U+FEFF), not a surrogate or private-use character.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str.isprintable` for one character, approximated (see [`py_repr`]).
fn printable(c: char) -> bool {
    let n = c as u32;
    !(c.is_control()
        || matches!(
            n,
            0xA0 | 0xAD
                | 0x1680
                | 0x2000..=0x200F
                | 0x2028..=0x202F
                | 0x205F..=0x2064
                | 0x3000
                | 0xFEFF
                | 0xE000..=0xF8FF
                | 0xF0000..
        ))
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

    #[test]
    fn py_repr_matches_python() {
        // Expected values printed by CPython 3.11's repr().
        assert_eq!(py_repr("T1"), "'T1'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("it's \"x\""), "'it\\'s \"x\"'");
        assert_eq!(py_repr("a\\b\nc\td\r"), "'a\\\\b\\nc\\td\\r'");
        assert_eq!(py_repr("é 東🦀"), "'é 東🦀'");
        assert_eq!(
            py_repr("\u{1}\u{7f}\u{a0}\u{200b}\u{feff}"),
            "'\\x01\\x7f\\xa0\\u200b\\ufeff'"
        );
    }
}
