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
//! The round's stop strings go to the server with token continuation on
//! (`request.rs`), so it stops at once instead of writing one more token
//! before it sees the client leave; and seeker still scans the text for
//! them and closes the connection at the first one, for servers that
//! ignore `stop`. Servers drop a matched stop string from the text: vLLM
//! keeps it when asked (`include_stop_str_in_output`), SGLang names it
//! (`matched_stop`), and llama-server sends the ids of the tokens it holds
//! back (a partial or whole stop string) with empty text; at the finish
//! those ids are read back as text (`POST /detokenize`) and scanned like
//! the rest. Held-back ids whose text comes later go with that text. The
//! prompt's
//! token count and the tokens taken from the prefix cache come from vLLM's
//! per-chunk usage (`continuous_usage_stats`,
//! `usage.prompt_tokens_details.cached_tokens`) or llama-server's per-token
//! timings (`timings.prompt_n` + `timings.cache_n`); servers ignore the
//! fields they do not know.

use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;
use tokio::sync::mpsc;

use super::pool::FailureKind;
use super::wire::{parse_chunk, SseLines};
use super::{Inner, LOG_TARGET};
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

/// The part of `stop` that `sent` does not already end with: a server that
/// names the stop string it matched may have sent its first characters.
fn unwritten<'s>(sent: &str, stop: &'s str) -> &'s str {
    let written = (0..=stop.len())
        .rev()
        .find(|&k| stop.is_char_boundary(k) && sent.ends_with(&stop[..k]))
        .unwrap_or(0);
    &stop[written..]
}

/// The round's last text as [`Inner::last_text`] reads it.
struct LastText {
    /// To forward.
    text: String,
    /// The ids `text` (with `rejoins`) came from; empty when unknown.
    ids: Vec<u32>,
    /// Text already forwarded in the last chunk that the ids also cover:
    /// that chunk and this one are kept as one.
    rejoins: Option<String>,
    /// `text` is the ids read back by the replica ([`Inner::detokenize`]).
    read_back: bool,
}

/// How one replica's stream ended.
pub(super) enum StreamEnd {
    /// Finished (or cut at a stop string), for the reason given: the
    /// caller keeps the round for the next one's token prompt, then tells
    /// the consumer (which may start that round at once).
    Done(EngineFinish),
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
    /// Ids of tokens whose text the server holds back (a possible stop
    /// string, or an unfinished character): they go with the text that
    /// comes next, or are read back at the finish.
    held: Vec<u32>,
    /// The last chunk's text and ids when they included held-back ids: at
    /// a stop string llama-server sends the text before it with the ids of
    /// the stop string's tokens too.
    released: Option<(String, Vec<u32>)>,
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
            held: Vec::new(),
            released: None,
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
                // What the server computed: the round's prompt less what it
                // says it took from its cache (all of it when it says nothing).
                self.metrics
                    .prompt_tokens_prefilled
                    .inc_by(tokens.saturating_sub(cached.unwrap_or(0)) as u64);
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
        if let Some(finish) = chunk.finish {
            self.mark_up(state.i);
            let last = self
                .last_text(
                    state,
                    &progress.text,
                    finish,
                    chunk.text,
                    chunk.ids,
                    chunk.matched_stop,
                )
                .await;
            let end = self
                .forward_last(state, progress, last, chunk.generated)
                .await;
            if end.is_some() {
                return end;
            }
            return Some(StreamEnd::Done(finish));
        }
        if progress.tokens + state.held.len() > state.params.max_tokens {
            // A server that writes past `max_tokens` (it ignores it) is cut
            // there, as one that ran out of tokens.
            return Some(StreamEnd::Done(EngineFinish::Length));
        }
        if !chunk.text.is_empty() {
            let released = !state.held.is_empty();
            let mut ids = std::mem::take(&mut state.held);
            ids.extend(chunk.ids);
            state.released = released.then(|| (chunk.text.clone(), ids.clone()));
            let end = self
                .on_text(state, progress, chunk.text, ids, chunk.generated, 1)
                .await;
            if matches!(end, Some(StreamEnd::Done(_))) {
                self.settle(state, progress).await;
            }
            return end;
        }
        if !chunk.ids.is_empty() {
            // Text held back: its tokens are counted when it comes.
            if state.generated_base.is_none() {
                state.generated_base = chunk.generated.map(|n| n.saturating_sub(chunk.ids.len()));
            }
            state.held.extend(chunk.ids);
        } else if let Some(n) = chunk.generated.filter(|_| state.held.is_empty()) {
            state.generated_base = Some(n);
        }
        None
    }

    /// The round's last text, from the finish chunk's `text` and `ids` and
    /// what the server held back:
    /// - with a stop string the server names (`matched`, one of the
    ///   round's), `text` ending with it, completed where the text
    ///   `forwarded` so far and `text` do not end with it already (vLLM
    ///   keeps it when asked; SGLang drops it);
    /// - with held-back tokens (llama-server: ids that came with empty
    ///   text, and the last chunk's when it released some), their ids read
    ///   back by the replica, when that text holds a stop string or the
    ///   round ran out of tokens; the part already forwarded is not sent
    ///   again. Otherwise the round ended at an end-of-sequence token, whose
    ///   text is no part of the round, and `text` is what the server
    ///   flushed. A replica that cannot read the ids back leaves `text`
    ///   (logged).
    async fn last_text(
        &self,
        state: &mut Forwarding<'_>,
        forwarded: &str,
        finish: EngineFinish,
        mut text: String,
        ids: Vec<u32>,
        matched: Option<String>,
    ) -> LastText {
        let plain = |text, ids| LastText {
            text,
            ids,
            rejoins: None,
            read_back: false,
        };
        let stop = &state.params.stop;
        let held = std::mem::take(&mut state.held);
        let released = state.released.take();
        if let Some(m) = matched.filter(|m| stop.contains(m)) {
            let before = [forwarded, text.as_str()].concat();
            text.push_str(unwritten(&before, &m));
            return plain(text, [held, ids].concat());
        }
        if held.is_empty() && released.is_none() {
            return plain(text, ids);
        }
        let (sent, mut all) = released.unwrap_or_default();
        all.extend(held);
        all.extend(ids);
        match self.detokenize(state.i, &all).await {
            Ok(whole) => {
                let has_stop = stop
                    .iter()
                    .any(|s| !s.is_empty() && whole.contains(s.as_str()));
                match whole.strip_prefix(sent.as_str()) {
                    Some(rest) if has_stop || finish == EngineFinish::Length => LastText {
                        text: rest.to_string(),
                        ids: all,
                        rejoins: (!sent.is_empty()).then_some(sent),
                        read_back: true,
                    },
                    _ => plain(text, Vec::new()),
                }
            }
            Err(error) => {
                // One round ends without them; later rounds are cut by
                // seeker alone, which needs nothing read back.
                if !self.client_stops.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        target: LOG_TARGET,
                        replica = %self.replica(state.i).url,
                        %error,
                        "reading back the tokens a remote engine held back at a stop string \
                         failed; that round ends without them, and stop strings are no longer \
                         sent to the servers (seeker cuts at them)"
                    );
                }
                plain(text, Vec::new())
            }
        }
    }

    /// Forwards the round's last text ([`Inner::last_text`]); the chunk it
    /// completes is kept as one, so the next round's token prompt pairs
    /// its ids with all of their text. `Some` when the stream ends here.
    async fn forward_last(
        &self,
        state: &mut Forwarding<'_>,
        progress: &mut Progress,
        last: LastText,
        generated: Option<usize>,
    ) -> Option<StreamEnd> {
        if last.text.is_empty() {
            return None;
        }
        let rejoined = last
            .rejoins
            .filter(|sent| progress.chunks.last().is_some_and(|(t, _)| t == sent))
            .inspect(|_| {
                progress.chunks.pop();
            });
        let end = self
            .on_text(state, progress, last.text, last.ids, generated, 0)
            .await;
        match (rejoined, progress.chunks.last_mut()) {
            // Read back whole already.
            (Some(sent), Some(chunk)) => chunk.0.insert_str(0, &sent),
            _ if last.read_back => {}
            _ if matches!(end, Some(StreamEnd::Done(_))) => self.settle(state, progress).await,
            _ => {}
        }
        end
    }

    /// Records the chunk a stop string cut (the round's last) with all of
    /// its ids' text, read back by the replica: a server asked to stop
    /// there may have cut the text of the stop string's last token after
    /// the stop (vLLM with `include_stop_str_in_output`), and the next
    /// round's token prompt pairs a chunk's ids with its text. Nothing when
    /// no stop strings went to the server, or the replica cannot read the
    /// ids back.
    async fn settle(&self, state: &Forwarding<'_>, progress: &mut Progress) {
        if self.rounds.is_none() || state.params.stop.is_empty() {
            return;
        }
        let Some((text, ids)) = progress.chunks.last_mut() else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        if let Ok(whole) = self.detokenize(state.i, ids).await {
            if whole.len() > text.len() && whole.starts_with(text.as_str()) {
                *text = whole;
            }
        }
    }

    /// Forwards a chunk's non-empty `text` (from token `ids`; `generated`:
    /// the server's running token count, when it gives one; `least`: the
    /// tokens counted at least, 0 for text whose tokens came before):
    /// records the time to first token on the first, counts its tokens,
    /// cuts the round at a stop string (then ends with
    /// [`EngineFinish::Stop`]). `Some` when the stream ends here.
    async fn on_text(
        &self,
        state: &mut Forwarding<'_>,
        progress: &mut Progress,
        text: String,
        ids: Vec<u32>,
        generated: Option<usize>,
        least: usize,
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
            (Some(n), Some(base)) => n.saturating_sub(base).max(least),
            _ => least,
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
            return Some(StreamEnd::Done(EngineFinish::Stop));
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
    fn a_named_stop_string_is_completed_not_repeated() {
        assert_eq!(unwritten("a </sea", "</search>"), "rch>");
        assert_eq!(unwritten("a q", "</search>"), "</search>");
        assert_eq!(unwritten("a q</search>", "</search>"), "");
        assert_eq!(unwritten("", "</search>"), "</search>");
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
