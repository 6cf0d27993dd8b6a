//! The tag scanner: a pure, synchronous state machine over generated text.
//!
//! The search loop feeds it the policy's output in whatever pieces the engine
//! produces (one token or several; whole characters, as engines send them). It
//! tells the loop which text is safe to show, which region that
//! text belongs to (reasoning, a query, an answer) and when the round ends.
//!
//! Guarantees, for any input and any way of splitting it into pieces (tested by
//! splitting at every byte boundary, which only the tests' `push_bytes` can):
//! - the same events come out, up to how adjacent text is grouped;
//! - no part of a tag is ever released as text: a suffix that could still become a
//!   tag is held back until it either completes the tag or can no longer become one
//!   (`</b>`, `a <sea creature>`), and is then released exactly once;
//! - the round ends at the FIRST closing tag in generation order (Search-R1,
//!   arXiv 2503.09516); everything after it is discarded, which also
//!   drops the extra token mistral.rs emits after a stop string;
//! - a document block the model starts writing itself (the profile's
//!   `documents_open`, e.g. `<information>`) is never trusted: the round is cut there;
//! - a tag set with a closing query tag and no opening one starts every round
//!   inside a query: the round's text up to the close is the query (IRCoT,
//!   arXiv 2212.10509, whose every reasoning sentence is the next query). Where
//!   one string closes both a query and an answer (`.` for IRCoT), it closes the
//!   region it is in.

/// What a recognised tag means to the search loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagKind {
    /// Opens a search call (`<search>`, `<|begin_of_query|>`).
    QueryOpen,
    /// Closes a search call (`</search>`, `<|end_of_query|>`).
    QueryClose,
    /// Opens the final answer (`<answer>`).
    AnswerOpen,
    /// Closes the final answer (`</answer>`).
    AnswerClose,
    /// Opens a document block (`<information>`): only the server may write one.
    DocumentsOpen,
    /// Opens a page action (`<access>`).
    PageOpen,
    /// Closes a page action (`</access>`).
    PageClose,
    /// Ends the round wherever it appears, kept (ASearcher's `</think>` after
    /// a page chunk, while more chunks wait).
    Pause,
}

/// The region generated text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Outside any query or answer: thinking and free text.
    Reasoning,
    /// Inside a search call.
    Query,
    /// Inside the answer tags.
    Answer,
    /// Inside a page action: the URL or document to open.
    Page,
}

/// Why a round ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundEnd {
    /// A search call was closed; the raw text between the last open tag and the
    /// close tag (not yet cleaned or stripped).
    Query(String),
    /// The answer was closed; the raw text between the tags (not stripped).
    Answer(String),
    /// A closing tag appeared without its own opening tag before it (an invalid
    /// action in Search-R1's terms).
    Unmatched(TagKind),
    /// The model started writing a document block itself; the round is cut before it.
    DocumentsOpened,
    /// A page action was closed; the raw text between its tags.
    Page(String),
    /// The pause string appeared (see [`TagKind::Pause`]); it is kept.
    Pause,
}

/// One thing the scanner saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEvent {
    /// Text that is definitely not part of a tag, in the region it belongs to.
    Text { region: Region, text: String },
    /// An opening tag: from now on text belongs to `Query` or `Answer`.
    Open(Region),
    /// The round is over; no further event follows until [`TagScanner::reset`].
    End(RoundEnd),
}

/// The tag strings a scanner watches for, taken from a policy profile.
#[derive(Clone, Debug)]
pub struct TagSet {
    tags: Vec<(String, TagKind)>,
    longest: usize,
    /// A closing query tag without an opening one: rounds start in a query.
    opens_in_query: bool,
}

impl TagSet {
    /// Builds a tag set. Empty strings are ignored (a profile without a document
    /// tag passes `""`). With an empty `query_open` and a `query_close`, every
    /// round starts inside a query ([`TagScanner::new`]).
    pub fn new(
        query_open: &str,
        query_close: &str,
        answer_open: &str,
        answer_close: &str,
        documents_open: &str,
    ) -> Self {
        let mut tags: Vec<(String, TagKind)> = [
            (query_open, TagKind::QueryOpen),
            (query_close, TagKind::QueryClose),
            (answer_open, TagKind::AnswerOpen),
            (answer_close, TagKind::AnswerClose),
            (documents_open, TagKind::DocumentsOpen),
        ]
        .into_iter()
        .filter(|(s, _)| !s.is_empty())
        .map(|(s, k)| (s.to_string(), k))
        .collect();
        // Longest first, so that at one position the longest complete tag wins.
        tags.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        let longest = tags.iter().map(|(s, _)| s.len()).max().unwrap_or(0);
        Self {
            tags,
            longest,
            opens_in_query: query_open.is_empty() && !query_close.is_empty(),
        }
    }

    /// Adds a page action's tags (empty strings are ignored).
    pub fn with_pages(self, open: &str, close: &str) -> Self {
        self.with(&[(open, TagKind::PageOpen), (close, TagKind::PageClose)])
    }

    /// Adds a pause string (see [`TagKind::Pause`]); empty is ignored.
    pub fn with_pause(self, pause: &str) -> Self {
        self.with(&[(pause, TagKind::Pause)])
    }

    fn with(mut self, more: &[(&str, TagKind)]) -> Self {
        for (s, k) in more {
            if !s.is_empty() {
                self.tags.push((s.to_string(), *k));
            }
        }
        self.tags.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        self.longest = self.tags.iter().map(|(s, _)| s.len()).max().unwrap_or(0);
        self
    }

    /// The earliest complete tag in `text`: (byte offset, byte length, kind).
    /// Of two equal tags at one position, the one that closes `region` wins.
    fn earliest(&self, text: &str, region: Region) -> Option<(usize, usize, TagKind)> {
        let closes = |kind: TagKind| {
            matches!(
                (kind, region),
                (TagKind::QueryClose, Region::Query)
                    | (TagKind::AnswerClose, Region::Answer)
                    | (TagKind::PageClose, Region::Page)
            )
        };
        let mut best: Option<(usize, usize, TagKind)> = None;
        for (tag, kind) in &self.tags {
            if let Some(pos) = text.find(tag.as_str()) {
                let better = match best {
                    None => true,
                    Some((b, len, k)) => {
                        pos < b || (pos == b && len == tag.len() && closes(*kind) && !closes(k))
                    }
                };
                if better {
                    best = Some((pos, tag.len(), *kind));
                }
            }
        }
        best
    }

    /// Length in bytes of the longest suffix of `text` that is a proper prefix of
    /// some tag (and so must be held back).
    fn partial_suffix(&self, text: &str) -> usize {
        let bytes = text.as_bytes();
        let start = bytes.len().saturating_sub(self.longest.saturating_sub(1));
        for i in start..bytes.len() {
            let suffix = &bytes[i..];
            if self
                .tags
                .iter()
                .any(|(tag, _)| tag.len() > suffix.len() && tag.as_bytes().starts_with(suffix))
            {
                // Tags are valid UTF-8 and start on a character boundary, so a
                // suffix equal to a tag's prefix starts on one too.
                return bytes.len() - i;
            }
        }
        0
    }
}

/// Scans one round of generated text. See the module documentation.
#[derive(Clone, Debug)]
pub struct TagScanner {
    tags: TagSet,
    /// Text received but not yet released (at most a partial tag after `process`).
    pending: String,
    /// Bytes of an incomplete UTF-8 character from `push_bytes` (tests
    /// only: engines send whole characters, [`crate::engine::EngineEvent::Text`]).
    #[cfg(test)]
    utf8_tail: Vec<u8>,
    region: Region,
    /// Raw content of the current query or answer region.
    content: String,
    /// Everything consumed this round, tags included, up to the round's end:
    /// what the transcript keeps.
    kept: String,
    ended: bool,
}

impl TagScanner {
    /// A scanner at the start of a round: in the reasoning region, or inside
    /// a query for a tag set without an opening query tag ([`TagSet::new`]).
    pub fn new(tags: TagSet) -> Self {
        let region = if tags.opens_in_query {
            Region::Query
        } else {
            Region::Reasoning
        };
        Self {
            tags,
            pending: String::new(),
            #[cfg(test)]
            utf8_tail: Vec::new(),
            region,
            content: String::new(),
            kept: String::new(),
            ended: false,
        }
    }

    /// Starts a new round: clears all state except the tag set.
    pub fn reset(&mut self) {
        *self = Self::new(self.tags.clone());
    }

    /// True once the round has ended; later input is ignored.
    pub fn is_done(&self) -> bool {
        self.ended
    }

    /// The raw text of this round kept for the transcript: everything through
    /// the round-ending tag (nothing after it), or everything so far.
    pub fn kept_text(&self) -> &str {
        &self.kept
    }

    /// Feeds a piece of decoded text; appends what it releases to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<ScanEvent>) {
        if self.ended {
            return;
        }
        #[cfg(test)]
        if !self.utf8_tail.is_empty() {
            // A str piece after raw bytes: the incomplete character can never
            // complete, so it is released as U+FFFD like any invalid byte.
            let tail = std::mem::take(&mut self.utf8_tail);
            self.pending.push_str(&String::from_utf8_lossy(&tail));
        }
        self.pending.push_str(text);
        self.process(out);
    }

    /// Feeds raw bytes, which may end (or start) inside a multi-byte UTF-8
    /// character; invalid sequences become U+FFFD. Tests only: they split
    /// input at every byte to check that events do not depend on where the
    /// pieces end.
    #[cfg(test)]
    fn push_bytes(&mut self, bytes: &[u8], out: &mut Vec<ScanEvent>) {
        if self.ended {
            return;
        }
        self.utf8_tail.extend_from_slice(bytes);
        let mut buf = std::mem::take(&mut self.utf8_tail);
        let mut valid_up_to = 0;
        loop {
            match std::str::from_utf8(&buf[valid_up_to..]) {
                Ok(s) => {
                    self.pending.push_str(s);
                    valid_up_to = buf.len();
                    break;
                }
                Err(e) => {
                    let good = valid_up_to + e.valid_up_to();
                    // SAFETY-free: from_utf8 just validated this range.
                    self.pending
                        .push_str(std::str::from_utf8(&buf[valid_up_to..good]).unwrap_or(""));
                    match e.error_len() {
                        Some(bad) => {
                            self.pending.push(char::REPLACEMENT_CHARACTER);
                            valid_up_to = good + bad;
                        }
                        None => {
                            // Incomplete character at the end: keep it for later.
                            valid_up_to = good;
                            break;
                        }
                    }
                }
            }
        }
        buf.drain(..valid_up_to);
        self.utf8_tail = buf;
        self.process(out);
    }

    /// End of generation (EOS or budget): releases everything held back,
    /// including a trailing partial tag such as `</`.
    pub fn finish(&mut self, out: &mut Vec<ScanEvent>) {
        if self.ended {
            return;
        }
        #[cfg(test)]
        if !self.utf8_tail.is_empty() {
            let tail = std::mem::take(&mut self.utf8_tail);
            self.pending.push_str(&String::from_utf8_lossy(&tail));
            self.process(out);
            if self.ended {
                return;
            }
        }
        let rest = std::mem::take(&mut self.pending);
        self.release(&rest, out);
    }

    fn process(&mut self, out: &mut Vec<ScanEvent>) {
        while !self.ended {
            match self.tags.earliest(&self.pending, self.region) {
                Some((pos, len, kind)) => {
                    let before = self.pending[..pos].to_string();
                    self.release(&before, out);
                    let tag = self.pending[pos..pos + len].to_string();
                    self.pending.drain(..pos + len);
                    self.on_tag(kind, &tag, out);
                }
                None => {
                    let hold = self.tags.partial_suffix(&self.pending);
                    let cut = self.pending.len() - hold;
                    if cut > 0 {
                        let text = self.pending[..cut].to_string();
                        self.pending.drain(..cut);
                        self.release(&text, out);
                    }
                    return;
                }
            }
        }
        // The round is over: nothing after the closing tag survives.
        self.pending.clear();
        #[cfg(test)]
        self.utf8_tail.clear();
    }

    fn release(&mut self, text: &str, out: &mut Vec<ScanEvent>) {
        if text.is_empty() {
            return;
        }
        self.kept.push_str(text);
        if self.region != Region::Reasoning {
            self.content.push_str(text);
        }
        // Adjacent text in the same region is merged into one event.
        if let Some(ScanEvent::Text { region, text: last }) = out.last_mut() {
            if *region == self.region {
                last.push_str(text);
                return;
            }
        }
        out.push(ScanEvent::Text {
            region: self.region,
            text: text.to_string(),
        });
    }

    fn on_tag(&mut self, kind: TagKind, tag: &str, out: &mut Vec<ScanEvent>) {
        let end = match kind {
            TagKind::QueryOpen | TagKind::AnswerOpen | TagKind::PageOpen => {
                self.kept.push_str(tag);
                self.region = match kind {
                    TagKind::QueryOpen => Region::Query,
                    TagKind::PageOpen => Region::Page,
                    _ => Region::Answer,
                };
                self.content.clear();
                out.push(ScanEvent::Open(self.region));
                return;
            }
            TagKind::QueryClose if self.region == Region::Query => {
                RoundEnd::Query(std::mem::take(&mut self.content))
            }
            TagKind::AnswerClose if self.region == Region::Answer => {
                RoundEnd::Answer(std::mem::take(&mut self.content))
            }
            TagKind::PageClose if self.region == Region::Page => {
                RoundEnd::Page(std::mem::take(&mut self.content))
            }
            TagKind::QueryClose | TagKind::AnswerClose | TagKind::PageClose => {
                RoundEnd::Unmatched(kind)
            }
            TagKind::Pause => RoundEnd::Pause,
            // The document tag itself is not kept: the round is cut before it.
            TagKind::DocumentsOpen => {
                self.ended = true;
                out.push(ScanEvent::End(RoundEnd::DocumentsOpened));
                return;
            }
        };
        self.kept.push_str(tag);
        self.ended = true;
        out.push(ScanEvent::End(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search_r1() -> TagSet {
        TagSet::new(
            "<search>",
            "</search>",
            "<answer>",
            "</answer>",
            "<information>",
        )
    }

    /// Feeds `pieces` then finishes; returns the events with adjacent text merged.
    fn scan_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> (Vec<ScanEvent>, String) {
        scan_pieces_with(search_r1(), pieces)
    }

    /// `text` as two pieces, split at byte `cut`.
    fn halves(text: &str, cut: usize) -> [&[u8]; 2] {
        let (a, b) = text.as_bytes().split_at(cut);
        [a, b]
    }

    /// [`scan_pieces`] with `tags`.
    fn scan_pieces_with<'a>(
        tags: TagSet,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> (Vec<ScanEvent>, String) {
        let mut s = TagScanner::new(tags);
        let mut out = Vec::new();
        for p in pieces {
            s.push_bytes(p, &mut out);
        }
        s.finish(&mut out);
        (merge(out), s.kept_text().to_string())
    }

    fn merge(events: Vec<ScanEvent>) -> Vec<ScanEvent> {
        let mut merged: Vec<ScanEvent> = Vec::new();
        for e in events {
            if let (
                Some(ScanEvent::Text {
                    region: r1,
                    text: t1,
                }),
                ScanEvent::Text {
                    region: r2,
                    text: t2,
                },
            ) = (merged.last_mut(), &e)
            {
                if r1 == r2 {
                    t1.push_str(t2);
                    continue;
                }
            }
            merged.push(e);
        }
        merged
    }

    fn scan(text: &str) -> Vec<ScanEvent> {
        scan_pieces([text.as_bytes()]).0
    }

    fn text(region: Region, t: &str) -> ScanEvent {
        ScanEvent::Text {
            region,
            text: t.to_string(),
        }
    }

    /// Every split of the input into two pieces, and one piece per byte, gives
    /// the same events and kept text as the unsplit input.
    fn assert_split_invariant(input: &str) {
        let bytes = input.as_bytes();
        let whole = scan_pieces([bytes]);
        for cut in 0..=bytes.len() {
            let split = scan_pieces([&bytes[..cut], &bytes[cut..]]);
            assert_eq!(split, whole, "split at byte {cut} of {input:?}");
        }
        let per_byte = scan_pieces(bytes.chunks(1));
        assert_eq!(per_byte, whole, "one byte per piece of {input:?}");
    }

    #[test]
    fn a_page_action_ends_the_round_with_its_target_at_any_split() {
        let tags = search_r1().with_pages("<access>", "</access>");
        let written = "I will read it. <access> https://a.org/x </access> never kept";
        for cut in 0..=written.len() {
            let (out, kept) = scan_pieces_with(tags.clone(), halves(written, cut));
            assert_eq!(
                out,
                vec![
                    text(Region::Reasoning, "I will read it. "),
                    ScanEvent::Open(Region::Page),
                    text(Region::Page, " https://a.org/x "),
                    ScanEvent::End(RoundEnd::Page(" https://a.org/x ".into())),
                ],
                "cut at {cut}"
            );
            assert_eq!(kept, "I will read it. <access> https://a.org/x </access>");
        }
        // A closing page tag without its opening tag is an invalid action.
        let mut s = TagScanner::new(tags);
        let mut out = Vec::new();
        s.push("oops </access>", &mut out);
        assert_eq!(
            out.last(),
            Some(&ScanEvent::End(RoundEnd::Unmatched(TagKind::PageClose)))
        );
    }

    #[test]
    fn the_pause_string_ends_the_round_in_any_region_and_is_kept() {
        let tags = search_r1().with_pause("</think>");
        for input in ["page 1 says X.</think>\n<search>", "<answer> X</think>"] {
            let mut s = TagScanner::new(tags.clone());
            let mut out = Vec::new();
            s.push(input, &mut out);
            assert_eq!(
                out.last(),
                Some(&ScanEvent::End(RoundEnd::Pause)),
                "{input}"
            );
            let end = input.find("</think>").unwrap() + "</think>".len();
            assert_eq!(s.kept_text(), &input[..end]);
        }
    }

    /// IRCoT's tags (config/policies/ircot.toml): no opening query tag, one
    /// full stop closing both a sentence and the answer.
    fn ircot() -> TagSet {
        TagSet::new("", ".", "answer is:", ".", "Article:")
    }

    #[test]
    fn without_an_opening_tag_each_sentence_is_a_query_at_any_split() {
        let written = "The husband of Ann Lee is Bo Tan. The friends of";
        for cut in 0..=written.len() {
            let (out, kept) = scan_pieces_with(ircot(), halves(written, cut));
            assert_eq!(
                out,
                vec![
                    text(Region::Query, "The husband of Ann Lee is Bo Tan"),
                    ScanEvent::End(RoundEnd::Query("The husband of Ann Lee is Bo Tan".into())),
                ],
                "cut at {cut}"
            );
            assert_eq!(kept, "The husband of Ann Lee is Bo Tan.");
        }
        // The next round starts inside a query again.
        let mut s = TagScanner::new(ircot());
        let mut out = Vec::new();
        s.push("Bo Tan.", &mut out);
        s.reset();
        out.clear();
        s.push("Cy.", &mut out);
        assert_eq!(
            out.last(),
            Some(&ScanEvent::End(RoundEnd::Query("Cy".into())))
        );
    }

    #[test]
    fn a_full_stop_closes_the_answer_once_the_answer_is_open() {
        for written in [
            "So the answer is: Bo Tan, Cy Lee. Done.",
            "The friends of Bo Tan are Cy Lee, so the answer is: Bo Tan, Cy Lee.",
        ] {
            for cut in 0..=written.len() {
                let (out, kept) = scan_pieces_with(ircot(), halves(written, cut));
                assert_eq!(
                    out.last(),
                    Some(&ScanEvent::End(RoundEnd::Answer(" Bo Tan, Cy Lee".into()))),
                    "{written:?} cut at {cut}"
                );
                let end = written.find("Cy Lee.").unwrap() + "Cy Lee.".len();
                assert_eq!(kept, &written[..end]);
            }
        }
        // Articles the model starts writing itself cut the round.
        let mut s = TagScanner::new(ircot());
        let mut out = Vec::new();
        s.push("Article: \"Bo", &mut out);
        assert_eq!(out.last(), Some(&ScanEvent::End(RoundEnd::DocumentsOpened)));
    }

    #[test]
    fn search_call_ends_the_round_and_drops_the_rest() {
        let input =
            "<think>need facts</think>\n<search> Mona Lisa painter </search>\n\n<information>fake";
        let events = scan(input);
        assert_eq!(
            events,
            vec![
                text(Region::Reasoning, "<think>need facts</think>\n"),
                ScanEvent::Open(Region::Query),
                text(Region::Query, " Mona Lisa painter "),
                ScanEvent::End(RoundEnd::Query(" Mona Lisa painter ".into())),
            ]
        );
        let (_, kept) = scan_pieces([input.as_bytes()]);
        assert_eq!(
            kept,
            "<think>need facts</think>\n<search> Mona Lisa painter </search>"
        );
    }

    #[test]
    fn answer_ends_the_round() {
        let events = scan("ok <answer> Leonardo da Vinci </answer> extra token");
        assert_eq!(
            events,
            vec![
                text(Region::Reasoning, "ok "),
                ScanEvent::Open(Region::Answer),
                text(Region::Answer, " Leonardo da Vinci "),
                ScanEvent::End(RoundEnd::Answer(" Leonardo da Vinci ".into())),
            ]
        );
    }

    #[test]
    fn first_closing_tag_in_generation_order_wins() {
        let events = scan("<answer> x </answer><search> y </search>");
        assert_eq!(
            events.last(),
            Some(&ScanEvent::End(RoundEnd::Answer(" x ".into())))
        );
        let events = scan("<search> y </search><answer> x </answer>");
        assert_eq!(
            events.last(),
            Some(&ScanEvent::End(RoundEnd::Query(" y ".into())))
        );
    }

    #[test]
    fn near_misses_are_released_once() {
        assert_eq!(
            scan("a <sea creature> and </b> bold"),
            vec![text(Region::Reasoning, "a <sea creature> and </b> bold")]
        );
        // A trailing partial tag is flushed at EOS.
        assert_eq!(
            scan("almost </"),
            vec![text(Region::Reasoning, "almost </")]
        );
    }

    #[test]
    fn partial_tag_is_held_until_it_resolves() {
        let mut s = TagScanner::new(search_r1());
        let mut out = Vec::new();
        s.push("think <sea", &mut out);
        assert_eq!(out, vec![text(Region::Reasoning, "think ")]);
        out.clear();
        s.push("rch>q", &mut out);
        assert_eq!(
            out,
            vec![ScanEvent::Open(Region::Query), text(Region::Query, "q")]
        );
        out.clear();
        s.push("</sear", &mut out);
        assert!(
            out.is_empty(),
            "a partial closing tag must be held: {out:?}"
        );
        s.push("ch>", &mut out);
        assert_eq!(out, vec![ScanEvent::End(RoundEnd::Query("q".into()))]);
        assert!(s.is_done());
        out.clear();
        s.push("more", &mut out);
        s.finish(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn model_written_document_block_cuts_the_round() {
        let events = scan("I recall <information>Doc 1(Title: fake)</information>");
        assert_eq!(
            events,
            vec![
                text(Region::Reasoning, "I recall "),
                ScanEvent::End(RoundEnd::DocumentsOpened),
            ]
        );
        let (_, kept) = scan_pieces([b"I recall <information>x".as_slice()]);
        assert_eq!(kept, "I recall ");
    }

    #[test]
    fn closing_tag_without_opening_is_unmatched() {
        assert_eq!(
            scan("just text </search> after").last(),
            Some(&ScanEvent::End(RoundEnd::Unmatched(TagKind::QueryClose)))
        );
        assert_eq!(
            scan("<search> q </answer>").last(),
            Some(&ScanEvent::End(RoundEnd::Unmatched(TagKind::AnswerClose)))
        );
    }

    #[test]
    fn a_second_open_tag_restarts_the_query() {
        assert_eq!(
            scan("<search> a <search> b </search>").last(),
            Some(&ScanEvent::End(RoundEnd::Query(" b ".into())))
        );
    }

    #[test]
    fn every_split_gives_the_same_events() {
        for input in [
            "<think>I should look this up.</think>\n<search> Who painted the Mona Lisa? </search>",
            "<answer> Leonardo da Vinci </answer>",
            "no tags at all, just an answer.",
            "a <sea creature> </b> <answe <answer>ok</answer>",
            "ends in a partial </sear",
            "<search> café – 東京 🦀 </search>",
            "ü<search>ö</search>",
            "<<search>>x</search></search>",
            "text <information> hallucinated </information>",
            "",
        ] {
            assert_split_invariant(input);
        }
    }

    #[test]
    fn bytes_split_inside_a_character_are_reassembled() {
        let input = "é🦀<search>東京</search>";
        let bytes = input.as_bytes();
        let (events, kept) = scan_pieces(bytes.chunks(1));
        assert_eq!(kept, input);
        assert_eq!(
            events.last(),
            Some(&ScanEvent::End(RoundEnd::Query("東京".into())))
        );
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let (events, _) = scan_pieces([b"a\xffb".as_slice()]);
        assert_eq!(events, vec![text(Region::Reasoning, "a\u{fffd}b")]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Text built from tag fragments, near misses and multi-byte characters.
        fn transcript() -> impl Strategy<Value = String> {
            let fragment = prop::sample::select(vec![
                "<search>",
                "</search>",
                "<answer>",
                "</answer>",
                "<information>",
                "<",
                "</",
                ">",
                "<sea",
                "rch>",
                "</sear",
                "ch>",
                "<ans",
                "wer>",
                "</b>",
                "<sea creature>",
                "a",
                "query",
                " ",
                "\n",
                "\r\n",
                "\t",
                "é",
                "東京",
                "🦀",
                "\u{fffd}",
                "<<",
                "</<",
            ]);
            prop::collection::vec(fragment, 0..40).prop_map(|parts| parts.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any split, including inside tags and inside multi-byte characters,
            /// gives the same events and the same kept text as the whole input.
            #[test]
            fn any_split_gives_the_same_events(
                text in transcript(),
                cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
            ) {
                let bytes = text.as_bytes();
                let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
                points.sort_unstable();
                points.dedup();
                let mut pieces = Vec::new();
                let mut start = 0;
                for p in points {
                    pieces.push(&bytes[start..p]);
                    start = p;
                }
                pieces.push(&bytes[start..]);
                let whole = scan_pieces([bytes]);
                let split = scan_pieces(pieces);
                prop_assert_eq!(&split, &whole);
                // No released text contains a complete tag, and none ends in U+FFFD
                // unless the input had one.
                for event in &whole.0 {
                    if let ScanEvent::Text { text: t, .. } = event {
                        for tag in ["<search>", "</search>", "<answer>", "</answer>", "<information>"] {
                            prop_assert!(!t.contains(tag), "{:?} leaked in {:?}", tag, t);
                        }
                        if !text.contains('\u{fffd}') {
                            prop_assert!(!t.contains(char::REPLACEMENT_CHARACTER), "U+FFFD in {t:?}");
                        }
                    }
                }
                // The kept text is a prefix of the input.
                prop_assert!(text.starts_with(&whole.1));
            }
        }
    }
}
