//! Loading a profile: the file read against its TOML schema (`schema`),
//! every section checked, template fields checked, and the validated
//! [`Profile`] built.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::schema::{FunctionSpec, PagesSpec, ProfileFile, PromptSpec, TagSpec, ToolsSpec};
use super::{Pages, Profile, ProfileError, PromptFormat, QuestionSearch, Tools};
use crate::template::Template;

/// Fields a prompt template may use: `date` is today's date (UTC) as
/// `YYYY-MM-DD` (Tongyi DeepResearch and DeepResearcher date their prompts).
const PROMPT_FIELDS: &[&str] = &["question", "date"];
/// The prompt fields of a profile whose question's documents go into its
/// prompt (`search_question_first = "prompt"`).
const PROMPT_FIELDS_WITH_DOCUMENTS: &[&str] = &["question", "date", "documents"];
/// Fields the document block template may use.
const BLOCK_FIELDS: &[&str] = &["docs"];
/// Fields a per-document template may use: `i` is the 1-based rank; the
/// `_py` forms are Python's `repr()` of the string (quotes included), for
/// policies whose tool results are printed Python lists (DeepResearcher).
const DOCUMENT_FIELDS: &[&str] = &[
    "i", "id", "title", "text", "url", "link", "title_py", "text_py", "url_py",
];
/// Fields of the failed-search text.
const FAILED_FIELDS: &[&str] = &["reason"];
/// Fields of one tool call's response.
const RESPONSE_FIELDS: &[&str] = &["result", "call", "name"];
/// Fields of one query's part of a search call's result.
const QUERY_BLOCK_FIELDS: &[&str] = &["query", "docs", "n", "query_py"];
/// Fields of one page chunk's splice.
const CHUNK_FIELDS: &[&str] = &["n", "text", "url", "title"];
/// Fields of a page that could not be opened.
const PAGE_FAILED_FIELDS: &[&str] = &["reason", "url"];
/// Fields of one page a `visit` call read.
const PAGE_FIELDS: &[&str] = &["url", "title", "text", "lead", "goal"];
/// Fields of one page a `visit` call could not read.
const PAGE_FAILED_FIELDS_TOOL: &[&str] = &["url", "goal", "reason"];
/// Fields of a failed tool call's result.
const ERROR_FIELDS: &[&str] = &["error"];

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
        let at = Keys { file: &file };
        check_tags_and_limits(&raw, &at)?;
        check_prompt_keys(&raw.prompt, &at)?;
        // The tool-response template's tags are control tags too.
        let response_src = raw
            .tools
            .as_ref()
            .map(|t| t.response.clone())
            .unwrap_or_default();
        let tools = raw.tools.map(|t| build_tools(t, &at)).transpose()?;
        let pages = build_pages(raw.pages, tools.is_some(), &at)?;
        let control_tags = control_tags(&raw.tags, &raw.splice.block, &response_src, &pages);
        let p = &raw.prompt;
        let fields = if raw.rollout.search_question_first == QuestionSearch::Prompt {
            PROMPT_FIELDS_WITH_DOCUMENTS
        } else {
            PROMPT_FIELDS
        };
        let prompt_system = at.prompt("prompt.system", &p.system, fields)?;
        let prompt_user = at.prompt("prompt.user", &p.user, fields)?;
        let prompt_raw = at.prompt("prompt.raw", &p.raw, fields)?;
        if raw.rollout.search_question_first == QuestionSearch::Prompt
            && ![&prompt_system, &prompt_user, &prompt_raw]
                .iter()
                .any(|t| t.as_ref().is_some_and(|t| t.uses("documents")))
        {
            return Err(at.invalid(
                "rollout.search_question_first",
                "\"prompt\" puts the question's documents at {documents}, which no prompt text has",
            ));
        }
        let splice = &raw.splice;
        let splice_block = at.template("splice.block", &splice.block, BLOCK_FIELDS)?;
        let splice_document = at.template("splice.document", &splice.document, DOCUMENT_FIELDS)?;
        let failed = at.template("splice.failed", &splice.failed, FAILED_FIELDS)?;
        Ok(Self {
            control_tags,
            prompt_system,
            prompt_user,
            prompt_raw,
            splice_block,
            splice_document,
            failed,
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
            documents_close: documents_close(&raw.splice.block),
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
            tools,
            pages,
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
}

/// The profile file being loaded, for errors that name it and the key.
struct Keys<'f> {
    file: &'f Path,
}

impl Keys<'_> {
    /// `src` parsed as a template that may use the `allowed` fields.
    ///
    /// # Errors
    /// [`ProfileError::Template`] naming the file and `key`.
    fn template(
        &self,
        key: &'static str,
        src: &str,
        allowed: &[&str],
    ) -> Result<Template, ProfileError> {
        Template::parse(src, allowed).map_err(|error| ProfileError::Template {
            file: self.file.to_path_buf(),
            key,
            error,
        })
    }

    /// An optional prompt template (`prompt.system`, `prompt.user`,
    /// `prompt.raw`), parsed with the prompt fields when present.
    ///
    /// # Errors
    /// As [`Keys::template`].
    fn prompt(
        &self,
        key: &'static str,
        src: &Option<String>,
        fields: &[&str],
    ) -> Result<Option<Template>, ProfileError> {
        src.as_deref()
            .map(|s| self.template(key, s, fields))
            .transpose()
    }

    /// [`ProfileError::Invalid`] for `key`, with `message`.
    fn invalid(&self, key: &'static str, message: &str) -> ProfileError {
        ProfileError::Invalid {
            file: self.file.to_path_buf(),
            key,
            message: message.to_string(),
        }
    }
}

/// Checks the tags, the name and the query and rollout limits of `raw`.
///
/// # Errors
/// [`ProfileError::Invalid`] for the first empty tag or name (an empty
/// `tags.query_open` is allowed in a text-tag profile without pages), zero
/// limit, or empty stop string.
fn check_tags_and_limits(raw: &ProfileFile, at: &Keys) -> Result<(), ProfileError> {
    // An empty opening query tag: every round is a query up to the close
    // (IRCoT's sentence queries), for a text-tag profile without page reads.
    if raw.tags.query_open.is_empty() && (raw.tools.is_some() || raw.pages.is_some()) {
        return Err(at.invalid(
            "tags.query_open",
            "may be empty (every round a query up to tags.query_close) only without [tools] or [pages]",
        ));
    }
    if raw.tags.query_open.is_empty() && raw.tags.query_close == raw.tags.answer_open {
        return Err(at.invalid(
            "tags.query_close",
            "must differ from tags.answer_open when tags.query_open is empty",
        ));
    }
    if !raw.tags.query_open.is_empty() && raw.tags.query_open.trim().is_empty() {
        return Err(at.invalid("tags.query_open", "must not be blank"));
    }
    for (key, tag) in [
        ("tags.query_close", &raw.tags.query_close),
        ("tags.answer_open", &raw.tags.answer_open),
        ("tags.answer_close", &raw.tags.answer_close),
    ] {
        if tag.trim().is_empty() {
            return Err(at.invalid(key, "must not be empty"));
        }
    }
    if raw.name.trim().is_empty() {
        return Err(at.invalid("name", "must not be empty"));
    }
    if raw.rollout.top_k == 0 {
        return Err(at.invalid("rollout.top_k", "must be at least 1"));
    }
    if raw.query.max_queries == 0 {
        return Err(at.invalid("query.max_queries", "must be at least 1"));
    }
    if raw.query.max_chars == 0 {
        return Err(at.invalid("query.max_chars", "must be at least 1"));
    }
    if raw.tags.stop.iter().any(String::is_empty) {
        return Err(at.invalid("tags.stop", "must not contain an empty string"));
    }
    Ok(())
}

/// Checks that `[prompt]` has the keys its format requires and none it does
/// not use.
///
/// # Errors
/// [`ProfileError::Invalid`] naming the first missing or unused key.
fn check_prompt_keys(p: &PromptSpec, at: &Keys) -> Result<(), ProfileError> {
    // (key, present) pairs a format requires, and those it does not use.
    type Pairs<'k> = &'k [(&'static str, bool)];
    let (needs, unused): (Pairs, Pairs) = match p.format {
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
        return Err(at.invalid(key, "is required by this prompt format"));
    }
    if let Some((key, _)) = unused.iter().find(|(_, present)| *present) {
        return Err(at.invalid(key, "is not used by this prompt format; remove it"));
    }
    Ok(())
}

/// The validated `[tools]` table: its functions as chat-template tool
/// descriptions, its argument names and its templates parsed.
///
/// # Errors
/// [`ProfileError::Invalid`] for bad functions, a `search` naming none of
/// them, an empty query argument, or `page` without `visit` and
/// `url_argument`; [`ProfileError::Template`] for a bad template.
fn build_tools(t: ToolsSpec, at: &Keys) -> Result<Tools, ProfileError> {
    let functions = tool_functions(&t.function, at)?;
    if !t.function.iter().any(|f| f.name == t.search) {
        return Err(at.invalid(
            "tools.search",
            &format!("names no function in tools.function: {:?}", t.search),
        ));
    }
    if t.query_argument.trim().is_empty() {
        return Err(at.invalid("tools.query_argument", "must not be empty"));
    }
    if !t.answer.is_empty() {
        if !t.function.iter().any(|f| f.name == t.answer) {
            return Err(at.invalid(
                "tools.answer",
                &format!("names no function in tools.function: {:?}", t.answer),
            ));
        }
        if t.answer == t.search || t.answer == t.visit {
            return Err(at.invalid(
                "tools.answer",
                "must be another function than tools.search and tools.visit",
            ));
        }
        if t.answer_argument.trim().is_empty() {
            return Err(at.invalid(
                "tools.answer_argument",
                "must name the answer's argument when tools.answer is set",
            ));
        }
    }
    Ok(Tools {
        render: t.render,
        functions,
        search: t.search,
        query_argument: t.query_argument,
        answer: t.answer,
        answer_argument: t.answer_argument,
        repeated: t.repeated,
        page: if t.page.is_empty() {
            None
        } else {
            if t.visit.is_empty() || t.url_argument.trim().is_empty() {
                return Err(at.invalid("tools.page", "needs tools.visit and tools.url_argument"));
            }
            Some(at.template("tools.page", &t.page, PAGE_FIELDS)?)
        },
        page_failed: at.template("tools.page_failed", &t.page_failed, PAGE_FAILED_FIELDS_TOOL)?,
        visit: t.visit,
        unavailable: t.unavailable,
        url_argument: t.url_argument,
        goal_argument: t.goal_argument,
        page_chars: t.page_chars,
        page_separator: t.page_separator,
        calls_per_turn: t.calls_per_turn,
        turn_prefix: t.turn_prefix,
        response: at.template("tools.response", &t.response, RESPONSE_FIELDS)?,
        response_separator: t.response_separator,
        query_block: at.template("tools.query_block", &t.query_block, QUERY_BLOCK_FIELDS)?,
        query_separator: t.query_separator,
        error: at.template("tools.error", &t.error, ERROR_FIELDS)?,
    })
}

/// `tools.function` as the chat template's tool descriptions
/// (`{"type": "function", "function": {name, description, parameters}}`).
///
/// # Errors
/// [`ProfileError::Invalid`] when there is no function, or one's parameters
/// are not a JSON object.
fn tool_functions(
    functions: &[FunctionSpec],
    at: &Keys,
) -> Result<Vec<serde_json::Value>, ProfileError> {
    if functions.is_empty() {
        return Err(at.invalid("tools.function", "needs at least one function"));
    }
    let mut described = Vec::with_capacity(functions.len());
    for f in functions {
        let parameters: serde_json::Value = serde_json::from_str(&f.parameters).map_err(|e| {
            at.invalid(
                "tools.function.parameters",
                &format!("function {:?}: not JSON: {e}", f.name),
            )
        })?;
        if !parameters.is_object() {
            return Err(at.invalid(
                "tools.function.parameters",
                &format!("function {:?}: must be a JSON Schema object", f.name),
            ));
        }
        described.push(serde_json::json!({
            "type": "function",
            "function": {
                "name": f.name,
                "description": f.description,
                "parameters": parameters,
            }
        }));
    }
    Ok(described)
}

/// The validated `[pages]` table, if any; `has_tools` says the profile has
/// `[tools]`, which read pages instead.
///
/// # Errors
/// [`ProfileError::Invalid`] for `[pages]` beside `[tools]`, empty page tags
/// or zero limits; [`ProfileError::Template`] for a bad template.
fn build_pages(
    pages: Option<PagesSpec>,
    has_tools: bool,
    at: &Keys,
) -> Result<Option<Pages>, ProfileError> {
    let Some(pg) = pages else {
        return Ok(None);
    };
    if has_tools {
        return Err(at.invalid(
            "pages",
            "a tool-calling profile reads pages through its visit function",
        ));
    }
    if pg.open.trim().is_empty() || pg.close.trim().is_empty() {
        return Err(at.invalid("pages.open", "the page tags must not be empty"));
    }
    if pg.chunk_chars == 0 || pg.max_chunks == 0 {
        return Err(at.invalid(
            "pages.chunk_chars",
            "chunk_chars and max_chunks must be at least 1",
        ));
    }
    Ok(Some(Pages {
        chunk: at.template("pages.chunk", &pg.chunk, CHUNK_FIELDS)?,
        failed: at.template("pages.failed", &pg.failed, PAGE_FAILED_FIELDS)?,
        open: pg.open,
        close: pg.close,
        chunk_chars: pg.chunk_chars,
        max_chunks: pg.max_chunks,
        pause: pg.pause,
        short_chars: pg.short_chars,
    }))
}

/// The profile's control tags, sorted and deduplicated: its own tags, stop
/// strings and page tags, and the tags written in the splice `block` and the
/// tool `response` template; only those with an angle bracket (the ones
/// [`defuse`](super::defuse) can make inert).
fn control_tags(tags: &TagSpec, block: &str, response: &str, pages: &Option<Pages>) -> Vec<String> {
    let page_tags: Vec<String> = pages
        .as_ref()
        .map(|p| vec![p.open.clone(), p.close.clone()])
        .unwrap_or_default();
    let mut control_tags: Vec<String> = [
        &tags.query_open,
        &tags.query_close,
        &tags.answer_open,
        &tags.answer_close,
        &tags.documents_open,
    ]
    .into_iter()
    .chain(&tags.stop)
    .chain(&page_tags)
    .cloned()
    .chain(
        BLOCK_TAG
            .find_iter(block)
            .chain(BLOCK_TAG.find_iter(response))
            .map(|m| m.as_str().to_string()),
    )
    // Only a tag with an angle bracket can be defused (see `neutralise`).
    .filter(|t| t.contains(['<', '>']))
    .collect();
    control_tags.sort();
    control_tags.dedup();
    control_tags
}

/// The tag that closes a document block: the first tag after `{docs}` in
/// `splice.block` (`</information>` for `"\n\n<information>{docs}</information>\n\n"`);
/// empty when the block has none.
fn documents_close(block: &str) -> String {
    let Some((_, after)) = block.split_once("{docs}") else {
        return String::new();
    };
    let after = after.trim_start();
    match (after.starts_with('<'), after.find('>')) {
        (true, Some(end)) => after[..=end].to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::profile::shipped as load;

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
    fn documents_in_the_prompt_need_a_documents_field_and_only_then_allow_one() {
        let rag = std::fs::read_to_string(&load("rag").source).unwrap();
        let path = Path::new("config/policies/broken.toml");
        let err = Profile::parse(&rag.replace("{documents}", ""), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("search_question_first") && err.contains("{documents}"),
            "{err}"
        );
        let err = Profile::parse(
            &rag.replace(
                "search_question_first = \"prompt\"",
                "search_question_first = \"off\"",
            ),
            path,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("prompt.system") && err.contains("documents"),
            "{err}"
        );
    }

    /// An empty opening query tag (IRCoT) is a text-tag profile's only:
    /// with tools or pages, or blank rather than empty, it is refused.
    #[test]
    fn an_empty_query_open_is_for_text_tags_only() {
        let path = Path::new("config/policies/broken.toml");
        let ircot = std::fs::read_to_string(&load("ircot").source).unwrap();
        assert!(load("ircot").query_open.is_empty());
        let blank = ircot.replace("query_open = \"\"", "query_open = \" \"");
        let err = Profile::parse(&blank, path).unwrap_err().to_string();
        assert!(
            err.contains("tags.query_open") && err.contains("blank"),
            "{err}"
        );
        let tool = std::fs::read_to_string(&load("tool-search").source).unwrap();
        let open = regex::Regex::new(r#"(?m)^query_open = ".*"$"#).unwrap();
        assert!(open.is_match(&tool));
        let err = Profile::parse(&open.replace(&tool, "query_open = \"\""), path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tags.query_open") && err.contains("[tools]"),
            "{err}"
        );
    }

    /// Without an opening query tag, a closing tag that also opens the answer
    /// would end every round as a query before any answer: refused.
    #[test]
    fn an_empty_query_open_needs_a_close_apart_from_the_answer_open() {
        let path = Path::new("config/policies/broken.toml");
        let ircot = std::fs::read_to_string(&load("ircot").source).unwrap();
        let same = ircot.replace("answer_open = \"answer is:\"", "answer_open = \".\"");
        assert_ne!(same, ircot);
        let err = Profile::parse(&same, path).unwrap_err().to_string();
        assert!(
            err.contains("tags.query_close") && err.contains("tags.answer_open"),
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
            "zerosearch",
            "research",
            "r-search",
            "stepsearch",
            "parallelsearch",
            "ircot",
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
