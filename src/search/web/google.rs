//! Google Programmable Search (the Custom Search JSON API).
//!
//! Request: `GET {url}?key=KEY&cx=ENGINE&q=&num=` (`num` 1–10; the key
//! travels in the URL, which is why no error or log line carries a URL).
//! Response: `items[].{title, link, snippet}` (`items` absent when nothing
//! was found). Errors: `{"error": {"code", "message", "status",
//! "errors": [{"reason"}]}}`: a bad key is 400 "API key not valid…"
//! (`API_KEY_INVALID`), a spent daily quota 429 `RESOURCE_EXHAUSTED` or,
//! in older answers, 403 with reason `dailyLimitExceeded`. Source: Google's
//! Custom Search JSON API documentation ("Using REST", `cse.list`). Google
//! has closed the API to new customers and announced its end for
//! 2027-01-01; existing engines keep working until then.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;

use super::{
    json_message, parse_json, read_body_as, transport_error, web_document, Key, Provider,
    WebSettings,
};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "google"`.
pub(super) const PROVIDER: Provider = Provider {
    kind: "google",
    name: "Google Programmable Search (Custom Search JSON API)",
    default_url: Some("https://www.googleapis.com/customsearch/v1"),
    key_env: Some("GOOGLE_API_KEY"),
    strip_html: false,
    document_text: "`snippet`",
    build: |s| Ok(Arc::new(GoogleBackend::new(s)?)),
};

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
    (status == 403 && quota.iter().any(|q| message.contains(q)))
        .then(|| SearchError::Quota(format!("HTTP {status}: {message}")))
}

#[async_trait]
impl SearchBackend for GoogleBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let num = k.clamp(1, 10).to_string();
        let response = self
            .client
            .get(&self.url)
            .query(&[
                ("key", self.key.0.as_str()),
                ("cx", &self.cx),
                ("q", query),
                ("num", &num),
            ])
            .send()
            .await
            .map_err(transport_error)?;
        let body = read_body_as(response, message, classify).await?;
        let parsed: GoogleResponse = parse_json(&body)?;
        Ok(parsed
            .items
            .into_iter()
            .take(k)
            .map(|r| web_document(r.title, r.link, r.snippet))
            .collect())
    }
}
