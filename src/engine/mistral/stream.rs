//! One mistral.rs sequence, low level: submitting a completion request on
//! token ids, and reading its responses as [`EngineEvent`]s for the rollout.
//!
//! Seam: [`super::MistralEngine`]'s `generate` builds a [`Forward`] and runs
//! it on a task of its own; the flush ([`super::reuse_state`]) uses
//! [`completion_request`] and [`submit`] directly, and the log-prob probe
//! (`probe.rs`) those and [`response_error`].

use std::sync::Arc;

use mistralrs::core::CompletionChunkResponse;
use mistralrs::{NormalRequest, Request, RequestMessage, Response, SamplingParams};
use tokio::sync::mpsc;

use crate::engine::reuse::{Forced, Sentinel};
use crate::engine::{EngineError, EngineEvent, EngineFinish};

/// Hands `request` to `model`'s engine; returns the engine's request queue
/// (closed once the engine has stopped).
///
/// # Errors
/// [`EngineError::Internal`] when the engine is gone.
pub(super) async fn submit(
    model: &mistralrs::Model,
    request: NormalRequest,
) -> Result<mpsc::Sender<Request>, EngineError> {
    let sender = model
        .inner()
        .get_sender(None)
        .map_err(|e| EngineError::Internal(format!("engine unavailable: {e}")))?;
    sender
        .send(Request::Normal(Box::new(request)))
        .await
        .map_err(|_| EngineError::Internal("engine stopped".into()))?;
    Ok(sender)
}

/// A streaming completion request continuing the token `ids` (always
/// streaming: dropping a non-streaming receiver can panic the engine thread in
/// 0.8.1), and the receiver of its responses (`capacity` buffered).
pub(super) fn completion_request(
    ids: Vec<u32>,
    sampling: SamplingParams,
    capacity: usize,
) -> (NormalRequest, mpsc::Receiver<Response>) {
    let (engine_tx, engine_rx) = mpsc::channel(capacity);
    let mut request = NormalRequest::new_simple(
        RequestMessage::CompletionTokens(ids),
        sampling,
        engine_tx,
        0,
        None,
        None,
    );
    request.is_streaming = true;
    (request, engine_rx)
}

/// The engine's failure in `response`, if it is one (an internal or
/// validation error, or a model error with its partial response).
pub(super) fn response_error(response: Response) -> Option<EngineError> {
    match response {
        Response::InternalError(e) | Response::ValidationError(e) => {
            Some(EngineError::Internal(e.to_string()))
        }
        Response::CompletionModelError(e, _) | Response::ModelError(e, _) => {
            Some(EngineError::Internal(e))
        }
        _ => None,
    }
}

/// Why a sequence stopped, from mistral.rs's finish reason and what the
/// sentinel forced: `length` for the token budget (mistral.rs's or the
/// sentinel's), `stop` otherwise.
fn finish(reason: &str, forced: Option<Forced>) -> EngineFinish {
    match (reason, forced) {
        ("length", _) | (_, Some(Forced::Length)) => EngineFinish::Length,
        _ => EngineFinish::Stop,
    }
}

/// Reads one sequence's responses and sends them on as [`EngineEvent`]s.
pub(super) struct Forward {
    /// The rollout's end of the stream.
    tx: mpsc::Sender<Result<EngineEvent, EngineError>>,
    engine_rx: mpsc::Receiver<Response>,
    /// The engine's request queue: closed once the engine has died.
    engine_sender: mpsc::Sender<Request>,
    /// Set when prefix reuse is on.
    sentinel: Option<Arc<Sentinel>>,
    /// Sent before the text (the prompt's size and what it reused).
    prompt: Option<EngineEvent>,
    /// No chunk has been read yet.
    first: bool,
    /// The consumer left: with a sentinel the sequence is ended by the
    /// processor at its next step and read to its end (so that its cache key
    /// is known); without one, dropping the engine's receiver cancels it.
    gone: bool,
}

/// What one chunk leaves [`Forward::run`] to do.
enum Chunk {
    /// Read on.
    More,
    /// The last chunk: send this finish.
    Done(EngineFinish),
    /// The consumer left and nothing ends the sequence but dropping it.
    Abandon,
}

impl Forward {
    /// Reads `engine_rx` (a sequence submitted on `engine_sender`) into
    /// `tx`, `prompt` first when given.
    pub(super) fn new(
        tx: mpsc::Sender<Result<EngineEvent, EngineError>>,
        engine_rx: mpsc::Receiver<Response>,
        engine_sender: mpsc::Sender<Request>,
        sentinel: Option<Arc<Sentinel>>,
        prompt: Option<EngineEvent>,
    ) -> Self {
        Self {
            tx,
            engine_rx,
            engine_sender,
            sentinel,
            prompt,
            first: true,
            gone: false,
        }
    }

    /// Forwards the sequence to its end. Returns whether it ended with an
    /// engine error, or `None` when the consumer left and the sequence was
    /// cancelled by dropping it (only without a sentinel).
    pub(super) async fn run(&mut self) -> Option<bool> {
        if let Some(prompt) = self.prompt.take() {
            let _ = self.tx.send(Ok(prompt)).await;
        }
        loop {
            let response = tokio::select! {
                () = self.tx.closed(), if !self.gone => {
                    if !self.leave() {
                        return None;
                    }
                    continue;
                }
                r = self.engine_rx.recv() => r,
            };
            let event = match response {
                Some(Response::CompletionChunk(chunk)) => match self.chunk(chunk).await {
                    Chunk::More => continue,
                    Chunk::Done(finish) => Ok(EngineEvent::Done(finish)),
                    Chunk::Abandon => return None,
                },
                Some(Response::CompletionDone(done)) => {
                    let reason = done.choices.first().map(|c| c.finish_reason.as_str());
                    Ok(EngineEvent::Done(finish(
                        reason.unwrap_or(""),
                        self.forced(),
                    )))
                }
                Some(other) => match response_error(other) {
                    Some(e) => Err(e),
                    None => continue,
                },
                None => self.closed().await,
            };
            let failed = event.is_err();
            if !self.gone {
                let _ = self.tx.send(event).await;
            }
            return Some(failed);
        }
    }

    fn forced(&self) -> Option<Forced> {
        self.sentinel.as_ref().and_then(|s| s.forced())
    }

    /// The consumer left: has the sentinel end the sequence at its next step
    /// (true), or says that dropping it is the only way (false).
    fn leave(&mut self) -> bool {
        match &self.sentinel {
            Some(s) => {
                s.cancel();
                self.gone = true;
                true
            }
            None => false,
        }
    }

    /// Sends one chunk's text on (one chunk per sampled token; a chunk that
    /// would end inside a UTF-8 character is merged into the next one).
    async fn chunk(&mut self, chunk: CompletionChunkResponse) -> Chunk {
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Chunk::More;
        };
        let mut text = choice.text;
        if self.first {
            self.first = false;
            // mistral.rs trims the first piece's leading whitespace.
            if let Some(raw) = choice
                .logprobs
                .as_ref()
                .and_then(|l| l.bytes.as_ref())
                .and_then(|b| std::str::from_utf8(b).ok())
            {
                if raw != text && raw.trim_start() == text {
                    text = raw.to_string();
                }
            }
        }
        let forced = self.forced();
        let finish = choice.finish_reason.as_deref().map(|r| finish(r, forced));
        // A sentinel forced at the budget or on leaving is no token of the
        // answer.
        let sentinel_step =
            finish.is_some() && matches!(forced, Some(Forced::Length | Forced::Cancelled));
        let nothing = sentinel_step && text.is_empty();
        if !self.gone && !nothing {
            let tokens = usize::from(!sentinel_step);
            let event = EngineEvent::Text { text, tokens };
            if self.tx.send(Ok(event)).await.is_err() && !self.leave() {
                return Chunk::Abandon;
            }
        }
        match finish {
            None => Chunk::More,
            Some(finish) => Chunk::Done(finish),
        }
    }

    /// The stream closed with no finish reason. mistral.rs 0.8.1 sends no
    /// chunk for a last token that ends inside a UTF-8 character
    /// (`get_delta` holds the bytes back), so a token budget that ends there
    /// closes the stream with no finish reason; EOS and stop strings always
    /// end on whole text. The engine still taking requests tells that case
    /// from an engine that died.
    async fn closed(&self) -> Result<EngineEvent, EngineError> {
        // A dying engine drops its request queue while it unwinds, just
        // after the sequences; give it that time.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if self.engine_sender.is_closed() {
            Err(EngineError::Internal(
                "engine closed the stream without finishing".into(),
            ))
        } else {
            Ok(EngineEvent::Done(EngineFinish::Length))
        }
    }
}
