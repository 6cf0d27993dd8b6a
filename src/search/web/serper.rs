//! Serper (Google results).
//!
//! Request: `POST {url}` with `X-API-KEY: KEY` and JSON `{"q", "num"}`.
//! Response: `organic[].{title, link, snippet, position}` beside
//! `answerBox`, `knowledgeGraph` and `peopleAlsoAsk`, which are not read.
//! Errors: `{"message", "statusCode"}`: a bad key is 403 "Unauthorized.",
//! spent credits 400 "Not enough credits". Source: serper.dev's playground
//! and API examples (the shape DeepResearcher's and WebThinker's Serper
//! clients read: `organic[].{title, link, snippet}`).

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::json;

use super::{fetch_json, json_message, limit_query, web_document, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "serper"`.
pub const PROVIDER: Provider = Provider {
    kind: "serper",
    name: "Serper (Google results)",
    default_url: Some("https://google.serper.dev/search"),
    key_env: Some("SERPER_API_KEY"),
    strip_html: false,
    document_text: "`snippet`",
    settings: &["url", "api_key_env"],
    build: |s| Ok(Arc::new(SerperBackend::new(s)?)),
};

/// Serper (see the module documentation).
pub struct SerperBackend {
    client: reqwest::Client,
    url: String,
    key: HeaderValue,
    secret: Key,
}

/// Characters of a query sent (Google's own query limit is 2,048).
const MAX_QUERY_CHARS: usize = 2000;

impl SerperBackend {
    /// A backend on `settings.url` with `settings.key`.
    ///
    /// # Errors
    /// No key, or one a header cannot hold.
    pub fn new(settings: &WebSettings<'_>) -> Result<Self, String> {
        Ok(Self {
            client: super::http_client(),
            url: settings.url.to_string(),
            key: settings.key_header("Serper")?,
            secret: Key(settings.key.unwrap_or_default().to_string()),
        })
    }
}

#[derive(Deserialize)]
struct SerperResponse {
    #[serde(default)]
    organic: Vec<SerperResult>,
}

#[derive(Deserialize)]
struct SerperResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    link: String,
    #[serde(default)]
    snippet: String,
}

fn classify(status: u16, message: &str) -> Option<SearchError> {
    let lower = message.to_lowercase();
    (status == 400 && lower.contains("credits"))
        .then(|| SearchError::Quota(format!("HTTP {status}: {message}")))
}

#[async_trait]
impl SearchBackend for SerperBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let query = limit_query(query, MAX_QUERY_CHARS);
        let request = self
            .client
            .post(&self.url)
            .header("X-API-KEY", self.key.clone())
            .json(&json!({"q": query, "num": k.clamp(1, 100)}));
        let message = |b: &[u8]| json_message(b, &["message"]);
        let parsed: SerperResponse =
            fetch_json(request, Some(&self.secret.0), message, classify).await?;
        Ok(parsed
            .organic
            .into_iter()
            .take(k)
            .map(|r| web_document(r.title, r.link, r.snippet))
            .collect())
    }
}
