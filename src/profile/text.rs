//! What a rollout asks of a profile: the question as the policy saw it, the
//! prompt, the tag set and stop strings, cleaned queries, the splice in the
//! trained format, and the round's text; plus [`defuse`], which makes control
//! tags and tokens in untrusted text inert.

use super::{CleanedQueries, Profile, PromptFormat, PromptText, QueryOutcome, SpliceFormat};
use crate::chat::{ChatTurn, Role};
use crate::pyjson::{dumps_indent2, py_repr, PyValue};
use crate::scanner::TagSet;

/// One chunk of an opened page, as spliced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageChunk {
    /// What the model reads right after the page action.
    pub full: String,
    /// What later prompts carry instead, once the chunk was read
    /// (`pages.short_chars`); `None` keeps the full chunk.
    pub short: Option<String>,
}

impl Profile {
    /// The question as the policy saw it in training: stripped, with a trailing
    /// `?` added when `question_mark` is set and none is there (Search-R1).
    pub fn normalize_question(&self, question: &str) -> String {
        let mut q = question.trim().to_string();
        if self.question_mark && !q.ends_with('?') {
            q.push('?');
        }
        q
    }

    /// The user message for `question` (normalised first); for `raw` profiles,
    /// the whole raw prompt.
    pub fn user_message(&self, question: &str) -> String {
        self.user_text(question, "")
    }

    /// The user message (raw prompt) with `documents` at `{documents}`.
    fn user_text(&self, question: &str, documents: &str) -> String {
        let q = self.normalize_question(question);
        self.prompt_user
            .as_ref()
            .or(self.prompt_raw.as_ref())
            .map(|t| {
                t.render(&[
                    ("question", &q),
                    ("date", &today()),
                    ("documents", documents),
                ])
            })
            .unwrap_or_default()
    }

    /// The prompt for the conversation `history`, whose turn `question_at` (a
    /// user turn) holds the question. `documents_first`, the question
    /// search's block, is placed before the instruction
    /// ([`super::QuestionSearch::User`]), or at `{documents}` in the prompt's
    /// texts ([`super::QuestionSearch::Prompt`]).
    ///
    /// `chat`: the history up to the question, the question turn replaced by the
    /// instruction. `system`: the profile's system message, then the history's
    /// non-system turns likewise. `raw`: the raw prompt alone.
    pub fn prompt(
        &self,
        history: &[ChatTurn],
        question_at: usize,
        documents_first: Option<&str>,
    ) -> PromptText {
        let question = &history[question_at].content;
        let in_prompt = self.search_question_first == super::QuestionSearch::Prompt;
        let (before, documents) = match documents_first {
            Some(d) if in_prompt => ("", d),
            Some(d) => (d, ""),
            None => ("", ""),
        };
        let mut instruction = before.to_string();
        instruction.push_str(&self.user_text(question, documents));
        match self.prompt_format {
            PromptFormat::Raw => PromptText::Raw(instruction),
            PromptFormat::Chat | PromptFormat::System => {
                let mut turns = Vec::with_capacity(question_at + 2);
                if let Some(system) = &self.prompt_system {
                    turns.push(ChatTurn::new(
                        Role::System,
                        system.render(&[
                            ("question", &self.normalize_question(question)),
                            ("date", &today()),
                            ("documents", documents),
                        ]),
                    ));
                }
                for (i, turn) in history[..=question_at].iter().enumerate() {
                    if self.prompt_system.is_some() && turn.role == Role::System {
                        continue;
                    }
                    let content = if i == question_at {
                        instruction.clone()
                    } else {
                        turn.content.clone()
                    };
                    turns.push(ChatTurn {
                        content,
                        ..turn.clone()
                    });
                }
                // Function calls made after the question and their results
                // (a client continuing after running its functions) follow
                // it, as the template renders them.
                turns.extend(
                    history[question_at + 1..]
                        .iter()
                        .filter(|t| t.is_tool_turn())
                        .cloned(),
                );
                PromptText::Chat(turns)
            }
        }
    }

    /// The functions to pass to the chat template as `tools`: those of a
    /// tool-calling profile whose `tools.render` is `template`; none otherwise.
    pub fn template_tools(&self) -> &[serde_json::Value] {
        match &self.tools {
            Some(tools) if tools.render == super::ToolRender::Template => &tools.functions,
            _ => &[],
        }
    }

    /// The tags the scanner watches for.
    /// A tool-calling profile's scanner leaves the call tags out: its round
    /// ends with the turn, and the turn's calls are read as a whole
    /// ([`crate::toolcall::parse_turn`]).
    pub fn tag_set(&self) -> TagSet {
        let (open, close) = if self.tools.is_some() {
            ("", "")
        } else {
            (self.query_open.as_str(), self.query_close.as_str())
        };
        let tags = TagSet::new(
            open,
            close,
            &self.answer_open,
            &self.answer_close,
            &self.documents_open,
        );
        match &self.pages {
            Some(p) => tags.with_pages(&p.open, &p.close),
            None => tags,
        }
    }

    /// The tags of a round that reads a page chunk while more wait: the
    /// usual ones plus the pause string.
    pub fn reading_tag_set(&self) -> TagSet {
        match &self.pages {
            Some(p) => self.tag_set().with_pause(&p.pause),
            None => self.tag_set(),
        }
    }

    /// The chunks an opened page is spliced as (see [`super::Pages`]): its
    /// text cut to `chunk_chars × max_chunks` characters, split every
    /// `chunk_chars`, each rendered with `pages.chunk`; with `short_chars`,
    /// also each chunk's short form. Text is defused like documents (this
    /// profile's tags, then `also`). Empty for a profile without pages or a
    /// page without text.
    pub fn page_chunks(
        &self,
        url: &str,
        title: &str,
        text: &str,
        also: &[String],
    ) -> Vec<PageChunk> {
        let Some(pages) = &self.pages else {
            return Vec::new();
        };
        let clean = |t: &str| defuse(&self.neutralise(t), also).into_owned();
        let (url, title) = (clean(url), clean(title));
        let text = clean(text);
        let mut chunks = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() && chunks.len() < pages.max_chunks {
            let cut = rest
                .char_indices()
                .nth(pages.chunk_chars)
                .map_or(rest.len(), |(i, _)| i);
            let (piece, after) = rest.split_at(cut);
            let n = (chunks.len() + 1).to_string();
            let render = |t: &str| {
                pages.chunk.render(&[
                    ("n", n.as_str()),
                    ("text", t),
                    ("url", url.as_str()),
                    ("title", title.as_str()),
                ])
            };
            let short = (pages.short_chars > 0).then(|| {
                let end = piece
                    .char_indices()
                    .nth(pages.short_chars)
                    .map_or(piece.len(), |(i, _)| i);
                render(&piece[..end])
            });
            chunks.push(PageChunk {
                full: render(piece),
                short,
            });
            rest = after;
        }
        chunks
    }

    /// What is spliced for a page that could not be opened (`pages.failed`).
    pub fn page_failed(&self, url: &str, reason: &str, also: &[String]) -> String {
        let Some(pages) = &self.pages else {
            return String::new();
        };
        let clean = |t: &str| defuse(&self.neutralise(t), also).into_owned();
        pages
            .failed
            .render(&[("reason", &clean(reason)), ("url", &clean(url))])
    }

    /// Strings at which the engine should stop: the closing tags and the
    /// profile's extra stops (the scanner still cuts exactly, since the engine
    /// stops one token late).
    /// A tool-calling profile does not stop at the call's closing tag: a
    /// turn may hold several calls.
    pub fn stop_strings(&self) -> Vec<String> {
        let mut stops = vec![self.answer_close.clone()];
        if self.tools.is_none() {
            stops.insert(0, self.query_close.clone());
        }
        if let Some(p) = &self.pages {
            stops.insert(1, p.close.clone());
        }
        stops.extend(self.stop.iter().cloned());
        stops
    }

    /// Cleans a search call's raw content into queries: split on the separator
    /// (if any), the profile's `remove` substrings deleted, every run of
    /// whitespace (newlines, tabs, CRLF) made one space, stripped; empty queries
    /// dropped; each cut to `max_query_chars` characters; at most `max_queries`
    /// kept. Truncation and the cap are reported in `notes`.
    pub fn clean_queries(&self, raw: &str) -> CleanedQueries {
        let parts: Vec<&str> = if self.query_separator.is_empty() {
            vec![raw]
        } else {
            raw.split(self.query_separator.as_str()).collect()
        };
        let mut out = CleanedQueries::default();
        for part in parts {
            let mut q = part.to_string();
            for r in &self.query_remove {
                if !r.is_empty() {
                    q = q.replace(r.as_str(), "");
                }
            }
            let mut q = crate::search::clean::collapse_whitespace(&q);
            if q.is_empty() {
                continue;
            }
            if let Some((cut, _)) = q.char_indices().nth(self.max_query_chars) {
                q.truncate(cut);
                let q_trimmed = q.trim_end().to_string();
                out.notes.push(format!(
                    "query truncated to {} characters: {q_trimmed:?}",
                    self.max_query_chars
                ));
                q = q_trimmed;
            }
            out.queries.push(q);
        }
        if out.queries.len() > self.max_queries {
            out.notes.push(format!(
                "kept the first {} of {} queries (the per-call cap); dropped {:?}",
                self.max_queries,
                out.queries.len(),
                &out.queries[self.max_queries..]
            ));
            out.queries.truncate(self.max_queries);
        }
        out
    }

    /// `text` with every control tag of this profile defused, so a document
    /// can neither close the document block nor start a search or an answer:
    /// `<` and `>` of each occurrence (ASCII case-insensitive) become `‹` and
    /// `›`, e.g. `</information>` → `‹/information›`. Other text is untouched.
    pub fn neutralise<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        defuse(text, &self.control_tags)
    }

    /// The text of one query's documents: each through `splice.document` with
    /// `i` = 1..k, joined by `splice.separator`, stripped when `strip_docs`;
    /// `no_documents` when there are none; the `failed` text on failure.
    /// Document text is defused twice over: this profile's control tags, then
    /// `also` (the tokenizer's control tokens).
    pub(super) fn docs_text(&self, outcome: QueryOutcome<'_>, also: &[String]) -> String {
        let clean = |text: &str| defuse(&self.neutralise(text), also).into_owned();
        let docs = match outcome {
            QueryOutcome::Failed(reason) => {
                return self.failed.render(&[("reason", &clean(reason))])
            }
            QueryOutcome::Documents([]) => return self.no_documents.clone(),
            QueryOutcome::Documents(docs) => docs,
        };
        let mut joined = String::new();
        for (i, doc) in docs.iter().enumerate() {
            if i > 0 {
                joined.push_str(&self.splice_separator);
            }
            let rank = (i + 1).to_string();
            self.splice_document
                .render_into(&mut joined, |field, out| match field {
                    "i" => out.push_str(&rank),
                    "id" => out.push_str(&doc.id),
                    "title" => out.push_str(&clean(&doc.title)),
                    "text" => out.push_str(&clean(&doc.text)),
                    "url" => out.push_str(doc.url.as_deref().unwrap_or("")),
                    "link" => out.push_str(&clean(doc.url.as_deref().unwrap_or(&doc.id))),
                    "title_py" => out.push_str(&py_repr(&clean(&doc.title))),
                    "text_py" => out.push_str(&py_repr(&clean(&doc.text))),
                    "url_py" => out.push_str(&py_repr(doc.url.as_deref().unwrap_or(""))),
                    _ => {}
                });
        }
        if self.strip_docs {
            joined.trim().to_string()
        } else {
            joined
        }
    }

    /// The text spliced after a search call for its queries' outcomes, byte
    /// for byte in the policy's trained format (`splice.block` with `{docs}`).
    #[cfg(any(test, feature = "testing"))]
    pub fn render_splice(&self, results: &[(&str, QueryOutcome<'_>)]) -> String {
        self.render_splice_defusing(results, &[])
    }

    /// [`Profile::render_splice`], with `also` (the tokenizer's control
    /// tokens, [`crate::engine::text::PolicyText::special_tokens`]) defused in every
    /// document and failure text as the profile's own tags are.
    pub fn render_splice_defusing(
        &self,
        results: &[(&str, QueryOutcome<'_>)],
        also: &[String],
    ) -> String {
        let docs = match self.splice_format {
            SpliceFormat::Text => results
                .iter()
                .map(|(_, outcome)| self.docs_text(*outcome, also))
                .collect::<Vec<_>>()
                .join("\n"),
            SpliceFormat::Json => dumps_indent2(&PyValue::Object(vec![
                (
                    "query".into(),
                    PyValue::List(
                        results
                            .iter()
                            .map(|(q, _)| PyValue::Str((*q).to_string()))
                            .collect(),
                    ),
                ),
                (
                    "documents".into(),
                    PyValue::List(
                        results
                            .iter()
                            .map(|(_, outcome)| PyValue::Str(self.docs_text(*outcome, also)))
                            .collect(),
                    ),
                ),
            ])),
        };
        self.splice_block.render(&[("docs", &docs)])
    }

    /// The round's generated text as the transcript keeps it: `kept` ends with
    /// the closing tag; with `strip_round` the text before the tag is stripped.
    pub fn round_text(&self, kept: &str, closing_tag: &str) -> String {
        if !self.strip_round {
            return kept.to_string();
        }
        let body = kept.strip_suffix(closing_tag).unwrap_or(kept);
        format!("{}{closing_tag}", body.trim())
    }
}

/// Today's date (UTC) as `YYYY-MM-DD`, for prompts that state it.
fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

/// What opens a boxed answer: `\boxed` and its opening brace.
const BOXED: &str = "\\boxed{";

/// The content of the last `\boxed{…}` in `text` (braces inside balanced),
/// as ReCall and the math-style policies write their answer; `None` when
/// there is none or it never closes.
pub(crate) fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind(BOXED)? + BOXED.len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` with each occurrence of each of `strings` (ASCII case-insensitive)
/// made inert: its `<` and `>` become `‹` and `›` (`<|im_start|>` →
/// `‹|im_start|›`, `</search>` → `‹/search›`); a string without angle
/// brackets (`[INST]`) gets a zero-width space (U+200B) after its first
/// character. A tokenizer then reads none of them as a control token, and the
/// tag scanner none as a tag. Other text is untouched (borrowed).
pub fn defuse<'t>(text: &'t str, strings: &[String]) -> std::borrow::Cow<'t, str> {
    let mut out = std::borrow::Cow::Borrowed(text);
    if strings.is_empty() {
        return out;
    }
    // Lower-cased once; again only after a replacement changed the text.
    let mut lower = text.to_ascii_lowercase();
    for tag in strings.iter().filter(|t| !t.is_empty()) {
        let needle = tag.to_ascii_lowercase();
        if !lower.contains(&needle) {
            continue;
        }
        let mut fixed = String::with_capacity(out.len() + 8);
        let mut from = 0;
        while let Some(rel) = lower[from..].find(&needle) {
            let at = from + rel;
            fixed.push_str(&out[from..at]);
            let found = &out[at..at + needle.len()];
            if found.contains(['<', '>']) {
                fixed.push_str(&found.replace('<', "‹").replace('>', "›"));
            } else {
                let first = found.chars().next().map_or(0, char::len_utf8);
                fixed.push_str(&found[..first]);
                fixed.push('\u{200B}');
                fixed.push_str(&found[first..]);
            }
            from = at + needle.len();
        }
        fixed.push_str(&out[from..]);
        lower = fixed.to_ascii_lowercase();
        out = std::borrow::Cow::Owned(fixed);
    }
    out
}

#[cfg(test)]
mod tests {

    use crate::profile::shipped as load;

    #[test]
    fn search_r1_prompt_matches_the_paper_text() {
        let p = load("search-r1");
        assert_eq!(
            p.user_message("  who painted the Mona Lisa "),
            "Answer the given question. You must conduct reasoning inside <think> and </think> \
             first every time you get new information. After reasoning, if you find you lack \
             some knowledge, you can call a search engine by <search> query </search> and it \
             will return the top searched results between <information> and </information>. \
             You can search as many times as your want. If you find no further external \
             knowledge needed, you can directly provide the answer inside <answer> and \
             </answer>, without detailed illustrations. For example, <answer> Beijing \
             </answer>. Question: who painted the Mona Lisa?\n"
        );
        assert_eq!(p.normalize_question("Is it?"), "Is it?");
    }

    #[test]
    fn rag_puts_the_question_documents_in_its_system_message() {
        use crate::chat::{ChatTurn, Role};
        use crate::profile::PromptText;
        let p = load("rag");
        let history = [ChatTurn::new(Role::User, "Who is the husband of Aida Wang")];
        let docs = "Doc 1(Title: \"Aida Wang\") The husband of Aida Wang is Ryan Wang.\n";
        let PromptText::Chat(turns) = p.prompt(&history, 0, Some(docs)) else {
            panic!("a chat prompt");
        };
        assert_eq!(turns.len(), 2);
        assert_eq!(
            turns[0].content,
            format!(
                "Answer the question based on the given document.Only give me the answer and do \
                 not output any other words.\nThe following are given documents.\n\n{docs}"
            )
        );
        assert_eq!(
            turns[1].content,
            "Question: Who is the husband of Aida Wang"
        );
        // Without documents (the prompt's size check) the field is empty.
        let PromptText::Chat(bare) = p.prompt(&history, 0, None) else {
            panic!("a chat prompt");
        };
        assert!(
            bare[0].content.ends_with("documents.\n\n"),
            "{:?}",
            bare[0].content
        );
    }

    #[test]
    fn queries_are_cleaned_split_capped_and_truncated_visibly() {
        let mq = load("rag-r1-mq");
        let cleaned = mq.clean_queries(" a ,, b\n\tc ,  , d, e ");
        assert_eq!(cleaned.queries, ["a", "b c", "d"]);
        assert_eq!(cleaned.notes.len(), 1);
        assert!(
            cleaned.notes[0].contains("first 3 of 4"),
            "{:?}",
            cleaned.notes
        );

        let r1 = load("r1-searcher");
        let cleaned = r1.clean_queries(" \"Mona\" 'Lisa'... painter\r\n");
        assert_eq!(cleaned.queries, ["Mona Lisa painter"]);

        let s = load("search-r1");
        assert!(s.clean_queries(" \n\t ").queries.is_empty());
        let long = "é".repeat(600);
        let cleaned = s.clean_queries(&long);
        assert_eq!(cleaned.queries[0].chars().count(), 512);
        assert!(cleaned.notes[0].contains("truncated to 512"));
    }
}
