//! [`Gated`]: an engine behind a first-come, first-served gate of N slots.
//!
//! A generation waits for a slot *before* its request reaches the engine, and
//! holds it until its stream ends or its consumer drops it. Two things follow:
//! - A client that leaves while it waits costs the engine nothing: its
//!   request is never sent. (Sent straight to mistral.rs, the request of a
//!   stream closed at once waited in mistral.rs's queue and was still
//!   prefilled when its turn came — 24 such streams cost 216 CPU-seconds and
//!   delayed a real request to 117 s, seeker issue 18.)
//! - Rounds are served in the order they ask: each search round of a rollout
//!   asks again, so long rollouts and short requests take turns round by
//!   round (tokio's semaphore is fair).
//!
//! The embedded engine is gated with `model.max_num_seqs` slots, the number of
//! sequences it runs at once.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, Semaphore};

use super::{ChatTurn, Engine, EngineError, Generation, GenerationParams};

/// See the module documentation.
pub struct Gated<E> {
    inner: E,
    slots: Arc<Semaphore>,
}

impl<E: Engine> Gated<E> {
    /// `inner` running at most `slots` generations at once (at least 1).
    pub fn new(inner: E, slots: usize) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new(slots.max(1))),
        }
    }
}

#[async_trait]
impl<E: Engine> Engine for Gated<E> {
    fn special_tokens(&self) -> &[String] {
        self.inner.special_tokens()
    }

    async fn render_chat(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        self.inner.render_chat(messages).await
    }

    /// Not gated: tokenizing is no generation.
    async fn count_tokens(&self, text: &str) -> Result<usize, EngineError> {
        self.inner.count_tokens(text).await
    }

    /// Waits for a slot (dropping this future while it waits leaves no trace
    /// in the engine), then starts the inner generation; the slot is given
    /// back when the stream ends or the returned receiver is dropped.
    ///
    /// # Errors
    /// As the inner engine's.
    async fn generate(
        &self,
        prompt: &str,
        params: &GenerationParams,
    ) -> Result<Generation, EngineError> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| EngineError::Internal("engine gate closed".into()))?;
        let mut inner = self.inner.generate(prompt, params).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let _slot = slot;
            loop {
                let event = tokio::select! {
                    // The consumer left: drop the inner stream (cancels it).
                    () = tx.closed() => return,
                    event = inner.events.recv() => event,
                };
                match event {
                    Some(event) => {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        });
        Ok(Generation {
            prompt_tokens: inner.prompt_tokens,
            events: rx,
        })
    }
}
