//! Web search backends: Bing Web Search v7 and SearXNG (`docs/protocols.md` §2).
//!
//! Both map results to [`Document`]s `{title, text, url}` (id = URL). Markup
//! and entities in snippets are left for the dispatcher to strip
//! ([`super::dispatch::BackendLimits::strip_html`]); retries, limits and
//! deadlines are the dispatcher's too. Credentials never appear in an error.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Response, StatusCode};
use serde::Deserialize;

use super::{Document, SearchBackend, SearchError};

/// Largest response body read from a provider (4 MiB); more is malformed.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Characters of a provider's error message kept in a [`SearchError`].
const MAX_MESSAGE_CHARS: usize = 200;

/// An HTTP client for search providers: connect timeout 3 s, no overall
/// timeout (the dispatcher's deadlines apply), identifying user agent.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .user_agent(concat!("seeker/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("the HTTP client builds")
}

/// A transport error as a [`SearchError`], without the URL's query string.
pub(crate) fn transport_error(e: reqwest::Error) -> SearchError {
    let e = e.without_url();
    if e.is_timeout() {
        SearchError::Connection(format!("timed out: {e}"))
    } else if e.is_decode() || e.is_body() {
        SearchError::Malformed(e.to_string())
    } else {
        SearchError::Connection(e.to_string())
    }
}

/// The `Retry-After` header as a wait: seconds, or an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
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
/// status as a [`SearchError`] (429 → `RateLimited` with `Retry-After`), with
/// `message` extracting the provider's own message from an error body.
pub(crate) async fn read_body(
    response: Response,
    message: impl Fn(&[u8]) -> Option<String>,
) -> Result<Vec<u8>, SearchError> {
    let status = response.status();
    let wait = retry_after(response.headers());
    let body = read_capped(response).await?;
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(SearchError::RateLimited { retry_after: wait });
    }
    if !status.is_success() {
        // Only the provider's own error message reaches the client (in the
        // splice and the stream); a raw body (an HTML error page, a traceback
        // with the provider's file paths) goes to the log alone.
        let text = message(&body).unwrap_or_else(|| {
            let raw = String::from_utf8_lossy(&body[..body.len().min(MAX_MESSAGE_CHARS * 4)]);
            tracing::warn!(
                status = status.as_u16(),
                body = %super::clean::collapse_whitespace(&raw),
                "search provider error without a structured message"
            );
            String::new()
        });
        let text = super::clean::collapse_whitespace(&text);
        let text = super::clean::truncate_chars(&text, MAX_MESSAGE_CHARS).to_string();
        return Err(SearchError::Status {
            status: status.as_u16(),
            message: if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                text
            },
        });
    }
    Ok(body)
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

// ---------------------------------------------------------------- Bing v7

/// Bing Web Search v7 (`GET {endpoint}?q=..&count=..&mkt=..` with header
/// `Ocp-Apim-Subscription-Key`; results in `webPages.value[].{name, url,
/// snippet}`). The public endpoint was retired on 2025-08-11; compatible
/// gateways keep the shape, so the endpoint is configurable.
pub struct BingBackend {
    client: reqwest::Client,
    endpoint: String,
    key: HeaderValue,
    market: String,
}

impl BingBackend {
    /// `endpoint` is the full search URL (`https://…/v7.0/search`); `key` the
    /// subscription key (read from the environment by the caller).
    ///
    /// # Errors
    /// A key that is not a valid header value (the message never includes it).
    pub fn new(endpoint: &str, key: &str, market: &str) -> Result<Self, String> {
        let mut key = HeaderValue::from_str(key)
            .map_err(|_| "the Bing key holds characters not allowed in a header".to_string())?;
        key.set_sensitive(true);
        Ok(Self {
            client: http_client(),
            endpoint: endpoint.to_string(),
            key,
            market: market.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct BingResponse {
    #[serde(rename = "_type", default)]
    kind: String,
    #[serde(rename = "webPages")]
    web_pages: Option<BingWebPages>,
    #[serde(default)]
    errors: Vec<BingError>,
}

#[derive(Deserialize)]
struct BingWebPages {
    #[serde(default)]
    value: Vec<BingPage>,
}

#[derive(Deserialize)]
struct BingPage {
    #[serde(default)]
    name: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    snippet: String,
}

#[derive(Deserialize)]
struct BingError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

fn bing_error_message(body: &[u8]) -> Option<String> {
    let r: BingResponse = serde_json::from_slice(body).ok()?;
    let e = r.errors.first()?;
    Some(format!("{}: {}", e.code, e.message))
}

#[async_trait]
impl SearchBackend for BingBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let count = k.clamp(1, 50).to_string();
        let response = self
            .client
            .get(&self.endpoint)
            .query(&[("q", query), ("count", &count), ("mkt", &self.market)])
            .header("Ocp-Apim-Subscription-Key", self.key.clone())
            .send()
            .await
            .map_err(transport_error)?;
        let body = read_body(response, bing_error_message).await?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(SearchError::Malformed(
                "HTTP 200 with an empty body (Bing does this when it suspects abuse)".into(),
            ));
        }
        let parsed: BingResponse = parse_json(&body)?;
        if parsed.kind == "ErrorResponse" {
            return Err(SearchError::Status {
                status: 200,
                message: bing_error_message(&body).unwrap_or_else(|| "ErrorResponse".into()),
            });
        }
        Ok(parsed
            .web_pages
            .map(|p| p.value)
            .unwrap_or_default()
            .into_iter()
            .take(k)
            .map(|p| Document {
                id: p.url.clone(),
                title: p.name,
                text: p.snippet,
                url: (!p.url.is_empty()).then_some(p.url),
                score: 0.0,
                backend: String::new(),
            })
            .collect())
    }
}

// ---------------------------------------------------------------- SearXNG

/// SearXNG / searx JSON API: `GET {base}/search?q=..&format=json` →
/// `results[].{title, url, content}` (the instance must enable the `json`
/// format in its `search.formats`).
pub struct SearxngBackend {
    client: reqwest::Client,
    search_url: String,
}

impl SearxngBackend {
    /// `base` is the instance's root URL (`http://127.0.0.1:8888`).
    pub fn new(base: &str) -> Self {
        Self {
            client: http_client(),
            search_url: format!("{}/search", base.trim_end_matches('/')),
        }
    }
}

#[derive(Debug, Deserialize)]
struct SearxResponse {
    results: Vec<SearxResult>,
}

#[derive(Debug, Deserialize)]
struct SearxResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

#[async_trait]
impl SearchBackend for SearxngBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let response = self
            .client
            .get(&self.search_url)
            .query(&[("q", query), ("format", "json")])
            .send()
            .await
            .map_err(transport_error)?;
        let body = read_body(response, |b| {
            // searx: {"error": "No query"}
            let v: serde_json::Value = serde_json::from_slice(b).ok()?;
            v.get("error")?.as_str().map(str::to_string)
        })
        .await?;
        let parsed: SearxResponse = parse_json(&body)?;
        Ok(parsed
            .results
            .into_iter()
            .take(k)
            .map(|r| {
                let url = r.url.filter(|u| !u.is_empty());
                Document {
                    id: url.clone().unwrap_or_default(),
                    title: r.title,
                    text: r.content.unwrap_or_default(),
                    url,
                    score: 0.0,
                    backend: String::new(),
                }
            })
            .collect())
    }
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
    }

    #[test]
    fn malformed_json_names_where() {
        let e = parse_json::<SearxResponse>(br#"{"results": [{"title": 3}]}"#).unwrap_err();
        assert_eq!(e.kind(), "malformed");
        assert!(e.to_string().contains("results[0].title"), "{e}");
        let e = parse_json::<SearxResponse>(b"  \n").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}
