//! Bing Web Search v7. Microsoft retired the public endpoint on
//! 2025-08-11; gateways that kept its shape (Azure-hosted proxies) still
//! speak it, so the endpoint has no default.
//!
//! Request: `GET {url}?q=&count=&mkt=` with `Ocp-Apim-Subscription-Key`.
//! Response: `webPages.value[].{name, url, snippet}`; errors
//! `{"_type": "ErrorResponse", "errors": [{code, message}]}`, sometimes with
//! status 200. Source: Microsoft's Bing Web Search API v7 reference
//! (`docs/protocols.md` §2).

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use serde::Deserialize;

use super::{limit_query, parse_json, read_body_as, transport_error, Key, Provider, WebSettings};
use crate::search::{Document, SearchBackend, SearchError};

/// `kind = "bing"`.
pub const PROVIDER: Provider = Provider {
    kind: "bing",
    name: "Bing Web Search v7 (or a gateway with its shape)",
    default_url: None,
    key_env: Some("BING_SEARCH_KEY"),
    strip_html: true,
    document_text: "`snippet`",
    settings: &["url", "api_key_env", "market"],
    build: |s| {
        Ok(Arc::new(BingBackend::new(
            s.url,
            s.key.unwrap_or_default(),
            s.market.unwrap_or("en-US"),
        )?))
    },
};

/// Bing Web Search v7 (see the module documentation).
pub struct BingBackend {
    client: reqwest::Client,
    endpoint: String,
    key: HeaderValue,
    secret: Key,
    market: String,
}

/// Characters of a query sent (Bing's query limit; the query travels in the
/// URL).
const MAX_QUERY_CHARS: usize = 1000;

impl BingBackend {
    /// `endpoint` is the full search URL (`https://…/v7.0/search`); `key` the
    /// subscription key (read from the environment by the caller).
    ///
    /// # Errors
    /// A key that is not a valid header value (the message never includes it).
    pub fn new(endpoint: &str, key: &str, market: &str) -> Result<Self, String> {
        let settings = WebSettings {
            url: endpoint,
            key: Some(key),
            market: None,
            cx: None,
            page_text: false,
        };
        let key: HeaderValue = settings.key_header("Bing")?;
        Ok(Self {
            client: super::http_client(),
            endpoint: endpoint.to_string(),
            key,
            secret: Key(settings.key.unwrap_or_default().to_string()),
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
        let query = limit_query(query, MAX_QUERY_CHARS);
        let secret = self.secret.0.as_str();
        let result = async {
            let response = self
                .client
                .get(&self.endpoint)
                .query(&[("q", query), ("count", &count), ("mkt", &self.market)])
                .header("Ocp-Apim-Subscription-Key", self.key.clone())
                .send()
                .await
                .map_err(transport_error)?;
            let body =
                read_body_as(response, Some(secret), bing_error_message, |_, _| None).await?;
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
            Ok(parsed)
        }
        .await;
        let parsed = result.map_err(|e| e.redact(secret))?;
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
