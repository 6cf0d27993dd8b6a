//! The dispatcher and its backends, built from the `[search]` config.

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::{BackendLimits, DispatchConfig, Dispatcher};
use super::{bm25, dense, embed, flashrag, hybrid, r1searcher, retriever, web, SearchBackend};
use crate::config::{BackendKind, PagesConfig, SearchConfig};
use crate::pages::PageReader;

/// The dispatcher for a `[search]` config: the built-in `tantivy` index plus
/// every `[search.backends.NAME]`, with `search.default` as the default, and
/// the page reader of `[pages]` (which opens the built-in index's documents
/// too). `env` looks up API keys by the variable names the config gives.
///
/// # Errors
/// An index that does not open, a Bing backend whose key variable is unset
/// (named in the message; the key itself never is), invalid `[pages]`.
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
    for (name, b) in &config.backends {
        let url = b.url.clone().unwrap_or_default();
        let limits = BackendLimits {
            concurrency: b.concurrency,
            requests_per_second: b.requests_per_second,
            retries: b.retries,
            strip_html: matches!(b.kind, BackendKind::Bing | BackendKind::Searxng),
        };
        let backend: Arc<dyn SearchBackend> = match b.kind {
            BackendKind::Tantivy => {
                let index = b
                    .index
                    .as_deref()
                    .expect("validated: tantivy backends have an index");
                open(index)?
            }
            BackendKind::Bing => {
                let var = b.api_key_env.as_deref().unwrap_or("BING_SEARCH_KEY");
                let key = env(var).filter(|k| !k.is_empty()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "search.backends.{name}: the Bing API key variable {var} is not set"
                    )
                })?;
                let market = b.market.as_deref().unwrap_or("en-US");
                Arc::new(
                    web::BingBackend::new(&url, &key, market)
                        .map_err(|e| anyhow::anyhow!("search.backends.{name}: {e}"))?,
                )
            }
            BackendKind::Searxng => Arc::new(web::SearxngBackend::new(&url)),
            BackendKind::Retriever => Arc::new(retriever::RetrieverBackend::new(&url)),
            BackendKind::Flashrag => Arc::new(flashrag::FlashragBackend::new(&url)),
            BackendKind::R1Searcher => Arc::new(r1searcher::R1SearcherBackend::new(&url)),
        };
        tracing::info!(backend = %name, kind = ?b.kind, url = %url, "search backend configured");
        d.add(name, backend, limits);
    }
    d.set_default(&config.default)
        .map_err(|e| anyhow::anyhow!("search.default: {e}"))?;
    Ok(d)
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
            }
            if !config.backends.contains_key("hybrid") {
                d.add("hybrid", Arc::new(hybrid), limits);
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
