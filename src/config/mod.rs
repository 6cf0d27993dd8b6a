//! Server configuration: a typed struct from `config/seeker.toml`, overridden by
//! `SEEKER_<SECTION>__<KEY>` environment variables, then by command-line flags.
//! Unknown keys are errors. Relative paths are relative to the working directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::engine::mistral::ActivationDtype;
use crate::engine::prepare::WeightFormat;
use crate::search::dense::HybridConfig;
use crate::search::dispatch::{BackendLimits, DispatchConfig};
use crate::search::embed::{EmbedOptions, Pooling};
use crate::secret::Secret;

/// The default config file, used when it exists and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "config/seeker.toml";

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    pub search: SearchConfig,
    pub policy: PolicyConfig,
    pub generation: GenerationConfig,
    pub pages: PagesConfig,
}

/// `[server]`: where to listen, who may call, and how much load to take.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (printed at startup).
    pub port: u16,
    /// Accepted `Authorization: Bearer` keys. Empty (with an empty
    /// `api_keys_env` variable) means no authentication. Prefer the variable:
    /// a key in a file is a key in every copy of that file.
    pub api_keys: Vec<Secret>,
    /// Environment variable holding more keys, comma-separated (default
    /// `SEEKER_API_KEYS`). Keys are never logged.
    pub api_keys_env: String,
    /// Origins allowed to call the API from a browser (CORS). Empty (the
    /// default) sends no CORS headers; `["*"]` allows any origin.
    pub cors_origins: Vec<String>,
    /// Largest request body, bytes (default 2 MiB); larger bodies get a 413.
    pub max_body_bytes: usize,
    /// Chat and `/retrieve` requests running at once; one more gets a 429 with
    /// `Retry-After`. 0 = no limit. Health, metrics and docs are never limited.
    pub max_concurrent_requests: usize,
    /// Seconds one chat request may run, search rounds included; past it the
    /// request ends with a `request_timeout` error. 0 = no deadline.
    pub request_timeout_s: u64,
    /// Seconds a client has to send a chat or `/retrieve` body once its
    /// headers arrived; past it the request gets a 408 `body_timeout`. The
    /// body is read before the request takes a concurrency slot, so clients
    /// that trickle bodies cannot hold the slots. 0 = no limit.
    pub body_timeout_s: u64,
    /// Seconds a client has to send a request's headers, from the moment the
    /// connection waits for them: a new connection, or a kept-alive one between
    /// requests (so this is also the idle timeout). The connection is closed
    /// after it. 0 = none.
    pub header_timeout_s: u64,
    /// Connections open at once (HTTP/1.1 and HTTP/2 alike; default 1,024).
    /// At the cap the server stops accepting: new connections wait in the
    /// kernel's listen backlog until one closes (idle ones close after
    /// `header_timeout_s`). Each open connection holds one file descriptor,
    /// so keep it below the process's descriptor limit (`ulimit -n`). 0 = no
    /// cap (the descriptor limit is then the cap).
    pub max_connections: usize,
    /// Seconds open streams may keep running after SIGTERM/SIGINT before they
    /// are ended with a `server_shutting_down` error; new connections are
    /// refused at once.
    pub shutdown_grace_s: u64,
    /// Host names `/mcp` answers to (the `Host` header, port ignored);
    /// others get a 403 `host_not_allowed`: the MCP specification's guard
    /// against DNS rebinding. Default: the loopback names. Add the names
    /// clients use when the server is reached from elsewhere; `["*"]`
    /// allows any host.
    pub mcp_allowed_hosts: Vec<String>,
    /// Send `Content-Security-Policy`, `X-Content-Type-Options: nosniff`,
    /// `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer` on every
    /// response (default true; the policies are in `server::headers`). Turn
    /// off behind a proxy that sets its own.
    pub security_headers: bool,
}

/// Largest `server.max_connections` and `server.max_concurrent_requests`.
pub const MAX_LIMIT: usize = 1_000_000;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_keys: Vec::new(),
            api_keys_env: "SEEKER_API_KEYS".into(),
            cors_origins: Vec::new(),
            max_body_bytes: 2 * 1024 * 1024,
            max_concurrent_requests: 16,
            request_timeout_s: 600,
            body_timeout_s: 30,
            header_timeout_s: 30,
            max_connections: 1024,
            shutdown_grace_s: 30,
            mcp_allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            security_headers: true,
        }
    }
}

impl ServerConfig {
    /// The keys from `api_keys` and the `api_keys_env` variable (looked up with
    /// `env`), blanks dropped.
    pub fn keys(&self, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let from_env = if self.api_keys_env.is_empty() {
            None
        } else {
            env(&self.api_keys_env)
        };
        self.api_keys
            .iter()
            .map(|k| k.expose().to_string())
            .chain(
                from_env
                    .unwrap_or_default()
                    .split(',')
                    .map(|k| k.trim().to_string()),
            )
            .filter(|k| !k.trim().is_empty())
            .collect()
    }
}

/// Which engine runs the policy.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// mistral.rs in this process, on `model.gguf` (the default).
    #[default]
    Embedded,
    /// Inference servers at `model.remote_urls` (vLLM, SGLang, llama-server)
    /// through `/v1/completions`; `engine::remote`.
    Remote,
}

/// `[model]`: the policy model and the engine that runs it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Id served in `/v1/models` (the alias `default` also works).
    pub id: String,
    /// `embedded` (mistral.rs, default) or `remote`.
    pub engine: EngineKind,
    /// GGUF file with weights, tokenizer and chat template. With the remote
    /// engine only its chat template and control tokens are read, unless
    /// `tokenizer_config` is set.
    pub gguf: PathBuf,
    /// Remote engine: base URL of each replica (`http://gpu1:8000`). A
    /// rollout stays on one replica; new rollouts go to the least busy.
    pub remote_urls: Vec<String>,
    /// Remote engine: the model name sent to the servers; empty = the first
    /// model the first reachable server lists at `/v1/models`.
    pub remote_model: String,
    /// Remote engine: environment variable holding the servers' API key
    /// (sent as `Authorization: Bearer`); unset or empty = none.
    pub remote_api_key_env: String,
    /// Remote engine: seconds to open a connection to a replica.
    pub remote_connect_timeout_s: u64,
    /// Remote engine: the longest silence from a replica in seconds (to its
    /// first token, a long prefill included, and between tokens); past it
    /// the round moves to another replica.
    pub remote_read_timeout_s: u64,
    /// Remote engine: a Hugging Face `tokenizer_config.json` to take the chat
    /// template and control tokens from instead of `gguf` (for servers that
    /// run safetensors checkpoints). Empty = `gguf`.
    pub tokenizer_config: PathBuf,
    /// Activation dtype; `f32` is the fastest on CPU (`bench/README.md`).
    pub dtype: ActivationDtype,
    /// Sequences the engine runs at once. 1 (the default) serves requests one
    /// after another: on a CPU, running sequences of different lengths together
    /// is slower in total (measured: 4 questions 140 s together, 58 s in turn)
    /// and makes greedy output depend on what else runs.
    pub max_num_seqs: usize,
    /// Weight format the engine runs, prepared once next to `gguf` and loaded
    /// from there: `auto` (default) is `f32` when the F32 copy is at most
    /// 2 GiB, else `q8_0` when some weight has no candle SIMD kernel (Q4_1,
    /// Q5_0, Q5_1, Q8_1), else `as_is` (the default Qwen Q4_K_M file);
    /// `f32` dequantizes every weight (dense matmuls, `STEM.f32.gguf`);
    /// `q8_0` re-quantizes every quantized weight (`STEM.q8_0.gguf`); `as_is`
    /// loads `gguf` unchanged. Measured in `bench/README.md`.
    pub weights: WeightFormat,
    /// Prefix reuse in the embedded engine: a round's prompt takes the KV
    /// rows of the cached sequence it starts with (the previous round, or an
    /// earlier request sharing the system prompt) and prefills only the rest
    /// (`engine::reuse`; measured in `bench/README.md`).
    pub prefix_cache: bool,
    /// Most MiB of KV rows the prefix cache may hold (seeker counts them:
    /// a cached sequence holds its tokens rounded up to 512, times the
    /// model's KV bytes per token, 56 KiB for Qwen2.5-1.5B in F32); past it
    /// the cache is emptied.
    pub prefix_cache_mib: usize,
    /// A rollout's next round continues the previous round's token ids (its
    /// prompt's and the ones the model generated) instead of tokenizing the
    /// transcript text again, so that the prefix cache reuses all of them
    /// (`engine::continued`). Embedded engine with `prefix_cache`, and the
    /// remote engine (later rounds sent as token ids,
    /// `engine::remote::tokens`); `false` tokenizes each round's text whole,
    /// as before (for comparison).
    pub token_continuation: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            id: DEFAULT_MODEL_ID.into(),
            engine: EngineKind::Embedded,
            gguf: DEFAULT_GGUF.into(),
            remote_urls: Vec::new(),
            remote_model: String::new(),
            remote_api_key_env: "SEEKER_REMOTE_API_KEY".into(),
            remote_connect_timeout_s: 5,
            remote_read_timeout_s: 300,
            tokenizer_config: PathBuf::new(),
            dtype: ActivationDtype::F32,
            max_num_seqs: 1,
            weights: WeightFormat::Auto,
            prefix_cache: true,
            prefix_cache_mib: 2048,
            token_continuation: true,
        }
    }
}

/// The served id of the default model, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M):
/// the Qwen2.5 architecture and chat template of Search-R1's and RAG-R1's
/// policies, small enough for a CPU, and it writes its own search calls
/// under Search-R1's prompt.
pub const DEFAULT_MODEL_ID: &str = "Qwen2.5-Coder-1.5B-Instruct";

/// Where `scripts/fetch-defaults.sh` puts the default model's GGUF (joined
/// from hash-pinned wheels; `scripts/models/`).
pub const DEFAULT_GGUF: &str = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The small model (SmolLM2-135M-Instruct Q4_1, 98 MB): tests and
/// low-memory machines; `config/small.toml` serves it with the
/// `search-r1-prefetch` profile (it never writes a search call itself).
pub const SMALL_GGUF: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

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
    /// Corpora with more documents than this also get an approximate index
    /// (HNSW) at `seeker index --dense`, searched instead of the exact
    /// matrix product.
    pub approximate_above: usize,
    /// The graph's build parameters (`m`, `ef_construction`).
    pub hnsw: crate::search::ann::HnswParams,
    /// Candidates the graph search keeps (at least top-k): recall against
    /// latency.
    pub ef_search: usize,
    pub query_prefix: Option<String>,
    pub passage_prefix: Option<String>,
    pub pooling: Option<Pooling>,
    pub max_length: Option<usize>,
}

impl Default for DenseConfig {
    fn default() -> Self {
        Self {
            model: DEFAULT_ENCODER.into(),
            batch_size: 32,
            approximate_above: DEFAULT_APPROXIMATE_ABOVE,
            hnsw: crate::search::ann::HnswParams::default(),
            ef_search: 256,
            query_prefix: None,
            passage_prefix: None,
            pooling: None,
            max_length: None,
        }
    }
}

/// Above this many documents `seeker index --dense` builds an HNSW graph:
/// exact search grows linearly (one 384-d MiniLM query: ~9 ms at 50,000
/// rows, ~170 ms at 1M on 2 cores; `bench/README.md`).
pub const DEFAULT_APPROXIMATE_ABOVE: usize = 100_000;

impl DenseConfig {
    /// What `seeker index --dense` builds with.
    pub fn build(&self) -> crate::search::dense::DenseBuild {
        crate::search::dense::DenseBuild {
            batch_size: self.batch_size,
            approximate_above: self.approximate_above,
            hnsw: self.hnsw,
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

/// `[pages]`: the page reader behind page actions (`<access>`, `visit`).
/// Corpus documents always open; web pages only with `web = true`. What the
/// checks protect against: README "Reading pages".
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PagesConfig {
    /// Fetch http(s) pages (default off).
    pub web: bool,
    /// Deadline of one page, redirects and reading included, milliseconds.
    pub timeout_ms: u64,
    /// Bytes of a body read at most.
    pub max_bytes: usize,
    /// Redirects followed.
    pub max_redirects: usize,
    /// Fetches in flight across all requests.
    pub concurrency: usize,
    /// Fetches started per second per host; 0 = no limit.
    pub host_requests_per_second: u32,
    /// Fetches started per second in all; 0 = no limit.
    pub requests_per_second: u32,
    /// Seconds a page stays cached; 0 turns the cache off.
    pub cache_ttl_s: u64,
    /// Bytes the page cache holds.
    pub cache_max_bytes: u64,
    /// Only these hosts when non-empty: `example.org` or `*.example.org`.
    pub allow_hosts: Vec<String>,
    /// Never these hosts (same forms).
    pub deny_hosts: Vec<String>,
    /// Networks (CIDR) allowed although private, loopback or link-local.
    pub allow_networks: Vec<String>,
    /// Networks (CIDR) refused besides the built-in ranges.
    pub deny_networks: Vec<String>,
}

impl Default for PagesConfig {
    fn default() -> Self {
        let d = crate::pages::PageSettings::default();
        Self {
            web: d.web,
            timeout_ms: d.timeout.as_millis() as u64,
            max_bytes: d.max_bytes,
            max_redirects: d.max_redirects,
            concurrency: d.concurrency,
            host_requests_per_second: d.host_requests_per_second,
            requests_per_second: d.requests_per_second,
            cache_ttl_s: d.cache_ttl.as_secs(),
            cache_max_bytes: d.cache_max_bytes,
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            allow_networks: Vec::new(),
            deny_networks: Vec::new(),
        }
    }
}

impl PagesConfig {
    /// The reader's settings.
    ///
    /// # Errors
    /// A network that is not CIDR notation or an address, a host that is
    /// empty or not a host name, a zero timeout or byte cap; the message
    /// names the key.
    pub fn settings(&self) -> Result<crate::pages::PageSettings, ConfigError> {
        let nets = |key: &str, list: &[String]| {
            list.iter()
                .map(|n| {
                    n.parse::<ipnet::IpNet>()
                        .or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| {
                            ConfigError::Invalid(format!(
                                "pages.{key}: {n:?} is not a network such as 10.0.0.0/8 or an address"
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        if self.timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "pages.timeout_ms must be positive".into(),
            ));
        }
        if self.max_bytes == 0 {
            return Err(ConfigError::Invalid(
                "pages.max_bytes must be positive".into(),
            ));
        }
        let hosts = |key: &str, list: &[String]| {
            list.iter()
                .map(|h| {
                    let host = h.trim().to_ascii_lowercase();
                    let bare = host.strip_prefix("*.").unwrap_or(&host);
                    if bare.is_empty() || bare.contains(['/', ':', ' ']) {
                        return Err(ConfigError::Invalid(format!(
                            "pages.{key}: {h:?} is not a host such as example.org or *.example.org"
                        )));
                    }
                    Ok(host)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(crate::pages::PageSettings {
            web: self.web,
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            max_bytes: self.max_bytes,
            max_redirects: self.max_redirects,
            concurrency: self.concurrency.max(1),
            host_requests_per_second: self.host_requests_per_second,
            requests_per_second: self.requests_per_second,
            cache_ttl: std::time::Duration::from_secs(self.cache_ttl_s),
            cache_max_bytes: self.cache_max_bytes,
            policy: crate::pages::UrlPolicy {
                allow_hosts: hosts("allow_hosts", &self.allow_hosts)?,
                deny_hosts: hosts("deny_hosts", &self.deny_hosts)?,
                allow_networks: nets("allow_networks", &self.allow_networks)?,
                deny_networks: nets("deny_networks", &self.deny_networks)?,
            },
            ..crate::pages::PageSettings::default()
        })
    }
}

/// What a configured backend talks to.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Another local index built by `seeker index` (`index`).
    Tantivy,
    /// Bing Web Search v7 shape (`url` = the search endpoint, `api_key_env`).
    Bing,
    /// A SearXNG or searx instance with the JSON format on (`url` = its root).
    Searxng,
    /// A Search-R1-style `POST /retrieve` server (`url` = the route).
    Retriever,
    /// A FlashRAG server as ReCall serves it (`url` = its `POST /search` route).
    Flashrag,
    /// R1-Searcher's retriever (`url` = its `POST /queries` route).
    #[serde(rename = "r1-searcher")]
    R1Searcher,
}

/// `[search.backends.NAME]`: one backend and its limits.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub kind: BackendKind,
    /// Endpoint (bing), instance root (searxng) or route (retriever).
    #[serde(default)]
    pub url: Option<String>,
    /// Index directory (tantivy).
    #[serde(default)]
    pub index: Option<PathBuf>,
    /// Environment variable holding the API key (bing; default
    /// `BING_SEARCH_KEY`). The key itself never goes in a file or a log.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Bing market (`mkt`), default `en-US`.
    #[serde(default)]
    pub market: Option<String>,
    /// Calls in flight at once across all requests (default 4).
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Calls started per second across all requests; 0 = no limit (default).
    #[serde(default)]
    pub requests_per_second: u32,
    /// Retries after 429, 5xx or a connection error (default 2).
    #[serde(default = "default_retries")]
    pub retries: u32,
}

fn default_concurrency() -> usize {
    BackendLimits::default().concurrency
}

fn default_retries() -> u32 {
    BackendLimits::default().retries
}

/// `[policy]`: which protocol profile serves requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Profile name (a file in `dir`).
    pub default: String,
    /// Directory of profile TOML files.
    pub dir: PathBuf,
    /// The profile a chat request with `tools` (or tool messages) runs when
    /// it names no policy and `default` cannot call functions; it must render
    /// functions through the chat template. Empty: such a request is a 400.
    pub tools: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default: "search-r1".into(),
            dir: "config/policies".into(),
            tools: "tool-search".into(),
        }
    }
}

/// `[generation]`: request defaults and limits.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationConfig {
    /// Token budget across all rounds when a request gives no `max_tokens`.
    pub max_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            max_tokens_limit: 8192,
        }
    }
}

/// Config loading failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} not found")]
    NotFound(PathBuf),
    #[error("config file {0} is not a file")]
    NotAFile(PathBuf),
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A `SEEKER_<SECTION>__<KEY>` variable that names no setting or holds a
    /// value of the wrong type.
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

impl Config {
    /// Loads defaults, then `file` (or [`DEFAULT_CONFIG_FILE`] if it exists),
    /// then `SEEKER_<SECTION>__<KEY>` variables from `env`, each parsed as the
    /// type of the setting it names.
    ///
    /// # Errors
    /// A named file that does not exist, unknown keys, wrong types (with the
    /// file or variable and the key).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) if !path.exists() => return Err(ConfigError::NotFound(path.into())),
            Some(path) if !path.is_file() => return Err(ConfigError::NotAFile(path.into())),
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let defaults = serde_json::to_value(Config::default()).expect("config serialises");
        // Only SEEKER_SECTION__KEY variables are configuration; other SEEKER_*
        // variables (SEEKER_BIN for scripts, SEEKER_API_KEY for eval) are not.
        for (var, raw) in env {
            let Some(rest) = var.strip_prefix("SEEKER_") else {
                continue;
            };
            // SECTION__KEY, or deeper: SEARCH__DENSE__MODEL is search.dense.model.
            let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            if path.len() < 2 {
                continue;
            }
            let default = path.iter().fold(&defaults, |v, part| &v[part.as_str()]);
            let value = env_value(default, &raw).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            figment = figment.merge((path.join("."), value));
        }
        let config: Config = figment.extract().map_err(|e| {
            ConfigError::Invalid(
                e.into_iter()
                    .map(|e| {
                        let source = e
                            .metadata
                            .as_ref()
                            .and_then(|m| m.source.as_ref())
                            .map(|s| format!("{s}: "))
                            .unwrap_or_default();
                        let key = e.path.join(".");
                        let key = if key.is_empty() {
                            String::new()
                        } else {
                            format!("{key}: ")
                        };
                        format!("{source}{key}{}", e.kind)
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.pages.settings()?;
        if self.server.max_body_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "server.max_body_bytes must be at least 1024".into(),
            ));
        }
        // Bounds that keep a typo from becoming a panic (tokio's semaphore
        // takes at most 2^61 permits) while allowing any real deployment.
        for (key, value) in [
            ("max_connections", self.server.max_connections),
            (
                "max_concurrent_requests",
                self.server.max_concurrent_requests,
            ),
        ] {
            if value > MAX_LIMIT {
                return Err(ConfigError::Invalid(format!(
                    "server.{key} is {value}; at most {MAX_LIMIT} (0 = no limit)"
                )));
            }
        }
        for host in &self.server.mcp_allowed_hosts {
            let bare = host.trim_matches(|c| c == '[' || c == ']');
            if bare.is_empty() || bare.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(ConfigError::Invalid(format!(
                    "server.mcp_allowed_hosts: {host:?} is not a host name \
                     (a name or address without scheme or port, or \"*\")"
                )));
            }
        }
        for origin in &self.server.cors_origins {
            if origin != "*" {
                check_origin(origin).map_err(|why| {
                    ConfigError::Invalid(format!("server.cors_origins: {origin:?} {why}"))
                })?;
            }
        }
        if self.model.engine == EngineKind::Remote {
            if self.model.remote_urls.is_empty() {
                return Err(ConfigError::Invalid(
                    "model.engine = \"remote\" needs model.remote_urls (the servers' base URLs)"
                        .into(),
                ));
            }
            for (i, url) in self.model.remote_urls.iter().enumerate() {
                match reqwest::Url::parse(url) {
                    Err(e) => {
                        return Err(ConfigError::Invalid(format!(
                            "model.remote_urls: {url:?}: {e}"
                        )))
                    }
                    Ok(u) if !matches!(u.scheme(), "http" | "https") || !u.has_host() => {
                        return Err(ConfigError::Invalid(format!(
                            "model.remote_urls: {url:?} is not an http(s) URL"
                        )))
                    }
                    Ok(_) => {}
                }
                if self.model.remote_urls[..i].contains(url) {
                    return Err(ConfigError::Invalid(format!(
                        "model.remote_urls: {url:?} is listed twice"
                    )));
                }
            }
            let tokenizer_config = &self.model.tokenizer_config;
            if !tokenizer_config.as_os_str().is_empty() && !tokenizer_config.is_file() {
                return Err(ConfigError::Invalid(format!(
                    "model.tokenizer_config = {} is not a file",
                    tokenizer_config.display()
                )));
            }
            if self.model.remote_read_timeout_s == 0 {
                return Err(ConfigError::Invalid(
                    "model.remote_read_timeout_s must be at least 1".into(),
                ));
            }
        }
        if self.generation.max_tokens == 0 || self.generation.max_tokens_limit == 0 {
            return Err(ConfigError::Invalid(
                "generation.max_tokens and generation.max_tokens_limit must be at least 1".into(),
            ));
        }
        if self.generation.max_tokens > self.generation.max_tokens_limit {
            return Err(ConfigError::Invalid(
                "generation.max_tokens exceeds generation.max_tokens_limit".into(),
            ));
        }
        let search = &self.search;
        if search.default != "tantivy" && !search.backends.contains_key(&search.default) {
            return Err(ConfigError::Invalid(format!(
                "search.default = {:?} is neither `tantivy` nor a key of [search.backends] \
                 (have: {})",
                search.default,
                search
                    .backends
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if search.round_timeout_ms == 0 || search.query_timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "search.round_timeout_ms and search.query_timeout_ms must be at least 1".into(),
            ));
        }
        let h = &search.dense.hnsw;
        if !(2..=256).contains(&h.m) || h.ef_construction == 0 || search.dense.ef_search == 0 {
            return Err(ConfigError::Invalid(
                "search.dense.hnsw.m must be 2 to 256, search.dense.hnsw.ef_construction and \
                 search.dense.ef_search at least 1"
                    .into(),
            ));
        }
        if search.dense.batch_size == 0 {
            return Err(ConfigError::Invalid(
                "search.dense.batch_size must be at least 1".into(),
            ));
        }
        if search.dense.max_length.is_some_and(|n| n < 2) {
            return Err(ConfigError::Invalid(
                "search.dense.max_length must be at least 2 ([CLS] and [SEP])".into(),
            ));
        }
        let h = &search.hybrid;
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
        if search.backends.contains_key("tantivy") {
            return Err(ConfigError::Invalid(
                "search.backends.tantivy: `tantivy` is the built-in index (set search.index); \
                 give another local index another name"
                    .into(),
            ));
        }
        for (name, b) in &search.backends {
            let key = |k: &str| format!("search.backends.{name}.{k}");
            match b.kind {
                BackendKind::Tantivy if b.index.is_none() => {
                    return Err(ConfigError::Invalid(format!(
                        "{} is required for kind = \"tantivy\"",
                        key("index")
                    )))
                }
                BackendKind::Bing
                | BackendKind::Searxng
                | BackendKind::Retriever
                | BackendKind::Flashrag
                | BackendKind::R1Searcher => {
                    let Some(url) = b.url.as_deref() else {
                        let kind = serde_json::to_value(b.kind)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default();
                        return Err(ConfigError::Invalid(format!(
                            "{} is required for kind = {kind:?}",
                            key("url"),
                        )));
                    };
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(ConfigError::Invalid(format!(
                            "{} must be an http:// or https:// URL, got {url:?}",
                            key("url")
                        )));
                    }
                }
                BackendKind::Tantivy => {}
            }
            if b.concurrency == 0 {
                return Err(ConfigError::Invalid(format!(
                    "{} must be at least 1",
                    key("concurrency")
                )));
            }
        }
        if self.model.prefix_cache && self.model.prefix_cache_mib == 0 {
            return Err(ConfigError::Invalid(
                "model.prefix_cache_mib must be at least 1 (or set model.prefix_cache = false)"
                    .into(),
            ));
        }
        if self.model.max_num_seqs == 0 {
            return Err(ConfigError::Invalid(
                "model.max_num_seqs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Checks that `origin` is written as browsers send `Origin` (RFC 6454
/// serialisation: `scheme://host[:port]`, lower case, no path, no default
/// port), the only form that can ever match one: a value such as
/// `["http://a.example"]` (a TOML list in an environment variable, where
/// lists are comma-separated), `a.example` or `http://a.example/` was taken
/// as written and silently matched nothing.
///
/// # Errors
/// Why it is no origin, and the origin it would be where there is one.
fn check_origin(origin: &str) -> Result<(), String> {
    let list_hint = if origin.starts_with('[') {
        " (in an environment variable lists are comma-separated: a,b)"
    } else {
        ""
    };
    let no_origin =
        || format!("is not an origin (scheme://host[:port], as browsers send it){list_hint}");
    let url = url::Url::parse(origin).map_err(|_| no_origin())?;
    let serialised = url.origin().ascii_serialization();
    if url.host().is_none() || serialised == "null" {
        return Err(no_origin());
    }
    if serialised != origin {
        return Err(format!(
            "never matches a browser's Origin header, which would read {serialised:?}"
        ));
    }
    Ok(())
}

/// An environment value parsed as the type of the setting's default:
/// strings stay strings (`SEEKER_MODEL__ID=12345` is the id "12345").
fn env_value(default: &serde_json::Value, raw: &str) -> Result<figment::value::Value, String> {
    use figment::value::Value;
    match default {
        serde_json::Value::Null => Err("no such setting (see config/seeker.toml)".into()),
        serde_json::Value::String(_) => Ok(Value::from(raw.to_string())),
        serde_json::Value::Bool(_) => raw
            .parse::<bool>()
            .map(Value::from)
            .map_err(|_| format!("expected true or false, got {raw:?}")),
        serde_json::Value::Number(_) => raw
            .parse::<u64>()
            .map(Value::from)
            .map_err(|_| format!("expected a non-negative integer, got {raw:?}")),
        // Lists of strings: comma-separated.
        serde_json::Value::Array(_) => Ok(Value::from(
            raw.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>(),
        )),
        _ => Err("this setting cannot be set from the environment".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pages_settings_name_their_key() {
        let bad = |edit: fn(&mut PagesConfig)| {
            let mut p = PagesConfig::default();
            edit(&mut p);
            p.settings().unwrap_err().to_string()
        };
        assert!(bad(|p| p.deny_hosts = vec!["".into()]).contains("pages.deny_hosts"));
        assert!(bad(|p| p.allow_hosts = vec!["http://a.org/".into()]).contains("pages.allow_hosts"));
        assert!(
            bad(|p| p.allow_networks = vec!["nonsense".into()]).contains("pages.allow_networks")
        );
        let timeout = bad(|p| p.timeout_ms = 0);
        assert!(timeout.contains("pages.timeout_ms") && !timeout.contains("max_bytes"));
        assert!(bad(|p| p.max_bytes = 0).contains("pages.max_bytes"));
        let ok = PagesConfig {
            allow_hosts: vec![" *.Example.org ".into()],
            allow_networks: vec!["10.0.0.1".into()],
            ..PagesConfig::default()
        };
        let settings = ok.settings().unwrap();
        assert_eq!(settings.policy.allow_hosts, ["*.example.org"]);
        assert_eq!(settings.policy.allow_networks[0].to_string(), "10.0.0.1/32");
    }

    #[test]
    fn api_keys_are_read_but_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seeker.toml");
        std::fs::write(&file, "[server]\napi_keys = [\"sk-file-1\"]\n").unwrap();
        let config = Config::load(Some(&file), []).unwrap();
        let env = |name: &str| (name == "SEEKER_API_KEYS").then(|| "sk-env-2".to_string());
        assert_eq!(config.server.keys(env), ["sk-file-1", "sk-env-2"]);
        let printed = format!("{config:?}");
        assert!(!printed.contains("sk-file-1"), "{printed}");
        assert!(printed.contains("api_keys: [[redacted]]"));
    }

    #[test]
    fn cors_origins_that_can_never_match_are_refused() {
        let load = |raw: &str| {
            Config::load(
                None,
                [("SEEKER_SERVER__CORS_ORIGINS".to_string(), raw.to_string())],
            )
            .map(|c| c.server.cors_origins)
            .map_err(|e| e.to_string())
        };
        let listed = load(r#"["http://ok.example"]"#).unwrap_err();
        assert!(listed.contains("comma-separated"), "{listed}");
        assert!(load("ok.example").unwrap_err().contains("is not an origin"));
        let slash = load("http://ok.example/").unwrap_err();
        assert!(slash.contains(r#""http://ok.example""#), "{slash}");
        assert!(load("HTTP://OK.example").is_err());
        assert!(load("http://ok.example:80").is_err());
        assert_eq!(
            load("http://ok.example, https://b.example:8443, *").unwrap(),
            ["http://ok.example", "https://b.example:8443", "*"]
        );
        assert_eq!(load("http://[::1]:3000").unwrap(), ["http://[::1]:3000"]);
    }

    #[test]
    fn shipped_config_equals_the_defaults() {
        let file = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/seeker.toml"));
        let config = Config::load(Some(file), []).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn the_small_config_changes_only_the_model_and_the_profile() {
        let file = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/small.toml"));
        let config = Config::load(Some(file), []).unwrap();
        assert_eq!(config.model.gguf, Path::new(SMALL_GGUF));
        assert_eq!(config.model.id, "SmolLM2-135M-Instruct");
        assert_eq!(config.policy.default, "search-r1-prefetch");
        let mut back = config.clone();
        back.model.gguf = DEFAULT_GGUF.into();
        back.model.id = DEFAULT_MODEL_ID.into();
        back.policy.default = "search-r1".into();
        assert_eq!(back, Config::default());
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_overrides_and_unknown_keys() {
        let config = Config::load(
            None,
            env(&[
                ("SEEKER_SERVER__PORT", "9000"),
                ("SEEKER_MODEL__ID", "12345"),
                ("SEEKER_POLICY__DEFAULT", "true"),
                ("SEEKER_SEARCH__DENSE__BATCH_SIZE", "4"),
                ("SEEKER_BIN", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(config.search.dense.batch_size, 4);
        assert_eq!(config.server.port, 9000);
        // String settings stay strings, whatever they look like.
        assert_eq!(config.model.id, "12345");
        assert_eq!(config.policy.default, "true");

        let err = Config::load(None, env(&[("SEEKER_SERVER__PORT", "notaport")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SEEKER_SERVER__PORT") && err.contains("notaport"),
            "{err}"
        );
        let err = Config::load(None, env(&[("SEEKER_SERVER__PROT", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SEEKER_SERVER__PROT") && err.contains("no such setting"),
            "{err}"
        );
        let err = Config::load(None, env(&[("SEEKER_SERVER__PORT", "70000")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.port"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[server]\nprot = 1\n").unwrap();
        let err = Config::load(Some(&file), []).unwrap_err().to_string();
        assert!(err.contains("prot") && err.contains("bad.toml"), "{err}");
        assert!(!err.contains("figment"), "{err}");
        let err = Config::load(Some(dir.path()), []).unwrap_err().to_string();
        assert!(err.contains("not a file"), "{err}");
        let err = Config::load(Some(&dir.path().join("missing.toml")), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }

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
        assert_eq!(config.search.backends["web"].kind, BackendKind::Searxng);
        assert_eq!(config.search.backends["web"].requests_per_second, 2);
        assert_eq!(config.search.backends["dense"].concurrency, 4);
        assert_eq!(config.search.index, SearchConfig::default().index);

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
            ("[search.backends.x]\nkind = \"google\"\n", "google"),
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
