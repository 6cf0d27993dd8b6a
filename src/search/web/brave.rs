//! Brave Search API, web search.
//!
//! Request: `GET {url}?q=&count=&extra_snippets=true` with headers
//! `X-Subscription-Token: KEY` and `Accept: application/json`; `count` is
//! at most 20. Response: `web.results[].{title, url, description,
//! extra_snippets[]}` (`web` absent when nothing was found); descriptions
//! carry `<strong>` markup. Errors: `{"type": "ErrorResponse", "error":
//! {"status", "code", "detail"}}`: a bad token is 401 or 422 with code
//! `SUBSCRIPTION_TOKEN_INVALID`, a spent rate or quota 429 with code
//! `RATE_LIMITED` and `X-RateLimit-Reset` (seconds, per window). Source:
//! Brave's Search API documentation (api-dashboard.search.brave.com,
//! "Web search" and "Rate limiting"); the same shape is what LangChain's
//! `BraveSearch` tool reads.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::{HeaderValue, ACCEPT};
use serde::Deserialize;

use super::{fetch_json, json_message, limit_query, web_document, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "brave"`.
pub const PROVIDER: Provider = Provider {
    kind: "brave",
    name: "Brave Search API",
    default_url: Some("https://api.search.brave.com/res/v1/web/search"),
    key_env: Some("BRAVE_SEARCH_API_KEY"),
    strip_html: true,
    document_text: "`description` and its `extra_snippets`",
    settings: &["url", "api_key_env"],
    build: |s| Ok(Arc::new(BraveBackend::new(s)?)),
};

/// The Brave Search API (see the module documentation).
pub struct BraveBackend {
    client: reqwest::Client,
    url: String,
    key: HeaderValue,
    secret: Key,
}

/// Characters of a query Brave takes (its documented limit: 400 characters,
/// 50 words; longer is a 422).
const MAX_QUERY_CHARS: usize = 400;
/// Words of a query Brave takes (the same documented limit).
const MAX_QUERY_WORDS: usize = 50;

impl BraveBackend {
    /// A backend on `settings.url` with `settings.key`.
    ///
    /// # Errors
    /// No key, or one a header cannot hold.
    pub fn new(settings: &WebSettings<'_>) -> Result<Self, String> {
        Ok(Self {
            client: super::http_client(),
            url: settings.url.to_string(),
            key: settings.key_header("Brave")?,
            secret: Key(settings.key.unwrap_or_default().to_string()),
        })
    }
}

#[derive(Deserialize)]
struct BraveResponse {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Deserialize)]
struct BraveResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    extra_snippets: Vec<String>,
}

fn message(body: &[u8]) -> Option<String> {
    let detail = json_message(body, &["error", "detail"])?;
    Some(match json_message(body, &["error", "code"]) {
        Some(code) => format!("{code}: {detail}"),
        None => detail,
    })
}

fn classify(_status: u16, message: &str) -> Option<SearchError> {
    message
        .starts_with("SUBSCRIPTION_TOKEN_INVALID")
        .then(|| SearchError::Auth(message.to_string()))
}

#[async_trait]
impl SearchBackend for BraveBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let count = k.clamp(1, 20).to_string();
        let words: Vec<&str> = limit_query(query, MAX_QUERY_CHARS)
            .split_whitespace()
            .take(MAX_QUERY_WORDS)
            .collect();
        let query = words.join(" ");
        let query = query.as_str();
        let request = self
            .client
            .get(&self.url)
            .query(&[("q", query), ("count", &count), ("extra_snippets", "true")])
            .header("X-Subscription-Token", self.key.clone())
            .header(ACCEPT, "application/json");
        let parsed: BraveResponse =
            fetch_json(request, Some(&self.secret.0), message, classify).await?;
        Ok(parsed
            .web
            .map(|w| w.results)
            .unwrap_or_default()
            .into_iter()
            .take(k)
            .map(|r| {
                let mut text = r.description;
                for extra in r.extra_snippets {
                    if !text.is_empty() {
                        text.push(' ');
                    }
                    text.push_str(&extra);
                }
                web_document(r.title, r.url, text)
            })
            .collect())
    }
}
