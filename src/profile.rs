//! Policy profiles: one TOML file per search policy in `config/policies/`.
//!
//! A profile is data, not code: how the prompt is built, the tag strings, how a
//! query is cleaned and split, the document block the policy was trained on,
//! what to splice when there is nothing to search or nothing found, and the
//! rollout limits. The formats reproduced are documented, with their sources,
//! in each profile file and in the README's Policies section.
//!
//! Loading is strict: an unknown or missing key, a key that does not apply to
//! the prompt format, or a template that names an unknown field is an error
//! naming the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::{ChatTurn, Role};
use crate::pyjson::{dumps_indent2, PyValue};
use crate::scanner::TagSet;
use crate::search::Document;
use crate::template::{Template, TemplateError};

/// Fields a prompt template may use.
const PROMPT_FIELDS: &[&str] = &["question"];
/// Fields the document block template may use.
const BLOCK_FIELDS: &[&str] = &["docs"];
/// Fields a per-document template may use: `i` is the 1-based rank.
const DOCUMENT_FIELDS: &[&str] = &["i", "id", "title", "text", "url"];
/// Fields of the failed-search text.
const FAILED_FIELDS: &[&str] = &["reason"];

/// How the prompt reaches the model.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// `prompt.user` as the user message, through the checkpoint's chat template
    /// with the generation prompt (Search-R1, RAG-R1).
    Chat,
    /// `prompt.system` as the system message and `prompt.user` as the user
    /// message, through the chat template (R1-Searcher's instruct checkpoint).
    System,
    /// `prompt.raw` as is, with no chat template (R1-Searcher's base checkpoint).
    Raw,
}

/// Whether and where the question itself is searched and spliced before the
/// first generated token (for models that never learned the search tags).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QuestionSearch {
    /// No search before the model asks for one (trained policies).
    Off,
    /// The document block right after the prompt, where the results of a
    /// search call made by the model would go.
    Assistant,
    /// The document block, without its surrounding whitespace, then `\n`, at
    /// the start of the user message (of the raw prompt for `raw`), before the
    /// instruction: the layout small untrained instruct models answer from best.
    User,
}

/// What the answer is when a rollout ends (EOS, token budget, round cap)
/// without a closed answer tag.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFallback {
    /// No answer: the trained policies must use the answer tag.
    None,
    /// The text generated after the last splice, outside search calls,
    /// stripped: for untrained instruct models that answer in plain text.
    AfterLastSplice,
}

/// How a round's documents are written into the block.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SpliceFormat {
    /// Each query's documents through `splice.document`, joined by
    /// `splice.separator`; several queries' texts joined by a newline.
    Text,
    /// `json.dumps({"query": [q1, ...], "documents": [d1, ...]}, indent=2)` with
    /// each `d_j` the text of query j's documents (RAG-R1 multi-query).
    Json,
}

/// What happens when the model calls a search after `max_searches`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RoundCap {
    /// The round after the cap is generated, but a search call in it is not
    /// run: the rollout ends there (`finish_reason: length`) (Search-R1).
    FinalRound,
    /// No further round: the rollout ends at the cap.
    Stop,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    description: String,
    #[serde(default)]
    unconfirmed: Option<String>,
    prompt: PromptSpec,
    tags: TagSpec,
    query: QuerySpec,
    splice: SpliceSpec,
    rollout: RolloutSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSpec {
    format: PromptFormat,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    assistant_prefix: String,
    question_mark: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TagSpec {
    query_open: String,
    query_close: String,
    answer_open: String,
    answer_close: String,
    #[serde(default)]
    documents_open: String,
    #[serde(default)]
    stop: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuerySpec {
    #[serde(default)]
    separator: String,
    max_queries: usize,
    max_chars: usize,
    #[serde(default)]
    remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpliceSpec {
    format: SpliceFormat,
    block: String,
    document: String,
    #[serde(default)]
    separator: String,
    strip_docs: bool,
    no_documents: String,
    failed: String,
    no_query: String,
    invalid_action: String,
    strip_round: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutSpec {
    top_k: usize,
    max_searches: usize,
    #[serde(default)]
    max_round_tokens: usize,
    on_round_cap: RoundCap,
    search_question_first: QuestionSearch,
    answer_fallback: AnswerFallback,
}

/// A profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read policy profile {file}: {error}")]
    Io {
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("no policy profiles (*.toml) in {0}")]
    Empty(PathBuf),
    #[error("policy profile {file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("policy profile {file}: key `{key}`: {error}")]
    Template {
        file: PathBuf,
        key: &'static str,
        error: TemplateError,
    },
    #[error("policy profile {file}: key `{key}`: {message}")]
    Invalid {
        file: PathBuf,
        key: &'static str,
        message: String,
    },
    #[error("policy profiles {first} and {second} both use the name {name:?}")]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
}

/// The prompt a profile builds, before the engine renders it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptText {
    /// Messages for the model's chat template (with the generation prompt).
    Chat(Vec<ChatTurn>),
    /// Text used as is.
    Raw(String),
}

/// A search call's raw content, cleaned into queries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanedQueries {
    /// The queries to run, in order, none empty.
    pub queries: Vec<String>,
    /// What was changed, for the trace (truncation, the per-call cap).
    pub notes: Vec<String>,
}

/// One query's outcome as the splice renders it.
#[derive(Clone, Copy, Debug)]
pub enum QueryOutcome<'a> {
    /// Documents found, best first (may be empty).
    Documents(&'a [Document]),
    /// The search failed, with a short reason.
    Failed(&'a str),
}

/// A validated policy profile.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Name clients and the config refer to (`search-r1`).
    pub name: String,
    /// One line for `/v1/models` and `seeker policies`.
    pub description: String,
    /// Why parts of the profile are not confirmed by a published source, if so.
    pub unconfirmed: Option<String>,
    /// Where the profile was loaded from.
    pub source: PathBuf,
    pub prompt_format: PromptFormat,
    prompt_system: Option<Template>,
    prompt_user: Option<Template>,
    prompt_raw: Option<Template>,
    /// Text after the rendered prompt, before the first generated token
    /// (R1-Searcher's instruct checkpoint: `<think>`).
    pub assistant_prefix: String,
    /// Append `?` to a question that does not end in one (Search-R1 does).
    pub question_mark: bool,
    pub query_open: String,
    pub query_close: String,
    pub answer_open: String,
    pub answer_close: String,
    /// A document-block opening tag the model must never write itself; empty if none.
    pub documents_open: String,
    /// More strings that end generation, such as end-of-turn tokens written as
    /// text (R1-Searcher stops at `<|im_end|>` and `<|endoftext|>`).
    pub stop: Vec<String>,
    /// Splits a search call into several queries; empty for one query per call.
    pub query_separator: String,
    /// Queries per call kept (the rest are dropped, visibly in the trace).
    pub max_queries: usize,
    /// Characters per query kept (the rest is cut, visibly in the trace).
    pub max_query_chars: usize,
    /// Substrings removed from queries (R1-Searcher removes `"`, `'` and `...`).
    pub query_remove: Vec<String>,
    pub splice_format: SpliceFormat,
    splice_block: Template,
    splice_document: Template,
    splice_separator: String,
    strip_docs: bool,
    no_documents: String,
    failed: Template,
    /// Spliced after a search call that held no usable query.
    pub no_query: String,
    /// Spliced after an invalid action (a closing tag without its opening tag,
    /// or a document block the model wrote itself); empty ends the rollout.
    pub invalid_action: String,
    /// Strip the round's generated text before re-appending the closing tag
    /// (R1-Searcher: `generated_text.strip() + "<|end_of_query|>"`).
    pub strip_round: bool,
    /// Documents per query (Search-R1: 3).
    pub top_k: usize,
    /// Search calls the model may make (Search-R1: 4).
    pub max_searches: usize,
    /// Tokens one round may generate; 0 for no limit but the request's budget
    /// (R1-Searcher: 512). A round that reaches it ends the rollout.
    pub max_round_tokens: usize,
    pub on_round_cap: RoundCap,
    /// Search the user's question and splice the results before the first
    /// token, and where: for models that never learned the search tags.
    pub search_question_first: QuestionSearch,
    pub answer_fallback: AnswerFallback,
    /// Tags a document must not carry verbatim: query, answer and document
    /// tags, stop strings, and every `<...>` tag in `splice.block` (those with
    /// an angle bracket).
    control_tags: Vec<String>,
}

/// A tag written in a splice block: `<information>`, `<|end_of_documents|>`.
static BLOCK_TAG: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(r"<[^<>\s]{1,64}>").expect("valid regex"));

impl Profile {
    /// Loads and validates one profile file.
    ///
    /// # Errors
    /// [`ProfileError`] naming the file and, where it applies, the key.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|error| ProfileError::Io {
            file: path.to_path_buf(),
            error,
        })?;
        Self::parse(&text, path)
    }

    /// Parses a profile from TOML text; `path` is used in error messages.
    ///
    /// # Errors
    /// As [`Profile::load`].
    pub fn parse(text: &str, path: &Path) -> Result<Self, ProfileError> {
        let file = path.to_path_buf();
        let raw: ProfileFile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            file: file.clone(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        let template = |key: &'static str, src: &str, allowed: &[&str]| {
            Template::parse(src, allowed).map_err(|error| ProfileError::Template {
                file: file.clone(),
                key,
                error,
            })
        };
        let invalid = |key: &'static str, message: &str| ProfileError::Invalid {
            file: file.clone(),
            key,
            message: message.to_string(),
        };
        for (key, tag) in [
            ("tags.query_open", &raw.tags.query_open),
            ("tags.query_close", &raw.tags.query_close),
            ("tags.answer_open", &raw.tags.answer_open),
            ("tags.answer_close", &raw.tags.answer_close),
        ] {
            if tag.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        if raw.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if raw.rollout.top_k == 0 {
            return Err(invalid("rollout.top_k", "must be at least 1"));
        }
        if raw.query.max_queries == 0 {
            return Err(invalid("query.max_queries", "must be at least 1"));
        }
        if raw.query.max_chars == 0 {
            return Err(invalid("query.max_chars", "must be at least 1"));
        }
        if raw.tags.stop.iter().any(String::is_empty) {
            return Err(invalid("tags.stop", "must not contain an empty string"));
        }
        let p = &raw.prompt;
        // (key, present) pairs a format requires, and those it does not use.
        type Keys<'k> = &'k [(&'static str, bool)];
        let (needs, unused): (Keys, Keys) = match p.format {
            PromptFormat::Chat => (
                &[("prompt.user", p.user.is_some())],
                &[
                    ("prompt.system", p.system.is_some()),
                    ("prompt.raw", p.raw.is_some()),
                ],
            ),
            PromptFormat::System => (
                &[
                    ("prompt.system", p.system.is_some()),
                    ("prompt.user", p.user.is_some()),
                ],
                &[("prompt.raw", p.raw.is_some())],
            ),
            PromptFormat::Raw => (
                &[("prompt.raw", p.raw.is_some())],
                &[
                    ("prompt.system", p.system.is_some()),
                    ("prompt.user", p.user.is_some()),
                ],
            ),
        };
        if let Some((key, _)) = needs.iter().find(|(_, present)| !present) {
            return Err(invalid(key, "is required by this prompt format"));
        }
        if let Some((key, _)) = unused.iter().find(|(_, present)| *present) {
            return Err(invalid(key, "is not used by this prompt format; remove it"));
        }
        let optional = |key: &'static str, src: &Option<String>| {
            src.as_deref()
                .map(|s| template(key, s, PROMPT_FIELDS))
                .transpose()
        };
        let mut control_tags: Vec<String> = [
            &raw.tags.query_open,
            &raw.tags.query_close,
            &raw.tags.answer_open,
            &raw.tags.answer_close,
            &raw.tags.documents_open,
        ]
        .into_iter()
        .chain(&raw.tags.stop)
        .cloned()
        .chain(
            BLOCK_TAG
                .find_iter(&raw.splice.block)
                .map(|m| m.as_str().to_string()),
        )
        // Only a tag with an angle bracket can be defused (see `neutralise`).
        .filter(|t| t.contains(['<', '>']))
        .collect();
        control_tags.sort();
        control_tags.dedup();
        Ok(Self {
            control_tags,
            prompt_system: optional("prompt.system", &p.system)?,
            prompt_user: optional("prompt.user", &p.user)?,
            prompt_raw: optional("prompt.raw", &p.raw)?,
            splice_block: template("splice.block", &raw.splice.block, BLOCK_FIELDS)?,
            splice_document: template("splice.document", &raw.splice.document, DOCUMENT_FIELDS)?,
            failed: template("splice.failed", &raw.splice.failed, FAILED_FIELDS)?,
            assistant_prefix: raw.prompt.assistant_prefix,
            name: raw.name,
            description: raw.description,
            unconfirmed: raw.unconfirmed,
            source: file,
            prompt_format: raw.prompt.format,
            question_mark: raw.prompt.question_mark,
            query_open: raw.tags.query_open,
            query_close: raw.tags.query_close,
            answer_open: raw.tags.answer_open,
            answer_close: raw.tags.answer_close,
            documents_open: raw.tags.documents_open,
            stop: raw.tags.stop,
            query_separator: raw.query.separator,
            max_queries: raw.query.max_queries,
            max_query_chars: raw.query.max_chars,
            query_remove: raw.query.remove,
            splice_format: raw.splice.format,
            splice_separator: raw.splice.separator,
            strip_docs: raw.splice.strip_docs,
            no_documents: raw.splice.no_documents,
            no_query: raw.splice.no_query,
            invalid_action: raw.splice.invalid_action,
            strip_round: raw.splice.strip_round,
            top_k: raw.rollout.top_k,
            max_searches: raw.rollout.max_searches,
            max_round_tokens: raw.rollout.max_round_tokens,
            on_round_cap: raw.rollout.on_round_cap,
            search_question_first: raw.rollout.search_question_first,
            answer_fallback: raw.rollout.answer_fallback,
        })
    }

    /// Loads every `*.toml` in `dir`, keyed by profile name.
    ///
    /// # Errors
    /// The first file that fails, two files with the same name, or no profile.
    pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Profile>, ProfileError> {
        let entries = std::fs::read_dir(dir).map_err(|error| ProfileError::Io {
            file: dir.to_path_buf(),
            error,
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        paths.sort();
        let mut profiles: BTreeMap<String, Profile> = BTreeMap::new();
        for path in paths {
            let profile = Profile::load(&path)?;
            if let Some(first) = profiles.get(&profile.name) {
                return Err(ProfileError::Duplicate {
                    name: profile.name.clone(),
                    first: first.source.clone(),
                    second: path,
                });
            }
            profiles.insert(profile.name.clone(), profile);
        }
        if profiles.is_empty() {
            return Err(ProfileError::Empty(dir.to_path_buf()));
        }
        Ok(profiles)
    }

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
        let q = self.normalize_question(question);
        self.prompt_user
            .as_ref()
            .or(self.prompt_raw.as_ref())
            .map(|t| t.render(&[("question", &q)]))
            .unwrap_or_default()
    }

    /// The prompt for the conversation `history`, whose turn `question_at` (a
    /// user turn) holds the question. `documents_first` is placed before the
    /// instruction (see [`QuestionSearch::User`]).
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
        let mut instruction = documents_first.unwrap_or("").to_string();
        instruction.push_str(&self.user_message(question));
        match self.prompt_format {
            PromptFormat::Raw => PromptText::Raw(instruction),
            PromptFormat::Chat | PromptFormat::System => {
                let mut turns = Vec::with_capacity(question_at + 2);
                if let Some(system) = &self.prompt_system {
                    turns.push(ChatTurn {
                        role: Role::System,
                        content: system.render(&[("question", &self.normalize_question(question))]),
                    });
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
                        role: turn.role,
                        content,
                    });
                }
                PromptText::Chat(turns)
            }
        }
    }

    /// The tags the scanner watches for.
    pub fn tag_set(&self) -> TagSet {
        TagSet::new(
            &self.query_open,
            &self.query_close,
            &self.answer_open,
            &self.answer_close,
            &self.documents_open,
        )
    }

    /// Strings at which the engine should stop: the closing tags and the
    /// profile's extra stops (the scanner still cuts exactly, since the engine
    /// stops one token late).
    pub fn stop_strings(&self) -> Vec<String> {
        let mut stops = vec![self.query_close.clone(), self.answer_close.clone()];
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
    fn docs_text(&self, outcome: QueryOutcome<'_>, also: &[String]) -> String {
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
    pub fn render_splice(&self, results: &[(&str, QueryOutcome<'_>)]) -> String {
        self.render_splice_defusing(results, &[])
    }

    /// [`Profile::render_splice`], with `also` (the tokenizer's control
    /// tokens, [`crate::engine::Engine::special_tokens`]) defused in every
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

    /// The answer in `generated` text: the content of the LAST complete
    /// `answer_open … answer_close` pair, stripped (Search-R1 `extract_answer`).
    /// Pass only text the model generated, never the prompt: the prompt's own
    /// example (`<answer> Beijing </answer>`) must not count.
    ///
    /// Each pair is the first closing tag and the last opening tag before it,
    /// the same pairing the [`crate::scanner::TagScanner`] uses.
    pub fn extract_answer(&self, generated: &str) -> Option<String> {
        let mut answer = None;
        let mut from = 0;
        while let Some(close_rel) = generated[from..].find(&self.answer_close) {
            let close = from + close_rel;
            if let Some(open) = generated[from..close].rfind(&self.answer_open) {
                let start = from + open + self.answer_open.len();
                answer = Some(generated[start..close].trim().to_string());
            }
            from = close + self.answer_close.len();
        }
        answer
    }
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
    use super::*;

    fn load(name: &str) -> Profile {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/policies"));
        Profile::load_dir(dir).expect("profiles load")[name].clone()
    }

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
    fn answer_extraction_ignores_the_prompt_example() {
        let p = load("search-r1");
        let prompt = p.user_message("Who painted the Mona Lisa");
        assert!(prompt.contains("<answer> Beijing </answer>"));
        // The model never answered: nothing, although the prompt has an example.
        assert_eq!(
            p.extract_answer("<think>hmm</think><search> q </search>"),
            None
        );
        // The last answer of the generated text wins, stripped.
        assert_eq!(
            p.extract_answer("<answer> Paris </answer> then <answer> Leonardo da Vinci </answer>"),
            Some("Leonardo da Vinci".into())
        );
        // An unclosed answer is not a complete answer.
        assert_eq!(p.extract_answer("<answer> Leonardo"), None);
        // The whole transcript would wrongly give the prompt's example.
        let transcript = format!("{prompt}<think>unsure</think>");
        assert_eq!(p.extract_answer(&transcript), Some("Beijing".into()));
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

    #[test]
    fn unknown_keys_fields_and_misplaced_prompt_keys_are_rejected_with_file_and_key() {
        let good = std::fs::read_to_string(&load("search-r1").source).unwrap();
        let path = Path::new("config/policies/broken.toml");
        let err = Profile::parse(&good.replace("top_k = 3", "top_k = 3\ntopk = 5"), path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("broken.toml") && err.contains("topk"), "{err}");
        let err = Profile::parse(&good.replace("{title}", "{titel}"), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("broken.toml") && err.contains("splice.document") && err.contains("titel"),
            "{err}"
        );
        let err = Profile::parse(&good.replace("format = \"chat\"", "format = \"raw\""), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("prompt.raw") && err.contains("required"),
            "{err}"
        );
        let err = Profile::parse(&good.replace("{reason}", "{why}"), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("splice.failed") && err.contains("why"),
            "{err}"
        );
    }

    #[test]
    fn shipped_profiles_all_load() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/policies"));
        let profiles = Profile::load_dir(dir).unwrap();
        for name in [
            "search-r1",
            "search-r1-prefetch",
            "rag-r1-sq",
            "rag-r1-mq",
            "r1-searcher",
            "r1-searcher-instruct",
            "r1-searcher-plus",
        ] {
            assert!(profiles.contains_key(name), "{name} missing");
        }
        assert_eq!(
            profiles["search-r1-prefetch"].search_question_first,
            QuestionSearch::User
        );
        assert_eq!(
            profiles["search-r1"].search_question_first,
            QuestionSearch::Off
        );
        assert!(profiles["r1-searcher-plus"].unconfirmed.is_some());
        assert!(profiles["search-r1"].unconfirmed.is_none());
    }
}
