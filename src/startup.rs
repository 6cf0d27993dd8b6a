//! The composition root: turns a [`Config`] into a running server — the
//! profiles, the search dispatcher (whose metrics registry is the server's),
//! the HTTP state and listener, the policy's text side (chat template,
//! control tokens, token count) and the engine, loaded in the
//! background — and owns the process's signals. Nothing else in the crate
//! names a concrete engine or reads the environment for the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::path::{Path, PathBuf};

use crate::config::{Config, EngineKind};
use crate::engine::chat_template::ChatTemplate;
use crate::engine::checkpoint::Checkpoint;
#[cfg(feature = "embedded")]
use crate::engine::mistral::{MistralConfig, MistralEngine};
use crate::engine::remote::{RemoteConfig, RemoteEngine};
use crate::engine::text::PolicyText;
use crate::engine::EngineError;
use crate::profile::Profile;
use crate::secret::Secret;
use crate::server::{run, AppState};

/// The server's shared state from `config`: profiles (the default one must
/// exist), the search dispatcher over every configured backend, API keys
/// read through `env`, limits. The engine is set later
/// ([`AppState::set_engine`]).
///
/// # Errors
/// Unreadable or invalid profiles, an unknown default policy, a search
/// backend that cannot start (a missing index).
pub fn app_state(
    config: &Config,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<AppState> {
    let profiles = Profile::load_dir(&config.policy.dir)?;
    if !profiles.contains_key(&config.policy.default) {
        anyhow::bail!(
            "policy.default = {:?} is not a profile in {} (have: {})",
            config.policy.default,
            config.policy.dir.display(),
            profiles.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let tools = &config.policy.tools;
    if !tools.is_empty()
        && profiles
            .get(tools)
            .is_none_or(|p| p.template_tools().is_empty())
    {
        anyhow::bail!(
            "policy.tools = {tools:?} is not a profile in {} that offers functions through \
             the chat template (tools.render = \"template\"); set it to one, or to \"\"",
            config.policy.dir.display()
        );
    }
    let search = crate::search::dispatcher_from_config(&config.search, &config.pages, &env)?;
    tracing::info!(
        backends = %search.backend_names().join(", "),
        default = search.default_backend(),
        policy = %config.policy.default,
        "search ready"
    );
    let keys = config.server.keys(&env);
    tracing::info!(
        api_keys = keys.len(),
        cors = %config.server.cors_origins.join(", "),
        max_concurrent_requests = config.server.max_concurrent_requests,
        request_timeout_s = config.server.request_timeout_s,
        "server settings"
    );
    Ok(AppState::new(
        config.model.id.clone(),
        Arc::new(search),
        profiles,
        config.policy.default.clone(),
        config.generation.clone(),
    )
    .with_server_config(&config.server, &keys)
    .with_tools_policy((!tools.is_empty()).then(|| tools.clone())))
}

/// Starts the server from `config`: opens the index and profiles (failing fast),
/// binds, prints `seeker listening on http://ADDR` to stdout, loads the model in
/// the background (`/health` is 503 until it is ready, every connection is
/// served meanwhile) and serves until SIGINT or SIGTERM. A signal during the
/// model load returns at once; one while serving starts the graceful shutdown
/// of [`run`], and a second one returns without waiting for open requests.
///
/// # Errors
/// Missing index or profile, bind failure, model load failure.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    #[cfg(not(feature = "embedded"))]
    anyhow::ensure!(
        config.model.engine == EngineKind::Remote,
        "model.engine = \"embedded\", but this seeker was built without the embedded engine \
         (cargo build --no-default-features): set model.engine = \"remote\" and \
         model.remote_urls (SEEKER_MODEL__ENGINE=remote), or build with the default features"
    );
    let state = Arc::new(app_state(&config, crate::config::env_value)?);
    let remote = config.model.engine == EngineKind::Remote;
    // The chat template and control tokens are read before the server
    // listens: a broken remote template stops the start here.
    let source = template_source(&config).await?;
    let (template, special_tokens) = tokio::task::spawn_blocking(move || source.load()).await??;
    let template = match template {
        Err(e) if remote => return Err(e.into()),
        template => template,
    };

    let listener = bind(&config).await?;
    let addr: SocketAddr = listener.local_addr()?;
    // Caught before anyone can know the address: a signal from a supervisor
    // that saw the line below is always handled as a shutdown.
    let mut signals = Signals::new()?;
    println!("seeker listening on http://{addr}");

    // Three independent pieces, none polled inside another (seeker issue 12):
    // the HTTP server and the model load are tasks of their own on the
    // runtime's workers, and this function only watches them and the signals.
    // Before, the accept loop and the load were polled together in one
    // `select!` on the `block_on` thread, and mistral.rs's warm-up run, which
    // parks that thread with a nested blocking wait, could swallow the accept
    // loop's wake-up for good (see `build_off_runtime` in `engine/mistral/load.rs`).
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let grace = Duration::from_secs(config.server.shutdown_grace_s);
    let mut server = tokio::spawn(run(
        listener,
        Arc::clone(&state),
        async move {
            let _ = server_stopped.await;
        },
        grace,
    ));
    let (gguf, weights) = (config.model.gguf.clone(), config.model.weights);
    let from_checkpoint = !config.model.checkpoint.as_os_str().is_empty();
    let mut load = if remote {
        tokio::spawn(connect_remote(
            remote_config(&config),
            (template, special_tokens),
            Arc::clone(&state),
        ))
    } else {
        spawn_embedded(&config, (template, special_tokens), Arc::clone(&state))
    };

    // Until the model is loaded (or fails to): a signal stops the server at
    // once, without waiting for the load (weight preparation and loading are
    // not interruptible: the process exits under them, and a half-written
    // weight copy is removed here, or swept on the next start after a kill).
    tokio::select! {
        () = signals.recv() => {
            tracing::info!("signal received while the model loads: stopping");
            let _ = stop_server.send(());
            load.abort();
            if !remote && !from_checkpoint {
                crate::engine::prepare::discard_own_partial(&gguf, weights);
            }
            // Nothing but `/health`-style answers runs before the model is
            // loaded: a connection still open after a moment (a client that
            // sent half its headers or body) is not waited for.
            return match tokio::time::timeout(LOADING_SHUTDOWN, finish_server(server, signals)).await {
                Ok(ended) => ended,
                Err(_) => {
                    tracing::warn!("connections still open; exiting without them");
                    Ok(())
                }
            };
        }
        loaded = &mut load => {
            let failure = match loaded {
                Ok(Ok(())) => None,
                // `EngineError::Load` says "model load failed: …" itself.
                Ok(Err(e)) => Some(anyhow::Error::new(e)),
                Err(e) => Some(anyhow::anyhow!("model load task failed: {e}")),
            };
            if let Some(e) = failure {
                let _ = stop_server.send(());
                server.abort();
                return Err(e);
            }
        }
        ended = &mut server => return server_result(ended),
    }
    tokio::select! {
        () = signals.recv() => {
            let _ = stop_server.send(());
            finish_server(server, signals).await
        }
        ended = &mut server => server_result(ended),
    }
}

/// Where the chat template comes from, checked before the server listens:
/// the remote engine's `model.tokenizer_config` when set; else
/// `model.checkpoint` when set (for the embedded engine the whole directory
/// is checked, weights included: [`Checkpoint::open`]); otherwise the GGUF,
/// which must be a file and a usable model (fail before listening when the
/// model file is missing, not after). Both engines' chat template and
/// control tokens are read from the source returned.
///
/// # Errors
/// A missing or unusable GGUF or checkpoint, with the setting to change.
async fn template_source(config: &Config) -> anyhow::Result<TemplateSource> {
    let remote = config.model.engine == EngineKind::Remote;
    if remote && !config.model.tokenizer_config.as_os_str().is_empty() {
        return Ok(TemplateSource::TokenizerConfig(
            config.model.tokenizer_config.clone(),
        ));
    }
    let checkpoint = config.model.checkpoint.clone();
    if !checkpoint.as_os_str().is_empty() {
        if remote {
            anyhow::ensure!(
                checkpoint.join("tokenizer_config.json").is_file(),
                "model.checkpoint = {}: no tokenizer_config.json",
                checkpoint.display()
            );
        } else {
            let dir = checkpoint.clone();
            tokio::task::spawn_blocking(move || Checkpoint::open(&dir))
                .await?
                .map_err(|e| e.context("model.checkpoint is not a checkpoint seeker can serve"))?;
        }
        return Ok(TemplateSource::Checkpoint(checkpoint));
    }
    anyhow::ensure!(
        config.model.gguf.is_file(),
        "model.gguf = {} is not a file (run scripts/fetch-defaults.sh, or set \
         SEEKER_MODEL__GGUF{})",
        config.model.gguf.display(),
        if remote {
            "; the remote engine reads its chat template, or set model.tokenizer_config"
        } else {
            ""
        }
    );
    let gguf = config.model.gguf.clone();
    tokio::task::spawn_blocking(move || crate::engine::prepare::check_gguf(&gguf))
        .await?
        .map_err(|e| e.context("model.gguf is not a usable model"))?;
    Ok(TemplateSource::Gguf(config.model.gguf.clone()))
}

/// Binds `[server] host` and `port`.
///
/// # Errors
/// The address that could not be bound, and why.
async fn bind(config: &Config) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind((config.server.host.as_str(), config.server.port))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {}:{}: {e}",
                config.server.host,
                config.server.port
            )
        })
}

/// Loads the embedded engine in a task of its own ([`load_engine`]).
#[cfg(feature = "embedded")]
fn spawn_embedded(
    config: &Config,
    parts: TextParts,
    state: Arc<AppState>,
) -> tokio::task::JoinHandle<Result<(), EngineError>> {
    tokio::spawn(load_engine(mistral_config(config), parts, state))
}

/// A build without the embedded engine: [`serve`] refuses its config before
/// this is reached; should it be, the load fails with the same reason.
#[cfg(not(feature = "embedded"))]
fn spawn_embedded(
    _: &Config,
    _: TextParts,
    _: Arc<AppState>,
) -> tokio::task::JoinHandle<Result<(), EngineError>> {
    tokio::spawn(async {
        Err(EngineError::Load(
            "this seeker was built without the embedded engine".into(),
        ))
    })
}

/// The embedded engine's settings from `[model]`. Prefix reuse is off when
/// `max_num_seqs` > 1, with a warning: with sequences batched and reuse on,
/// questions sharing a long prefix got one another's answers (4 clients at
/// `max_num_seqs = 4` on the default model, `STEPS=embedded-throughput
/// bench/loop.sh`: EM 0.05 with reuse against 0.50 without, the same as one
/// sequence at a time; the cause inside mistral.rs's batching of reused caches
/// is not yet found), so correctness goes before the speed of reuse until that
/// path is fixed.
#[cfg(feature = "embedded")]
fn mistral_config(config: &Config) -> MistralConfig {
    let prefix_cache = config.model.prefix_cache && config.model.max_num_seqs == 1;
    if config.model.prefix_cache && !prefix_cache {
        tracing::warn!(
            max_num_seqs = config.model.max_num_seqs,
            "prefix reuse is off: it is not correct with batched sequences yet \
             (model.max_num_seqs > 1)"
        );
    }
    let checkpoint = &config.model.checkpoint;
    MistralConfig {
        gguf: config.model.gguf.clone(),
        checkpoint: (!checkpoint.as_os_str().is_empty()).then(|| checkpoint.clone()),
        isq: config.model.isq,
        dtype: config.model.dtype,
        max_num_seqs: config.model.max_num_seqs,
        weights: config.model.weights,
        prefix_cache,
        prefix_cache_mib: config.model.prefix_cache_mib,
        naive_prefix_cache: false,
        token_continuation: config.model.token_continuation,
    }
}

/// How long a signal during the model load waits for open connections.
const LOADING_SHUTDOWN: Duration = Duration::from_secs(1);

/// Where the policy's chat template and control tokens come from.
#[derive(Clone, Debug)]
enum TemplateSource {
    Gguf(PathBuf),
    TokenizerConfig(PathBuf),
    /// A Hugging Face checkpoint directory.
    Checkpoint(PathBuf),
}

/// The chat template (or why it cannot be used) and the control tokens: the
/// parts of the policy's [`PolicyText`] that startup reads from files.
type TextParts = (Result<ChatTemplate, EngineError>, Vec<String>);

impl TemplateSource {
    /// The compiled template, or why it does not compile, and the control
    /// tokens.
    ///
    /// # Errors
    /// The control tokens cannot be read.
    fn load(&self) -> anyhow::Result<TextParts> {
        Ok(match self {
            TemplateSource::Gguf(gguf) => (
                ChatTemplate::from_gguf(gguf),
                crate::engine::prepare::special_tokens(gguf)?,
            ),
            TemplateSource::TokenizerConfig(path) => (
                ChatTemplate::from_tokenizer_config(path),
                tokenizer_config_tokens(path)?,
            ),
            TemplateSource::Checkpoint(dir) => (
                ChatTemplate::from_checkpoint(dir),
                tokenizer_config_tokens(&dir.join("tokenizer_config.json"))?,
            ),
        })
    }
}

/// The control tokens of a `tokenizer_config.json`, with a warning when it
/// has none.
///
/// # Errors
/// An unreadable or malformed file.
fn tokenizer_config_tokens(path: &Path) -> anyhow::Result<Vec<String>> {
    let tokens = crate::engine::chat_template::special_tokens_of_tokenizer_config(path)?;
    if tokens.is_empty() {
        tracing::warn!(
            tokenizer_config = %path.display(),
            "no control tokens found (no special added_tokens_decoder entries, \
             no bos/eos/pad token, no additional_special_tokens): control tokens \
             written in messages and documents reach the model as such"
        );
    }
    Ok(tokens)
}

/// The remote engine's settings from `[model]`, the API key read from the
/// environment.
fn remote_config(config: &Config) -> RemoteConfig {
    let model = &config.model;
    RemoteConfig {
        urls: model.remote_urls.clone(),
        model: (!model.remote_model.is_empty()).then(|| model.remote_model.clone()),
        api_key: (!model.remote_api_key_env.is_empty())
            .then(|| std::env::var(&model.remote_api_key_env).ok())
            .flatten()
            .filter(|k| !k.trim().is_empty())
            .map(Secret::from),
        connect_timeout: Duration::from_secs(model.remote_connect_timeout_s.max(1)),
        read_timeout: Duration::from_secs(model.remote_read_timeout_s.max(1)),
        token_continuation: model.token_continuation,
    }
}

/// Connects to the remote engine's servers and hands the engine, with the
/// policy's text side made of `parts` and the servers' tokenizer, to `state`
/// (`/health` turns 200 once a replica answers).
async fn connect_remote(
    remote: RemoteConfig,
    (template, special_tokens): TextParts,
    state: Arc<AppState>,
) -> Result<(), EngineError> {
    let started = std::time::Instant::now();
    let engine = RemoteEngine::connect(&remote, Arc::clone(&state.metrics), |what| {
        state.set_waiting(what)
    })
    .await?;
    tracing::info!(
        replicas = %remote.urls.join(", "),
        model = engine.model(),
        seconds = started.elapsed().as_secs_f64(),
        "remote engine ready"
    );
    let text = PolicyText::with_template(template, special_tokens, engine.token_count());
    state.set_engine(Arc::new(engine), Arc::new(text));
    Ok(())
}

/// Loads the embedded model and hands it, with the policy's text side made
/// of `parts` and the model's tokenizer, to `state` (`/health` turns 200).
#[cfg(feature = "embedded")]
async fn load_engine(
    mistral: MistralConfig,
    (template, special_tokens): TextParts,
    state: Arc<AppState>,
) -> Result<(), EngineError> {
    let started = std::time::Instant::now();
    let engine = MistralEngine::load(&mistral)
        .await?
        .with_metrics(Arc::clone(&state.metrics));
    tracing::info!(
        model = %mistral.checkpoint.as_ref().unwrap_or(&mistral.gguf).display(),
        dtype = ?mistral.dtype,
        context = ?engine.max_seq_len(),
        seconds = started.elapsed().as_secs_f64(),
        "model loaded"
    );
    let text = PolicyText::with_template(template, special_tokens, engine.token_count());
    state.set_engine(
        Arc::new(
            crate::engine::gate::Gated::new(engine, mistral.max_num_seqs)
                .with_metrics(Arc::clone(&state.metrics)),
        ),
        Arc::new(text),
    );
    Ok(())
}

/// Waits for the server task after it was told to stop (graceful shutdown:
/// open requests get `shutdown_grace_s`); a second signal ends the wait at once.
async fn finish_server(
    mut server: tokio::task::JoinHandle<std::io::Result<()>>,
    mut signals: Signals,
) -> anyhow::Result<()> {
    tokio::select! {
        ended = &mut server => server_result(ended),
        () = signals.recv() => {
            tracing::warn!("second signal: exiting without waiting for open requests");
            server.abort();
            Ok(())
        }
    }
}

fn server_result(ended: Result<std::io::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    match ended {
        Ok(result) => Ok(result?),
        Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
    }
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from the moment this is created: from
/// then on they no longer end the process by their default action but are
/// reported by [`Signals::recv`], so create it before telling anyone the
/// server listens.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next SIGINT or SIGTERM (Ctrl-C elsewhere).
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batched sequences get no prefix reuse (it gave them one another's answers);
    /// one sequence at a time keeps it, and `prefix_cache = false` stays off.
    /// A build without the embedded engine refuses a config that asks for it,
    /// before it opens anything, and says what to set instead.
    #[cfg(not(feature = "embedded"))]
    #[tokio::test]
    async fn without_the_embedded_engine_an_embedded_config_is_refused() {
        let e = serve(Config::default()).await.unwrap_err().to_string();
        assert!(e.contains("built without the embedded engine"), "{e}");
        assert!(e.contains("model.engine = \"remote\""), "{e}");
    }

    #[cfg(feature = "embedded")]
    #[test]
    fn prefix_reuse_only_runs_one_sequence_at_a_time() {
        let mut config = Config::default();
        assert!(mistral_config(&config).prefix_cache);
        config.model.max_num_seqs = 4;
        let batched = mistral_config(&config);
        assert!(!batched.prefix_cache);
        assert_eq!(batched.max_num_seqs, 4);
        config.model.max_num_seqs = 1;
        config.model.prefix_cache = false;
        assert!(!mistral_config(&config).prefix_cache);
    }
}
