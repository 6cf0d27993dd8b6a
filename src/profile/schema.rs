//! The profile file's TOML schema: one struct per table, unknown keys
//! refused. `load` validates what these read and builds the
//! [`Profile`](super::Profile).

use serde::Deserialize;

use super::{AnswerFallback, PromptFormat, QuestionSearch, RoundCap, SpliceFormat, ToolRender};

/// A whole profile file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProfileFile {
    pub(super) name: String,
    pub(super) description: String,
    #[serde(default)]
    pub(super) unconfirmed: Option<String>,
    pub(super) prompt: PromptSpec,
    pub(super) tags: TagSpec,
    pub(super) query: QuerySpec,
    pub(super) splice: SpliceSpec,
    pub(super) rollout: RolloutSpec,
    #[serde(default)]
    pub(super) tools: Option<ToolsSpec>,
    #[serde(default)]
    pub(super) pages: Option<PagesSpec>,
}

/// `[pages]`: page reading for tag-protocol profiles.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PagesSpec {
    pub(super) open: String,
    pub(super) close: String,
    pub(super) chunk: String,
    pub(super) chunk_chars: usize,
    pub(super) max_chunks: usize,
    pub(super) failed: String,
    #[serde(default)]
    pub(super) pause: String,
    #[serde(default)]
    pub(super) short_chars: usize,
}

/// `[tools]`: the functions of a tool-calling profile and their texts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolsSpec {
    pub(super) render: ToolRender,
    pub(super) search: String,
    pub(super) query_argument: String,
    #[serde(default)]
    pub(super) answer: String,
    #[serde(default)]
    pub(super) answer_argument: String,
    #[serde(default)]
    pub(super) repeated: String,
    #[serde(default)]
    pub(super) visit: String,
    #[serde(default)]
    pub(super) unavailable: String,
    #[serde(default)]
    pub(super) url_argument: String,
    #[serde(default)]
    pub(super) goal_argument: String,
    #[serde(default)]
    pub(super) page: String,
    #[serde(default)]
    pub(super) page_failed: String,
    #[serde(default)]
    pub(super) page_chars: usize,
    #[serde(default)]
    pub(super) page_separator: String,
    #[serde(default)]
    pub(super) calls_per_turn: usize,
    #[serde(default)]
    pub(super) turn_prefix: String,
    pub(super) response: String,
    pub(super) response_separator: String,
    pub(super) query_block: String,
    pub(super) query_separator: String,
    pub(super) error: String,
    pub(super) function: Vec<FunctionSpec>,
}

/// One `[[tools.function]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FunctionSpec {
    pub(super) name: String,
    pub(super) description: String,
    /// JSON Schema as JSON text, so its key order is kept as written.
    pub(super) parameters: String,
}

/// `[prompt]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PromptSpec {
    pub(super) format: PromptFormat,
    #[serde(default)]
    pub(super) system: Option<String>,
    #[serde(default)]
    pub(super) user: Option<String>,
    #[serde(default)]
    pub(super) raw: Option<String>,
    #[serde(default)]
    pub(super) assistant_prefix: String,
    pub(super) question_mark: bool,
}

/// `[tags]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TagSpec {
    pub(super) query_open: String,
    pub(super) query_close: String,
    pub(super) answer_open: String,
    pub(super) answer_close: String,
    #[serde(default)]
    pub(super) documents_open: String,
    #[serde(default)]
    pub(super) stop: Vec<String>,
}

/// `[query]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QuerySpec {
    #[serde(default)]
    pub(super) separator: String,
    pub(super) max_queries: usize,
    pub(super) max_chars: usize,
    #[serde(default)]
    pub(super) remove: Vec<String>,
}

/// `[splice]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpliceSpec {
    pub(super) format: SpliceFormat,
    pub(super) block: String,
    pub(super) document: String,
    #[serde(default)]
    pub(super) separator: String,
    pub(super) strip_docs: bool,
    pub(super) no_documents: String,
    pub(super) failed: String,
    pub(super) no_query: String,
    pub(super) invalid_action: String,
    pub(super) strip_round: bool,
}

/// `[rollout]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RolloutSpec {
    pub(super) top_k: usize,
    pub(super) max_searches: usize,
    #[serde(default)]
    pub(super) max_round_tokens: usize,
    pub(super) on_round_cap: RoundCap,
    pub(super) search_question_first: QuestionSearch,
    pub(super) answer_fallback: AnswerFallback,
}
