//! A conversation's messages as every layer reads them: the HTTP layer
//! parses them from OpenAI's `messages` (and the Responses API's input
//! items), profiles build prompts from them, and engines render them through
//! the model's chat template. Beneath all three, so none imports another for them.

/// A chat role, as in OpenAI's API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    #[default]
    User,
    Assistant,
    /// A function's result, sent by the client that ran it.
    Tool,
}

/// One message of a conversation: its text, and for function calling the
/// calls an assistant turn made or the call a tool turn answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: Role,
    pub content: String,
    /// An assistant turn's function calls, in OpenAI's shape with the
    /// arguments as a JSON object where they parse (as Hugging Face chat
    /// templates expect): `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`. Empty for other turns.
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool turn's `tool_call_id`.
    pub tool_call_id: Option<String>,
}

impl ChatTurn {
    /// A text message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            ..Self::default()
        }
    }

    /// Whether rendering this turn needs the chat template's function-calling
    /// parts (a tool result, or an assistant turn with calls).
    pub fn is_tool_turn(&self) -> bool {
        self.role == Role::Tool || !self.tool_calls.is_empty()
    }
}
