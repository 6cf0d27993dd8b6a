//! One `Host` and `Origin` policy for every route, against DNS rebinding and
//! cross-site requests from a browser.
//!
//! DNS rebinding: a page on `attacker.example` re-points its name at
//! 127.0.0.1 and then calls a keyless local server as a same-origin site —
//! every route would run rollouts, searches and page fetches for it and let
//! it read the results. Its requests still carry `Host: attacker.example`,
//! so a server that answers only the names it is reached by refuses them
//! (`server.allowed_hosts`: by default, on a loopback bind, the loopback
//! names). Cross-site requests: a browser sends `Origin` with every
//! cross-origin request (and same-origin POSTs); one from an origin that is
//! neither the server's own (its `Host`) nor listed in `server.cors_origins`
//! is refused before it does anything, as the MCP specification requires of
//! MCP servers (2025-06-18, "Security Warning": validate `Origin`).
//! Requests without `Host` (HTTP/1.0, in-process) or `Origin` (every
//! non-browser client) pass these checks. Refusals are 403s in the API's
//! error shape, counted in `seeker_requests_rejected_total{reason}` (`host`,
//! `origin`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{clip, ApiError, ErrorCode};
use super::AppState;

/// The host names a server bound to `bind` answers to when
/// `server.allowed_hosts` is empty: the loopback names and the bound
/// address on a loopback bind; `None` (any) on any other bind, whose
/// clients use names the server cannot know.
pub(crate) fn default_hosts(bind: &str) -> Option<Vec<String>> {
    let bind = bind
        .trim_matches(|c| c == '[' || c == ']')
        .to_ascii_lowercase();
    let loopback = bind == "localhost"
        || bind
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(String::from)
            .collect();
        if !names.contains(&bind) {
            names.push(bind);
        }
        names
    })
}

/// `server.allowed_hosts` as the state holds it: names lower-cased without
/// brackets; `None` for any host (`*` in the list, or an empty list on a
/// bind that is not loopback).
pub(crate) fn resolve(allowed: &[String], bind: &str) -> Option<Vec<String>> {
    let names = normalise(allowed);
    if names.iter().any(|h| h == "*") {
        return None;
    }
    if names.is_empty() {
        return default_hosts(bind);
    }
    Some(names)
}

/// Host names lower-cased, IPv6 brackets dropped.
pub(crate) fn normalise(names: &[String]) -> Vec<String> {
    names
        .iter()
        .map(|h| {
            h.trim()
                .trim_matches(|c| c == '[' || c == ']')
                .to_ascii_lowercase()
        })
        .collect()
}

/// The host `request` is for, as sent (port included): the request
/// target's authority when it has one (HTTP/1.1's absolute form, whose
/// `Host` a server must ignore, RFC 9112 §3.2.2; HTTP/2's `:authority`),
/// else the `Host` header.
pub(crate) fn host_of(request: &Request) -> Option<&str> {
    request.uri().authority().map(|a| a.as_str()).or_else(|| {
        request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

/// The name part of a `Host` value: port, IPv6 brackets and the root's
/// trailing dot (`localhost.` is `localhost`) dropped, lower-cased.
pub(crate) fn host_name(value: &str) -> String {
    let host = match value.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => value.rsplit_once(':').map_or(value, |(h, _)| h),
    };
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// Checks a `Host` name (as [`host_name`] gives it) against `allowed`
/// (lower-cased names; `*` allows any): `Ok`, or the 403 `host_not_allowed`
/// saying that `who` (`this server`, `/mcp`) does not answer it and which
/// `setting` lists the names. Every route's check and `/mcp`'s use it.
pub(crate) fn check_host(
    name: &str,
    allowed: &[String],
    who: &str,
    setting: &str,
) -> Result<(), ApiError> {
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
    {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::HostNotAllowed,
        format!(
            "{who} does not answer requests for host `{}`; add it to {setting} (now: {})",
            clip(name),
            allowed.join(", ")
        ),
    ))
}

/// Whether a browser request from `origin` may reach a server it calls
/// `host` (the `Host` it sent): listed in `cors` (or `*` there), or the
/// server's own origin (scheme's default port ignored).
fn origin_allowed(origin: &str, host: Option<&str>, cors: &[String]) -> bool {
    if cors
        .iter()
        .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let (Some(host), Ok(url)) = (host, url::Url::parse(origin)) else {
        return false;
    };
    let Some(name) = url.host_str() else {
        return false;
    };
    // `Url` leaves out the scheme's default port; so does this.
    let own = match url.port() {
        Some(port) => format!("{name}:{port}"),
        None => name.to_string(),
    };
    let default_port = match url.scheme() {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let host = host.strip_suffix(default_port).unwrap_or(host);
    host.eq_ignore_ascii_case(&own)
}

/// Refuses a request whose `Host` is not an allowed name (403
/// `host_not_allowed`) or whose `Origin` is another site's that CORS does
/// not allow (403 `origin_not_allowed`); see the module documentation.
pub(crate) async fn check(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    // RFC 9112 §3.2: a request with more than one Host is a 400 (which one
    // a check reads and which one a proxy forwards could differ).
    let hosts = request.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        return refuse(
            &state,
            "host",
            ApiError::invalid_field(
                "Host",
                format!("the request names {hosts} Host headers; send one (RFC 9112 §3.2)"),
            ),
        );
    }
    let host = host_of(&request);
    if let (Some(allowed), Some(host)) = (&state.allowed_hosts, host) {
        if let Err(e) = check_host(
            &host_name(host),
            allowed,
            "this server",
            "server.allowed_hosts",
        ) {
            return refuse(&state, "host", e);
        }
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(origin, host, &state.cors_origins) {
            return refuse(
                &state,
                "origin",
                ApiError::new(
                    ErrorCode::OriginNotAllowed,
                    format!(
                        "requests from the web origin `{}` are not allowed; list it in \
                         server.cors_origins",
                        clip(origin)
                    ),
                ),
            );
        }
    }
    next.run(request).await
}

fn refuse(state: &AppState, reason: &str, error: ApiError) -> Response {
    state
        .metrics
        .requests_rejected
        .with_label_values(&[reason])
        .inc();
    error.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_binds_answer_loopback_names_and_others_any() {
        let names = default_hosts("127.0.0.1").unwrap();
        assert_eq!(names, ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(
            default_hosts("127.0.0.2").unwrap(),
            ["localhost", "127.0.0.1", "::1", "127.0.0.2"]
        );
        assert!(default_hosts("[::1]").is_some());
        assert!(default_hosts("localhost").is_some());
        assert_eq!(default_hosts("0.0.0.0"), None);
        assert_eq!(default_hosts("192.168.1.5"), None);
        assert_eq!(resolve(&["*".into()], "127.0.0.1"), None);
        assert_eq!(
            resolve(&["Seeker.LAN".into(), "[fd00::1]".into()], "0.0.0.0").unwrap(),
            ["seeker.lan", "fd00::1"]
        );
    }

    #[test]
    fn host_names_drop_ports_and_brackets() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("LocalHost"), "localhost");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("localhost.:8080"), "localhost");
    }

    #[test]
    fn only_the_servers_own_origin_and_listed_ones_pass() {
        let none: Vec<String> = Vec::new();
        assert!(origin_allowed(
            "http://127.0.0.1:8080",
            Some("127.0.0.1:8080"),
            &none
        ));
        assert!(origin_allowed(
            "http://[::1]:8080",
            Some("[::1]:8080"),
            &none
        ));
        assert!(origin_allowed(
            "https://seeker.example",
            Some("seeker.example:443"),
            &none
        ));
        assert!(origin_allowed(
            "http://LOCALHOST:8080",
            Some("localhost:8080"),
            &none
        ));
        assert!(!origin_allowed(
            "http://127.0.0.1:9999",
            Some("127.0.0.1:8080"),
            &none
        ));
        assert!(!origin_allowed(
            "https://evil.example",
            Some("127.0.0.1:8080"),
            &none
        ));
        assert!(!origin_allowed("null", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("http://127.0.0.1:8080", None, &none));
        let cors = vec!["https://ui.example".to_string()];
        assert!(origin_allowed(
            "https://ui.example",
            Some("127.0.0.1:8080"),
            &cors
        ));
        assert!(origin_allowed("null", None, &["*".to_string()]));
    }
}
