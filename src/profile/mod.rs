//! Policy profiles: one TOML file per search policy in `config/policies/`.
//!
//! A profile is data, not code: how the prompt is built, the tag strings, how a
//! query is cleaned and split, the document block the policy was trained on,
//! what to splice when there is nothing to search or nothing found, and the
//! rollout limits. The formats reproduced are documented, with their sources,
//! in each profile file and in docs/policies.md.
//!
//! Loading is strict: an unknown or missing key, a key that does not apply to
//! the prompt format, or a template that names an unknown field is an error
//! naming the file and the key.
//!
//! `schema`: the TOML schema; `load`: its validation; `text`: what a rollout
//! asks of a profile — the prompt, cleaned queries, splices, round text —
//! and [`defuse`] for text that must not carry control tags.

mod load;
mod schema;
mod text;
mod tools;

use std::path::PathBuf;

use serde::Deserialize;

use crate::chat::ChatTurn;
use crate::search::Document;
use crate::template::{Template, TemplateError};
pub use text::defuse;
pub(crate) use text::last_boxed;
pub use text::PageChunk;
pub use tools::{CallPlan, ToolResult};

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
    /// The document block, as written, in place of `{documents}` in the
    /// prompt's system or user text: the one-shot retrieval-augmented
    /// baseline, whose prompt holds the question's documents and no search
    /// tags (FlashRAG's standard RAG template, `flashrag/prompt/base_prompt.py`,
    /// puts them in the system message).
    Prompt,
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
    /// The content of the last `\boxed{…}` in the text generated after the
    /// last splice, stripped (ReCall); without one, as `after_last_splice`.
    LastBoxed,
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

/// Where a tool-calling profile's functions are described to the model.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ToolRender {
    /// As `tools` in the model's own chat template (Qwen2.5's writes them
    /// into its system turn, as `transformers`' `apply_chat_template(tools=…)`
    /// does; DeepResearcher, generic instruct models).
    Template,
    /// The profile's prompt text describes them itself (ReCall, WebSailor,
    /// Tongyi DeepResearch write their own system prompt).
    Prompt,
}

/// The tools of a tool-calling profile (`[tools]`): the model calls them in
/// `<tool_call>` JSON (or a fenced or bare JSON object, see
/// [`crate::toolcall`]), one or several per turn; the round ends with the
/// turn, and every call's result is spliced as the policy's tool-response turn.
#[derive(Clone, Debug)]
pub struct Tools {
    /// Where the functions are described.
    pub render: ToolRender,
    /// The functions in OpenAI's shape, key order as written:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub functions: Vec<serde_json::Value>,
    /// The function that searches.
    pub search: String,
    /// Its argument holding the query: a string or an array of strings.
    pub query_argument: String,
    /// The function whose call is the final answer (as agent frameworks'
    /// `final_answer` tool); empty if none. A turn that calls it ends the
    /// rollout with its [`Tools::answer_argument`] as the answer.
    pub answer: String,
    /// `answer`'s argument holding the answer: a string, or an array of
    /// strings (a set answer), joined by `", "`.
    pub answer_argument: String,
    /// The reply to a search call whose every query the rollout already
    /// searched, instead of the same documents again (WebThinker answers a
    /// repeated query with such a sentence); empty searches them again.
    pub repeated: String,
    /// The page-reading function; empty if none.
    pub visit: String,
    /// The text answered to a call of `visit` when the profile reads no
    /// pages (`page` empty).
    pub unavailable: String,
    /// `visit`'s argument holding the URL(s): a string or an array.
    pub url_argument: String,
    /// `visit`'s argument stating what to look for (echoed as `{goal}`);
    /// empty if none.
    pub goal_argument: String,
    /// One page's result (`{url}`, `{title}`, `{text}`: the page's readable
    /// text cut to `page_chars`, `{lead}`: its first paragraph, at most 500
    /// characters, `{goal}`); `None`: `visit` is answered `unavailable`.
    pub(super) page: Option<Template>,
    /// One page that could not be read (`{url}`, `{goal}`, `{reason}`).
    pub(super) page_failed: Template,
    /// Characters of a page's text in `{text}` (0: all).
    pub page_chars: usize,
    /// Between the results of one call's pages.
    pub page_separator: String,
    /// Calls run per turn, the first ones; 0 for all (Tongyi DeepResearch and
    /// DeepResearcher run only the first, ReCall all). Calls past it get no
    /// response.
    pub calls_per_turn: usize,
    /// Text the model's next turn starts with after a tool response, written
    /// by seeker after `splice.block` (as `prompt.assistant_prefix` is after
    /// the prompt); empty for none.
    pub turn_prefix: String,
    /// One call's response (`{result}`, `{call}`: the call's JSON as written,
    /// `{name}`): Qwen2.5's `<tool_response>\n{result}\n</tool_response>`.
    pub(super) response: Template,
    /// Between two calls' responses of one turn.
    pub response_separator: String,
    /// One query's part of a search call's result (`{query}`, `{docs}`: the
    /// documents as `splice.document` renders them, `{n}`: how many,
    /// `{query_py}`: the query as Python's `repr()`).
    pub(super) query_block: Template,
    /// Between the parts of a call that searched several queries.
    pub query_separator: String,
    /// A call that cannot run (`{error}`: bad JSON, unknown function, a
    /// missing or mistyped argument).
    pub(super) error: Template,
}

/// The page action of a profile (`[pages]`): the model names a URL (or a
/// corpus document) between two tags, seeker opens it and splices its text
/// in chunks (ASearcher's `<access> url </access>`).
#[derive(Clone, Debug)]
pub struct Pages {
    /// Opens the action (`<access>`).
    pub open: String,
    /// Closes it (`</access>`); generation stops here as at `query_close`.
    pub close: String,
    /// One chunk's splice (`{n}`: the chunk's number from 1, `{text}`,
    /// `{url}`, `{title}`).
    pub(super) chunk: Template,
    /// Characters per chunk (ASearcher: 25,000).
    pub chunk_chars: usize,
    /// Chunks spliced at most; the rest of the page is dropped (ASearcher: 10).
    pub max_chunks: usize,
    /// Spliced when the page cannot be opened (`{reason}`, `{url}`).
    pub(super) failed: Template,
    /// After a chunk with more to come, generation stops at this string (kept
    /// in the transcript) and the next chunk follows (ASearcher: `</think>`);
    /// empty splices all chunks at once.
    pub pause: String,
    /// Once the model has read a chunk (its next round ended), the chunk is
    /// rendered again with its text cut to this many characters in every
    /// later prompt (ASearcher's `short_text`: 100); 0 keeps it whole.
    pub short_chars: usize,
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
    /// The tag that closes a spliced document block: the first tag after
    /// `{docs}` in `splice.block` (`</information>`); empty if it has none.
    pub documents_close: String,
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
    /// The functions the policy calls, for tool-calling profiles; `None` for
    /// text-tag profiles.
    pub tools: Option<Tools>,
    /// The page action, for profiles that read pages; `None` otherwise.
    pub pages: Option<Pages>,
    /// Tags a document must not carry verbatim: query, answer and document
    /// tags, stop strings, and every `<...>` tag in `splice.block` (those with
    /// an angle bracket).
    control_tags: Vec<String>,
}

/// A profile shipped in `config/policies/`, by name (unit tests).
#[cfg(test)]
pub(crate) fn shipped(name: &str) -> Profile {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/policies"));
    Profile::load_dir(dir).expect("profiles load")[name].clone()
}
