//! Token-level continuation of a rollout's rounds (the embedded engine).
//!
//! A rollout's round n+1 prompt is round n's prompt, the text the model
//! generated up to the round's end, and the splice. Tokenizing that text
//! again does not give back the ids the model generated: Qwen's tokenizer
//! merges a prompt's last `\n` with the model's first `<` (`\n<`), so the
//! prefix cache's match ended early and the round's own output was
//! prefilled again. Here round n+1's ids are round n's prompt ids, the ids
//! it generated (as far as their bytes are what the rollout kept), and only
//! the rest tokenized — what verl's agent loop does by keeping token ids
//! across turns. The transcript text is unchanged; only its ids differ where
//! the model's own tokenization differed from the tokenizer's.

use std::collections::{HashMap, VecDeque};

/// One finished round of a rollout: its prompt text and ids, and the ids
/// the engine generated after them (sentinel excluded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    pub prompt: String,
    pub ids: Vec<u32>,
    pub generated: Vec<u32>,
}

/// The last round of each rollout (by `GenerationParams::session`), at most
/// `cap` rollouts, the oldest forgotten first (a rollout's round is taken
/// when its next round starts; an abandoned rollout's stays until evicted).
#[derive(Debug)]
pub struct Rounds {
    entries: HashMap<u64, Round>,
    order: VecDeque<u64>,
    cap: usize,
}

impl Rounds {
    /// Room for `cap` rollouts (at least 1).
    pub fn new(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Keeps `round` as rollout `session`'s last.
    pub fn insert(&mut self, session: u64, round: Round) {
        if self.entries.insert(session, round).is_none() {
            self.order.push_back(session);
        }
        while self.entries.len() > self.cap {
            match self.order.pop_front() {
                Some(old) => {
                    self.entries.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Takes rollout `session`'s last round.
    pub fn take(&mut self, session: u64) -> Option<Round> {
        let round = self.entries.remove(&session)?;
        self.order.retain(|&s| s != session);
        Some(round)
    }

    /// Rollouts held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The ids `prompt` starts with when it continues `round`: round's prompt
/// ids, then the longest run of its generated ids whose bytes (`piece`, the
/// token's bytes; empty for control tokens, where the run stops) come next
/// in `prompt`; and how many bytes of `prompt` they stand for (always a
/// character boundary). `None` when `prompt` does not start with round's
/// prompt text (the rollout rewrote it, as a page chunk's short form does).
pub fn head<'v>(
    round: &Round,
    prompt: &str,
    piece: impl Fn(u32) -> &'v [u8],
) -> Option<(Vec<u32>, usize)> {
    let rest = prompt.strip_prefix(round.prompt.as_str())?.as_bytes();
    let mut at = 0;
    let mut kept = 0;
    // (ids kept, bytes) at the last character boundary.
    let mut whole = (0, 0);
    for &id in &round.generated {
        let bytes = piece(id);
        if bytes.is_empty() || !rest[at..].starts_with(bytes) {
            break;
        }
        at += bytes.len();
        kept += 1;
        if prompt.is_char_boundary(round.prompt.len() + at) {
            whole = (kept, at);
        }
    }
    let (kept, at) = whole;
    let mut ids = Vec::with_capacity(round.ids.len() + kept);
    ids.extend_from_slice(&round.ids);
    ids.extend_from_slice(&round.generated[..kept]);
    Some((ids, round.prompt.len() + at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: id → bytes; 9 is a control token.
    fn piece(id: u32) -> &'static [u8] {
        match id {
            1 => b"<search>",
            2 => b" q ",
            3 => b"</search>",
            4 => b" more",
            5 => b"\xc3",
            6 => b"\xa9",
            _ => b"",
        }
    }

    fn round(generated: &[u32]) -> Round {
        Round {
            prompt: "P\n".into(),
            ids: vec![100, 101],
            generated: generated.to_vec(),
        }
    }

    #[test]
    fn the_generated_ids_the_rollout_kept_are_reused_and_the_rest_is_left() {
        // The model wrote past the closing tag; the rollout kept up to it.
        let r = round(&[1, 2, 3, 4]);
        let prompt = "P\n<search> q </search>\n\n<information>";
        let (ids, used) = head(&r, prompt, piece).unwrap();
        assert_eq!(ids, [100, 101, 1, 2, 3]);
        assert_eq!(&prompt[used..], "\n\n<information>");
    }

    #[test]
    fn a_rewritten_prompt_is_tokenized_whole() {
        assert_eq!(head(&round(&[1]), "Q\n<search>", piece), None);
    }

    #[test]
    fn the_run_stops_at_a_control_token_and_at_a_difference() {
        let (ids, used) = head(&round(&[1, 9, 2]), "P\n<search> q ", piece).unwrap();
        assert_eq!((ids.len(), used), (3, "P\n<search>".len()));
        let (ids, used) = head(&round(&[1, 2]), "P\n<search> x ", piece).unwrap();
        assert_eq!((ids.len(), used), (3, "P\n<search>".len()));
    }

    #[test]
    fn the_head_ends_on_a_character_boundary() {
        // 'é' is two tokens: both are kept when the prompt holds 'é'; when it
        // holds another character with the same first byte, neither is.
        let (ids, used) = head(&round(&[5, 6]), "P\né!", piece).unwrap();
        assert_eq!((ids.len(), used), (4, "P\né".len()));
        let (ids, used) = head(&round(&[5, 4]), "P\nà", piece).unwrap();
        assert_eq!((ids.len(), used), (2, 2));
    }

    #[test]
    fn rounds_keep_the_newest_rollouts() {
        let mut rounds = Rounds::new(2);
        for s in 1..=3 {
            rounds.insert(s, round(&[]));
        }
        assert_eq!(rounds.len(), 2);
        assert!(rounds.take(1).is_none());
        assert!(rounds.take(3).is_some());
        assert!(rounds.take(3).is_none());
    }
}
