//! Tavily Search.
//!
//! Request: `POST {url}` with `Authorization: Bearer KEY` and JSON
//! `{"query", "max_results" (at most 20), "search_depth": "basic",
//! "include_raw_content"}`. Response: `results[].{title, url, content,
//! score, raw_content}`; `raw_content` (the page's text) only when asked
//! for, and may be null. Errors: `{"detail": {"error": "…"}}` with 401 (bad
//! key), 429 (rate), 432 (the plan's limit) and 433 (the pay-as-you-go
//! limit). Source: Tavily's API reference (docs.tavily.com, "Tavily Search"
//! and its error codes); LangChain's `TavilySearchAPIWrapper` reads the same
//! fields.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::json;

use super::{fetch_json, json_message, limit_query, web_document, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "tavily"`.
pub const PROVIDER: Provider = Provider {
    kind: "tavily",
    name: "Tavily",
    default_url: Some("https://api.tavily.com/search"),
    key_env: Some("TAVILY_API_KEY"),
    strip_html: false,
    document_text: "`content`; with `page_text = true`, `raw_content` (the page) when given",
    settings: &["url", "api_key_env", "page_text"],
    build: |s| Ok(Arc::new(TavilyBackend::new(s)?)),
};

/// Tavily Search (see the module documentation).
pub struct TavilyBackend {
    client: reqwest::Client,
    url: String,
    key: HeaderValue,
    secret: Key,
    page_text: bool,
}

/// Characters of a query sent (Tavily documents no limit; a query is a few
/// words to a sentence).
const MAX_QUERY_CHARS: usize = 2000;

impl TavilyBackend {
    /// A backend on `settings.url` with `settings.key`; `page_text` asks for
    /// `raw_content`.
    ///
    /// # Errors
    /// No key, or one a header cannot hold.
    pub fn new(settings: &WebSettings<'_>) -> Result<Self, String> {
        let bearer = settings.key.map(|k| format!("Bearer {k}"));
        let key = WebSettings {
            key: bearer.as_deref(),
            ..*settings
        }
        .key_header("Tavily")?;
        Ok(Self {
            client: super::http_client(),
            url: settings.url.to_string(),
            key,
            secret: Key(settings.key.unwrap_or_default().to_string()),
            page_text: settings.page_text,
        })
    }
}

#[derive(Deserialize)]
struct TavilyResponse {
    results: Vec<TavilyResult>,
}

#[derive(Deserialize)]
struct TavilyResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    score: Option<f32>,
    #[serde(default)]
    raw_content: Option<String>,
}

fn message(body: &[u8]) -> Option<String> {
    json_message(body, &["detail", "error"]).or_else(|| json_message(body, &["detail"]))
}

fn classify(status: u16, message: &str) -> Option<SearchError> {
    matches!(status, 432 | 433).then(|| SearchError::Quota(format!("HTTP {status}: {message}")))
}

#[async_trait]
impl SearchBackend for TavilyBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let body = json!({
            "query": limit_query(query, MAX_QUERY_CHARS),
            "max_results": k.clamp(1, 20),
            "search_depth": "basic",
            "include_raw_content": self.page_text,
        });
        let request = self
            .client
            .post(&self.url)
            .header(reqwest::header::AUTHORIZATION, self.key.clone())
            .json(&body);
        let parsed: TavilyResponse =
            fetch_json(request, Some(&self.secret.0), message, classify).await?;
        Ok(parsed
            .results
            .into_iter()
            .take(k)
            .map(|r| {
                let text = match r
                    .raw_content
                    .filter(|t| self.page_text && !t.trim().is_empty())
                {
                    Some(page) => page,
                    None => r.content,
                };
                let mut doc = web_document(r.title, r.url, text);
                doc.score = r.score.unwrap_or(0.0);
                doc
            })
            .collect())
    }
}
