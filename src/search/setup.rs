//! The dispatcher and its backends, built from the `[search]` config.

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::{BackendLimits, DispatchConfig, Dispatcher};
use super::{bm25, retriever, web, SearchBackend};
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
        };
        tracing::info!(backend = %name, kind = ?b.kind, url = %url, "search backend configured");
        d.add(name, backend, limits);
    }
    d.set_default(&config.default)
        .map_err(|e| anyhow::anyhow!("search.default: {e}"))?;
    Ok(d)
}
