//! Google Programmable Search (the Custom Search JSON API).
//!
//! Request: `GET {url}?key=KEY&cx=ENGINE&q=&num=` (`num` 1–10; the key
//! travels in the URL, which is why no error or log line carries a URL).
//! Response: `items[].{title, link, snippet}` (`items` absent when nothing
//! was found). Errors: `{"error": {"code", "message", "status",
//! "errors": [{"reason"}]}}`: a bad key is 400 "API key not valid…"
//! (`API_KEY_INVALID`), a spent daily quota 429 `RESOURCE_EXHAUSTED`
//! naming "Queries per day" (a per-minute one is retried) or, in older
//! answers, 403 with reason `dailyLimitExceeded`. Source: Google's
//! Custom Search JSON API documentation ("Using REST", `cse.list`). Google
//! has closed the API to new customers and announced its end for
//! 2027-01-01; existing engines keep working until then.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;

use super::{fetch_json, json_message, limit_query, web_document, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "google"`.
pub const PROVIDER: Provider = Provider {
    kind: "google",
    name: "Google Programmable Search (Custom Search JSON API)",
    default_url: Some("https://www.googleapis.com/customsearch/v1"),
    key_env: Some("GOOGLE_API_KEY"),
    strip_html: false,
    document_text: "`snippet`",
    settings: &["url", "api_key_env", "cx"],
    build: |s| Ok(Arc::new(GoogleBackend::new(s)?)),
};

/// Characters of a query sent (Google's query limit is 2,048 characters,
/// and the query travels in the URL).
const MAX_QUERY_CHARS: usize = 1000;

/// Google Programmable Search (see the module documentation).
pub struct GoogleBackend {
    client: reqwest::Client,
    url: String,
    key: Key,
    cx: String,
}

impl GoogleBackend {
    /// A backend on `settings.url` with `settings.key` and engine `cx`.
    ///
    /// # Errors
    /// No key, or no `cx`.
    pub fn new(settings: &WebSettings<'_>) -> Result<Self, String> {
        let key = settings
            .key
            .ok_or("Google Programmable Search needs an API key")?;
        let cx = settings.cx.filter(|c| !c.trim().is_empty()).ok_or(
            "Google Programmable Search needs `cx`, the search engine id \
             (its control panel's Overview page)",
        )?;
        Ok(Self {
            client: super::http_client(),
            url: settings.url.to_string(),
            key: Key(key.to_string()),
            cx: cx.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct GoogleResponse {
    #[serde(default)]
    items: Vec<GoogleItem>,
}

#[derive(Deserialize)]
struct GoogleItem {
    #[serde(default)]
    title: String,
    #[serde(default)]
    link: String,
    #[serde(default)]
    snippet: String,
}

fn message(body: &[u8]) -> Option<String> {
    let text = json_message(body, &["error", "message"])?;
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let reason = v["error"]["errors"][0]["reason"]
        .as_str()
        .or_else(|| v["error"]["status"].as_str());
    Some(match reason {
        Some(r) => format!("{r}: {text}"),
        None => text,
    })
}

fn classify(status: u16, message: &str) -> Option<SearchError> {
    if message.contains("API key not valid") || message.contains("API_KEY_INVALID") {
        return Some(SearchError::Auth(format!("HTTP {status}: {message}")));
    }
    let quota = ["dailyLimitExceeded", "quotaExceeded", "RESOURCE_EXHAUSTED"];
    // A 429 is a spent quota only when it names the daily limit ("Queries
    // per day"); a per-minute one is retried.
    let spent = match status {
        403 => quota.iter().any(|q| message.contains(q)),
        429 => message.contains("per day") || message.contains("dailyLimitExceeded"),
        _ => false,
    };
    spent.then(|| SearchError::Quota(format!("HTTP {status}: {message}")))
}

#[async_trait]
impl SearchBackend for GoogleBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let num = k.clamp(1, 10).to_string();
        let request = self.client.get(&self.url).query(&[
            ("key", self.key.0.as_str()),
            ("cx", &self.cx),
            ("q", limit_query(query, MAX_QUERY_CHARS)),
            ("num", &num),
        ]);
        let parsed: GoogleResponse =
            fetch_json(request, Some(&self.key.0), message, classify).await?;
        Ok(parsed
            .items
            .into_iter()
            .take(k)
            .map(|r| web_document(r.title, r.link, r.snippet))
            .collect())
    }
}
