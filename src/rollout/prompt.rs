//! The first step of a rollout: the prompt, the question search of prefetch
//! profiles, the functions given to the chat template and the continued
//! message's trusted prefix.

use std::sync::Arc;

use super::{resume, ClientTools, Resumed, Rollout, RolloutError, RolloutEvent, ToolChoice};
use crate::chat::{ChatTurn, Role};
use crate::profile::{defuse, Profile, PromptText, QuestionSearch};

impl Rollout<'_> {
    /// Builds the prompt (running the question search if the profile asks for
    /// one); returns the assistant text to continue, if any.
    pub(super) async fn start(&mut self) -> Result<Option<String>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let (ctx, request) = (self.ctx, self.request);
        // Control tokens come from the chat template only: in the messages'
        // text they are defused (`<|im_start|>` → `‹|im_start|›`).
        let specials = ctx.text.special_tokens();
        let messages = &defused_messages(&request.messages, specials);
        let continuation = if self.request.continue_final_message {
            match messages.last() {
                Some(m) if m.role == Role::Assistant => Some(m.content.clone()),
                _ => return Err(RolloutError::NothingToContinue),
            }
        } else {
            None
        };
        let question_at = messages
            .iter()
            .rposition(|m| m.role == Role::User && !m.content.trim().is_empty())
            .ok_or(RolloutError::NoQuestion)?;
        // The question searched is the user's own text.
        let question = profile.normalize_question(&request.messages[question_at].content);
        let (documents_first, after_prompt) = self.search_question(question).await?;
        self.prompt.tools = profile.template_tools().to_vec();
        let client = &request.client_tools;
        if client.choice != ToolChoice::None {
            // The client's descriptions and schemas are text like its
            // messages: control tokens in them are defused.
            self.prompt
                .tools
                .extend(client.functions.iter().map(|f| defuse_json(f, specials)));
        }
        let mut prompt = match profile.prompt(messages, question_at, documents_first.as_deref()) {
            PromptText::Chat(turns) => self.ctx.text.render(&turns, &self.prompt.tools)?,
            PromptText::Raw(text) => text,
        };
        if documents_first.is_some() {
            self.prompt.bare = Some(profile.prompt(messages, question_at, None));
        } else if after_prompt.is_some() {
            self.prompt.bare = Some(PromptText::Raw(prompt.clone()));
        }
        prompt.push_str(&profile.assistant_prefix);
        // After the client's function results the turn starts as it does
        // after seeker's own tool responses (`tools.turn_prefix`).
        if messages.last().is_some_and(|m| m.role == Role::Tool) && continuation.is_none() {
            if let Some(tools) = &profile.tools {
                prompt.push_str(&tools.turn_prefix);
            }
        }
        self.prompt.len = prompt.len();
        self.transcript = prompt;
        if let Some(splice) = after_prompt {
            self.splice(splice).await?;
        }
        let continuation = match continuation {
            Some(text) => self.resume_continued(&text).await?,
            None => None,
        };
        Ok(match (continuation, forced_opening(&profile, client)) {
            (Some(text), Some(opening)) => Some(text + &opening),
            (text, opening) => text.or(opening),
        })
    }

    /// The question search of a prefetch profile: searches `question` when
    /// `search_question_first` asks for it. Returns the document block for
    /// the start of the user message (`user`) or for the prompt's
    /// `{documents}` (`prompt`), already sent as a splice event, and the
    /// splice for right after the prompt (`assistant`); both
    /// `None` when the profile searches nothing first.
    ///
    /// # Errors
    /// As the search and the event stream fail.
    async fn search_question(
        &mut self,
        question: String,
    ) -> Result<(Option<String>, Option<String>), RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let mut documents_first = None;
        let mut after_prompt = None;
        match profile.search_question_first {
            QuestionSearch::Off => {}
            QuestionSearch::Assistant => {
                after_prompt = Some(self.search(0, vec![question], Vec::new()).await?);
            }
            QuestionSearch::User => {
                let splice = self.search(0, vec![question], Vec::new()).await?;
                let block = format!("{}\n", splice.trim());
                self.emit(RolloutEvent::Splice(block.clone())).await?;
                documents_first = Some(block);
            }
            QuestionSearch::Prompt => {
                let block = self.search(0, vec![question], Vec::new()).await?;
                self.emit(RolloutEvent::Splice(block.clone())).await?;
                documents_first = Some(block);
            }
        }
        Ok((documents_first, after_prompt))
    }

    /// A resumed rollout: the calls the client's continued message `text`
    /// answers itself are kept as written (appended to the transcript,
    /// counted, and sent as reasoning); only its tail is scanned. Returns
    /// that tail, `None` when empty.
    ///
    /// # Errors
    /// As [`resume::split`] and the event stream fail.
    async fn resume_continued(&mut self, text: &str) -> Result<Option<String>, RolloutError> {
        let profile = Arc::clone(&self.ctx.profile);
        let split = resume::split(&profile, text)?;
        if !split.trusted.is_empty() {
            self.transcript.push_str(split.trusted);
            self.ledger.calls += split.calls;
            self.resumed = Some(Resumed {
                bytes: split.trusted.len(),
                calls: split.calls,
            });
            self.emit(RolloutEvent::Reasoning(split.trusted.to_string()))
                .await?;
        }
        Ok(Some(split.tail.to_string()).filter(|tail| !tail.is_empty()))
    }
}

/// `messages` with control-token strings defused in their content, tool
/// calls and tool call ids (`specials`: the engine's special tokens).
fn defused_messages(messages: &[ChatTurn], specials: &[String]) -> Vec<ChatTurn> {
    messages
        .iter()
        .map(|m| ChatTurn {
            role: m.role,
            content: defuse(&m.content, specials).into_owned(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|call| defuse_json(call, specials))
                .collect(),
            tool_call_id: m
                .tool_call_id
                .as_ref()
                .map(|id| defuse(id, specials).into_owned()),
        })
        .collect()
}

/// A forced call's opening, which seeker writes and the policy completes:
/// the call tag and `{"name": "` for `required`, up to the arguments for a
/// named function; `None` when the client forces nothing or offers no
/// functions.
fn forced_opening(profile: &Profile, client: &ClientTools) -> Option<String> {
    match (&client.choice, client.functions.is_empty()) {
        (_, true) | (ToolChoice::Auto | ToolChoice::None, _) => None,
        (ToolChoice::Required, _) => Some(format!("{}\n{{\"name\": \"", profile.query_open)),
        (ToolChoice::Named(name), _) => Some(format!(
            "{}\n{{\"name\": {}, \"arguments\":",
            profile.query_open,
            serde_json::Value::String(name.clone())
        )),
    }
}

/// `value` with the control-token strings inside its strings (keys and
/// values) defused, as message text is ([`defuse`]).
pub(super) fn defuse_json(value: &serde_json::Value, specials: &[String]) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(defuse(s, specials).into_owned()),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| defuse_json(v, specials)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (defuse(k, specials).into_owned(), defuse_json(v, specials)))
                .collect(),
        ),
        other => other.clone(),
    }
}
