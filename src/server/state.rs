//! The state every handler shares: the engine (set once the model has
//! loaded), the search dispatcher, the policy profiles, the served model id,
//! generation defaults, metrics and the operational settings.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::openai::ModelObject;
use super::ops;
use crate::config::GenerationConfig;
use crate::engine::text::PolicyText;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::profile::Profile;
use crate::search::dispatch::Dispatcher;

/// Shared state of all handlers.
pub struct AppState {
    /// Set once the model has loaded, with the policy's text side; `None`
    /// until then (`/health` is 503).
    engine: OnceLock<(Arc<dyn Engine>, Arc<PolicyText>)>,
    /// What the load is waiting for, while it waits on something outside
    /// the server (a remote engine's replicas); said in the 503s until then.
    waiting: std::sync::Mutex<Option<String>>,
    /// Every configured search backend, behind one dispatcher.
    pub search: Arc<Dispatcher>,
    /// Every loaded policy profile, by name.
    pub profiles: BTreeMap<String, Arc<Profile>>,
    /// The profile used when a request names none.
    pub default_policy: String,
    /// The served model id (`/v1/models`).
    pub model_id: String,
    pub generation: GenerationConfig,
    /// Every metric (`GET /metrics`): the dispatcher's registry, one per
    /// server (search metrics are recorded by the dispatcher itself).
    pub metrics: Arc<Metrics>,
    /// API keys, limits, deadline and the shutdown signal.
    pub ops: ops::Ops,
    /// Browser origins allowed by CORS; empty = no CORS headers.
    pub(crate) cors_origins: Vec<String>,
    /// The policy a request with client tools runs when it names none and
    /// the default policy cannot call functions (`policy.tools`).
    pub(crate) tools_policy: Option<String>,
    /// Host names `/mcp` answers to (`server.mcp_allowed_hosts`).
    pub(crate) mcp_allowed_hosts: Vec<String>,
    /// Host names every route answers to; `None` for any
    /// (`server.allowed_hosts`, resolved by [`super::hosts::resolve`]).
    pub(crate) allowed_hosts: Option<Vec<String>>,
    /// Whether responses carry the security headers (`server.security_headers`).
    pub(crate) security_headers: bool,
    started: u64,
}

impl AppState {
    /// State whose engine is set later with [`AppState::set_engine`].
    ///
    /// # Panics
    /// When `default_policy` is not in `profiles` (checked at startup).
    pub fn new(
        model_id: String,
        search: Arc<Dispatcher>,
        profiles: BTreeMap<String, Profile>,
        default_policy: String,
        generation: GenerationConfig,
    ) -> Self {
        assert!(
            profiles.contains_key(&default_policy),
            "default policy {default_policy:?} is not loaded"
        );
        let metrics = Arc::clone(search.metrics());
        Self {
            engine: OnceLock::new(),
            waiting: std::sync::Mutex::new(None),
            metrics,
            ops: ops::Ops::default(),
            cors_origins: Vec::new(),
            mcp_allowed_hosts: crate::config::ServerConfig::default().mcp_allowed_hosts,
            allowed_hosts: None,
            security_headers: true,
            tools_policy: Some(crate::config::PolicyConfig::default().tools)
                .filter(|name| profiles.contains_key(name)),
            search,
            profiles: profiles
                .into_iter()
                .map(|(name, p)| (name, Arc::new(p)))
                .collect(),
            default_policy,
            model_id,
            generation,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// With the `[server]` settings (keys, limits, deadline, CORS, hosts, headers) instead of
    /// the defaults; `keys` are the accepted API keys.
    pub fn with_server_config(
        mut self,
        config: &crate::config::ServerConfig,
        keys: &[String],
    ) -> Self {
        self.ops = ops::Ops::new(config, keys);
        self.cors_origins = config.cors_origins.clone();
        self.security_headers = config.security_headers;
        self.mcp_allowed_hosts = super::hosts::normalise(&config.mcp_allowed_hosts);
        self.allowed_hosts = super::hosts::resolve(&config.allowed_hosts, &config.host);
        self
    }

    /// With `name` as the policy of requests with client tools
    /// (`policy.tools`; `None`: such requests must name a policy).
    pub fn with_tools_policy(mut self, name: Option<String>) -> Self {
        self.tools_policy = name;
        self
    }

    /// Marks the model as loaded: `engine` generates, `text` renders the
    /// policy's chats and counts its tokens. A second call is ignored.
    pub fn set_engine(&self, engine: Arc<dyn Engine>, text: Arc<PolicyText>) {
        let _ = self.engine.set((engine, text));
    }

    /// Says what the load is waiting for (shown in the 503s of `/health`
    /// and of requests until the engine is set).
    pub fn set_waiting(&self, what: String) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }

    /// The 503 message while the model loads: `the model is loading`, and
    /// what the load is waiting for when it said.
    pub(crate) fn loading_message(&self) -> String {
        match &*self.waiting.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(what) => format!("the model is still loading: {what}"),
            None => "the model is still loading; retry shortly".into(),
        }
    }

    /// The profile named `name`, or the default one.
    pub fn profile(&self, name: Option<&str>) -> Option<Arc<Profile>> {
        self.profiles
            .get(name.unwrap_or(&self.default_policy))
            .cloned()
    }

    /// The engine, once loaded.
    pub fn engine(&self) -> Option<Arc<dyn Engine>> {
        self.engine.get().map(|(engine, _)| Arc::clone(engine))
    }

    /// The engine and the policy's text side, once loaded.
    pub(crate) fn loaded(&self) -> Option<(Arc<dyn Engine>, Arc<PolicyText>)> {
        self.engine.get().cloned()
    }

    /// The served model as `/v1/models` lists it.
    pub(crate) fn model_object(&self) -> ModelObject {
        ModelObject {
            id: self.model_id.clone(),
            object: super::openai::ModelTag::Tag,
            created: self.started,
            owned_by: "seeker".into(),
            policy: self.default_policy.clone(),
            policies: self.profiles.keys().cloned().collect(),
            search_backends: self
                .search
                .backend_names()
                .into_iter()
                .map(str::to_string)
                .collect(),
            search_backend_kinds: self.search.backend_kinds(),
            default_search_backend: self.search.default_backend().to_string(),
            max_tokens: self.generation.max_tokens,
            max_tokens_limit: self.generation.max_tokens_limit,
        }
    }
}
