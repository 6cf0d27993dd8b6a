//! Web search providers, one file each, and what they share: the HTTP
//! client, reading a capped body, `Retry-After`, error statuses mapped onto
//! [`SearchError`] kinds, JSON parsing that names where it failed.
//!
//! Each provider maps its results to [`super::Document`]s `{title, text,
//! url}` (id = URL). Markup and entities in snippets are left for the
//! dispatcher to strip where [`Provider::strip_html`] says so; retries,
//! limits, deadlines and fallback are the dispatcher's. Credentials never
//! appear in an error, a log line or a `Debug` output: keys sent in headers
//! are marked sensitive, and errors drop the request URL (Google's key
//! travels in it).
//!
//! A provider is a file here with one [`Provider`] constant named
//! `PROVIDER` and its name in the `providers!` line below, which declares
//! the module and lists it in [`PROVIDERS`]; that list is all the config and
//! the dispatcher know of providers (`kind = "…"` in
//! `[search.backends.NAME]`).

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Response, StatusCode};
use serde::Deserialize;

use super::{SearchBackend, SearchError};

/// Declares each provider's module and lists its [`Provider`] in
/// [`PROVIDERS`], in this order: adding a provider is its file and its name
/// here.
macro_rules! providers {
    ($($provider:ident),* $(,)?) => {
        $(pub mod $provider;)*
        /// Every web provider a config may name.
        pub const PROVIDERS: &[&Provider] = &[$(&$provider::PROVIDER),*];
    };
}

providers!(bing, searxng, brave, tavily, serper, exa, google);

pub use bing::BingBackend;
pub use searxng::SearxngBackend;

/// The provider of `kind = "…"`, if one is listed in [`PROVIDERS`].
pub fn provider(kind: &str) -> Option<&'static Provider> {
    PROVIDERS.iter().copied().find(|p| p.kind == kind)
}

/// One web search provider: how the config names it, what it needs, and
/// how its backend is built.
pub struct Provider {
    /// `kind = "…"` in `[search.backends.NAME]`.
    pub kind: &'static str,
    /// The product, for messages and `seeker` docs ("Brave Search API").
    pub name: &'static str,
    /// The endpoint used when the config gives no `url`; `None`: a `url` is
    /// required (a self-hosted instance, a gateway).
    pub default_url: Option<&'static str>,
    /// The environment variable read for the API key when the config names
    /// none in `api_key_env`; `None`: no key (SearXNG).
    pub key_env: Option<&'static str>,
    /// Whether its snippets carry HTML markup or entities to strip.
    pub strip_html: bool,
    /// What becomes a document's text (for the table in docs/search.md).
    pub document_text: &'static str,
    /// The `[search.backends.NAME]` settings it reads besides `kind` and the
    /// limits (`url`, `api_key_env`, `market`, `cx`, `page_text`): setting
    /// another is a config error, not silently ignored.
    pub settings: &'static [&'static str],
    /// Builds the backend from the resolved settings.
    ///
    /// # Errors
    /// A setting it needs is missing or unusable (never naming the key).
    pub build: fn(&WebSettings<'_>) -> Result<Arc<dyn SearchBackend>, String>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind)
    }
}

impl PartialEq for Provider {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

impl Eq for Provider {}

/// What a provider's backend is built from: `[search.backends.NAME]` with
/// the defaults of its [`Provider`] applied and the key read from the
/// environment.
#[derive(Clone, Copy)]
pub struct WebSettings<'a> {
    /// The endpoint (or instance root, for SearXNG).
    pub url: &'a str,
    /// The API key, when the provider takes one.
    pub key: Option<&'a str>,
    /// Bing's market (`mkt`), e.g. `en-US`.
    pub market: Option<&'a str>,
    /// Google Programmable Search's engine id (`cx`).
    pub cx: Option<&'a str>,
    /// Ask for the page's text where the provider can return it (Tavily's
    /// `raw_content`, Exa's `text`) instead of a snippet.
    pub page_text: bool,
}

impl WebSettings<'_> {
    /// The key as a header value marked sensitive (never printed by
    /// `Debug`), for a provider called `name`.
    ///
    /// # Errors
    /// No key, or one with characters a header cannot hold (the message
    /// never includes it).
    pub fn key_header(&self, name: &str) -> Result<HeaderValue, String> {
        let key = self.key.ok_or_else(|| format!("{name} needs an API key"))?;
        let mut value = HeaderValue::from_str(key).map_err(|_| {
            format!("the {name} key holds characters not allowed in a header (a line break?)")
        })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// A key kept out of `Debug` output and logs.
#[derive(Clone)]
pub(crate) struct Key(pub(crate) String);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Largest response body read from a provider (4 MiB); more is malformed.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Characters of a provider's error message kept in a [`SearchError`].
const MAX_MESSAGE_CHARS: usize = 200;

/// An HTTP client for search providers: connect timeout 3 s, no overall
/// timeout (the dispatcher's deadlines apply), identifying user agent, and
/// no redirects followed and no `Referer` sent: a provider's API does not
/// redirect, and following one would carry the key (a header reqwest keeps
/// across hosts, or Google's URL as the `Referer`) to another server. A 3xx
/// is an `http_status` error.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .user_agent(concat!("seeker/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
        .build()
        .expect("the HTTP client builds")
}

/// A transport error as a [`SearchError`], without the URL's query string.
pub(crate) fn transport_error(e: reqwest::Error) -> SearchError {
    let e = e.without_url();
    // reqwest's own text ("error sending request") hides the cause; its
    // sources name it ("tcp connect error: Connection refused").
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    if e.is_builder() {
        // Not the provider's fault and not worth a retry: a request that
        // could not be built (a query too long for a URL, say).
        SearchError::Backend(format!("the request could not be built: {text}"))
    } else if e.is_timeout() {
        SearchError::Connection(format!("timed out: {text}"))
    } else if e.is_decode() || e.is_body() {
        SearchError::Malformed(text)
    } else {
        SearchError::Connection(text)
    }
}

/// `query` cut to at most `max` characters (at a character boundary) for
/// a provider that refuses longer ones or takes the query in its URL.
pub(crate) fn limit_query(query: &str, max: usize) -> &str {
    match query.char_indices().nth(max) {
        Some((at, _)) => &query[..at],
        None => query,
    }
}

/// Sends a provider's `request` and parses its JSON answer as `T`: errors
/// read with [`read_body_as`] (`message` and `classify` as there), and
/// every error's message with `secret` (the key) redacted
/// ([`SearchError::redact`]).
pub(crate) async fn fetch_json<T: for<'de> Deserialize<'de>>(
    request: reqwest::RequestBuilder,
    secret: Option<&str>,
    message: impl Fn(&[u8]) -> Option<String>,
    classify: impl Fn(u16, &str) -> Option<SearchError>,
) -> Result<T, SearchError> {
    let result = async {
        let response = request.send().await.map_err(transport_error)?;
        let body = read_body_as(response, secret, message, classify).await?;
        parse_json(&body)
    }
    .await;
    result.map_err(|e| match secret {
        Some(secret) => e.redact(secret),
        None => e,
    })
}

/// The `Retry-After` header as a wait: seconds, or an HTTP date. Without
/// it, the first window of Brave's `X-RateLimit-Reset` (`"1, 1419704"`:
/// seconds until each window resets) when that is at most an hour (an
/// epoch time, as other APIs send there, is not a wait).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let Some(value) = headers.get(RETRY_AFTER) else {
        let reset = headers.get("x-ratelimit-reset")?.to_str().ok()?;
        let first: u64 = reset.split(',').next()?.trim().parse().ok()?;
        return (first <= 3600).then(|| Duration::from_secs(first));
    };
    let value = value.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(3600.0)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// Reads a response: the body of a 2xx (at most [`MAX_BODY_BYTES`]), or the
/// status as a [`SearchError`] (429 → `RateLimited` with `Retry-After`, 401
/// and 403 → `Auth`, others → `Status`), with `message` extracting the
/// provider's own message from an error body.
pub(crate) async fn read_body(
    response: Response,
    message: impl Fn(&[u8]) -> Option<String>,
) -> Result<Vec<u8>, SearchError> {
    read_body_as(response, None, message, |_, _| None).await
}

/// [`read_body`] for a provider with codes of its own: `classify` sees an
/// error status (429 included) and the provider's message (already bounded)
/// and may name the error (a quota code → `Quota`, a key code → `Auth`);
/// `None` keeps the generic reading. `secret` (the key) is redacted from
/// the message and from a raw body written to the log.
pub(crate) async fn read_body_as(
    response: Response,
    secret: Option<&str>,
    message: impl Fn(&[u8]) -> Option<String>,
    classify: impl Fn(u16, &str) -> Option<SearchError>,
) -> Result<Vec<u8>, SearchError> {
    let status = response.status();
    let wait = retry_after(response.headers());
    let body = read_capped(response).await?;
    let redact = |text: String| match secret {
        Some(secret) => super::redact_secret(text, secret),
        None => text,
    };
    if status == StatusCode::TOO_MANY_REQUESTS {
        let text = message(&body).map(redact).unwrap_or_default();
        if let Some(error) = classify(429, &text) {
            return Err(error);
        }
        return Err(SearchError::RateLimited { retry_after: wait });
    }
    if !status.is_success() {
        // Only the provider's own error message reaches the client (in the
        // splice and the stream); a raw body (an HTML error page, a traceback
        // with the provider's file paths) goes to the log alone.
        let text = message(&body).map(redact).unwrap_or_else(|| {
            // Redacted whole, then cut: a cut could split the key.
            let raw = redact(String::from_utf8_lossy(&body).into_owned());
            let raw = super::clean::truncate_chars(&raw, MAX_MESSAGE_CHARS * 4);
            tracing::warn!(
                status = status.as_u16(),
                body = %super::clean::collapse_whitespace(raw),
                "search provider error without a structured message"
            );
            String::new()
        });
        let text = super::clean::collapse_whitespace(&text);
        let text = super::clean::truncate_chars(&text, MAX_MESSAGE_CHARS).to_string();
        let text = if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_string()
        } else {
            text
        };
        if let Some(error) = classify(status.as_u16(), &text) {
            return Err(error);
        }
        if matches!(status.as_u16(), 401 | 403) {
            return Err(SearchError::Auth(format!(
                "HTTP {}: {text}",
                status.as_u16()
            )));
        }
        return Err(SearchError::Status {
            status: status.as_u16(),
            message: text,
        });
    }
    Ok(body)
}

/// The JSON value at `path` (object keys) of an error body, as text.
pub(crate) fn json_message(body: &[u8], path: &[&str]) -> Option<String> {
    let mut v: &serde_json::Value = &serde_json::from_slice(body).ok()?;
    for key in path {
        v = v.get(key)?;
    }
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// A document from a web result: id = URL, no score.
pub(crate) fn web_document(title: String, url: String, text: String) -> super::Document {
    let url = (!url.is_empty()).then_some(url);
    super::Document {
        id: url.clone().unwrap_or_default(),
        title,
        text,
        url,
        score: 0.0,
        backend: String::new(),
    }
}

async fn read_capped(mut response: Response) -> Result<Vec<u8>, SearchError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(SearchError::Malformed(format!(
                "response body over {MAX_BODY_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Parses a JSON body, naming the path of the first mismatch.
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, SearchError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(SearchError::Malformed("empty response body".into()));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        SearchError::Malformed(format!("at {path}: {}", e.into_inner()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.5"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(500)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
        let mut brave = HeaderMap::new();
        brave.insert("x-ratelimit-reset", HeaderValue::from_static("1, 1419704"));
        assert_eq!(retry_after(&brave), Some(Duration::from_secs(1)));
        brave.insert("x-ratelimit-reset", HeaderValue::from_static("1767225600"));
        assert_eq!(retry_after(&brave), None, "an epoch time is no wait");
    }

    #[test]
    fn malformed_json_names_where() {
        let e =
            parse_json::<searxng::SearxResponse>(br#"{"results": [{"title": 3}]}"#).unwrap_err();
        assert_eq!(e.kind(), "malformed");
        assert!(e.to_string().contains("results[0].title"), "{e}");
        let e = parse_json::<searxng::SearxResponse>(b"  \n").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}
