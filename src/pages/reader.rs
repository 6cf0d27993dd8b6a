//! The page reader: opens what a page action names — a web page, or a
//! document of the local corpus — and returns its readable text.
//!
//! A web page is fetched under [`super::guard`]'s checks: redirects are
//! followed here (at most `max_redirects`), each target checked again; the
//! body is read up to `max_bytes` (the rest is never read, so a huge or
//! never-ending body costs at most that); the whole fetch has a deadline.
//! HTML becomes text in [`super::extract`] (Readability's article, a page too
//! deep to parse as flat text), on a blocking thread, at most
//! `extract_concurrency` at once; `text/plain` is kept as is; PDF and other
//! types are refused with a clear reason. A failed page answers with its
//! failure for `failure_ttl` without a new fetch. Fetches are limited globally
//! (`concurrency` in flight, `requests_per_second` started) and per host
//! (`host_requests_per_second`), and cached by
//! URL (TTL, bounded in bytes, concurrent misses of one URL fetched once).
//!
//! A target that is not an absolute URL opens a document of the local
//! corpus by id or title ([`Corpus`]: the tantivy index is one).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::corpus::Corpus;
use super::guard::{GuardedResolver, Lookup, Refusal, SystemLookup, UrlPolicy};
use crate::metrics::Metrics;

/// Hosts the per-host rate limiter tracks before it drops the idle ones.
const MAX_RATE_HOSTS: usize = 10_000;

/// Settings of the page reader (`[pages]` in the config).
#[derive(Clone, Debug)]
pub struct PageSettings {
    /// Fetch web pages at all (off until configured); the local corpus can
    /// always be opened.
    pub web: bool,
    /// Deadline of one page, redirects and reading included (default 10 s).
    pub timeout: Duration,
    /// Deadline of one connection (default 5 s).
    pub connect_timeout: Duration,
    /// Bytes of a body read at most (default 2 MiB); the rest is never read.
    pub max_bytes: usize,
    /// Redirects followed (default 5).
    pub max_redirects: usize,
    /// Fetches in flight across all requests (default 8).
    pub concurrency: usize,
    /// HTML extractions running at once (default 2). An extraction holds its
    /// slot until it ends, also after its page's deadline has passed, so
    /// slow pages queue rather than pile up on the blocking threads.
    pub extract_concurrency: usize,
    /// Fetches started per second per host; 0 for no limit (default 2).
    pub host_requests_per_second: u32,
    /// Fetches started per second in all; 0 for no limit (default 20).
    pub requests_per_second: u32,
    /// How long a page is served from the cache (default 600 s); 0 disables it.
    pub cache_ttl: Duration,
    /// Bytes the page cache holds at most (default 64 MiB).
    pub cache_max_bytes: u64,
    /// How long a failed web page answers with its failure without a new
    /// fetch (default 30 s); zero disables it.
    pub failure_ttl: Duration,
    /// Sent as `User-Agent`.
    pub user_agent: String,
    /// Hosts and networks (see [`UrlPolicy`]).
    pub policy: UrlPolicy,
}

impl Default for PageSettings {
    fn default() -> Self {
        Self {
            web: false,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_bytes: 2 * 1024 * 1024,
            max_redirects: 5,
            concurrency: 8,
            extract_concurrency: 2,
            host_requests_per_second: 2,
            requests_per_second: 20,
            cache_ttl: Duration::from_secs(600),
            cache_max_bytes: 64 * 1024 * 1024,
            failure_ttl: Duration::from_secs(30),
            user_agent: concat!("seeker/", env!("CARGO_PKG_VERSION"), " (page reader)").into(),
            policy: UrlPolicy::default(),
        }
    }
}

/// An opened page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Page {
    /// The URL read (after redirects), or the corpus document's id.
    pub url: String,
    /// The page's title (Readability's, the corpus title), possibly empty.
    pub title: String,
    /// Readable text, paragraphs separated by blank lines.
    pub text: String,
    /// `web`, or the corpus backend's name (`tantivy`).
    pub source: String,
    /// The body was longer than `max_bytes` and was cut there.
    pub truncated: bool,
}

/// Why a page could not be opened. The policy reads its own failure text;
/// this goes to the trace, the events and the metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// The URL or an address it resolves to is refused ([`UrlPolicy`]).
    #[error("refused: {0}")]
    Refused(String),
    /// Web pages are not read: `[pages] web = true` turns them on.
    #[error("reading web pages is off on this server")]
    Disabled,
    /// No corpus document has that id or title.
    #[error("no document {0:?} in the corpus")]
    NotFound(String),
    /// A content type seeker does not read (PDF, images, ...).
    #[error("cannot read {0} pages")]
    Unsupported(String),
    /// A non-success HTTP status.
    #[error("the page answered HTTP {0}")]
    Status(u16),
    /// The page's deadline passed.
    #[error("the page did not load within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// More redirects than allowed, or one without a usable `Location`.
    #[error("redirects: {0}")]
    Redirect(String),
    /// Connection, TLS or read failure.
    #[error("the page could not be fetched: {0}")]
    Connection(String),
}

impl PageError {
    /// A bounded label for metrics (`seeker_page_fetches_total{outcome}`).
    pub fn kind(&self) -> &'static str {
        match self {
            PageError::Refused(_) => "refused",
            PageError::Disabled => "disabled",
            PageError::NotFound(_) => "not_found",
            PageError::Unsupported(_) => "unsupported",
            PageError::Status(_) => "http_status",
            PageError::Timeout(_) => "timeout",
            PageError::Redirect(_) => "redirect",
            PageError::Connection(_) => "connection",
        }
    }
}

/// Opens pages; shared by all requests. See the module docs.
pub struct PageReader {
    settings: PageSettings,
    policy: Arc<UrlPolicy>,
    client: reqwest::Client,
    slots: Semaphore,
    extractions: Arc<Semaphore>,
    host_rate: Option<DefaultKeyedRateLimiter<String>>,
    rate: Option<DefaultDirectRateLimiter>,
    cache: Option<moka::future::Cache<String, Arc<Page>>>,
    failures: Option<moka::future::Cache<String, PageError>>,
    corpus: Option<(String, Arc<dyn Corpus>)>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for PageReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageReader")
            .field("web", &self.settings.web)
            .field("corpus", &self.corpus.as_ref().map(|c| &c.0))
            .finish_non_exhaustive()
    }
}

impl PageReader {
    /// A reader resolving names with the system resolver.
    ///
    /// # Errors
    /// When the HTTP client cannot be built (TLS backend initialisation).
    pub fn new(settings: PageSettings, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        Self::with_lookup(settings, Arc::new(SystemLookup), metrics)
    }

    /// A reader resolving names with `lookup` (tests give a fixed table).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn with_lookup(
        settings: PageSettings,
        lookup: Arc<dyn Lookup>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let policy = Arc::new(settings.policy.clone());
        let client = reqwest::Client::builder()
            // Every name goes through the guard; no proxy could bypass it.
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::clone(&policy), lookup)))
            .no_proxy()
            // Every fetch resolves (and so checks) its host again: a pooled
            // connection would skip the check of a changed DNS answer.
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.timeout)
            .user_agent(settings.user_agent.clone())
            .build()?;
        let host_rate = NonZeroU32::new(settings.host_requests_per_second)
            .map(|n| RateLimiter::keyed(Quota::per_second(n)));
        let rate = NonZeroU32::new(settings.requests_per_second)
            .map(|n| RateLimiter::direct(Quota::per_second(n)));
        let cache = (!settings.cache_ttl.is_zero() && settings.cache_max_bytes > 0).then(|| {
            moka::future::Cache::builder()
                .max_capacity(settings.cache_max_bytes)
                .weigher(|url: &String, page: &Arc<Page>| {
                    let bytes = url.len() + page.url.len() + page.title.len() + page.text.len();
                    u32::try_from(bytes + 64).unwrap_or(u32::MAX)
                })
                .time_to_live(settings.cache_ttl)
                .build()
        });
        let failures = (!settings.failure_ttl.is_zero()).then(|| {
            moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(settings.failure_ttl)
                .build()
        });
        Ok(Self {
            slots: Semaphore::new(settings.concurrency.max(1)),
            extractions: Arc::new(Semaphore::new(settings.extract_concurrency.max(1))),
            failures,
            settings,
            policy,
            client,
            host_rate,
            rate,
            cache,
            corpus: None,
            metrics,
        })
    }

    /// Opens corpus documents from `index`, reported as backend `name`.
    pub fn with_corpus(mut self, name: &str, index: Arc<dyn Corpus>) -> Self {
        self.corpus = Some((name.to_string(), index));
        self
    }

    /// Whether web pages are read at all.
    pub fn web_enabled(&self) -> bool {
        self.settings.web
    }

    /// Opens every target at once; one result per target, in order.
    pub async fn open_all(&self, targets: &[String]) -> Vec<Result<Page, PageError>> {
        futures::future::join_all(targets.iter().map(|t| self.open(t))).await
    }

    /// Opens one target: an `http(s)` URL, or a corpus document's id or
    /// title. Counted in `seeker_page_fetches_total{outcome}` (`cached` for
    /// a page the cache answered).
    ///
    /// # Errors
    /// A [`PageError`] for this target only.
    pub async fn open(&self, target: &str) -> Result<Page, PageError> {
        let started = Instant::now();
        let result = self.open_uncounted(target).await;
        let outcome = match &result {
            Ok((_, true)) => "cached",
            Ok((page, false)) if page.source == "web" => "ok",
            Ok(_) => "corpus",
            Err(e) => e.kind(),
        };
        let result = result.map(|(page, _)| page);
        self.metrics
            .page_fetches
            .with_label_values(&[outcome])
            .inc();
        if let Ok(page) = &result {
            self.metrics.page_bytes.inc_by(page.text.len() as u64);
        }
        self.metrics
            .page_fetch_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            tracing::info!(target, kind = e.kind(), error = %e, "page not opened");
        }
        result
    }

    /// The page, and whether it came from the cache.
    async fn open_uncounted(&self, target: &str) -> Result<(Page, bool), PageError> {
        let target = clean_target(target);
        let url = match url::Url::parse(target) {
            Ok(url) => url,
            // Not an absolute URL: a corpus document.
            Err(_) => return self.open_document(target).await.map(|p| (p, false)),
        };
        self.policy
            .check_url(&url)
            .map_err(|r| PageError::Refused(r.0))?;
        if !self.settings.web {
            return Err(PageError::Disabled);
        }
        let key = url.to_string();
        if let Some(failure) = match &self.failures {
            Some(failures) => failures.get(&key).await,
            None => None,
        } {
            return Err(failure);
        }
        let fetch = async {
            tokio::time::timeout(self.settings.timeout, self.fetch(url))
                .await
                .unwrap_or(Err(PageError::Timeout(self.settings.timeout)))
                .map(Arc::new)
        };
        let result = match &self.cache {
            None => fetch.await.map(|p| (p.as_ref().clone(), false)),
            Some(cache) => cache
                .entry(key.clone())
                .or_try_insert_with(fetch)
                .await
                .map(|e| {
                    let cached = !e.is_fresh();
                    (e.into_value().as_ref().clone(), cached)
                })
                .map_err(|e| e.as_ref().clone()),
        };
        // A page that failed is not fetched again for a while: a hostile
        // page a model keeps asking for costs one fetch, not one a call.
        if let (Err(e), Some(failures)) = (&result, &self.failures) {
            failures.insert(key, e.clone()).await;
        }
        result
    }

    async fn open_document(&self, target: &str) -> Result<Page, PageError> {
        let Some((name, index)) = &self.corpus else {
            return Err(PageError::NotFound(target.to_string()));
        };
        let index = Arc::clone(index);
        let locator = target.to_string();
        let found = tokio::task::spawn_blocking(move || index.article(&locator))
            .await
            .map_err(|e| PageError::Connection(format!("corpus lookup failed: {e}")))?
            .map_err(|e| PageError::Connection(format!("corpus lookup failed: {e}")))?;
        match found {
            Some(article) => Ok(Page {
                url: article.id,
                title: article.title,
                text: article.text,
                source: name.clone(),
                truncated: false,
            }),
            None => Err(PageError::NotFound(target.to_string())),
        }
    }

    /// Fetches `url`, following redirects, each checked.
    async fn fetch(&self, mut url: url::Url) -> Result<Page, PageError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| PageError::Connection("reader closed".into()))?;
        let mut hops = 0;
        let response = loop {
            self.policy
                .check_url(&url)
                .map_err(|r| PageError::Refused(r.0))?;
            if let Some(rate) = &self.host_rate {
                rate.until_key_ready(&url.host_str().unwrap_or_default().to_string())
                    .await;
                // One entry per host ever seen: forget the idle ones now and then.
                if rate.len() > MAX_RATE_HOSTS {
                    rate.retain_recent();
                }
            }
            if let Some(rate) = &self.rate {
                rate.until_ready().await;
            }
            let response = self
                .client
                .get(url.clone())
                .header(
                    reqwest::header::ACCEPT,
                    "text/html, text/plain;q=0.9, */*;q=0.1",
                )
                // Bodies are read as they come: no compressed ones.
                .header(reqwest::header::ACCEPT_ENCODING, "identity")
                .send()
                .await
                .map_err(|e| request_error(e, self.settings.timeout))?;
            if !response.status().is_redirection() {
                break response;
            }
            hops += 1;
            if hops > self.settings.max_redirects {
                return Err(PageError::Redirect(format!(
                    "more than {} redirects",
                    self.settings.max_redirects
                )));
            }
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| PageError::Redirect("a redirect without Location".into()))?;
            url = url
                .join(location)
                .map_err(|e| PageError::Redirect(format!("bad Location {location:?}: {e}")))?;
        };
        let status = response.status();
        if !status.is_success() {
            return Err(PageError::Status(status.as_u16()));
        }
        let content_type_header = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let content_type = content_type_header
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let charset = content_type_header.split(';').skip(1).find_map(|p| {
            let (key, value) = p.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("charset")
                .then(|| value.trim().trim_matches('"').to_string())
        });
        let kind = match content_type.as_str() {
            "text/html" | "application/xhtml+xml" => Kind::Html,
            "text/plain" | "text/markdown" | "" => Kind::Plain,
            "application/pdf" => return Err(PageError::Unsupported("PDF".into())),
            other => return Err(PageError::Unsupported(other.to_string())),
        };
        // A server that compresses anyway sends bytes no extractor reads.
        if let Some(encoding) = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty() && v != "identity")
        {
            return Err(PageError::Unsupported(format!("{encoding}-encoded")));
        }
        let final_url = response.url().to_string();
        let (body, truncated) =
            read_capped(response, self.settings.max_bytes, self.settings.timeout).await?;
        // The slot is held by the blocking work itself: when the deadline
        // drops this future, the extraction still counts until it ends.
        let slot = Arc::clone(&self.extractions)
            .acquire_owned()
            .await
            .map_err(|_| PageError::Connection("reader closed".into()))?;
        let running = Running::start(self.metrics.page_extractions_running.clone());
        let flattened = self.metrics.page_flattened.clone();
        // Decoding (up to `max_bytes`) and extraction are CPU work: both run
        // on the blocking thread, not the runtime's.
        let (title, text) = tokio::task::spawn_blocking(move || {
            let _held = (slot, running);
            let body = decode(&body, charset.as_deref())?;
            Ok(match kind {
                // Without a type, markup is still read as HTML.
                Kind::Plain if !body.trim_start().starts_with('<') => {
                    (String::new(), body.trim().to_string())
                }
                _ => {
                    let (title, text, flat) = super::extract::extract(&body, "");
                    if flat {
                        flattened.inc();
                    }
                    (title, text)
                }
            })
        })
        .await
        .map_err(|e| PageError::Connection(format!("extraction failed: {e}")))??;
        Ok(Page {
            url: final_url,
            title,
            text,
            source: "web".into(),
            truncated,
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Html,
    Plain,
}

/// The body as text: in the charset the response declares (WHATWG labels:
/// `iso-8859-1` is read as windows-1252, as browsers read it), or the one
/// its byte-order mark names, else UTF-8.
///
/// # Errors
/// `Unsupported("binary")` when what it decodes to is not text: a NUL, or
/// more than a tenth replacement characters, in its first 8,192 characters.
fn decode(body: &[u8], charset: Option<&str>) -> Result<String, PageError> {
    let declared = charset.and_then(|c| encoding_rs::Encoding::for_label(c.as_bytes()));
    let encoding = declared.unwrap_or(encoding_rs::UTF_8);
    // `decode` lets a byte-order mark override the declared charset.
    let (text, _, _) = encoding.decode(body);
    let (mut chars, mut bad) = (0usize, 0usize);
    for c in text.chars().take(8192) {
        if c == '\0' {
            return Err(PageError::Unsupported("binary".into()));
        }
        chars += 1;
        bad += usize::from(c == char::REPLACEMENT_CHARACTER);
    }
    if bad * 10 > chars {
        return Err(PageError::Unsupported("binary".into()));
    }
    Ok(text.into_owned())
}

/// A target as models write it: surrounding whitespace, quotes and angle
/// brackets removed (`<access> "https://…" </access>`).
fn clean_target(target: &str) -> &str {
    target
        .trim()
        .trim_matches(|c| matches!(c, '"' | '\'' | '<' | '>' | '`'))
        .trim()
}

/// Counts one running extraction in a gauge while it lives (a panic
/// included).
struct Running(prometheus::IntGauge);

impl Running {
    fn start(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Reads at most `cap` bytes of the body; whether it was cut.
async fn read_capped(
    response: reqwest::Response,
    cap: usize,
    timeout: Duration,
) -> Result<(Vec<u8>, bool), PageError> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| request_error(e, timeout))?;
        let room = cap - body.len();
        if chunk.len() >= room {
            body.extend_from_slice(&chunk[..room]);
            // Dropping the stream closes the connection: the rest is never read.
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// A reqwest error as a [`PageError`]: a refusal by the resolver stays a
/// refusal (it is found in the error's source chain); reqwest's own deadline
/// (`timeout`, the page's) is a timeout.
fn request_error(e: reqwest::Error, timeout: Duration) -> PageError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Refusal>() {
            return PageError::Refused(r.0.clone());
        }
        source = s.source();
    }
    if e.is_timeout() {
        return PageError::Timeout(timeout);
    }
    // reqwest's Display hides the cause; the chain's last element names it.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message = s.to_string();
        source = s.source();
    }
    PageError::Connection(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_decoded_in_their_charset_and_binary_ones_refused() {
        let binary = || Err(PageError::Unsupported("binary".into()));
        assert_eq!(
            decode("ünïcödé, 日本語".as_bytes(), None).unwrap(),
            "ünïcödé, 日本語"
        );
        assert_eq!(decode(b"", None).unwrap(), "");
        assert_eq!(
            decode(b"caf\xe9 na\xefve", Some("iso-8859-1")).unwrap(),
            "café naïve"
        );
        assert_eq!(
            decode(b"caf\xe9 na\xefve", Some("Windows-1252")).unwrap(),
            "café naïve"
        );
        let utf16: Vec<u8> = "Taj Mahal"
            .encode_utf16()
            .flat_map(|u| u.to_le_bytes())
            .collect();
        assert_eq!(decode(&utf16, Some("utf-16le")).unwrap(), "Taj Mahal");
        let mut with_bom = vec![0xff, 0xfe];
        with_bom.extend(&utf16);
        assert_eq!(decode(&with_bom, None).unwrap(), "Taj Mahal");
        assert_eq!(decode(b"GIF89a\x00\x01", None), binary());
        let gzip = [0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0xfd, 0xfc, 0x80, 0x81];
        assert_eq!(decode(&gzip, None), binary());
        // A multi-byte character cut by the byte cap is not binary.
        let mut cut = "x".repeat(100).into_bytes();
        cut.extend_from_slice(&"日".as_bytes()[..2]);
        assert!(decode(&cut, None).is_ok());
        // An unknown label falls back to UTF-8.
        assert_eq!(decode(b"plain", Some("x-nonsense")).unwrap(), "plain");
    }

    #[test]
    fn targets_lose_quotes_and_brackets() {
        assert_eq!(clean_target("  \"https://a.org/x\" "), "https://a.org/x");
        assert_eq!(clean_target("<https://a.org/x>"), "https://a.org/x");
        assert_eq!(clean_target("Taj Mahal"), "Taj Mahal");
    }
}
