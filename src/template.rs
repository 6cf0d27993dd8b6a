//! Tiny text templates for prompts and splices: `{name}` is a field, `{{` and
//! `}}` are literal braces. Templates are parsed once, when a profile loads, so a
//! template that names an unknown field is rejected at startup, not mid-request.

use std::fmt;

/// A parsed template: literal text and named fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(String),
}

/// Why a template was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// `{name}` where `name` is not one of the fields this template may use.
    #[error("unknown field {{{field}}} (allowed: {allowed})")]
    UnknownField { field: String, allowed: String },
    /// A `{` without a matching `}`, or a lone `}`.
    #[error("unbalanced brace at byte {0} (write {{{{ or }}}} for a literal brace)")]
    Unbalanced(usize),
}

impl Template {
    /// Parses `source`, accepting only the fields in `allowed`.
    ///
    /// # Errors
    /// [`TemplateError`] for an unknown field or an unbalanced brace.
    pub fn parse(source: &str, allowed: &[&str]) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = source.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|(_, c)| *c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|(_, c)| *c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((_, c)) if c != '{' => name.push(c),
                            _ => return Err(TemplateError::Unbalanced(at)),
                        }
                    }
                    if !allowed.contains(&name.as_str()) {
                        return Err(TemplateError::UnknownField {
                            field: name,
                            allowed: allowed.join(", "),
                        });
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(name));
                }
                '}' => return Err(TemplateError::Unbalanced(at)),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Self { parts })
    }

    /// Renders into `out`, asking `value` for each field's text.
    pub fn render_into(&self, out: &mut String, mut value: impl FnMut(&str, &mut String)) {
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Field(name) => value(name, out),
            }
        }
    }

    /// Whether the template has the field `name`.
    pub fn uses(&self, name: &str) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Field(f) if f == name))
    }

    /// Renders to a new string with the given `(field, value)` pairs; a field
    /// without a pair renders empty.
    pub fn render(&self, values: &[(&str, &str)]) -> String {
        let mut out = String::new();
        self.render_into(&mut out, |name, out| {
            if let Some((_, v)) = values.iter().find(|(k, _)| *k == name) {
                out.push_str(v);
            }
        });
        out
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Literal(s) => write!(f, "{}", s.replace('{', "{{").replace('}', "}}"))?,
                Part::Field(name) => write!(f, "{{{name}}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_fields_and_literal_braces() {
        let t = Template::parse("Doc {i}(Title: {title}) {{json}}\n", &["i", "title"]).unwrap();
        assert_eq!(
            t.render(&[("i", "1"), ("title", "Mona Lisa")]),
            "Doc 1(Title: Mona Lisa) {json}\n"
        );
        assert_eq!(t.to_string(), "Doc {i}(Title: {title}) {{json}}\n");
    }

    #[test]
    fn rejects_unknown_fields_and_unbalanced_braces() {
        assert_eq!(
            Template::parse("{titel}", &["title"]),
            Err(TemplateError::UnknownField {
                field: "titel".into(),
                allowed: "title".into()
            })
        );
        assert_eq!(
            Template::parse("x {title", &["title"]),
            Err(TemplateError::Unbalanced(2))
        );
        assert_eq!(
            Template::parse("x } y", &["title"]),
            Err(TemplateError::Unbalanced(2))
        );
    }
}
