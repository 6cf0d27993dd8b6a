//! Exa search.
//!
//! Request: `POST {url}` with `x-api-key: KEY` and JSON `{"query",
//! "numResults", "type": "auto", "contents": {"highlights": true}}`, or
//! `{"text": {"maxCharacters": 4000}}` with `page_text = true`. Response:
//! `results[].{title, url, id, score, text, highlights[]}` (`title` may be
//! null). Errors: `{"error": "…", "tag"}` with 400, 401 (bad key), 402
//! (no credits), 429 and 5xx. Source: Exa's API reference
//! (exa.ai/docs/reference/search) and its SDKs' `search_and_contents`;
//! where the reference and older SDK examples disagree on `highlights`
//! options, the boolean form (accepted by both) is sent.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::json;

use super::{fetch_json, json_message, limit_query, web_document, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// Characters of page text asked for with `page_text = true`.
const PAGE_CHARS: usize = 4000;

/// `kind = "exa"`.
pub const PROVIDER: Provider = Provider {
    kind: "exa",
    name: "Exa",
    default_url: Some("https://api.exa.ai/search"),
    key_env: Some("EXA_API_KEY"),
    strip_html: false,
    document_text: "`highlights`; with `page_text = true`, `text` (the page, 4,000 characters)",
    settings: &["url", "api_key_env", "page_text"],
    build: |s| Ok(Arc::new(ExaBackend::new(s)?)),
};

/// Exa (see the module documentation).
pub struct ExaBackend {
    client: reqwest::Client,
    url: String,
    key: HeaderValue,
    secret: Key,
    page_text: bool,
}

/// Characters of a query sent (Exa documents no limit).
const MAX_QUERY_CHARS: usize = 2000;

impl ExaBackend {
    /// A backend on `settings.url` with `settings.key`; `page_text` asks for
    /// the page's text instead of highlights.
    ///
    /// # Errors
    /// No key, or one a header cannot hold.
    pub fn new(settings: &WebSettings<'_>) -> Result<Self, String> {
        Ok(Self {
            client: super::http_client(),
            url: settings.url.to_string(),
            key: settings.key_header("Exa")?,
            secret: Key(settings.key.unwrap_or_default().to_string()),
            page_text: settings.page_text,
        })
    }
}

#[derive(Deserialize)]
struct ExaResponse {
    results: Vec<ExaResult>,
}

#[derive(Deserialize)]
struct ExaResult {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: String,
    #[serde(default)]
    score: Option<f32>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    highlights: Vec<String>,
}

fn classify(status: u16, message: &str) -> Option<SearchError> {
    (status == 402).then(|| SearchError::Quota(format!("HTTP {status}: {message}")))
}

#[async_trait]
impl SearchBackend for ExaBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let contents = if self.page_text {
            json!({"text": {"maxCharacters": PAGE_CHARS}})
        } else {
            json!({"highlights": true})
        };
        let body = json!({
            "query": limit_query(query, MAX_QUERY_CHARS),
            "numResults": k.clamp(1, 100),
            "type": "auto",
            "contents": contents,
        });
        let request = self
            .client
            .post(&self.url)
            .header("x-api-key", self.key.clone())
            .json(&body);
        let message = |b: &[u8]| json_message(b, &["error"]);
        let parsed: ExaResponse =
            fetch_json(request, Some(&self.secret.0), message, classify).await?;
        Ok(parsed
            .results
            .into_iter()
            .take(k)
            .map(|r| {
                let highlights = r.highlights.join(" … ");
                let text = match (self.page_text, r.text) {
                    (true, Some(text)) if !text.trim().is_empty() => text,
                    (_, text) if highlights.is_empty() => text.unwrap_or_default(),
                    _ => highlights,
                };
                let mut doc = web_document(r.title.unwrap_or_default(), r.url, text);
                doc.score = r.score.unwrap_or(0.0);
                doc
            })
            .collect())
    }
}
