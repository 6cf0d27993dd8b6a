//! Prefix reuse for the embedded engine, correct by construction: every
//! sequence mistral.rs keeps in its prefix cache ends in a sentinel token
//! that no later prompt continues with, and seeker keeps its own copy of the
//! cache's keys to count what is reused and to bound the memory it holds.
//!
//! Why a sentinel (mistral.rs 0.8.1, `prefix_cacher.rs`, `sampling.rs`,
//! `sequence.rs`): a finished sequence is cached under its whole token list,
//! prompt and every sampled token, but the last sampled token was never run
//! through the model, so its KV row is zeros. A later prompt that contains
//! the whole key and goes on reuses that zero row: the token is erased from
//! the context at every layer. Stop strings make it common in a search
//! rollout: they are found one token late, so the last token is the model's
//! guess at what follows `</search>`, which is what a trained policy's
//! splice starts with (`\n\n<information>`). Measured on SmolLM2 (F32): the
//! next-token log-probabilities after such a prompt move by 2.46 nats
//! (`cargo run --release --example logprob_probe -- rows`).
//!
//! [`Sentinel`], a logits processor on every request, makes the last token
//! of every sequence one of two control tokens seeker's prompts never hold
//! ([`super::vocab::Vocab::sentinels`]):
//! - `mark`, forced on the step after a stop string appeared (the step
//!   mistral.rs ends the sequence on; it cuts the text at the stop string as
//!   before);
//! - `stop`, a stop token of the request: forced when the token budget is
//!   spent (`max_len` is the budget plus one), when the consumer left, and
//!   in place of an end-of-sequence token: the processor draws the end
//!   itself, with the probability the sampler would have given the
//!   end-of-sequence ids together (greedy: when one of them has the largest
//!   logit), and otherwise takes them out of the distribution. Stopping and
//!   each continuation keep their probabilities (with `top_p`, the nucleus
//!   is taken among the continuations).
//!
//! A key ending in a sentinel can only be covered whole by a prompt holding
//! that sentinel at that place; such a prompt flushes the cache first
//! ([`super::mistral`]).
//!
//! What reuse does not change: the rows reused were computed by the same
//! weights on the same tokens. What it can change: rows of generated tokens
//! were computed one at a time (decode), a full prefill computes them
//! together. With F32 weights the two agree to every printed digit; with
//! quantized weights the activations are quantized too (Q8_K), and a
//! rounding difference in the attention can flip a quantization step:
//! measured up to 0.25 nats on the top 5 for Qwen2.5-Coder-1.5B Q4_K_M, the
//! same size as its F32-vs-quantized difference (`bench/README.md`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::Tensor;

use super::vocab::Vocab;

/// Rows a KV cache grows by (mistral.rs 0.8.1 `NormalCache::CACHE_GROW_SIZE`):
/// a cached sequence holds its row count rounded up to this.
pub const CACHE_BLOCK_ROWS: usize = 512;

/// Why [`Sentinel`] ended a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// A stop string appeared: `mark` was forced.
    StopString,
    /// The token budget was spent: `stop` was forced.
    Length,
    /// The consumer left: `stop` was forced.
    Cancelled,
    /// The model ended its sequence (an end-of-sequence id or a stop token):
    /// `stop` was forced in its place.
    Eos,
    /// A `mark` forced after a stop string did not end the sequence
    /// (seeker's byte mapping disagreed with mistral.rs's): `stop` was forced.
    Recovery,
}

/// The two sentinel tokens of a model: `(id, text)`.
#[derive(Clone, Debug)]
pub struct Sentinels {
    pub stop: (u32, String),
    pub mark: (u32, String),
}

/// What one request's [`Sentinel`] saw.
#[derive(Debug, Default)]
struct SentinelState {
    /// Calls so far (call `k` samples generated token `k`, 0-based).
    calls: usize,
    /// Generated tokens, in order (each seen in `context` one call later).
    generated: Vec<u32>,
    /// Bytes of the generated text, for the stop-string search.
    text: Vec<u8>,
    forced: Option<Forced>,
    /// Bytes the last token added to `text`.
    new_bytes: usize,
}

impl SentinelState {
    /// Whether `needle` occurs in `text` ending within its last `new_bytes`
    /// bytes (earlier occurrences were seen on earlier calls).
    fn ends_a_new(&self, needle: &[u8]) -> bool {
        let from = self
            .text
            .len()
            .saturating_sub(self.new_bytes + needle.len().saturating_sub(1));
        contains(&self.text[from..], needle)
    }
}

/// The per-request logits processor of the module documentation.
pub struct Sentinel {
    vocab: Arc<Vocab>,
    sentinels: Sentinels,
    /// Stop strings as bytes (those of more than one token; single tokens are
    /// in `to_stop`).
    stop_strings: Vec<Vec<u8>>,
    /// Ids whose probability goes to `stop`: the end-of-sequence ids and the
    /// request's single-token stop strings.
    to_stop: Vec<u32>,
    /// Generated tokens allowed before `stop` is forced.
    max_tokens: usize,
    /// Sampling temperature (`None`: greedy).
    temperature: Option<f64>,
    /// Set when the consumer left: `stop` is forced on the next call.
    cancel: AtomicBool,
    state: Mutex<SentinelState>,
}

impl Sentinel {
    /// A processor for one request. `stop` are the request's stop strings
    /// (those that are a single token of the vocabulary join the
    /// end-of-sequence ids).
    pub fn new(
        vocab: Arc<Vocab>,
        sentinels: Sentinels,
        stop: &[String],
        max_tokens: usize,
        temperature: Option<f64>,
    ) -> Self {
        let mut to_stop = vocab.eos.clone();
        let mut stop_strings = Vec::new();
        for s in stop.iter().filter(|s| !s.is_empty()) {
            // mistral.rs makes a stop string that is one token a stop token.
            if let Some(id) = vocab.token_of(s) {
                if !to_stop.contains(&id) {
                    to_stop.push(id);
                }
            }
            // Spelled with several tokens, it is searched in the text.
            stop_strings.push(s.as_bytes().to_vec());
        }
        to_stop.retain(|&id| id != sentinels.stop.0 && id != sentinels.mark.0);
        Self {
            vocab,
            sentinels,
            stop_strings,
            to_stop,
            max_tokens,
            temperature,
            cancel: AtomicBool::new(false),
            state: Mutex::default(),
        }
    }

    /// Ends the sequence at its next step (forces `stop`).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// Why the processor ended the sequence, if it did.
    pub fn forced(&self) -> Option<Forced> {
        self.state.lock().expect("sentinel lock").forced
    }

    /// The tokens generated before the last call (the last sampled token is
    /// not among them: no call saw it).
    pub fn generated(&self) -> Vec<u32> {
        self.state.lock().expect("sentinel lock").generated.clone()
    }

    /// What to do at this call: force a token, or pass the logits on with
    /// the end-of-sequence ids taken out. `logits` are the raw logits.
    fn decide(&self, logits: &[f32], context: &[u32]) -> Decision {
        let mut state = self.state.lock().expect("sentinel lock");
        let k = state.calls;
        state.calls += 1;
        if k > 0 {
            // On the first call after a prefix-cache hit `context` holds only
            // the prompt's uncached tail; from the second call on it ends with
            // the token sampled by the previous call.
            let last = context.last().copied().unwrap_or(u32::MAX);
            state.generated.push(last);
            if state.forced == Some(Forced::StopString) && last == self.sentinels.mark.0 {
                // mistral.rs did not end the sequence on `mark`.
                state.forced = Some(Forced::Recovery);
                return Decision::Force(self.sentinels.stop.0);
            }
            let piece = self.vocab.piece(last);
            state.text.extend_from_slice(piece);
            state.new_bytes = piece.len();
        }
        if state.forced.is_some() {
            return Decision::Force(self.sentinels.stop.0);
        }
        if self.cancel.load(Ordering::SeqCst) {
            state.forced = Some(Forced::Cancelled);
            return Decision::Force(self.sentinels.stop.0);
        }
        if k > 0 && self.stop_strings.iter().any(|s| state.ends_a_new(s)) {
            state.forced = Some(Forced::StopString);
            return Decision::Force(self.sentinels.mark.0);
        }
        if k >= self.max_tokens {
            state.forced = Some(Forced::Length);
            return Decision::Force(self.sentinels.stop.0);
        }
        if self.draws_the_end(logits) {
            state.forced = Some(Forced::Eos);
            return Decision::Force(self.sentinels.stop.0);
        }
        Decision::Continue
    }

    /// Whether the sequence ends here: greedy, when an end-of-sequence id
    /// has the largest logit (the lowest id wins a tie, as an argmax does);
    /// else with the probability `softmax(logits / T)` gives those ids.
    fn draws_the_end(&self, logits: &[f32]) -> bool {
        let ends = |i: usize| self.to_stop.contains(&(i as u32));
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        match self.temperature {
            Some(t) if t > 0.0 => {
                let (mut end, mut all) = (0.0f64, 0.0f64);
                for (i, &l) in logits.iter().enumerate() {
                    let p = (((l - max) as f64) / t).exp();
                    all += p;
                    if ends(i) {
                        end += p;
                    }
                }
                all > 0.0 && fastrand::f64() < end / all
            }
            _ => logits.iter().position(|&l| l == max).is_some_and(ends),
        }
    }
}

enum Decision {
    Force(u32),
    /// Sample from the logits without the end-of-sequence ids.
    Continue,
}

impl mistralrs::CustomLogitsProcessor for Sentinel {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> candle_core::Result<Tensor> {
        let mut values: Vec<f32> = logits
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        match self.decide(&values, context) {
            Decision::Force(id) => {
                for (i, v) in values.iter_mut().enumerate() {
                    *v = if i == id as usize {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
            Decision::Continue => {
                for &id in &self.to_stop {
                    if let Some(v) = values.get_mut(id as usize) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Tensor::from_vec(values, logits.shape(), logits.device())?.to_dtype(logits.dtype())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// One cached sequence as seeker knows it.
#[derive(Clone, Debug)]
struct Entry {
    key: Vec<u32>,
    /// Rows the entry's KV tensors hold (capacity, not only the used ones).
    rows: usize,
}

/// seeker's copy of mistral.rs's prefix-cache keys: which prompt tokens a
/// request will take from the cache (mistral.rs's rule: the longest shared
/// prefix with any key; nothing when it covers the whole prompt), and the
/// bytes the cached KV rows hold.
#[derive(Debug)]
pub struct PrefixTracker {
    entries: Vec<Entry>,
    /// KV bytes per cached row (all layers, K and V).
    bytes_per_row: usize,
}

impl PrefixTracker {
    /// An empty tracker for a model with `bytes_per_row` KV bytes per token.
    pub fn new(bytes_per_row: usize) -> Self {
        Self {
            entries: Vec::new(),
            bytes_per_row,
        }
    }

    /// `(tokens reused, rows of the entry reused)` for `prompt`: mistral.rs's
    /// longest match, or `(0, 0)` when none or when it covers the whole prompt.
    pub fn lookup(&self, prompt: &[u32]) -> (usize, usize) {
        let best = self
            .entries
            .iter()
            .map(|e| (shared_prefix(&e.key, prompt), e.rows))
            .fold((0, 0), |best, m| if m.0 > best.0 { m } else { best });
        if best.0 >= prompt.len() {
            (0, 0)
        } else {
            best
        }
    }

    /// Whether `prompt` holds some entry's whole key and goes on past it: it
    /// would reuse the row of the key's last token, which was never computed.
    pub fn covers_a_whole_key(&self, prompt: &[u32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.key.len() < prompt.len() && prompt.starts_with(&e.key))
    }

    /// Records a finished sequence: `key` (prompt, generated tokens and the
    /// sentinel) whose KV tensors hold `rows` rows (the prompt's rows and
    /// the generated ones, rounded up to [`CACHE_BLOCK_ROWS`]; a reused
    /// entry's capacity when larger). An equal key replaces its entry, as in
    /// mistral.rs's map.
    pub fn insert(&mut self, key: Vec<u32>, rows: usize) {
        self.entries.retain(|e| e.key != key);
        self.entries.push(Entry { key, rows });
    }

    /// Bytes the cached KV rows hold.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.rows).sum::<usize>() * self.bytes_per_row
    }

    /// Cached sequences.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every entry (the cache was flushed).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

/// Rows a KV cache of `used` rows holds: `used` rounded up to [`CACHE_BLOCK_ROWS`].
pub fn capacity_rows(used: usize) -> usize {
    used.div_ceil(CACHE_BLOCK_ROWS).max(1) * CACHE_BLOCK_ROWS
}

fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ids: 0 "a", 1 " </", 2 "search", 3 ">", 4 "\n", 5 end, 6 mark, 7 stop.
    fn sentinel(stop: &[&str], max_tokens: usize, temperature: Option<f64>) -> Sentinel {
        let vocab = Vocab::for_tests(
            &[
                ("a", false),
                (" </", false),
                ("search", false),
                (">", false),
                ("\n", false),
                ("<|end|>", true),
                ("<|mark|>", true),
                ("<|stop|>", true),
            ],
            &[5],
        );
        let stops: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        Sentinel::new(
            Arc::new(vocab),
            Sentinels {
                stop: (7, "<|stop|>".into()),
                mark: (6, "<|mark|>".into()),
            },
            &stops,
            max_tokens,
            temperature,
        )
    }

    /// Logits favouring `top` (all others lower).
    fn logits(top: usize) -> Vec<f32> {
        (0..8).map(|i| if i == top { 5.0 } else { 0.0 }).collect()
    }

    fn forced(d: Decision) -> Option<u32> {
        match d {
            Decision::Force(id) => Some(id),
            Decision::Continue => None,
        }
    }

    #[test]
    fn a_stop_string_split_over_tokens_is_marked_on_the_next_step() {
        let s = sentinel(&["</search>"], 100, None);
        let prompt = [0u32, 0];
        // Call 0 samples " </", call 1 "search", call 2 ">".
        assert_eq!(forced(s.decide(&logits(1), &prompt)), None);
        assert_eq!(forced(s.decide(&logits(2), &[0, 0, 1])), None);
        assert_eq!(forced(s.decide(&logits(3), &[0, 0, 1, 2])), None);
        // Call 3 sees ">" and the whole stop string: the step mistral.rs
        // ends the sequence on samples the mark.
        assert_eq!(forced(s.decide(&logits(4), &[0, 0, 1, 2, 3])), Some(6));
        assert_eq!(s.forced(), Some(Forced::StopString));
        assert_eq!(s.generated(), vec![1, 2, 3]);
        // Had mistral.rs not stopped, the next call recovers with `stop`.
        assert_eq!(forced(s.decide(&logits(0), &[0, 0, 1, 2, 3, 6])), Some(7));
        assert_eq!(s.forced(), Some(Forced::Recovery));
    }

    #[test]
    fn the_budget_forces_stop_after_the_last_token() {
        let s = sentinel(&[], 2, None);
        assert_eq!(forced(s.decide(&logits(0), &[4])), None);
        assert_eq!(forced(s.decide(&logits(0), &[4, 0])), None);
        assert_eq!(forced(s.decide(&logits(0), &[4, 0, 0])), Some(7));
        assert_eq!(s.forced(), Some(Forced::Length));
        assert_eq!(s.generated(), vec![0, 0]);
    }

    #[test]
    fn greedy_ends_where_an_end_token_is_the_argmax() {
        let s = sentinel(&[], 10, None);
        assert_eq!(forced(s.decide(&logits(0), &[4])), None);
        assert_eq!(forced(s.decide(&logits(5), &[4, 0])), Some(7));
        assert_eq!(s.forced(), Some(Forced::Eos));
        // A single-token stop string is an end too.
        let s = sentinel(&[">"], 10, None);
        assert_eq!(forced(s.decide(&logits(3), &[4])), Some(7));
    }

    #[test]
    fn sampled_ends_keep_their_probability() {
        // The end token holds half the mass at T = 1.
        let mut l = vec![f32::NEG_INFINITY; 8];
        l[0] = 0.0;
        l[5] = 0.0;
        let n = 4000;
        let ends = (0..n)
            .filter(|_| {
                let s = sentinel(&[], 10, Some(1.0));
                forced(s.decide(&l, &[4])).is_some()
            })
            .count();
        let share = ends as f64 / n as f64;
        assert!((share - 0.5).abs() < 0.05, "{share}");
    }

    #[test]
    fn leaving_forces_stop_and_ends_are_taken_out_of_the_logits() {
        let s = sentinel(&[], 10, None);
        let out = mistralrs::CustomLogitsProcessor::apply(
            &s,
            &Tensor::new(logits(0).as_slice(), &candle_core::Device::Cpu).unwrap(),
            &[4],
        )
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
        assert_eq!(out[5], f32::NEG_INFINITY, "the end id is out");
        assert_eq!(out[0], 5.0);
        s.cancel();
        assert_eq!(forced(s.decide(&logits(0), &[4, 0])), Some(7));
        assert_eq!(s.forced(), Some(Forced::Cancelled));
    }

    #[test]
    fn a_match_covering_the_whole_prompt_reuses_nothing() {
        let mut t = PrefixTracker::new(10);
        t.insert(vec![1, 2, 3, 4, 99], 512);
        assert_eq!(t.lookup(&[1, 2, 3, 4, 5, 6]), (4, 512));
        assert_eq!(t.lookup(&[1, 2, 3]), (0, 0), "whole prompt covered");
        assert_eq!(t.lookup(&[7, 8]), (0, 0));
        assert_eq!(t.bytes(), 5120);
        assert!(!t.covers_a_whole_key(&[1, 2, 3, 4, 5]));
        assert!(!t.covers_a_whole_key(&[1, 2, 3, 4, 99]), "the key itself");
        assert!(t.covers_a_whole_key(&[1, 2, 3, 4, 99, 7]));
        // The longest match wins; an equal key replaces its entry.
        t.insert(vec![1, 2, 3, 4, 5, 99], 1024);
        assert_eq!(t.lookup(&[1, 2, 3, 4, 5, 6]), (5, 1024));
        t.insert(vec![1, 2, 3, 4, 5, 99], 1024);
        assert_eq!(t.len(), 2);
        assert_eq!(t.bytes(), 15360);
        t.clear();
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }

    #[test]
    fn capacity_is_rounded_up_to_whole_blocks() {
        assert_eq!(capacity_rows(0), 512);
        assert_eq!(capacity_rows(512), 512);
        assert_eq!(capacity_rows(513), 1024);
    }
}
