//! Filters on the answer as it streams: [`AnswerStripper`] trims it the way
//! the finished answer is trimmed, and [`StopFilter`] cuts it at the
//! request's `stop` strings (OpenAI's semantics: the stop string itself is
//! never sent), holding back text that may be the start of one.

/// Strips the answer while streaming it: leading whitespace is dropped and
/// trailing whitespace is held until more text follows, so the concatenated
/// output equals `content.trim()`.
#[derive(Default)]
pub(crate) struct AnswerStripper {
    /// Some answer text has been sent.
    pub started: bool,
    held: String,
}

impl AnswerStripper {
    /// The part of `text` that can be sent now.
    pub fn push(&mut self, text: &str) -> Option<String> {
        let text = if self.started {
            text
        } else {
            text.trim_start()
        };
        if text.is_empty() {
            return None;
        }
        self.started = true;
        self.held.push_str(text);
        let keep = self.held.trim_end().len();
        if keep == 0 {
            return None;
        }
        Some(self.held.drain(..keep).collect())
    }
}

/// Cuts the answer at the first stop string. Text that could be the start of
/// a stop string is held back until the next piece shows whether it is, so a
/// stop string split across tokens is still caught and never half-sent.
#[derive(Default)]
pub(crate) struct StopFilter {
    stops: Vec<String>,
    held: String,
    /// A stop string has appeared: the answer is over.
    pub stopped: bool,
}

impl StopFilter {
    /// A filter for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    /// The part of `text` (after what was held) that can be sent now; once a
    /// stop string has appeared, nothing more.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        if self.stops.is_empty() {
            return text.to_string();
        }
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            self.held.truncate(at);
            return std::mem::take(&mut self.held);
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial_overlap(&self.held, s))
            .max()
            .unwrap_or(0);
        self.held.drain(..self.held.len() - hold).collect()
    }

    /// What was held back, at the end of the answer.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with. The
/// cut it implies is a char boundary of `text`: equal bytes starting where
/// `stop` starts begin a character.
fn partial_overlap(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .find(|&k| text.as_bytes().ends_with(&stop.as_bytes()[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `pieces` through a filter for `stops`; what a client receives.
    fn filtered(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut out = String::new();
        for p in pieces {
            out.push_str(&f.push(p));
        }
        out.push_str(&f.flush());
        (out, f.stopped)
    }

    /// Feeds `pieces` through a stripper; what a client receives.
    fn stripped(pieces: &[&str]) -> String {
        let mut s = AnswerStripper::default();
        pieces.iter().filter_map(|p| s.push(p)).collect()
    }

    #[test]
    fn the_streamed_answer_is_the_trimmed_content() {
        assert_eq!(
            stripped(&["  ", " Leo", "nardo ", " da", " Vinci  ", "\n"]),
            "Leonardo  da Vinci"
        );
        assert_eq!(stripped(&[" \n", "  "]), "");
        let mut s = AnswerStripper::default();
        assert_eq!(s.push("  "), None);
        assert!(!s.started, "whitespace alone starts no answer");
        assert_eq!(s.push(" a "), Some("a".into()));
        assert!(s.started);
        assert_eq!(
            s.push("b"),
            Some(" b".into()),
            "held whitespace goes out before more text"
        );
    }

    #[test]
    fn stop_strings_cut_the_answer_even_across_pieces() {
        assert_eq!(
            filtered(&["\n\n"], &["Paris", "\n", "\nmore"]),
            ("Paris".into(), true)
        );
        assert_eq!(
            filtered(&["END", "."], &["Par", "is. E", "ND"]),
            ("Paris".into(), true)
        );
        // A partial match that does not complete is sent at the end.
        assert_eq!(filtered(&["STOP"], &["a ST", "O"]), ("a STO".into(), false));
        assert_eq!(filtered(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            filtered(&["é"], &["caf", "é au lait"]),
            ("caf".into(), true)
        );
    }

    proptest! {
        /// However the answer is split into pieces, the client gets the text
        /// up to the first stop string, and never part of a stop string.
        #[test]
        fn any_split_gives_the_text_before_the_first_stop(
            text in "[ab\\n é]{0,24}",
            stop in "[ab\\n é]{1,3}",
            cuts in proptest::collection::vec(0usize..32, 0..6),
        ) {
            let mut bounds: Vec<usize> = cuts
                .into_iter()
                .map(|c| c.min(text.len()))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort_unstable();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let (out, stopped) = filtered(&[stop.as_str()], &pieces);
            let expected = text.find(stop.as_str()).map_or(text.as_str(), |at| &text[..at]);
            prop_assert_eq!(out.as_str(), expected);
            prop_assert_eq!(stopped, text.contains(stop.as_str()));
        }
    }
}
