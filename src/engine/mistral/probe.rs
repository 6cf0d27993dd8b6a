//! Probes of the embedded engine for faithfulness checks: the log-softmax
//! of the next token's raw logits, to compare with llama.cpp's `n_probs`;
//! and mistral.rs's own rendering of the chat template, to compare with
//! seeker's ([`crate::engine::chat_template`], which serves every request).
//!
//! Seam: called by tests (`tests/it/qwen.rs`, `tests/it/reuse.rs`) and
//! `examples/logprob_probe.rs`, never by the serving path. It goes through
//! the same admission and prefix-reuse records as a generation
//! ([`super::reuse_state`]), so probes can check what reuse computes.

use std::sync::Arc;

use either::Either;
use mistralrs::{Response, SamplingParams, TextMessageRole, TextMessages};

use super::stream::{completion_request, response_error, submit};
use super::{detached, MistralEngine};
use crate::chat::{ChatTurn, Role};
use crate::engine::chat_template::ChatTemplate;
use crate::engine::EngineError;

impl MistralEngine {
    /// `messages` rendered by mistral.rs itself (its chat template through
    /// its tokenizer, the ids decoded with special tokens kept), ending with
    /// the generation prompt of a new assistant turn: the reference that
    /// seeker's [`ChatTemplate`] is tested against.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the template or the tokenizer fails.
    pub async fn render_chat(&self, messages: &[ChatTurn]) -> Result<String, EngineError> {
        let mut chat = TextMessages::new();
        for m in messages {
            let role = match m.role {
                Role::System => TextMessageRole::System,
                Role::User => TextMessageRole::User,
                Role::Assistant => TextMessageRole::Assistant,
                Role::Tool => TextMessageRole::Tool,
            };
            chat = chat.add_message(role, &m.content);
        }
        let model = Arc::clone(&self.model);
        detached(async move {
            let ids = model
                .tokenize(Either::Left(chat), None, false, true, None)
                .await
                .map_err(|e| EngineError::Internal(format!("chat template: {e}")))?;
            model
                .detokenize(ids, false)
                .await
                .map_err(|e| EngineError::Internal(format!("detokenize: {e}")))
        })
        .await?
    }

    /// [`MistralEngine::render_chat`] when there are no tools and no tool
    /// turns; otherwise seeker's rendering of the GGUF's template with
    /// `tools` (mistral.rs's `tojson` is minijinja's, not Python's).
    ///
    /// # Errors
    /// As [`MistralEngine::render_chat`], or the GGUF's template does not
    /// compile.
    pub async fn render_chat_with_tools(
        &self,
        messages: &[ChatTurn],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        if tools.is_empty() && !messages.iter().any(ChatTurn::is_tool_turn) {
            return self.render_chat(messages).await;
        }
        let template = match &self.files {
            super::ModelFiles::Gguf(gguf) => ChatTemplate::from_gguf(gguf)?,
            super::ModelFiles::Checkpoint(c) => ChatTemplate::from_checkpoint(&c.dir)?,
        };
        template.render_with_tools(messages, tools)
    }
}

impl MistralEngine {
    /// The `top` most likely next tokens after `prompt` (tokenized as
    /// [`MistralEngine::tokenize`] does), as `(token id, natural-log
    /// probability)` pairs, most likely first: the log-softmax (in f64) of the
    /// raw logits the model gives for the next position, read by a logits
    /// processor before sampling. One greedy step, no token kept.
    ///
    /// What faithfulness checks compare with llama.cpp's `n_probs` (same
    /// definition: probabilities of the unmodified distribution). mistral.rs's
    /// own `logprobs` are not used: in greedy mode 0.8.1 reports the base-10
    /// logarithm of a raw logit (`sampler.rs`, `sample_argmax`).
    ///
    /// # Errors
    /// [`EngineError::ContextLength`] when `prompt` fills the context;
    /// [`EngineError::Internal`] when the engine fails or sends no logits.
    pub async fn next_token_logprobs(
        &self,
        prompt: &str,
        top: usize,
    ) -> Result<Vec<(u32, f64)>, EngineError> {
        let ids = self.tokenize(prompt).await?;
        self.room_after(ids.len())?;
        let admitted = self.admit(&ids).await?;
        let captured: Arc<std::sync::Mutex<Option<Vec<f32>>>> = Arc::default();
        let sink = Arc::clone(&captured);
        let capture = move |logits: &candle_core::Tensor,
                            _context: &[u32]|
              -> candle_core::Result<candle_core::Tensor> {
            let mut slot = sink.lock().unwrap();
            if slot.is_none() {
                *slot = Some(logits.to_dtype(candle_core::DType::F32)?.to_vec1()?);
            }
            Ok(logits.clone())
        };
        let mut sampling = SamplingParams::deterministic();
        sampling.max_len = Some(1);
        let (mut request, mut engine_rx) = completion_request(ids.clone(), sampling, 8);
        let mut processors: Vec<Arc<dyn mistralrs::CustomLogitsProcessor>> =
            vec![Arc::new(capture)];
        let sentinel = self.sentinel(&[], 0, None, &mut request);
        processors.extend(sentinel.clone().map(|s| s as Arc<_>));
        request.logits_processors = Some(processors);
        submit(&self.model, request).await?;
        // Read to the end: the sequence is finished, not cancelled.
        while let Some(response) = engine_rx.recv().await {
            match response {
                Response::CompletionDone(_) => break,
                Response::CompletionChunk(c)
                    if c.choices.iter().any(|c| c.finish_reason.is_some()) =>
                {
                    break
                }
                other => {
                    if let Some(e) = response_error(other) {
                        return Err(e);
                    }
                }
            }
        }
        if let (Some(reuse), Some(sentinel)) = (&self.reuse, sentinel) {
            reuse
                .end_sequence(&self.model, admitted, ids, &sentinel, None, false)
                .await;
        }
        let logits = captured
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| EngineError::Internal("no logits were computed".into()))?;
        Ok(top_log_softmax(&logits, top))
    }
}

/// The `top` largest entries of `log_softmax(logits)` as `(index, log-prob)`,
/// largest first (ties by lower index), computed in f64.
fn top_log_softmax(logits: &[f32], top: usize) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    order
        .into_iter()
        .take(top)
        .map(|i| (i, logits[i as usize] as f64 - log_sum))
        .collect()
}
