//! `[search]`: [`SearchConfig`] (the built-in index, the dispatcher's
//! deadlines, cache and document budget), [`DenseConfig`] (`[search.dense]`,
//! the built-in `dense` and `hybrid` backends' encoder), the configured
//! backends ([`BackendKind`], [`BackendConfig`]), their defaults
//! ([`DEFAULT_INDEX`], [`DEFAULT_ENCODER`], [`DEFAULT_APPROXIMATE_ABOVE`]) and
//! their checks. Used by `search::setup` (which builds the dispatcher from
//! them), `main` (`seeker index --dense`), `eval` and the benchmarks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::search::dispatch::{BackendLimits, DispatchConfig};
use crate::search::embed::{EmbedOptions, Pooling};
use crate::search::hybrid::HybridConfig;

/// Where `scripts/fetch-defaults.sh` builds the default corpus's index, and
/// the default of `search.index` and of every `--index` flag.
pub const DEFAULT_INDEX: &str = "data/wiki/index";

/// `[search]`: the built-in local index, the other backends, and the
/// dispatcher's deadlines, cache and document budget.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Directory built by `seeker index`; served as the backend `tantivy`.
    pub index: PathBuf,
    /// Backend of requests that name none: `tantivy` or a key of `backends`.
    pub default: String,
    /// Deadline of a whole search round, milliseconds.
    pub round_timeout_ms: u64,
    /// Deadline of one query, retries included, milliseconds.
    pub query_timeout_ms: u64,
    /// Seconds a result stays in the shared cache; 0 turns the cache off.
    pub cache_ttl_s: u64,
    /// Result lists the shared cache holds.
    pub cache_capacity: u64,
    /// Bytes the shared cache may hold (queries and documents); 0 turns it off.
    pub cache_max_bytes: u64,
    /// Characters kept per document (title + text); 0 keeps everything.
    pub max_document_chars: usize,
    /// More backends by name (`[search.backends.web]`).
    pub backends: BTreeMap<String, BackendConfig>,
    /// The encoder of the built-in `dense` and `hybrid` backends.
    pub dense: DenseConfig,
    /// How `hybrid` fuses BM25 and dense.
    pub hybrid: HybridConfig,
}

/// Where `scripts/fetch-defaults.sh` puts the default sentence encoder
/// (all-MiniLM-L6-v2), and the default of `search.dense.model`.
pub const DEFAULT_ENCODER: &str = "models/all-MiniLM-L6-v2";

/// `[search.dense]`: the sentence encoder of the built-in `dense` and
/// `hybrid` backends, served when `model` holds an encoder and
/// `<search.index>/dense` was built with it (`seeker index --dense`). The
/// optional settings override what the model's own files say
/// ([`crate::search::embed`]).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DenseConfig {
    /// A local Hugging Face directory (config.json, model.safetensors,
    /// tokenizer.json); empty turns dense retrieval off.
    pub model: PathBuf,
    /// Passages per forward pass when `seeker index --dense` builds, and the
    /// most concurrent queries the `dense` backend embeds in one pass.
    pub batch_size: usize,
    /// Dense indexes with more documents than this are searched by their
    /// sign-bit codes with exact rescoring ([`crate::search::signbits`]),
    /// made when the index opens, instead of by the exact matrix product.
    pub approximate_above: usize,
    /// Candidates the sign-bit codes keep for exact scoring (at least
    /// top-k): recall against latency ([`DEFAULT_RESCORE`]).
    pub rescore: usize,
    /// Prepended to every query (e5's `"query: "`); unset = what the model's
    /// files or family say.
    pub query_prefix: Option<String>,
    /// Prepended to every passage (e5's `"passage: "`); unset = what the
    /// model's files or family say.
    pub passage_prefix: Option<String>,
    /// `mean` or `cls`; unset = what the model's files or family say.
    pub pooling: Option<Pooling>,
    /// Tokens per text, `[CLS]` and `[SEP]` included (at least 2); longer
    /// texts are cut. Unset = the model's `max_seq_length`, else 512.
    pub max_length: Option<usize>,
}

impl Default for DenseConfig {
    fn default() -> Self {
        Self {
            model: DEFAULT_ENCODER.into(),
            batch_size: 32,
            approximate_above: DEFAULT_APPROXIMATE_ABOVE,
            rescore: DEFAULT_RESCORE,
            query_prefix: None,
            passage_prefix: None,
            pooling: None,
            max_length: None,
        }
    }
}

/// Above this many documents the dense index is searched by its sign-bit
/// codes: exact search grows linearly (one 384-d MiniLM query: ~9 ms at
/// 50,000 rows, 120–240 ms at 1M on 2 cores; `bench/README.md`).
pub const DEFAULT_APPROXIMATE_ABOVE: usize = 100_000;

/// Candidates rescored exactly past `approximate_above`: at 1M synthetic
/// 384-d vectors on 2 cores, recall@10 of exact search's 0.975 (Gaussian
/// data) and 0.982 (noisy copies of real vectors) at p50 5.2 ms; 4,000 gives
/// 0.954 and 0.968 at 3.9 ms (`bench/dense.sh`, `bench/README.md`).
pub const DEFAULT_RESCORE: usize = 8_000;

impl DenseConfig {
    /// How an open dense index searches.
    pub fn search(&self) -> crate::search::dense::DenseSearch {
        crate::search::dense::DenseSearch {
            approximate_above: self.approximate_above,
            rescore: self.rescore,
        }
    }

    /// The encoder overrides in `embed`'s terms.
    pub fn options(&self) -> EmbedOptions {
        EmbedOptions {
            query_prefix: self.query_prefix.clone(),
            passage_prefix: self.passage_prefix.clone(),
            pooling: self.pooling,
            max_length: self.max_length,
        }
    }
}

/// The dispatcher's own defaults ([`DispatchConfig`]), in config units.
impl Default for SearchConfig {
    fn default() -> Self {
        let d = DispatchConfig::default();
        Self {
            index: DEFAULT_INDEX.into(),
            default: "tantivy".into(),
            round_timeout_ms: d.round_timeout.as_millis() as u64,
            query_timeout_ms: d.query_timeout.as_millis() as u64,
            cache_ttl_s: d.cache_ttl.as_secs(),
            cache_capacity: d.cache_capacity,
            cache_max_bytes: d.cache_max_bytes,
            max_document_chars: d.max_document_chars,
            backends: BTreeMap::new(),
            dense: DenseConfig::default(),
            hybrid: HybridConfig::default(),
        }
    }
}

/// What a configured backend talks to (`kind = "…"`): a local index, a
/// retriever protocol, a web provider of [`crate::search::web::PROVIDERS`]
/// (`bing`, `searxng`, `brave`, `tavily`, `serper`, `exa`, `google`), or a
/// list of other backends (`fallback`, `merge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Another local index built by `seeker index` (`index`).
    Tantivy,
    /// A Search-R1-style `POST /retrieve` server (`url` = the route).
    Retriever,
    /// A FlashRAG server as ReCall serves it (`url` = its `POST /search` route).
    Flashrag,
    /// R1-Searcher's retriever (`url` = its `POST /queries` route).
    R1Searcher,
    /// The `backends` in order: the next one when one fails (an error,
    /// a quota, a refused key, its share of the deadline spent).
    Fallback,
    /// The `backends` at once, fused by reciprocal rank, one document per
    /// normalised URL.
    Merge,
    /// A web search provider (`url` defaults to its public endpoint, the key
    /// comes from `api_key_env`).
    Web(&'static crate::search::web::Provider),
}

impl BackendKind {
    /// The kind named `name` in a config, if there is one.
    pub fn named(name: &str) -> Option<Self> {
        Some(match name {
            "tantivy" => Self::Tantivy,
            "retriever" => Self::Retriever,
            "flashrag" => Self::Flashrag,
            "r1-searcher" => Self::R1Searcher,
            "fallback" => Self::Fallback,
            "merge" => Self::Merge,
            other => Self::Web(crate::search::web::provider(other)?),
        })
    }

    /// The name a config gives this kind.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tantivy => "tantivy",
            Self::Retriever => "retriever",
            Self::Flashrag => "flashrag",
            Self::R1Searcher => "r1-searcher",
            Self::Fallback => "fallback",
            Self::Merge => "merge",
            Self::Web(p) => p.kind,
        }
    }

    /// Every kind a config may name, in documentation order.
    pub fn all() -> Vec<&'static str> {
        let mut all = vec!["tantivy", "retriever", "flashrag", "r1-searcher"];
        all.extend(crate::search::web::PROVIDERS.iter().map(|p| p.kind));
        all.extend(["fallback", "merge"]);
        all
    }
}

impl Serialize for BackendKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for BackendKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::named(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown backend kind `{name}`, expected one of {}",
                Self::all().join(", ")
            ))
        })
    }
}

/// `[search.backends.NAME]`: one backend and its limits.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// What it talks to; decides which settings are required.
    pub kind: BackendKind,
    /// Endpoint (web providers: default their public one), instance root
    /// (searxng) or route (retriever, flashrag, r1-searcher).
    #[serde(default)]
    pub url: Option<String>,
    /// Index directory (tantivy).
    #[serde(default)]
    pub index: Option<PathBuf>,
    /// Environment variable holding the API key (web providers; default per
    /// provider: `BRAVE_SEARCH_API_KEY`, `TAVILY_API_KEY`, `SERPER_API_KEY`,
    /// `EXA_API_KEY`, `GOOGLE_API_KEY`, `BING_SEARCH_KEY`). The key itself
    /// never goes in a file or a log.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Bing market (`mkt`), default `en-US`.
    #[serde(default)]
    pub market: Option<String>,
    /// Google Programmable Search's search engine id (`cx`; required for
    /// kind `google`).
    #[serde(default)]
    pub cx: Option<String>,
    /// Ask the provider for the page's text instead of a snippet where it
    /// can (tavily: `raw_content`, exa: `text`); default false.
    #[serde(default)]
    pub page_text: bool,
    /// The backends a `fallback` tries in order, or a `merge` asks at once:
    /// names of `[search.backends]` or the built-in `tantivy`, `dense`,
    /// `hybrid` (not another `fallback` or `merge`).
    #[serde(default)]
    pub backends: Vec<String>,
    /// Calls in flight at once across all requests (default 4). Not for a
    /// `fallback` or `merge`: their members' limits apply.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Calls started per second across all requests; 0 = no limit (default).
    #[serde(default)]
    pub requests_per_second: Option<u32>,
    /// Retries after 429, 5xx or a connection error (default 2).
    #[serde(default)]
    pub retries: Option<u32>,
}

impl BackendConfig {
    /// A backend of `kind` with every other setting at its default.
    pub fn of(kind: BackendKind) -> Self {
        Self {
            kind,
            url: None,
            index: None,
            api_key_env: None,
            market: None,
            cx: None,
            page_text: false,
            backends: Vec::new(),
            concurrency: None,
            requests_per_second: None,
            retries: None,
        }
    }

    /// Its limits, the defaults where unset ([`BackendLimits::default`]:
    /// 4 calls at once, no rate limit, 2 retries); `strip_html` as given.
    pub fn limits(&self, strip_html: bool) -> BackendLimits {
        let d = BackendLimits::default();
        BackendLimits {
            concurrency: self.concurrency.unwrap_or(d.concurrency),
            requests_per_second: self.requests_per_second.unwrap_or(d.requests_per_second),
            retries: self.retries.unwrap_or(d.retries),
            strip_html,
        }
    }
}

impl SearchConfig {
    /// Checks what the types cannot, in this order: `default` names a
    /// backend, the deadlines are positive, `[search.dense]`,
    /// `[search.hybrid]`, no configured backend takes the name `tantivy`,
    /// then each backend in name order.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.default != "tantivy" && !self.backends.contains_key(&self.default) {
            return Err(ConfigError::Invalid(format!(
                "search.default = {:?} is neither `tantivy` nor a key of [search.backends] \
                 (have: {})",
                self.default,
                self.backends.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        if self.round_timeout_ms == 0 || self.query_timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "search.round_timeout_ms and search.query_timeout_ms must be at least 1".into(),
            ));
        }
        self.dense.validate()?;
        validate_hybrid(&self.hybrid)?;
        if self.backends.contains_key("tantivy") {
            return Err(ConfigError::Invalid(
                "search.backends.tantivy: `tantivy` is the built-in index (set search.index); \
                 give another local index another name"
                    .into(),
            ));
        }
        for (name, backend) in &self.backends {
            backend.validate(name, &self.backends)?;
        }
        Ok(())
    }
}

impl DenseConfig {
    /// `[search.dense]`: `rescore`, the batch size and `max_length` in range.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.rescore == 0 {
            return Err(ConfigError::Invalid(
                "search.dense.rescore must be at least 1".into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::Invalid(
                "search.dense.batch_size must be at least 1".into(),
            ));
        }
        if self.max_length.is_some_and(|n| n < 2) {
            return Err(ConfigError::Invalid(
                "search.dense.max_length must be at least 2 ([CLS] and [SEP])".into(),
            ));
        }
        Ok(())
    }
}

/// `[search.hybrid]`: finite, non-negative `rrf_k` and weights, at least one
/// candidate.
fn validate_hybrid(h: &HybridConfig) -> Result<(), ConfigError> {
    if !(h.rrf_k.is_finite() && h.rrf_k >= 0.0) {
        return Err(ConfigError::Invalid(
            "search.hybrid.rrf_k must be a finite number, 0 or more".into(),
        ));
    }
    for (key, w) in [
        ("bm25_weight", h.bm25_weight),
        ("dense_weight", h.dense_weight),
    ] {
        if !(w.is_finite() && w >= 0.0) {
            return Err(ConfigError::Invalid(format!(
                "search.hybrid.{key} must be a finite number, 0 or more"
            )));
        }
    }
    if h.candidates == 0 {
        return Err(ConfigError::Invalid(
            "search.hybrid.candidates must be at least 1".into(),
        ));
    }
    Ok(())
}

impl BackendConfig {
    /// `[search.backends.NAME]`: the setting its kind needs (`index` for
    /// tantivy, an http(s) `url` for the retrievers and providers without a
    /// public endpoint, `backends` for fallback and merge), `concurrency` at
    /// least 1. `configured` is every name of `[search.backends]`.
    fn validate(
        &self,
        name: &str,
        configured: &BTreeMap<String, BackendConfig>,
    ) -> Result<(), ConfigError> {
        let key = |k: &str| format!("search.backends.{name}.{k}");
        let kind = self.kind.name();
        // Settings its kind does not read are mistakes, not silently ignored.
        const LIMITS: [&str; 3] = ["concurrency", "requests_per_second", "retries"];
        let own: &[&str] = match self.kind {
            BackendKind::Tantivy => &["index"],
            BackendKind::Retriever | BackendKind::Flashrag | BackendKind::R1Searcher => &["url"],
            BackendKind::Web(provider) => provider.settings,
            BackendKind::Fallback | BackendKind::Merge => &["backends"],
        };
        let lists = matches!(self.kind, BackendKind::Fallback | BackendKind::Merge);
        let reads: Vec<&str> = own
            .iter()
            .copied()
            .chain(LIMITS.iter().copied().filter(|_| !lists))
            .collect();
        let set = [
            ("concurrency", self.concurrency.is_some()),
            ("requests_per_second", self.requests_per_second.is_some()),
            ("retries", self.retries.is_some()),
            ("url", self.url.is_some()),
            ("index", self.index.is_some()),
            ("api_key_env", self.api_key_env.is_some()),
            ("market", self.market.is_some()),
            ("cx", self.cx.is_some()),
            ("page_text", self.page_text),
        ];
        if let Some((setting, _)) = set.iter().find(|(s, on)| *on && !reads.contains(s)) {
            let why = if lists && LIMITS.contains(setting) {
                " (a list has no limits of its own: each member's apply)"
            } else {
                ""
            };
            return Err(ConfigError::Invalid(format!(
                "{} does not apply to kind = {kind:?}{why} (it reads: {})",
                key(setting),
                reads.join(", ")
            )));
        }
        if self
            .api_key_env
            .as_deref()
            .is_some_and(|v| v.trim().is_empty())
        {
            return Err(ConfigError::Invalid(format!(
                "{} is empty: name the environment variable that holds the key",
                key("api_key_env")
            )));
        }
        let url_required = match self.kind {
            BackendKind::Tantivy => {
                if self.index.is_none() {
                    return Err(ConfigError::Invalid(format!(
                        "{} is required for kind = \"tantivy\"",
                        key("index")
                    )));
                }
                false
            }
            BackendKind::Retriever | BackendKind::Flashrag | BackendKind::R1Searcher => true,
            BackendKind::Web(provider) => provider.default_url.is_none(),
            BackendKind::Fallback | BackendKind::Merge => {
                self.validate_members(name, configured)?;
                false
            }
        };
        if !matches!(self.kind, BackendKind::Fallback | BackendKind::Merge)
            && !self.backends.is_empty()
        {
            return Err(ConfigError::Invalid(format!(
                "{} is for kind = \"fallback\" or \"merge\", not {kind:?}",
                key("backends")
            )));
        }
        match self.url.as_deref() {
            None if url_required => {
                return Err(ConfigError::Invalid(format!(
                    "{} is required for kind = {kind:?}",
                    key("url"),
                )));
            }
            Some(url)
                if !(url.starts_with("http://") || url.starts_with("https://"))
                    || url.contains(":///")
                    || !reqwest::Url::parse(url)
                        .is_ok_and(|u| u.host_str().is_some_and(|h| !h.is_empty())) =>
            {
                return Err(ConfigError::Invalid(format!(
                    "{} must be an http:// or https:// URL with a host, got {url:?}",
                    key("url")
                )));
            }
            _ => {}
        }
        if self.concurrency == Some(0) {
            return Err(ConfigError::Invalid(format!(
                "{} must be at least 1",
                key("concurrency")
            )));
        }
        Ok(())
    }

    /// A `fallback` or `merge`: at least one member, each once, each a
    /// configured or built-in backend that is not itself a list.
    fn validate_members(
        &self,
        name: &str,
        configured: &BTreeMap<String, BackendConfig>,
    ) -> Result<(), ConfigError> {
        let key = format!("search.backends.{name}.backends");
        if self.backends.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{key} is required for kind = {:?}: the backends to {}",
                self.kind.name(),
                if self.kind == BackendKind::Fallback {
                    "try in order"
                } else {
                    "ask at once"
                }
            )));
        }
        for (i, member) in self.backends.iter().enumerate() {
            if member == name {
                return Err(ConfigError::Invalid(format!(
                    "{key} names `{name}` itself; list other backends"
                )));
            }
            if self.backends[..i].contains(member) {
                return Err(ConfigError::Invalid(format!(
                    "{key} names `{member}` twice"
                )));
            }
            match configured.get(member) {
                Some(other) if matches!(other.kind, BackendKind::Fallback | BackendKind::Merge) => {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: `{member}` is itself a {:?}; list its backends instead",
                        other.kind.name()
                    )));
                }
                Some(_) => {}
                None if BUILT_IN_BACKENDS.contains(&member.as_str()) => {}
                None => {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: `{member}` is neither a key of [search.backends] nor one of \
                         the built-in {}",
                        BUILT_IN_BACKENDS.join(", ")
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Backends every server has without a `[search.backends]` entry (`dense`
/// and `hybrid` when their index is built).
pub const BUILT_IN_BACKENDS: &[&str] = &["tantivy", "dense", "hybrid"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn search_backends_from_a_file_and_their_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seeker.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(Some(&file), [])
        };
        let config = load(
            "[search]\ndefault = \"web\"\n\
             [search.backends.web]\nkind = \"searxng\"\nurl = \"http://127.0.0.1:8888\"\n\
             requests_per_second = 2\n\
             [search.backends.dense]\nkind = \"retriever\"\nurl = \"http://gpu:8000/retrieve\"\n",
        )
        .unwrap();
        assert_eq!(config.search.default, "web");
        assert_eq!(config.search.backends["web"].kind.name(), "searxng");
        assert_eq!(config.search.backends["web"].requests_per_second, Some(2));
        assert_eq!(config.search.backends["dense"].limits(false).concurrency, 4);
        assert_eq!(config.search.index, SearchConfig::default().index);

        // Providers with a public endpoint need no `url`; lists name members.
        let config = load(
            "[search]\ndefault = \"web\"\n\
             [search.backends.brave]\nkind = \"brave\"\n\
             [search.backends.google]\nkind = \"google\"\ncx = \"0123\"\n\
             [search.backends.web]\nkind = \"fallback\"\nbackends = [\"brave\", \"google\", \"tantivy\"]\n",
        )
        .unwrap();
        assert_eq!(config.search.backends["brave"].kind.name(), "brave");
        assert_eq!(config.search.backends["brave"].url, None);
        assert_eq!(config.search.backends["web"].kind, BackendKind::Fallback);
        assert_eq!(
            config.search.backends["web"].backends,
            ["brave", "google", "tantivy"]
        );

        for (text, needle) in [
            ("[search]\ndefault = \"nope\"\n", "search.default"),
            (
                "[search.backends.web]\nkind = \"searxng\"\nurl = \"localhost:8888\"\n",
                "search.backends.web.url",
            ),
            (
                "[search.backends.tantivy]\nkind = \"tantivy\"\nindex = \"x\"\n",
                "built-in",
            ),
            ("[search.backends.x]\nkind = \"altavista\"\n", "altavista"),
            (
                "[search.backends.x]\nkind = \"searxng\"\n",
                "search.backends.x.url",
            ),
            (
                "[search.backends.x]\nkind = \"fallback\"\n",
                "search.backends.x.backends is required",
            ),
            (
                "[search.backends.x]\nkind = \"merge\"\nbackends = [\"tantivy\", \"nope\"]\n",
                "`nope` is neither",
            ),
            (
                "[search.backends.x]\nkind = \"merge\"\nbackends = [\"tantivy\", \"tantivy\"]\n",
                "twice",
            ),
            (
                "[search.backends.x]\nkind = \"merge\"\nbackends = [\"y\"]\n\
                 [search.backends.y]\nkind = \"fallback\"\nbackends = [\"tantivy\"]\n",
                "itself a \"fallback\"",
            ),
            (
                "[search.backends.x]\nkind = \"brave\"\nbackends = [\"tantivy\"]\n",
                "search.backends.x.backends is for kind",
            ),
            (
                "[search.backends.x]\nkind = \"brave\"\ncx = \"0123\"\n",
                "search.backends.x.cx does not apply to kind = \"brave\"",
            ),
            (
                "[search.backends.x]\nkind = \"searxng\"\nurl = \"http://h\"\napi_key_env = \"K\"\n",
                "search.backends.x.api_key_env does not apply",
            ),
            (
                "[search.backends.x]\nkind = \"merge\"\nbackends = [\"tantivy\"]\nurl = \"http://h\"\n",
                "search.backends.x.url does not apply",
            ),
            (
                "[search.backends.x]\nkind = \"brave\"\napi_key_env = \" \"\n",
                "search.backends.x.api_key_env is empty",
            ),
            ("[search.backends.x]\nkind = \"brave\"\nurl = \"http://\"\n", "with a host"),
            (
                "[search.backends.x]\nkind = \"brave\"\nurl = \"http://exa mple.com/x\"\n",
                "with a host",
            ),
            (
                "[search.backends.x]\nkind = \"fallback\"\nbackends = [\"x\"]\n",
                "names `x` itself",
            ),
            (
                "[search.backends.x]\nkind = \"merge\"\nbackends = [\"tantivy\"]\nretries = 7\n",
                "search.backends.x.retries does not apply to kind = \"merge\" (a list has no limits",
            ),
            (
                "[search.backends.x]\nkind = \"brave\"\nurl = \"http:///res\"\n",
                "with a host",
            ),
            (
                "[search.backends.x]\nkind = \"bing\"\nurl = \"http://h\"\napi_key = \"k\"\n",
                "api_key",
            ),
        ] {
            let err = load(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
