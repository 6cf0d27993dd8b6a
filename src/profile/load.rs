//! Loading a profile: the TOML schema (one struct per table, unknown keys
//! refused), template fields checked, and the validated [`Profile`] built.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    AnswerFallback, Pages, Profile, ProfileError, PromptFormat, QuestionSearch, RoundCap,
    SpliceFormat, ToolRender, Tools,
};
use crate::template::Template;

/// Fields a prompt template may use: `date` is today's date (UTC) as
/// `YYYY-MM-DD` (Tongyi DeepResearch and DeepResearcher date their prompts).
const PROMPT_FIELDS: &[&str] = &["question", "date"];
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
    #[serde(default)]
    tools: Option<ToolsSpec>,
    #[serde(default)]
    pages: Option<PagesSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PagesSpec {
    open: String,
    close: String,
    chunk: String,
    chunk_chars: usize,
    max_chunks: usize,
    failed: String,
    #[serde(default)]
    pause: String,
    #[serde(default)]
    short_chars: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsSpec {
    render: ToolRender,
    search: String,
    query_argument: String,
    #[serde(default)]
    visit: String,
    #[serde(default)]
    unavailable: String,
    #[serde(default)]
    url_argument: String,
    #[serde(default)]
    goal_argument: String,
    #[serde(default)]
    page: String,
    #[serde(default)]
    page_failed: String,
    #[serde(default)]
    page_chars: usize,
    #[serde(default)]
    page_separator: String,
    #[serde(default)]
    calls_per_turn: usize,
    #[serde(default)]
    turn_prefix: String,
    response: String,
    response_separator: String,
    query_block: String,
    query_separator: String,
    error: String,
    function: Vec<FunctionSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionSpec {
    name: String,
    description: String,
    /// JSON Schema as JSON text, so its key order is kept as written.
    parameters: String,
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
        // The tool-response template's tags are control tags too.
        let response_src = raw
            .tools
            .as_ref()
            .map(|t| t.response.clone())
            .unwrap_or_default();
        let tools = raw
            .tools
            .map(|t| -> Result<Tools, ProfileError> {
                if t.function.is_empty() {
                    return Err(invalid("tools.function", "needs at least one function"));
                }
                let mut functions = Vec::with_capacity(t.function.len());
                for f in &t.function {
                    let parameters: serde_json::Value = serde_json::from_str(&f.parameters)
                        .map_err(|e| {
                            invalid(
                                "tools.function.parameters",
                                &format!("function {:?}: not JSON: {e}", f.name),
                            )
                        })?;
                    if !parameters.is_object() {
                        return Err(invalid(
                            "tools.function.parameters",
                            &format!("function {:?}: must be a JSON Schema object", f.name),
                        ));
                    }
                    functions.push(serde_json::json!({
                        "type": "function",
                        "function": {
                            "name": f.name,
                            "description": f.description,
                            "parameters": parameters,
                        }
                    }));
                }
                if !t.function.iter().any(|f| f.name == t.search) {
                    return Err(invalid(
                        "tools.search",
                        &format!("names no function in tools.function: {:?}", t.search),
                    ));
                }
                if t.query_argument.trim().is_empty() {
                    return Err(invalid("tools.query_argument", "must not be empty"));
                }
                Ok(Tools {
                    render: t.render,
                    functions,
                    search: t.search,
                    query_argument: t.query_argument,
                    page: if t.page.is_empty() {
                        None
                    } else {
                        if t.visit.is_empty() || t.url_argument.trim().is_empty() {
                            return Err(invalid(
                                "tools.page",
                                "needs tools.visit and tools.url_argument",
                            ));
                        }
                        Some(template("tools.page", &t.page, PAGE_FIELDS)?)
                    },
                    page_failed: template(
                        "tools.page_failed",
                        &t.page_failed,
                        PAGE_FAILED_FIELDS_TOOL,
                    )?,
                    visit: t.visit,
                    unavailable: t.unavailable,
                    url_argument: t.url_argument,
                    goal_argument: t.goal_argument,
                    page_chars: t.page_chars,
                    page_separator: t.page_separator,
                    calls_per_turn: t.calls_per_turn,
                    turn_prefix: t.turn_prefix,
                    response: template("tools.response", &t.response, RESPONSE_FIELDS)?,
                    response_separator: t.response_separator,
                    query_block: template("tools.query_block", &t.query_block, QUERY_BLOCK_FIELDS)?,
                    query_separator: t.query_separator,
                    error: template("tools.error", &t.error, ERROR_FIELDS)?,
                })
            })
            .transpose()?;
        let pages = match raw.pages {
            None => None,
            Some(_) if tools.is_some() => {
                return Err(invalid(
                    "pages",
                    "a tool-calling profile reads pages through its visit function",
                ))
            }
            Some(pg) => {
                if pg.open.trim().is_empty() || pg.close.trim().is_empty() {
                    return Err(invalid("pages.open", "the page tags must not be empty"));
                }
                if pg.chunk_chars == 0 || pg.max_chunks == 0 {
                    return Err(invalid(
                        "pages.chunk_chars",
                        "chunk_chars and max_chunks must be at least 1",
                    ));
                }
                Some(Pages {
                    chunk: template("pages.chunk", &pg.chunk, CHUNK_FIELDS)?,
                    failed: template("pages.failed", &pg.failed, PAGE_FAILED_FIELDS)?,
                    open: pg.open,
                    close: pg.close,
                    chunk_chars: pg.chunk_chars,
                    max_chunks: pg.max_chunks,
                    pause: pg.pause,
                    short_chars: pg.short_chars,
                })
            }
        };
        let page_tags: Vec<String> = pages
            .as_ref()
            .map(|p| vec![p.open.clone(), p.close.clone()])
            .unwrap_or_default();
        let mut control_tags: Vec<String> = [
            &raw.tags.query_open,
            &raw.tags.query_close,
            &raw.tags.answer_open,
            &raw.tags.answer_close,
            &raw.tags.documents_open,
        ]
        .into_iter()
        .chain(&raw.tags.stop)
        .chain(&page_tags)
        .cloned()
        .chain(
            BLOCK_TAG
                .find_iter(&raw.splice.block)
                .chain(BLOCK_TAG.find_iter(&response_src))
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
