//! Security headers on every response (`server.security_headers`, on by
//! default): a `Content-Security-Policy` per kind of page, `X-Content-Type-Options:
//! nosniff`, `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`.
//!
//! The policies, by path:
//! - `/` (the web UI, one page with one inline `<style>` and one inline
//!   `<script>`): only those two blocks run, allowed by their SHA-256 hashes
//!   (computed from the embedded page at first use, so an edited page stays
//!   allowed); the page may call its own origin (`connect-src 'self'`) and
//!   nothing else; no plugins, no `<base>`, no form posts, no framing.
//! - `/docs/…` (Swagger UI, served from the binary): its own scripts and styles
//!   (`'self'`); inline `style` attributes and `data:` images, which Swagger UI
//!   writes while it renders; calls to its own origin ("Try it out"); no framing.
//! - everything else (JSON, Prometheus text): `default-src 'none';
//!   frame-ancestors 'none'`: a response opened in a browser runs nothing.
//!
//! A header the response already has is kept. Deployments whose proxy sets its
//! own headers turn these off with `security_headers = false`. The directive
//! names and values follow CSP Level 3 (W3C) and the OWASP Secure Headers
//! Project's recommendations.

use std::sync::LazyLock;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The policy of the web UI: `page` is the HTML served at `/`; each of its
/// inline `<script>` and `<style>` blocks is allowed by its hash.
///
/// Shape: `default-src 'none'; script-src 'sha256-…'; style-src 'sha256-…';
/// connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action
/// 'none'; frame-ancestors 'none'`.
pub(crate) fn ui_policy(page: &str) -> String {
    let hashes = |tag: &str| {
        inline_blocks(page, tag)
            .map(|block| format!("'sha256-{}'", sha256_base64(block)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        or_none(hashes("script")),
        or_none(hashes("style")),
    )
}

/// Swagger UI's policy (`/docs/…`).
pub(crate) const DOCS_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
     font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The policy of every other response (JSON, Prometheus text, errors).
pub(crate) const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// The headers every response gets besides its policy.
const FIXED: [(header::HeaderName, &str); 3] = [
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::REFERRER_POLICY, "no-referrer"),
];

/// The headers of an API response as HTTP/1.1 header lines (each ending in
/// CRLF), for the one response seeker writes itself before hyper parses a
/// request (the 414 of an over-long request line, `super::listen`).
pub(crate) fn api_header_lines() -> String {
    std::iter::once((header::CONTENT_SECURITY_POLICY, API_POLICY))
        .chain(FIXED)
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect()
}

fn or_none(sources: String) -> String {
    if sources.is_empty() {
        "'none'".into()
    } else {
        sources
    }
}

/// The contents of every `<tag>…</tag>` block of `html` (attribute-free
/// opening tags, as `static/index.html` writes them), byte for byte: what a
/// browser hashes to check a CSP hash source.
fn inline_blocks<'a>(html: &'a str, tag: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut rest = html;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let block = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(block)
    })
}

fn sha256_base64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
}

/// The UI's policy, computed once from the embedded page.
static UI_POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    HeaderValue::from_str(&ui_policy(super::INDEX_HTML)).expect("the policy is ASCII")
});

/// Middleware: adds the security headers to the response of `request`.
pub(crate) async fn secure(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let policy = if path == "/" {
        UI_POLICY.clone()
    } else if path == "/docs" || path.starts_with("/docs/") {
        HeaderValue::from_static(DOCS_POLICY)
    } else {
        HeaderValue::from_static(API_POLICY)
    };
    let mut response = next.run(request).await;
    add(response.headers_mut(), policy);
    response
}

fn add(headers: &mut HeaderMap, policy: HeaderValue) {
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(policy);
    for (name, value) in FIXED {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_inline_block_is_hashed_byte_for_byte() {
        let page = "<style>a{}</style><p><script>x()</script><script>\ny()\n</script>";
        let policy = ui_policy(page);
        for block in ["x()", "\ny()\n"] {
            assert!(
                policy.contains(&format!("'sha256-{}'", sha256_base64(block))),
                "{policy}"
            );
        }
        assert!(policy.contains(&format!("style-src 'sha256-{}';", sha256_base64("a{}"))));
        // The well-known digest of the empty string, so the encoding is the
        // one browsers use (standard base64 with padding).
        assert_eq!(
            sha256_base64(""),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }

    #[test]
    fn the_written_414_carries_what_the_middleware_adds() {
        let mut headers = HeaderMap::new();
        add(&mut headers, HeaderValue::from_static(API_POLICY));
        let lines = api_header_lines();
        assert_eq!(lines.matches("\r\n").count(), headers.len());
        for (name, value) in &headers {
            let line = format!("{name}: {}\r\n", value.to_str().unwrap());
            assert!(lines.contains(&line), "{line:?} missing in {lines:?}");
        }
    }

    #[test]
    fn a_page_without_inline_code_allows_none() {
        let policy = ui_policy("<p>hi</p>");
        assert!(policy.contains("script-src 'none';"), "{policy}");
        assert!(policy.contains("style-src 'none';"), "{policy}");
    }

    #[test]
    fn the_shipped_page_has_one_script_and_one_style() {
        // The page's blocks are found (attribute-free tags); an inline handler
        // (`onclick=`) or `style=` attribute would be refused by the browser:
        // tests/python/test_web_ui.py fails on any CSP violation.
        assert_eq!(inline_blocks(super::super::INDEX_HTML, "script").count(), 1);
        assert_eq!(inline_blocks(super::super::INDEX_HTML, "style").count(), 1);
    }
}
