//! A test engine that replays scripted output with chosen piece boundaries.
//!
//! Each [`Engine::generate`] call plays the next script: a list of pieces, each
//! counted as one token. Like mistral.rs it stops one piece AFTER a stop string
//! appears, and at `max_tokens` with [`EngineFinish::Length`]; it records every
//! prompt it was given so tests can check the transcript byte for byte.
//! [`ScriptedEngine::text`] is its text side: a ChatML stand-in for a chat
//! template and words for tokens.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::text::{ChatFormat, PolicyText, TokenCount};
use super::{Engine, EngineError, EngineEvent, EngineFinish, Generation, GenerationParams};
use crate::chat::ChatTurn;

/// See the module documentation.
#[derive(Clone, Default)]
pub struct ScriptedEngine {
    scripts: Arc<Mutex<VecDeque<Vec<String>>>>,
    prompts: Arc<Mutex<Vec<String>>>,
    delay: Duration,
    context_limit: Option<usize>,
    /// Generations whose task is still running.
    running: Arc<AtomicUsize>,
    /// Put each script back at the end after playing it.
    cycle: bool,
    /// What its [`PolicyText::special_tokens`] reports.
    special_tokens: Vec<String>,
}

/// Decrements the running count when a generation task ends, however it ends.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ScriptedEngine {
    /// An engine that plays `scripts` in order, one per generation call; after
    /// the last one it generates nothing and stops.
    pub fn new<S: AsRef<str>>(scripts: impl IntoIterator<Item = Vec<S>>) -> Self {
        Self {
            scripts: Arc::new(Mutex::new(
                scripts
                    .into_iter()
                    .map(|s| s.iter().map(|p| p.as_ref().to_string()).collect())
                    .collect(),
            )),
            ..Self::default()
        }
    }

    /// Reports `tokens` as the tokenizer's special tokens.
    pub fn with_special_tokens(mut self, tokens: &[&str]) -> Self {
        self.special_tokens = tokens.iter().map(|t| t.to_string()).collect();
        self
    }

    /// Waits `delay` before each piece (for cancellation tests).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Plays the scripts round and round instead of once (a demo or API test
    /// server that must answer any number of requests).
    pub fn cycling(mut self) -> Self {
        self.cycle = true;
        self
    }

    /// Generations still producing pieces: 0 once every request has finished
    /// or been cancelled (cancellation tests).
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Refuses prompts of `limit` or more whitespace-separated words (its
    /// stand-in for tokens) with [`EngineError::ContextLength`].
    pub fn with_context_limit(mut self, limit: usize) -> Self {
        self.context_limit = Some(limit);
        self
    }

    /// Every prompt received so far, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.prompts.lock().expect("prompts lock").clone()
    }
}

impl ScriptedEngine {
    /// Its text side for a rollout: ChatML turns ([`ScriptedChat`]), the
    /// special tokens set by [`ScriptedEngine::with_special_tokens`], and
    /// whitespace-separated words as tokens ([`Words`]).
    pub fn text(&self) -> Arc<PolicyText> {
        Arc::new(PolicyText::new(
            Arc::new(ScriptedChat),
            self.special_tokens.clone(),
            Arc::new(Words),
        ))
    }
}

/// The scripted engine's chat format: ChatML turns, each assistant call as
/// `\n<tool_call>\n{function JSON}\n</tool_call>` after its content, then the
/// generation prompt; with tools, a system turn holding their JSON, one per
/// line, first.
pub struct ScriptedChat;

impl ChatFormat for ScriptedChat {
    fn render(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        let mut out = String::new();
        if !tools.is_empty() {
            let lines: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
            out.push_str(&format!(
                "<|im_start|>system\n<tools>\n{}\n</tools><|im_end|>\n",
                lines.join("\n")
            ));
        }
        for m in messages {
            let role = serde_json::to_value(m.role).expect("role serialises");
            let role = role.as_str().unwrap_or("user");
            let mut content = m.content.clone();
            for call in &m.tool_calls {
                content.push_str(&format!(
                    "\n<tool_call>\n{}\n</tool_call>",
                    call["function"]
                ));
            }
            out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        out.push_str("<|im_start|>assistant\n");
        Ok(out)
    }
}

/// Whitespace-separated words: the scripted engine's stand-in for tokens.
pub struct Words;

#[async_trait]
impl TokenCount for Words {
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        Ok(text.split_whitespace().count())
    }
}

#[async_trait]
impl Engine for ScriptedEngine {
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let prompt_tokens = prompt.split_whitespace().count();
        if let Some(limit) = self.context_limit {
            if prompt_tokens >= limit {
                return Err(EngineError::ContextLength {
                    prompt_tokens,
                    limit,
                });
            }
        }
        self.prompts
            .lock()
            .expect("prompts lock")
            .push(prompt.to_string());
        let script = {
            let mut scripts = self.scripts.lock().expect("scripts lock");
            let script = scripts.pop_front().unwrap_or_default();
            if self.cycle {
                scripts.push_back(script.clone());
            }
            script
        };
        let (tx, rx) = mpsc::channel(16);
        let params = params.clone();
        let delay = self.delay;
        self.running.fetch_add(1, Ordering::SeqCst);
        let running = Running(Arc::clone(&self.running));
        tokio::spawn(async move {
            let _running = running;
            let mut text = String::new();
            let mut finish = EngineFinish::Stop;
            let mut stop_seen = false;
            for (generated, piece) in script.into_iter().enumerate() {
                if generated >= params.max_tokens {
                    finish = EngineFinish::Length;
                    break;
                }
                if !delay.is_zero() {
                    // A dropped receiver cancels at once, even mid-delay.
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = tx.closed() => return,
                    }
                }
                text.push_str(&piece);
                let stop_now = stop_seen;
                let event = EngineEvent::Text {
                    text: piece,
                    tokens: 1,
                };
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
                // mistral.rs emits one more token after the stop string.
                if stop_now {
                    break;
                }
                stop_seen = params.stop.iter().any(|s| text.contains(s.as_str()));
            }
            let _ = tx.send(Ok(EngineEvent::Done(finish))).await;
        });
        Ok(Generation {
            prompt_tokens,
            events: rx,
        })
    }
}
