//! The dispatcher and its backends, built from the `[search]` config.

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::{BackendLimits, DispatchConfig, Dispatcher, ListMode};
use super::{
    bm25, dense, embed, flashrag, hybrid, r1searcher, retriever, web, SearchBackend, SearchError,
};
use crate::config::{BackendConfig, BackendKind, PagesConfig, SearchConfig};
use crate::pages::PageReader;

/// The dispatcher for a `[search]` config: the built-in `tantivy` index plus
/// every `[search.backends.NAME]`, with `search.default` as the default, and
/// the page reader of `[pages]` (which opens the built-in index's documents
/// too). `env` looks up API keys by the variable names the config gives.
///
/// # Errors
/// An index that does not open, a web provider whose key variable is unset
/// (named in the message; the key itself never is) or that lacks a setting,
/// a list naming a backend this server does not have (`dense` without its
/// index), invalid `[pages]`.
pub fn dispatcher_from_config(
    config: &SearchConfig,
    pages: &PagesConfig,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Dispatcher> {
    let mut d = Dispatcher::new(DispatchConfig {
        round_timeout: Duration::from_millis(config.round_timeout_ms),
        query_timeout: Duration::from_millis(config.query_timeout_ms),
        cache_ttl: Duration::from_secs(config.cache_ttl_s),
        cache_capacity: config.cache_capacity,
        cache_max_bytes: config.cache_max_bytes,
        max_document_chars: config.max_document_chars,
    });
    let open_index = |path: &std::path::Path| -> anyhow::Result<Arc<bm25::Bm25Index>> {
        let index = bm25::Bm25Index::open(path)?;
        tracing::info!(index = %path.display(), documents = index.num_docs(), "search index ready");
        Ok(Arc::new(index))
    };
    let open = |path: &std::path::Path| -> anyhow::Result<Arc<dyn SearchBackend>> {
        Ok(Arc::new(bm25::Bm25Backend::new(open_index(path)?)))
    };
    let local = BackendLimits {
        concurrency: std::thread::available_parallelism().map_or(2, |n| n.get()),
        retries: 0,
        ..BackendLimits::default()
    };
    let index = open_index(&config.index).map_err(|e| anyhow::anyhow!("search.index: {e}"))?;
    d.add(
        "tantivy",
        Arc::new(bm25::Bm25Backend::new(Arc::clone(&index))),
        local.clone(),
    );
    add_dense(&mut d, config, &index, local.clone());
    let settings = pages.settings()?;
    tracing::info!(
        web = settings.web,
        allow_hosts = settings.policy.allow_hosts.len(),
        allow_networks = settings.policy.allow_networks.len(),
        "page reader ready"
    );
    let reader = PageReader::new(settings, Arc::clone(d.metrics()))?.with_corpus("tantivy", index);
    d.set_pages(reader);
    d.set_kind("tantivy", "tantivy");
    for (name, b) in &config.backends {
        if matches!(b.kind, BackendKind::Fallback | BackendKind::Merge) {
            continue;
        }
        let url = b.url.clone().unwrap_or_default();
        let limits = b.limits(matches!(b.kind, BackendKind::Web(p) if p.strip_html));
        let backend: Arc<dyn SearchBackend> = match b.kind {
            BackendKind::Tantivy => {
                let index = b
                    .index
                    .as_deref()
                    .expect("validated: tantivy backends have an index");
                open(index)?
            }
            BackendKind::Web(provider) => web_backend(name, b, provider, &env)?,
            BackendKind::Retriever => Arc::new(retriever::RetrieverBackend::new(&url)),
            BackendKind::Flashrag => Arc::new(flashrag::FlashragBackend::new(&url)),
            BackendKind::R1Searcher => Arc::new(r1searcher::R1SearcherBackend::new(&url)),
            BackendKind::Fallback | BackendKind::Merge => unreachable!("skipped above"),
        };
        let shown = match b.kind {
            BackendKind::Web(p) => b.url.as_deref().or(p.default_url).unwrap_or_default(),
            _ => url.as_str(),
        };
        tracing::info!(backend = %name, kind = b.kind.name(), url = %shown, "search backend configured");
        d.add(name, backend, limits);
        d.set_kind(name, b.kind.name());
    }
    for (name, b) in &config.backends {
        let mode = match b.kind {
            BackendKind::Fallback => ListMode::Fallback,
            BackendKind::Merge => ListMode::Merge,
            _ => continue,
        };
        d.add_list(name, mode, b.backends.clone()).map_err(|e| {
            let reason = match &e {
                SearchError::UnknownBackend(member) => d
                    .check_backend(member)
                    .err()
                    .unwrap_or_else(|| e.to_string()),
                other => other.to_string(),
            };
            anyhow::anyhow!("search.backends.{name}.backends: {reason}")
        })?;
        tracing::info!(backend = %name, kind = b.kind.name(), members = %b.backends.join(", "), "search backend list configured");
    }
    d.set_default(&config.default)
        .map_err(|e| anyhow::anyhow!("search.default: {e}"))?;
    Ok(d)
}

/// The web provider backend `name` of `b`: its `url` or the provider's
/// endpoint, the key from the variable `api_key_env` names (or the
/// provider's default variable).
fn web_backend(
    name: &str,
    b: &BackendConfig,
    provider: &'static web::Provider,
    env: &impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Arc<dyn SearchBackend>> {
    let key = match provider.key_env {
        None => None,
        Some(default) => {
            let var = b.api_key_env.as_deref().unwrap_or(default);
            let fix = format!(
                "export {var}=<your {} key> before starting seeker",
                provider.kind
            );
            let key = env(var).ok_or_else(|| {
                anyhow::anyhow!(
                    "search.backends.{name} (kind = {:?}): the key variable {var} is not set; {fix}",
                    provider.kind
                )
            })?;
            if key.is_empty() {
                anyhow::bail!(
                    "search.backends.{name} (kind = {:?}): the key variable {var} is set but empty; {fix}",
                    provider.kind
                );
            }
            if key.trim() != key || !key.chars().all(|c| c.is_ascii_graphic()) {
                anyhow::bail!(
                    "search.backends.{name} (kind = {:?}): the key in {var} holds spaces, line \
                     breaks, bytes that are not UTF-8 or characters other than printable ASCII \
                     (a trailing newline from a file?); {fix}",
                    provider.kind
                );
            }
            if key.chars().count() < 8 {
                anyhow::bail!(
                    "search.backends.{name} (kind = {:?}): the key in {var} is shorter than 8 \
                     characters, which no provider issues; {fix}",
                    provider.kind
                );
            }
            Some(key)
        }
    };
    let url = b
        .url
        .as_deref()
        .or(provider.default_url)
        .expect("validated: a provider without an endpoint has a url");
    let settings = web::WebSettings {
        url,
        key: key.as_deref(),
        market: b.market.as_deref(),
        cx: b.cx.as_deref(),
        page_text: b.page_text,
    };
    (provider.build)(&settings).map_err(|e| anyhow::anyhow!("search.backends.{name}: {e}"))
}

/// `dense` and `hybrid` from `[search.dense]`: served when the encoder loads
/// and `<search.index>/dense` was built with it; otherwise both are marked
/// unavailable with the reason (and the command that fixes it), which a
/// request naming one is told, and the start logs it once. An empty
/// `search.dense.model` adds neither; a `[search.backends.dense]` (or
/// `hybrid`) of the config takes that name instead of the built-in one.
fn add_dense(
    d: &mut Dispatcher,
    config: &SearchConfig,
    index: &Arc<bm25::Bm25Index>,
    limits: BackendLimits,
) {
    let model = &config.dense.model;
    if model.as_os_str().is_empty() {
        return;
    }
    let built = config
        .index
        .join(dense::DENSE_DIR)
        .join(dense::DENSE_MANIFEST)
        .is_file();
    let opened = (|| -> anyhow::Result<(Arc<dyn SearchBackend>, usize, &'static str)> {
        if !model.join("config.json").is_file() {
            anyhow::bail!(
                "no sentence encoder at {} (search.dense.model); `scripts/fetch-defaults.sh` \
                 fetches the default one",
                model.display()
            );
        }
        if !built {
            anyhow::bail!(
                "{} has no dense index; build it with `seeker index --dense {} --index {}`",
                config.index.display(),
                model.display(),
                config.index.display()
            );
        }
        let embedder = embed::Embedder::load(model, &config.dense.options())?;
        let dense_index = dense::DenseIndex::open(
            &config.index,
            index,
            embedder.spec(),
            model,
            config.dense.search(),
        )?;
        let rows = dense_index.manifest().rows;
        let search = if dense_index.is_approximate() {
            "binary"
        } else {
            "exact"
        };
        Ok((
            Arc::new(dense::DenseBackend::new(
                Arc::clone(index),
                Arc::new(dense_index),
                Arc::new(embedder),
                config.dense.batch_size,
            )),
            rows,
            search,
        ))
    })();
    match opened {
        Ok((dense_backend, rows, search)) => {
            // Concurrent queries are what the query encoder batches: let as
            // many in as it embeds at once (the matrix search after it is on
            // the blocking pool).
            let limits = BackendLimits {
                concurrency: config.dense.batch_size.max(limits.concurrency),
                ..limits
            };
            tracing::info!(model = %model.display(), rows, search, "dense index ready (backends dense, hybrid)");
            let bm25: Arc<dyn SearchBackend> = Arc::new(bm25::Bm25Backend::new(Arc::clone(index)));
            let hybrid =
                hybrid::HybridBackend::new(bm25, Arc::clone(&dense_backend), config.hybrid.clone());
            if !config.backends.contains_key("dense") {
                d.add("dense", dense_backend, limits.clone());
                d.set_kind("dense", "dense");
            }
            if !config.backends.contains_key("hybrid") {
                d.add("hybrid", Arc::new(hybrid), limits);
                d.set_kind("hybrid", "hybrid");
            }
        }
        Err(e) => {
            let reason = format!("dense retrieval is unavailable: {e:#}");
            if built {
                tracing::warn!("{reason}");
            } else {
                tracing::info!("{reason}");
            }
            for name in ["dense", "hybrid"] {
                if !config.backends.contains_key(name) {
                    d.set_unavailable(name, reason.clone());
                }
            }
        }
    }
}
