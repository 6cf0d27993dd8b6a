//! The model's chat template, applied by seeker itself, so a transcript is
//! byte-identical whichever engine continues it (the embedded one, or a
//! remote server that only ever sees raw text).
//!
//! Templates are Jinja (Hugging Face `tokenizer_config.json` `chat_template`,
//! or a GGUF's `tokenizer.chat_template`), rendered with minijinja the way
//! mistral.rs 0.8.1 renders them (`mistralrs-core` `chat_template.rs`):
//! `trim_blocks` and `lstrip_blocks` on (as `transformers` does), Python
//! string methods (`.strip()`, `.startswith()`) through minijinja-contrib's
//! `pycompat`, `raise_exception`, `strftime_now`, and the variables
//! `messages`, `add_generation_prompt` (always true here), `bos_token`,
//! `eos_token`, and `tools` when a tool-calling profile passes functions.
//!
//! `tojson` writes what Hugging Face `transformers` writes
//! (`json.dumps(x, ensure_ascii=False, indent=…)`: `", "` and `": "`, keys in
//! the order given, non-ASCII as is), not minijinja's compact, HTML-escaped
//! form: Qwen2.5's template writes each tool with `tool | tojson`, and the
//! policy was trained on Python's rendering.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value};
use minijinja::{context, Environment, Error, ErrorKind};

use super::EngineError;
use crate::chat::{ChatTurn, Role};

/// A compiled chat template with its special-token strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`.
    ///
    /// # Errors
    /// [`EngineError::Load`] when the template does not parse.
    pub fn new(
        source: &str,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, EngineError> {
        // The same two rewrites mistral.rs applies before compiling.
        let source = source.replace("[::-1]", "|reverse");
        let range = regex::Regex::new(r"range\((?P<expr>[^,]+),\s*-1,\s*-1\)").expect("regex");
        let source = range
            .replace_all(&source, "range($expr)|reverse")
            .into_owned();
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_lstrip_blocks(true);
        env.set_trim_blocks(true);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            chrono::Utc::now().format(&format).to_string()
        });
        env.add_filter("tojson", python_tojson);
        env.add_template_owned("chat", source)
            .map_err(|e| EngineError::Load(format!("chat template: {e}")))?;
        Ok(Self { env, bos, eos })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`).
    ///
    /// # Errors
    /// An unreadable GGUF, no template in it, or one that does not parse.
    pub fn from_gguf(gguf: &Path) -> Result<Self, EngineError> {
        let (source, bos, eos) = super::prepare::chat_template_parts(gguf)
            .map_err(|e| EngineError::Load(format!("{}: {e:#}", gguf.display())))?;
        let source = source.ok_or_else(|| {
            EngineError::Load(format!("{} has no tokenizer.chat_template", gguf.display()))
        })?;
        Self::new(&source, bos, eos)
    }

    /// The template of a Hugging Face `tokenizer_config.json`: its
    /// `chat_template` (a string, or the entry named `default` of a list),
    /// `bos_token` and `eos_token` (strings or `{"content": ...}` objects).
    ///
    /// # Errors
    /// An unreadable file, no template in it, or one that does not parse.
    pub fn from_tokenizer_config(path: &Path) -> Result<Self, EngineError> {
        let (source, bos, eos) =
            tokenizer_config_parts(path).map_err(|e| EngineError::Load(format!("{e:#}")))?;
        let source = source
            .ok_or_else(|| EngineError::Load(format!("{}: no chat_template", path.display())))?;
        Self::new(&source, bos, eos)
    }

    /// The template of Hugging Face checkpoint directory `dir`
    /// ([`super::checkpoint::chat_template_parts`]: `chat_template.jinja`
    /// when there is one, else `tokenizer_config.json`'s).
    ///
    /// # Errors
    /// Unreadable files, no template, or one that does not parse.
    pub fn from_checkpoint(dir: &Path) -> Result<Self, EngineError> {
        let (source, bos, eos) = super::checkpoint::chat_template_parts(dir)
            .map_err(|e| EngineError::Load(format!("{e:#}")))?;
        let source = source
            .ok_or_else(|| EngineError::Load(format!("{}: no chat_template", dir.display())))?;
        Self::new(&source, bos, eos)
    }

    /// `messages` rendered, ending with the generation prompt of a new
    /// assistant turn.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the template fails (it raised an
    /// exception, e.g. for a role order it does not accept).
    pub fn render(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        self.render_with_tools(messages, &[])
    }

    /// `messages` rendered with `tools` (functions in OpenAI's shape,
    /// `{"type": "function", "function": {…}}`) in the template's `tools`
    /// variable, key order kept; no tools leaves `tools` undefined, as
    /// `transformers` does.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_with_tools(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::System => "system",
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::Tool => "tool",
                };
                if m.is_tool_turn() {
                    let calls = serde_json::Value::Array(m.tool_calls.clone());
                    context! {
                        role => role,
                        content => m.content,
                        tool_calls => (!m.tool_calls.is_empty()).then(|| json_value(&calls)),
                        tool_call_id => m.tool_call_id,
                    }
                } else {
                    context! { role => role, content => m.content }
                }
            })
            .collect();
        self.render_values(Value::from(messages), tools)
    }

    /// Messages given as OpenAI-shaped JSON (any role the template knows:
    /// `tool`, assistant `tool_calls`), rendered with `tools` as
    /// [`ChatTemplate::render_with_tools`] does. For checking that what
    /// seeker splices is what the template itself writes.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        let messages: Vec<Value> = messages.iter().map(json_value).collect();
        self.render_values(Value::from(messages), tools)
    }

    fn render_values(
        &self,
        messages: Value,
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        let template = self.env.get_template("chat").expect("compiled in new");
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos,
                eos_token => self.eos,
                tools => (!tools.is_empty())
                    .then(|| json_value(&serde_json::Value::Array(tools.to_vec()))),
            })
            .map_err(|e| EngineError::Internal(format!("chat template: {e}")))
    }
}

/// A JSON array or object seen by the template in its own key order
/// (minijinja's maps sort their keys).
#[derive(Debug)]
struct OrderedJson(serde_json::Value);

impl Object for OrderedJson {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match self.0 {
            serde_json::Value::Array(_) => ObjectRepr::Seq,
            _ => ObjectRepr::Map,
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match &self.0 {
            serde_json::Value::Array(items) => items.get(key.as_usize()?).map(json_value),
            serde_json::Value::Object(map) => map.get(key.as_str()?).map(json_value),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match &self.0 {
            serde_json::Value::Array(items) => Enumerator::Seq(items.len()),
            serde_json::Value::Object(map) => {
                Enumerator::Values(map.keys().map(|k| Value::from(k.as_str())).collect())
            }
            _ => Enumerator::Empty,
        }
    }
}

/// A JSON value for the template: arrays and objects as [`OrderedJson`].
fn json_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
            Value::from_object(OrderedJson(value.clone()))
        }
        other => Value::from_serialize(other),
    }
}

/// `tojson` as `transformers` defines it for chat templates:
/// `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn python_tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // The other keywords transformers accepts; their defaults are what is written.
    for key in ["ensure_ascii", "separators", "sort_keys"] {
        let _: Option<Value> = kwargs.get(key)?;
    }
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(crate::pyjson::dumps(&json, indent)))
}

/// What a chat template needs from a Hugging Face `tokenizer_config.json`:
/// its `chat_template` (a string, or the entry named `default` of a list),
/// `bos_token` and `eos_token` (strings or `{"content": ...}` objects), each
/// `None` when absent.
///
/// # Errors
/// An unreadable or malformed file (naming it).
pub(crate) fn tokenizer_config_parts(path: &Path) -> anyhow::Result<TemplateParts> {
    let load = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| load(e.to_string()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| load(format!("not JSON: {e}")))?;
    let source = match &config["chat_template"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    };
    Ok((
        source,
        token_content(&config["bos_token"]),
        token_content(&config["eos_token"]),
    ))
}

/// A chat template's source, BOS and EOS token strings, each when known.
pub(crate) type TemplateParts = (Option<String>, Option<String>, Option<String>);

/// A token as `tokenizer_config.json` writes it: a string, or an
/// `AddedToken` object's `{"content": …}`.
fn token_content(token: &serde_json::Value) -> Option<String> {
    match token {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The special-token attributes of a `tokenizer_config.json` (what
/// `transformers`' `all_special_tokens` gathers besides added tokens).
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The control tokens of a Hugging Face `tokenizer_config.json`, sorted:
/// the `content` of every `added_tokens_decoder` entry marked `special`,
/// the special-token attributes (`bos_token`, `eos_token`, `unk_token`,
/// `sep_token`, `pad_token`, `cls_token`, `mask_token`) and every entry of
/// `additional_special_tokens`, each a string or a `{"content": …}` object.
/// A file with none of these gives an empty list (startup warns: nothing in
/// user text is then defused).
///
/// # Errors
/// An unreadable or malformed file.
pub fn special_tokens_of_tokenizer_config(path: &Path) -> Result<Vec<String>, EngineError> {
    let load = |e: String| EngineError::Load(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| load(e.to_string()))?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| load(e.to_string()))?;
    let added = config["added_tokens_decoder"]
        .as_object()
        .into_iter()
        .flat_map(|added| added.values())
        .filter(|t| t["special"] == true)
        .filter_map(|t| t["content"].as_str().map(str::to_string));
    let named = SPECIAL_TOKEN_KEYS
        .iter()
        .filter_map(|key| token_content(&config[*key]));
    let additional = config["additional_special_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(token_content);
    let mut tokens: Vec<String> = added
        .chain(named)
        .chain(additional)
        .filter(|t| !t.is_empty())
        .collect();
    tokens.sort();
    tokens.dedup();
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn turn(role: Role, content: &str) -> ChatTurn {
        ChatTurn::new(role, content)
    }

    #[test]
    fn renders_chatml_with_python_methods_and_a_default_system_turn() {
        let t = ChatTemplate::new(CHATML, None, Some("<|im_end|>".into())).unwrap();
        let out = t.render(&[turn(Role::User, "  Who?  ")]).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn exceptions_and_bad_templates_are_errors() {
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let e = t.render(&[turn(Role::User, "q")]).unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
        assert!(ChatTemplate::new("{% for %}", None, None).is_err());
    }

    #[test]
    fn reads_a_tokenizer_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer_config.json");
        std::fs::write(
            &path,
            serde_json::json!({
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}",
                "bos_token": {"content": "<s>"},
                "eos_token": "</s>",
                "added_tokens_decoder": {
                    "0": {"content": "<s>", "special": true},
                    "1": {"content": "</s>", "special": true},
                    "5": {"content": "word", "special": false},
                },
            })
            .to_string(),
        )
        .unwrap();
        let t = ChatTemplate::from_tokenizer_config(&path).unwrap();
        assert_eq!(
            t.render(&[turn(Role::User, "hi")]).unwrap(),
            "<s>[user]hi</s>"
        );
        assert_eq!(
            special_tokens_of_tokenizer_config(&path).unwrap(),
            ["</s>", "<s>"]
        );
    }

    /// A config without `added_tokens_decoder` (older or hand-written files)
    /// still names its control tokens through the special-token attributes,
    /// so user text is defused as with a full one.
    #[test]
    fn a_minimal_tokenizer_config_names_its_control_tokens_by_attribute() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer_config.json");
        std::fs::write(
            &path,
            serde_json::json!({
                "chat_template": CHATML,
                "eos_token": "<|im_end|>",
                "pad_token": {"content": "<|endoftext|>"},
                "unk_token": null,
                "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}, 7],
            })
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            special_tokens_of_tokenizer_config(&path).unwrap(),
            ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]
        );
        std::fs::write(&path, r#"{"chat_template": "x"}"#).unwrap();
        assert!(special_tokens_of_tokenizer_config(&path)
            .unwrap()
            .is_empty());
    }
}
