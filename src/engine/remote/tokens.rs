//! Token prompts for the remote engine (`model.token_continuation`).
//!
//! A rollout's round n+1 prompt is round n's prompt, the text the model
//! generated, and the splice. Sent as text, the server tokenizes it whole:
//! Qwen's tokenizer merges the prompt's last `\n` with the model's first `<`
//! (`\n<`), and the model itself writes ids the tokenizer would not (it
//! wrote `<`, `think` where the tokenizer reads `<th`, `ink`), so the
//! server's prefix cache — which holds the ids the model generated — matched
//! only up to round n's prompt, and the round's own output was prefilled
//! again (the embedded engine had the same loss: [`crate::engine::continued`]).
//! Here round n+1 goes out as token ids (`"prompt": [ids]`, which vLLM,
//! SGLang and llama-server take in `/v1/completions`): round n's prompt ids,
//! the ids the server generated for as long as their text is what the rollout
//! kept, then the rest of the kept text and the splice, each tokenized on
//! its own. The generated ids come with the stream: vLLM's
//! `choices[0].token_ids` (request `return_token_ids`, vLLM 0.10.2 and
//! later), llama-server's `choices[0].logprobs.content[].id` (request
//! `logprobs: 1`); a server that sends neither gets its generated text
//! tokenized instead (the cache then matches as far as the model wrote its
//! text the tokenizer's way). Text is tokenized by the replica's `POST
//! /tokenize` (llama-server: `{"content"}` → `{"tokens"}`; vLLM:
//! `{"prompt"}` → `{"tokens"}`; both read control tokens written as text, as
//! a text prompt is read). Any failure sends the prompt as text, as before;
//! a server that refuses a token prompt (a 4xx) but takes the same round as
//! text gets every later round as text too.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::watch;

use super::Inner;

/// Rollouts whose last round is kept (the oldest forgotten first).
const ROLLOUTS_KEPT: u64 = 256;

/// One finished round of a rollout: its prompt, the ids it went out as
/// (`None` when it went out as text), and what the server streamed for it:
/// each chunk's text (as sent, before a stop cut) with the ids it came from
/// (empty when the server gave none).
#[derive(Debug)]
pub(super) struct Round {
    pub(super) prompt: String,
    pub(super) ids: Option<Arc<Vec<u32>>>,
    pub(super) generated: Vec<(String, Vec<u32>)>,
}

/// The last round of each rollout, by [`crate::engine::GenerationParams::session`]:
/// `None` while it is still streaming, filled by its [`Keeper`] when it ends.
/// The rollout may start the next round as soon as it reads the stop string,
/// before the stream task has kept the round; that round waits for it.
pub(super) type Rounds = moka::future::Cache<u64, watch::Receiver<Option<Arc<Round>>>>;

/// Fills a begun round's entry in [`Rounds`] ([`Inner::keep_round`]); dropped
/// unfilled (a failed round), the next round goes as text.
pub(super) type Keeper = Option<watch::Sender<Option<Arc<Round>>>>;

/// An empty [`Rounds`].
pub(super) fn rounds() -> Rounds {
    moka::future::Cache::builder()
        .max_capacity(ROLLOUTS_KEPT)
        .time_to_idle(std::time::Duration::from_secs(600))
        .build()
}

/// How `prompt`, continuing `round` (whose prompt text it starts with),
/// goes out: the generated ids that stand for its next bytes (whole chunks
/// whose text comes next, until one does not or has no ids), then the byte
/// offsets where the rest of round's generated text that `prompt` keeps ends
/// and where it starts (character boundaries): `[start..kept]` and
/// `[kept..]` are tokenized on their own. `None` when `prompt` does not
/// start with round's prompt (the rollout rewrote it, as a page chunk's short
/// form does).
pub(super) fn split(round: &Round, prompt: &str) -> Option<(Vec<u32>, usize, usize)> {
    let rest = prompt.strip_prefix(round.prompt.as_str())?;
    let mut ids = Vec::new();
    let mut at = 0;
    let mut chunks = round.generated.iter();
    let mut unread = String::new();
    for (text, chunk_ids) in chunks.by_ref() {
        if chunk_ids.is_empty() || text.is_empty() || !rest[at..].starts_with(text.as_str()) {
            unread.push_str(text);
            break;
        }
        ids.extend_from_slice(chunk_ids);
        at += text.len();
    }
    unread.extend(chunks.map(|(text, _)| text.as_str()));
    let tail = &rest[at..];
    let kept = tail
        .char_indices()
        .zip(unread.chars())
        .find(|((_, a), b)| a != b)
        .map_or_else(|| tail.len().min(unread.len()), |((i, _), _)| i);
    let start = round.prompt.len() + at;
    Some((ids, start, start + kept))
}

impl Inner {
    /// `POST {replica i}/{path}` with JSON `body` (the API key, the read
    /// timeout); the JSON answer, or why there is none.
    async fn post_replica(&self, i: usize, path: &str, body: Value) -> Result<Value, String> {
        let mut request = self
            .client
            .post(format!("{}/{path}", self.replica(i).url))
            .timeout(self.read_timeout)
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        response.json().await.map_err(|e| e.to_string())
    }

    /// The ids of `text` as replica `i` tokenizes a prompt (no BOS, control
    /// tokens written as text read as control tokens).
    pub(super) async fn tokenize(&self, i: usize, text: &str) -> Result<Vec<u32>, String> {
        let body = self
            .post_replica(
                i,
                "tokenize",
                json!({
                    "model": self.model,
                    "content": text,
                    "prompt": text,
                    "add_special": false,
                    "add_special_tokens": false,
                }),
            )
            .await?;
        body["tokens"]
            .as_array()
            .ok_or("no tokens in the answer")?
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| format!("not a token id: {t}"))
            })
            .collect()
    }

    /// The text of generated `ids` as replica `i` writes it (`POST
    /// /detokenize`; llama-server: `{"tokens"}` → `{"content"}`, vLLM:
    /// `{"model", "tokens"}` → `{"prompt"}`). Control tokens come out as
    /// their text (`<|im_end|>`).
    pub(super) async fn detokenize(&self, i: usize, ids: &[u32]) -> Result<String, String> {
        let body = self
            .post_replica(i, "detokenize", json!({"model": self.model, "tokens": ids}))
            .await?;
        body["content"]
            .as_str()
            .or_else(|| body["prompt"].as_str())
            .map(str::to_string)
            .ok_or_else(|| "no text in the answer".to_string())
    }

    /// The ids `prompt` goes out as when it continues rollout `session`'s
    /// last round (see the module documentation); `None` sends it as text:
    /// the rollout's first round, a rewritten prompt, token continuation off,
    /// or a failed tokenization.
    pub(super) async fn continued_ids(
        &self,
        prompt: &str,
        session: Option<u64>,
    ) -> Option<Arc<Vec<u32>>> {
        let rounds = self.rounds.as_ref()?;
        if self.text_only.load(Ordering::Relaxed) {
            return None;
        }
        let mut pending = rounds.get(&session?).await?;
        let round = tokio::time::timeout(self.read_timeout, pending.wait_for(Option::is_some))
            .await
            .ok()?
            .ok()?
            .clone()?;
        let (generated, start, kept) = split(&round, prompt)?;
        let i = self.pick(session, &[]).await?;
        self.done(i);
        let built = async {
            let mut ids = match &round.ids {
                Some(ids) => ids.as_ref().clone(),
                None => self.tokenize(i, &round.prompt).await?,
            };
            ids.extend(generated);
            for part in [&prompt[start..kept], &prompt[kept..]] {
                if !part.is_empty() {
                    ids.extend(self.tokenize(i, part).await?);
                }
            }
            Ok::<_, String>(ids)
        }
        .await;
        match built {
            Ok(ids) => Some(Arc::new(ids)),
            Err(error) => {
                tracing::debug!(%error, "tokenizing a continued round failed; sent as text");
                None
            }
        }
    }

    /// A server refused a round sent as token ids with `error` (a 4xx that
    /// is not a context overflow) and took it as text: from now on every
    /// round goes out as text, as it would with `token_continuation` off.
    pub(super) fn refuse_token_prompts(&self, error: &str) {
        if !self.text_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %error,
                "the remote engine refused a prompt of token ids; sending rounds as text \
                 from now on (model.token_continuation = false does so from the start)"
            );
        }
    }

    /// Marks rollout `session`'s round as begun: the next round waits for
    /// it to be kept with the [`Keeper`] returned.
    pub(super) async fn begin_round(&self, session: Option<u64>) -> Keeper {
        let (rounds, session) = (self.rounds.as_ref()?, session?);
        let (keeper, pending) = watch::channel(None);
        rounds.insert(session, pending).await;
        Some(keeper)
    }

    /// Keeps the round just finished as its rollout's last.
    pub(super) fn keep_round(keeper: Keeper, round: Round) {
        if let Some(keeper) = keeper {
            keeper.send_replace(Some(Arc::new(round)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round whose prompt is `P\n` and whose stream sent `chunks`.
    fn round(chunks: &[(&str, &[u32])]) -> Round {
        Round {
            prompt: "P\n".into(),
            ids: None,
            generated: chunks
                .iter()
                .map(|(text, ids)| (text.to_string(), ids.to_vec()))
                .collect(),
        }
    }

    #[test]
    fn the_generated_ids_the_rollout_kept_are_reused_and_the_rest_is_tokenized() {
        // The model wrote past the closing tag in the tag's chunk; the
        // rollout kept up to the tag.
        let r = round(&[
            ("<", &[27]),
            ("search> q </", &[1, 2]),
            ("search> more", &[3, 4]),
        ]);
        let prompt = "P\n<search> q </search>\n\n<information>";
        let (ids, start, kept) = split(&r, prompt).unwrap();
        assert_eq!(ids, [27, 1, 2]);
        assert_eq!(&prompt[start..kept], "search>");
        assert_eq!(&prompt[kept..], "\n\n<information>");
        // A token past the tag that the splice happens to start with is kept.
        let r = round(&[("<search> q </search>", &[1, 2, 3]), ("\n\n", &[4])]);
        let (ids, start, kept) = split(&r, prompt).unwrap();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert_eq!((start, kept), (prompt.len() - 13, prompt.len() - 13));
    }

    #[test]
    fn without_ids_the_generated_text_is_tokenized_on_its_own() {
        let r = round(&[("<search> q </search>", &[]), (" more", &[])]);
        let prompt = "P\n<search> q </search>\n\n<information>";
        let (ids, start, kept) = split(&r, prompt).unwrap();
        assert!(ids.is_empty());
        assert_eq!(&prompt[start..kept], "<search> q </search>");
        assert_eq!(&prompt[kept..], "\n\n<information>");
    }

    #[test]
    fn all_of_the_generated_text_and_nothing_after_it() {
        let r = round(&[("<search>", &[1]), (" q", &[])]);
        let prompt = "P\n<search> q";
        assert_eq!(split(&r, prompt), Some((vec![1], 10, prompt.len())));
        // A prompt that ends inside the generated text.
        assert_eq!(split(&r, "P\n<sea"), Some((vec![], 2, 6)));
    }

    #[test]
    fn the_split_falls_on_a_character_boundary() {
        // "é" and "è" share their first byte; the split is before the character.
        let prompt = "P\nabé";
        let (_, start, kept) = split(&round(&[("abè", &[])]), prompt).unwrap();
        assert_eq!(&prompt[start..kept], "ab");
    }

    #[test]
    fn a_rewritten_prompt_is_not_continued() {
        assert_eq!(split(&round(&[("x", &[1])]), "Q\nx"), None);
    }
}
