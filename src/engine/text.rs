//! The policy's text side, above the [`super::Engine`] seam: its chat
//! template, its control tokens and its token count — what a Python loop
//! takes from `transformers`' tokenizer object (`apply_chat_template`,
//! `all_special_tokens`, `len(encode(text))`) before it sends raw text to an
//! engine.
//!
//! Startup builds one [`PolicyText`] per server and hands it, with the
//! engine, to every rollout: the template is seeker's own
//! ([`super::chat_template::ChatTemplate`], the same for the embedded engine
//! and for remote servers, which only ever see raw text), the control tokens
//! are read from the same file (GGUF or `tokenizer_config.json`), and only
//! the token count asks the model's tokenizer ([`TokenCount`]: mistral.rs's
//! tokenizer, or a remote server's `POST /tokenize`).

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::chat_template::ChatTemplate;
use super::EngineError;
use crate::chat::ChatTurn;

/// Renders a conversation into the prompt text the policy continues.
pub trait ChatFormat: Send + Sync {
    /// `messages` ending with the generation prompt of a new assistant turn,
    /// with `tools` (functions in OpenAI's shape, none for most profiles) in
    /// the template's `tools` variable, as `transformers`'
    /// `apply_chat_template(messages, tools=…, add_generation_prompt=True)`
    /// renders them.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the template fails.
    fn render(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError>;
}

impl ChatFormat for ChatTemplate {
    fn render(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        self.render_with_tools(messages, tools)
    }
}

/// A model with no usable chat template: raw-prompt profiles still run,
/// chat profiles get the reason.
struct NoTemplate(String);

impl ChatFormat for NoTemplate {
    fn render(&self, _: &[ChatTurn], _: &[serde_json::Value]) -> Result<String, EngineError> {
        Err(EngineError::Internal(format!(
            "the model's chat template cannot be used: {}",
            self.0
        )))
    }
}

/// Counts a text's tokens the way the engine reads a prompt.
#[async_trait]
pub trait TokenCount: Send + Sync {
    /// How many tokens `text` is as a prompt (raw text, control tokens
    /// written out read as control tokens, no BOS added): what
    /// [`super::Generation::prompt_tokens`] would report.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the tokenizer fails or cannot be
    /// reached.
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError>;
}

/// See the module documentation.
#[derive(Clone)]
pub struct PolicyText {
    format: Arc<dyn ChatFormat>,
    special_tokens: Vec<String>,
    counter: Arc<dyn TokenCount>,
}

impl std::fmt::Debug for PolicyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyText")
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl PolicyText {
    /// `format` renders chats, `special_tokens` are the tokenizer's control
    /// tokens, `counter` counts tokens.
    pub fn new(
        format: Arc<dyn ChatFormat>,
        special_tokens: Vec<String>,
        counter: Arc<dyn TokenCount>,
    ) -> Self {
        Self {
            format,
            special_tokens,
            counter,
        }
    }

    /// With `template` as the chat format, or, when it could not be loaded,
    /// one that answers every chat with that error (a model without a usable
    /// template still serves raw-prompt profiles).
    pub fn with_template(
        template: Result<ChatTemplate, EngineError>,
        special_tokens: Vec<String>,
        counter: Arc<dyn TokenCount>,
    ) -> Self {
        let format: Arc<dyn ChatFormat> = match template {
            Ok(template) => Arc::new(template),
            Err(e) => {
                tracing::warn!("chats cannot be rendered: {e}");
                Arc::new(NoTemplate(e.to_string()))
            }
        };
        Self::new(format, special_tokens, counter)
    }

    /// The chat template and control tokens of `gguf`, with `counter`
    /// counting tokens (a template that does not compile is reported at
    /// render time, as [`PolicyText::with_template`]).
    ///
    /// # Errors
    /// [`EngineError::Load`] when the GGUF's control tokens cannot be read.
    pub fn from_gguf(gguf: &Path, counter: Arc<dyn TokenCount>) -> Result<Self, EngineError> {
        let special_tokens = super::prepare::special_tokens(gguf)
            .map_err(|e| EngineError::Load(format!("{}: {e:#}", gguf.display())))?;
        Ok(Self::with_template(
            ChatTemplate::from_gguf(gguf),
            special_tokens,
            counter,
        ))
    }

    /// Strings the tokenizer reads as control tokens wherever they appear in
    /// text, e.g. `<|im_start|>` for ChatML models. The rollout defuses them
    /// in message contents and documents, so that only the chat template
    /// writes control tokens.
    pub fn special_tokens(&self) -> &[String] {
        &self.special_tokens
    }

    /// [`ChatFormat::render`] of this policy's template.
    ///
    /// # Errors
    /// As [`ChatFormat::render`].
    pub fn render(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        self.format.render(messages, tools)
    }

    /// [`TokenCount::count_tokens`] of this policy's tokenizer. Used where no
    /// generation runs (usage of an answer the client already wrote) and to
    /// tell an over-long conversation from over-long documents.
    ///
    /// # Errors
    /// As [`TokenCount::count_tokens`].
    pub async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        self.counter.count_tokens(text).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Role;

    struct Words;

    #[async_trait]
    impl TokenCount for Words {
        async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
            Ok(text.split_whitespace().count())
        }
    }

    #[tokio::test]
    async fn a_model_without_a_template_refuses_chats_with_the_reason() {
        let text = PolicyText::with_template(
            Err(EngineError::Load(
                "m.gguf has no tokenizer.chat_template".into(),
            )),
            vec!["<|im_start|>".into()],
            Arc::new(Words),
        );
        let err = text
            .render(&[ChatTurn::new(Role::User, "hi")], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no tokenizer.chat_template"), "{err}");
        assert_eq!(text.special_tokens(), ["<|im_start|>"]);
        assert_eq!(text.count_tokens("a b c").await.unwrap(), 3);
    }

    #[test]
    fn a_template_renders_chats_and_tools() {
        let template = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\
             {% if tools %}<{{ tools | length }} tools>{% endif %}[assistant]",
            None,
            None,
        );
        let text = PolicyText::with_template(template, Vec::new(), Arc::new(Words));
        let turns = [ChatTurn::new(Role::User, "hi")];
        assert_eq!(text.render(&turns, &[]).unwrap(), "[user]hi[assistant]");
        let tool = serde_json::json!({"type": "function", "function": {"name": "search"}});
        assert_eq!(
            text.render(&turns, &[tool]).unwrap(),
            "[user]hi<1 tools>[assistant]"
        );
    }
}
