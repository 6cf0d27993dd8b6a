//! SearXNG (and searx): `GET {url}/search?q=&format=json` →
//! `results[].{title, url, content}`; errors `{"error": "…"}`. The instance
//! must enable the `json` format in its `search.formats` setting (SearXNG's
//! "Search API" documentation).

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;

use super::{limit_query, parse_json, read_body, transport_error, Provider};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "searxng"`.
pub const PROVIDER: Provider = Provider {
    kind: "searxng",
    name: "SearXNG (self-hosted)",
    default_url: None,
    key_env: None,
    strip_html: true,
    document_text: "`content`",
    settings: &["url"],
    build: |s| Ok(Arc::new(SearxngBackend::new(s.url))),
};

/// Characters of a query sent (the query travels in the URL).
const MAX_QUERY_CHARS: usize = 1000;

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
            client: super::http_client(),
            search_url: format!("{}/search", base.trim_end_matches('/')),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct SearxResponse {
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
            .query(&[
                ("q", limit_query(query, MAX_QUERY_CHARS)),
                ("format", "json"),
            ])
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
