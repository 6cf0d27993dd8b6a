//! One replica's stream, forwarded to the consumer: SSE `data:` lines read
//! into chunks, the prompt's token counts reported once, the text passed on
//! with its token counts, and the round cut at its first stop string.
//!
//! Seam: [`Inner::relay`] (`request.rs`) calls [`Inner::forward`] for each
//! replica a round runs on, with the round's [`Progress`]; the
//! [`StreamEnd`] tells it whether to re-run the rest elsewhere. The stream
//! gives its replica back to the pool (`pool.rs`: [`Inner::done`]) however
//! it ends, records its time to first token there, and marks the replica up
//! when it finishes. The wire format itself is read by `wire.rs`.
//!
//! The answer is SSE `data:` lines of `{"choices": [{"text",
//! "finish_reason"}], "usage"?, "timings"?}` ending with `data: [DONE]`.
//! Stop strings are **not** sent to the servers: they drop a matched stop
//! string from the text and not all of them say which one matched
//! (llama-server's `/v1/completions` does not), so seeker scans the text
//! for the round's stop strings and closes the connection at the first one
//! (the servers stop generating when the client disconnects). The prompt's
//! token count and the tokens taken from the prefix cache come from vLLM's
//! per-chunk usage (`continuous_usage_stats`,
//! `usage.prompt_tokens_details.cached_tokens`) or llama-server's per-token
//! timings (`timings.prompt_n` + `timings.cache_n`); servers ignore the
//! fields they do not know.

use std::time::Instant;

use futures::StreamExt;
use tokio::sync::mpsc;

use super::pool::FailureKind;
use super::wire::{parse_chunk, SseLines};
use super::Inner;
use crate::engine::{EngineError, EngineEvent, EngineFinish, GenerationParams};

/// Where a round's events go: the consumer of the generation.
pub(super) type Events = mpsc::Sender<Result<EngineEvent, EngineError>>;

/// What the round streamed so far, for a re-run elsewhere after a failure.
#[derive(Default)]
pub(super) struct Progress {
    /// The round's text sent to the consumer (cut at a stop string).
    pub(super) text: String,
    /// Each chunk's text as the server sent it (before a stop cut) with the
    /// ids it came from, for the next round's token prompt.
    pub(super) chunks: Vec<(String, Vec<u32>)>,
    /// Tokens generated (the servers' running counts where they give them).
    pub(super) tokens: usize,
    /// Whether the prompt's token counts went to the consumer already.
    prompt_reported: bool,
}

impl Progress {
    /// Appends a chunk's `text` (and, when `keep_chunks`, the chunk with its
    /// token `ids`) and cuts the round at the first of `stop` that the new
    /// text completes, looked for only where the new text can complete one
    /// (from `longest_stop` bytes, the longest stop string's length, before
    /// it; no copy of the round's text). Returns the part of `text` to send
    /// (through the stop string) and whether a stop string ended the round.
    fn push_text(
        &mut self,
        mut text: String,
        ids: Vec<u32>,
        keep_chunks: bool,
        stop: &[String],
        longest_stop: usize,
    ) -> (String, bool) {
        let before = self.text.len();
        let mut from = before.saturating_sub(longest_stop);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(&text);
        if keep_chunks {
            self.chunks.push((text.clone(), ids));
        }
        let window = &self.text[from..];
        let cut = stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| window.find(s.as_str()).map(|at| from + at + s.len()))
            .filter(|&end| end > before)
            .min();
        if let Some(end) = cut {
            self.text.truncate(end);
            text.truncate(end - before);
        }
        (text, cut.is_some())
    }
}

/// How one replica's stream ended.
pub(super) enum StreamEnd {
    /// Finished (or cut at a stop string); nothing more to do.
    Done,
    /// The consumer left.
    Cancelled,
    /// The replica failed mid-stream: re-run elsewhere.
    Failed { kind: FailureKind, message: String },
}

impl StreamEnd {
    /// A broken stream.
    fn broken(message: impl Into<String>) -> Self {
        Self::Failed {
            kind: FailureKind::Stream,
            message: message.into(),
        }
    }
}

/// The generation [`Inner::pick`] counted on a replica, given back
/// ([`Inner::done`]) when the stream ends, however it ends.
struct InFlight<'a>(&'a Inner, usize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// The round's time on a replica (seconds since the request was sent),
/// observed when the stream ends, however it ends.
struct RoundTimer<'a>(&'a prometheus::Histogram, Instant);

impl Drop for RoundTimer<'_> {
    fn drop(&mut self) {
        self.0.observe(self.1.elapsed().as_secs_f64());
    }
}

/// What [`Inner::forward`] keeps between two chunks of one replica's stream.
struct Forwarding<'a> {
    /// The replica.
    i: usize,
    params: &'a GenerationParams,
    tx: &'a Events,
    /// When the request went to the replica.
    sent_at: Instant,
    /// No text came yet: the next is the first token.
    first_text: bool,
    /// The server's running count of generated tokens at the last chunk
    /// that gave one.
    generated_base: Option<usize>,
    /// Bytes of the round's longest stop string.
    longest_stop: usize,
}

impl Inner {
    /// Forwards replica `i`'s stream (`response`, sent at `sent_at`) to `tx`;
    /// cuts it at the first stop string. Adds what it forwards to
    /// `progress`.
    pub(super) async fn forward(
        &self,
        i: usize,
        response: reqwest::Response,
        params: &GenerationParams,
        progress: &mut Progress,
        tx: &Events,
        sent_at: Instant,
    ) -> StreamEnd {
        let _in_flight = InFlight(self, i);
        let round_seconds = self
            .metrics
            .engine_round_duration
            .with_label_values(&[self.replica(i).url.as_str()]);
        let _round = RoundTimer(&round_seconds, sent_at);
        let mut stream = response.bytes_stream();
        let mut lines = SseLines::default();
        let mut state = Forwarding {
            i,
            params,
            tx,
            sent_at,
            first_text: true,
            generated_base: None,
            longest_stop: params.stop.iter().map(String::len).max().unwrap_or(0),
        };
        loop {
            let next = tokio::select! {
                () = tx.closed() => return StreamEnd::Cancelled,
                next = tokio::time::timeout(self.read_timeout, stream.next()) => next,
            };
            let payloads = match self.payloads(next, &mut lines) {
                Ok(payloads) => payloads,
                Err(end) => return end,
            };
            for data in payloads {
                if let Some(end) = self.on_payload(&mut state, &data, progress).await {
                    return end;
                }
            }
        }
    }

    /// The SSE payloads of the stream's next read (`next`: the read, or its
    /// timeout); a timeout, a read error, the end of the stream or malformed
    /// SSE is the replica's failure.
    fn payloads<B: AsRef<[u8]>>(
        &self,
        next: Result<Option<Result<B, reqwest::Error>>, tokio::time::error::Elapsed>,
        lines: &mut SseLines,
    ) -> Result<Vec<String>, StreamEnd> {
        let bytes = match next {
            Err(_) => {
                return Err(StreamEnd::Failed {
                    kind: FailureKind::Timeout,
                    message: format!("silent for {:?}", self.read_timeout),
                })
            }
            Ok(None) => {
                return Err(StreamEnd::broken(
                    "the stream ended without a finish reason",
                ))
            }
            Ok(Some(Err(e))) => return Err(StreamEnd::broken(e.to_string())),
            Ok(Some(Ok(bytes))) => bytes,
        };
        lines.push(bytes.as_ref()).map_err(StreamEnd::broken)
    }

    /// Handles one SSE payload: reports the prompt's token counts (once),
    /// forwards the text, ends the round at its finish reason (the replica
    /// is then marked up). `Some` when the stream ends here.
    async fn on_payload(
        &self,
        state: &mut Forwarding<'_>,
        data: &str,
        progress: &mut Progress,
    ) -> Option<StreamEnd> {
        if data.trim() == "[DONE]" {
            // A stream that ends without a finish reason ended badly.
            return Some(StreamEnd::broken("[DONE] without a finish reason"));
        }
        let chunk = match parse_chunk(data) {
            Ok(c) => c,
            Err(message) => return Some(StreamEnd::broken(message)),
        };
        if let Some((tokens, cached)) = chunk.prompt {
            if !progress.prompt_reported {
                progress.prompt_reported = true;
                if let Some(c) = cached {
                    self.metrics.prompt_tokens_cached.inc_by(c as u64);
                }
                if state
                    .tx
                    .send(Ok(EngineEvent::Prompt { tokens, cached }))
                    .await
                    .is_err()
                {
                    return Some(StreamEnd::Cancelled);
                }
            }
        }
        if !chunk.text.is_empty() {
            let end = self
                .on_text(state, progress, chunk.text, chunk.ids, chunk.generated)
                .await;
            if end.is_some() {
                return end;
            }
        } else if let Some(n) = chunk.generated {
            state.generated_base = Some(n);
        }
        if let Some(finish) = chunk.finish {
            self.mark_up(state.i);
            let _ = state.tx.send(Ok(EngineEvent::Done(finish))).await;
            return Some(StreamEnd::Done);
        }
        None
    }

    /// Forwards a chunk's non-empty `text` (from token `ids`; `generated`:
    /// the server's running token count, when it gives one): records the
    /// time to first token on the first, counts its tokens, cuts the round
    /// at a stop string (then sends [`EngineFinish::Stop`]). `Some` when
    /// the stream ends here.
    async fn on_text(
        &self,
        state: &mut Forwarding<'_>,
        progress: &mut Progress,
        text: String,
        ids: Vec<u32>,
        generated: Option<usize>,
    ) -> Option<StreamEnd> {
        if state.first_text {
            state.first_text = false;
            let seconds = state.sent_at.elapsed().as_secs_f64();
            self.metrics
                .engine_time_to_first_token
                .with_label_values(&[self.replica(state.i).url.as_str()])
                .observe(seconds);
            self.first_token(state.i, seconds);
        }
        // Tokens: the server's running count where it gives one.
        let tokens = match (generated, state.generated_base) {
            (Some(n), Some(base)) => n.saturating_sub(base).max(1),
            _ => 1,
        };
        if let Some(n) = generated {
            state.generated_base = Some(n);
        }
        let (text, stopped) = progress.push_text(
            text,
            ids,
            self.rounds.is_some(),
            &state.params.stop,
            state.longest_stop,
        );
        progress.tokens += tokens;
        if state
            .tx
            .send(Ok(EngineEvent::Text { text, tokens }))
            .await
            .is_err()
        {
            return Some(StreamEnd::Cancelled);
        }
        if stopped {
            let _ = state
                .tx
                .send(Ok(EngineEvent::Done(EngineFinish::Stop)))
                .await;
            return Some(StreamEnd::Done);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(progress: &mut Progress, text: &str, stop: &[&str]) -> (String, bool) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        progress.push_text(text.into(), vec![7], true, &stop, longest)
    }

    #[test]
    fn a_stop_string_split_across_chunks_cuts_the_round_after_it() {
        let mut progress = Progress::default();
        assert_eq!(
            push(&mut progress, "a <sea", &["</search>", "<search>"]),
            ("a <sea".into(), false)
        );
        assert_eq!(
            push(&mut progress, "rch> and more", &["</search>", "<search>"]),
            ("rch>".into(), true)
        );
        assert_eq!(progress.text, "a <search>");
        // The chunks keep what the server sent, before the cut.
        assert_eq!(progress.chunks[1].0, "rch> and more");
    }

    #[test]
    fn a_stop_string_already_sent_is_not_cut_again() {
        let mut progress = Progress {
            text: "<a> x".into(),
            ..Progress::default()
        };
        assert_eq!(push(&mut progress, "y", &["<a>"]), ("y".into(), false));
        assert_eq!(
            push(&mut progress, "é<a>z", &["<a>"]),
            ("é<a>".into(), true)
        );
        assert_eq!(progress.text, "<a> xyé<a>");
    }
}
