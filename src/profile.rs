//! Policy profiles: one TOML file per search policy in `config/policies/`.
//!
//! A profile is data, not code: the prompt template, the tag strings, the
//! document block the policy was trained on, and the rollout limits. The
//! formats reproduced here are documented, with their sources, in
//! `../shared/PROTOCOLS.md` and in each profile file.
//!
//! Loading is strict: an unknown key, a missing key or a template that names an
//! unknown field is an error naming the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::scanner::TagSet;
use crate::search::Document;
use crate::template::{Template, TemplateError};

/// Fields a prompt template may use.
const PROMPT_FIELDS: &[&str] = &["question"];
/// Fields the document block template may use.
const BLOCK_FIELDS: &[&str] = &["docs"];
/// Fields a per-document template may use: `i` is the 1-based rank.
const DOCUMENT_FIELDS: &[&str] = &["i", "id", "title", "text", "url"];

/// How the instruction reaches the model.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// One user message rendered through the checkpoint's chat template with the
    /// generation prompt (Search-R1, RAG-R1).
    Chat,
}

/// Whether and where the question itself is searched and spliced before the
/// first generated token (for models that never learned the search tags).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QuestionSearch {
    /// No search before the model asks for one (trained policies).
    Off,
    /// The document block right after the generation prompt, where the
    /// results of a search call made by the model would go.
    Assistant,
    /// The document block, without its surrounding whitespace, then `\n`, at
    /// the start of the user message, before the instruction: the layout small
    /// untrained instruct models answer from best.
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    description: String,
    prompt: PromptSpec,
    tags: TagSpec,
    splice: SpliceSpec,
    rollout: RolloutSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSpec {
    format: PromptFormat,
    user: String,
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpliceSpec {
    block: String,
    document: String,
    strip_docs: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutSpec {
    top_k: usize,
    max_searches: usize,
    search_question_first: QuestionSearch,
    answer_fallback: AnswerFallback,
}

/// A profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read policy profile {file}: {source}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("policy profile {file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("policy profile {file}: key `{key}`: {source}")]
    Template {
        file: PathBuf,
        key: &'static str,
        source: TemplateError,
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

/// A validated policy profile.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Name clients and the config refer to (`search-r1`).
    pub name: String,
    /// One line for `/v1/models` and `seeker policies`.
    pub description: String,
    /// Where the profile was loaded from.
    pub source: PathBuf,
    pub prompt_format: PromptFormat,
    prompt_user: Template,
    /// Append `?` to a question that does not end in one (Search-R1 does).
    pub question_mark: bool,
    pub query_open: String,
    pub query_close: String,
    pub answer_open: String,
    pub answer_close: String,
    /// A document-block opening tag the model must never write itself; empty if none.
    pub documents_open: String,
    splice_block: Template,
    splice_document: Template,
    strip_docs: bool,
    /// Documents per query (Search-R1: 3).
    pub top_k: usize,
    /// Search rounds the model may call before a final round without search
    /// (Search-R1: 4).
    pub max_searches: usize,
    /// Search the user's question and splice the results before the first
    /// token, and where: for models that never learned the search tags.
    pub search_question_first: QuestionSearch,
    pub answer_fallback: AnswerFallback,
}

impl Profile {
    /// Loads and validates one profile file.
    ///
    /// # Errors
    /// [`ProfileError`] naming the file and, where it applies, the key.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            file: path.to_path_buf(),
            source,
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
            Template::parse(src, allowed).map_err(|source| ProfileError::Template {
                file: file.clone(),
                key,
                source,
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
        if raw.rollout.top_k == 0 {
            return Err(invalid("rollout.top_k", "must be at least 1"));
        }
        if raw.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        Ok(Self {
            prompt_user: template("prompt.user", &raw.prompt.user, PROMPT_FIELDS)?,
            splice_block: template("splice.block", &raw.splice.block, BLOCK_FIELDS)?,
            splice_document: template("splice.document", &raw.splice.document, DOCUMENT_FIELDS)?,
            name: raw.name,
            description: raw.description,
            source: file,
            prompt_format: raw.prompt.format,
            question_mark: raw.prompt.question_mark,
            query_open: raw.tags.query_open,
            query_close: raw.tags.query_close,
            answer_open: raw.tags.answer_open,
            answer_close: raw.tags.answer_close,
            documents_open: raw.tags.documents_open,
            strip_docs: raw.splice.strip_docs,
            top_k: raw.rollout.top_k,
            max_searches: raw.rollout.max_searches,
            search_question_first: raw.rollout.search_question_first,
            answer_fallback: raw.rollout.answer_fallback,
        })
    }

    /// Loads every `*.toml` in `dir`, keyed by profile name.
    ///
    /// # Errors
    /// The first file that fails, or two files with the same name.
    pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Profile>, ProfileError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ProfileError::Io {
            file: dir.to_path_buf(),
            source,
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

    /// The user message for `question` (normalised first).
    pub fn user_message(&self, question: &str) -> String {
        let q = self.normalize_question(question);
        self.prompt_user.render(&[("question", &q)])
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

    /// Strings at which the engine should stop: the closing tags (the scanner
    /// still cuts exactly, since the engine stops one token late).
    pub fn stop_strings(&self) -> Vec<String> {
        vec![self.query_close.clone(), self.answer_close.clone()]
    }

    /// The text spliced after a search call for `docs` (ranked best first),
    /// byte for byte in the policy's trained format: each document through
    /// `splice.document` with `i` = 1..k, concatenated, stripped of surrounding
    /// whitespace when `strip_docs`, then placed in `splice.block` as `{docs}`.
    pub fn render_splice(&self, docs: &[Document]) -> String {
        let mut joined = String::new();
        for (i, doc) in docs.iter().enumerate() {
            let rank = (i + 1).to_string();
            self.splice_document
                .render_into(&mut joined, |field, out| match field {
                    "i" => out.push_str(&rank),
                    "id" => out.push_str(&doc.id),
                    "title" => out.push_str(&doc.title),
                    "text" => out.push_str(&doc.text),
                    "url" => out.push_str(doc.url.as_deref().unwrap_or("")),
                    _ => {}
                });
        }
        let docs_text = if self.strip_docs {
            joined.trim()
        } else {
            &joined
        };
        self.splice_block.render(&[("docs", docs_text)])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn search_r1() -> Profile {
        Profile::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/policies/search-r1.toml"
        )))
        .expect("search-r1 profile loads")
    }

    fn doc(title: &str, text: &str) -> Document {
        Document {
            id: "0".into(),
            title: title.into(),
            text: text.into(),
            url: None,
            score: 1.0,
        }
    }

    #[test]
    fn search_r1_prompt_matches_the_paper_text() {
        let p = search_r1();
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
    fn search_r1_splice_is_byte_exact() {
        // ../shared/PROTOCOLS.md §1: "\n\n<information>{docs}</information>\n\n",
        // each document `Doc {i}(Title: {title}) {text}\n`, the whole stripped; the
        // title keeps the double quotes of the original corpus's first line.
        let p = search_r1();
        let spliced = p.render_splice(&[
            doc(
                "Evan Morris",
                "Evan L. Morris (January 26, 1977 - July 9, 2015) was a lobbyist.",
            ),
            doc(
                "Mona Lisa",
                "The Mona Lisa is a portrait\nby Leonardo da Vinci.",
            ),
        ]);
        assert_eq!(
            spliced,
            "\n\n<information>Doc 1(Title: \"Evan Morris\") Evan L. Morris (January 26, 1977 - \
             July 9, 2015) was a lobbyist.\nDoc 2(Title: \"Mona Lisa\") The Mona Lisa is a \
             portrait\nby Leonardo da Vinci.</information>\n\n"
        );
        assert_eq!(p.render_splice(&[]), "\n\n<information></information>\n\n");
    }

    #[test]
    fn answer_extraction_ignores_the_prompt_example() {
        let p = search_r1();
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
    fn unknown_keys_and_fields_are_rejected_with_file_and_key() {
        let good = std::fs::read_to_string(&search_r1().source).unwrap();
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
    }

    #[test]
    fn shipped_profiles_all_load() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/policies"));
        let profiles = Profile::load_dir(dir).unwrap();
        assert!(profiles.contains_key("search-r1"));
        assert_eq!(
            profiles["search-r1-prefetch"].search_question_first,
            QuestionSearch::User
        );
        assert_eq!(
            profiles["search-r1"].search_question_first,
            QuestionSearch::Off
        );
    }
}
