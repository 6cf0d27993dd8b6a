//! `[server]`: [`ServerConfig`] (where to listen, the API keys, CORS origins,
//! `/mcp` host names, load limits and timeouts), [`MAX_LIMIT`], and the checks
//! of those settings. Used by `startup` and `server` (state, router, ops);
//! re-exported as `crate::config::ServerConfig`.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::secret::Secret;

/// `[server]`: where to listen, who may call, and how much load to take.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (printed at startup).
    pub port: u16,
    /// Accepted `Authorization: Bearer` keys. Empty (with an empty
    /// `api_keys_env` variable) means no authentication. Prefer the variable:
    /// a key in a file is a key in every copy of that file.
    pub api_keys: Vec<Secret>,
    /// Environment variable holding more keys, comma-separated (default
    /// `SEEKER_API_KEYS`). Keys are never logged.
    pub api_keys_env: String,
    /// Origins allowed to call the API from a browser (CORS). Empty (the
    /// default) sends no CORS headers; `["*"]` allows any origin.
    pub cors_origins: Vec<String>,
    /// Largest request body, bytes (default 2 MiB); larger bodies get a 413.
    pub max_body_bytes: usize,
    /// Chat and `/retrieve` requests running at once; one more gets a 429 with
    /// `Retry-After`. 0 = no limit. Health, metrics and docs are never limited.
    pub max_concurrent_requests: usize,
    /// Seconds one chat request may run, search rounds included; past it the
    /// request ends with a `request_timeout` error. 0 = no deadline.
    pub request_timeout_s: u64,
    /// Seconds a client has to send a chat or `/retrieve` body once its
    /// headers arrived; past it the request gets a 408 `body_timeout`. The
    /// body is read before the request takes a concurrency slot, so clients
    /// that trickle bodies cannot hold the slots. 0 = no limit.
    pub body_timeout_s: u64,
    /// Seconds a client has to send a request's headers, from the moment the
    /// connection waits for them: a new connection, or a kept-alive one between
    /// requests (so this is also the idle timeout). The connection is closed
    /// after it. 0 = none.
    pub header_timeout_s: u64,
    /// Connections open at once (HTTP/1.1 and HTTP/2 alike; default 1,024).
    /// At the cap the server stops accepting: new connections wait in the
    /// kernel's listen backlog until one closes (idle ones close after
    /// `header_timeout_s`). Each open connection holds one file descriptor,
    /// so keep it below the process's descriptor limit (`ulimit -n`). 0 = no
    /// cap (the descriptor limit is then the cap).
    pub max_connections: usize,
    /// Seconds open streams may keep running after SIGTERM/SIGINT before they
    /// are ended with a `server_shutting_down` error; new connections are
    /// refused at once.
    pub shutdown_grace_s: u64,
    /// Host names `/mcp` answers to (the `Host` header, port ignored);
    /// others get a 403 `host_not_allowed`: the MCP specification's guard
    /// against DNS rebinding. Default: the loopback names. Add the names
    /// clients use when the server is reached from elsewhere; `["*"]`
    /// allows any host.
    pub mcp_allowed_hosts: Vec<String>,
    /// Host names every route answers to (the `Host` header, port ignored);
    /// others get a 403 `host_not_allowed`, against DNS rebinding. Empty
    /// (the default): the loopback names and the bound address when `host`
    /// is a loopback address, any name otherwise. `["*"]` allows any host.
    /// A browser request whose `Origin` is neither the server's own nor in
    /// `cors_origins` gets a 403 `origin_not_allowed` on every route.
    pub allowed_hosts: Vec<String>,
    /// Send `Content-Security-Policy`, `X-Content-Type-Options: nosniff`,
    /// `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer` on every
    /// response (default true; the policies are in `server::headers`). Turn
    /// off behind a proxy that sets its own.
    pub security_headers: bool,
}

/// Largest `server.max_connections` and `server.max_concurrent_requests`.
pub const MAX_LIMIT: usize = 1_000_000;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_keys: Vec::new(),
            api_keys_env: "SEEKER_API_KEYS".into(),
            cors_origins: Vec::new(),
            max_body_bytes: 2 * 1024 * 1024,
            max_concurrent_requests: 16,
            request_timeout_s: 600,
            body_timeout_s: 30,
            header_timeout_s: 30,
            max_connections: 1024,
            shutdown_grace_s: 30,
            mcp_allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_hosts: Vec::new(),
            security_headers: true,
        }
    }
}

impl ServerConfig {
    /// The keys from `api_keys` and the `api_keys_env` variable (looked up with
    /// `env`), blanks dropped.
    pub fn keys(&self, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let from_env = if self.api_keys_env.is_empty() {
            None
        } else {
            env(&self.api_keys_env)
        };
        self.api_keys
            .iter()
            .map(|k| k.expose().to_string())
            .chain(
                from_env
                    .unwrap_or_default()
                    .split(',')
                    .map(|k| k.trim().to_string()),
            )
            .filter(|k| !k.trim().is_empty())
            .collect()
    }

    /// Checks what the types cannot, in this order: the body cap, the load
    /// limits (at most [`MAX_LIMIT`]), the host names, the CORS
    /// origins.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key and value.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "server.max_body_bytes must be at least 1024".into(),
            ));
        }
        // Bounds that keep a typo from becoming a panic (tokio's semaphore
        // takes at most 2^61 permits) while allowing any real deployment.
        for (key, value) in [
            ("max_connections", self.max_connections),
            ("max_concurrent_requests", self.max_concurrent_requests),
        ] {
            if value > MAX_LIMIT {
                return Err(ConfigError::Invalid(format!(
                    "server.{key} is {value}; at most {MAX_LIMIT} (0 = no limit)"
                )));
            }
        }
        for (key, hosts) in [
            ("mcp_allowed_hosts", &self.mcp_allowed_hosts),
            ("allowed_hosts", &self.allowed_hosts),
        ] {
            for host in hosts {
                let bare = host.trim_matches(|c| c == '[' || c == ']');
                if bare.is_empty() || bare.contains(|c: char| c.is_whitespace() || c == '/') {
                    return Err(ConfigError::Invalid(format!(
                        "server.{key}: {host:?} is not a host name \
                         (a name or address without scheme or port, or \"*\")"
                    )));
                }
            }
        }
        for origin in &self.cors_origins {
            if origin != "*" {
                check_origin(origin).map_err(|why| {
                    ConfigError::Invalid(format!("server.cors_origins: {origin:?} {why}"))
                })?;
            }
        }
        Ok(())
    }
}

/// Checks that `origin` is written as browsers send `Origin` (RFC 6454
/// serialisation: `scheme://host[:port]`, lower case, no path, no default
/// port), the only form that can ever match one: a value such as
/// `["http://a.example"]` (a TOML list in an environment variable, where
/// lists are comma-separated), `a.example` or `http://a.example/` was taken
/// as written and silently matched nothing.
///
/// # Errors
/// Why it is no origin, and the origin it would be where there is one.
fn check_origin(origin: &str) -> Result<(), String> {
    let list_hint = if origin.starts_with('[') {
        " (in an environment variable lists are comma-separated: a,b)"
    } else {
        ""
    };
    let no_origin =
        || format!("is not an origin (scheme://host[:port], as browsers send it){list_hint}");
    let url = url::Url::parse(origin).map_err(|_| no_origin())?;
    let serialised = url.origin().ascii_serialization();
    if url.host().is_none() || serialised == "null" {
        return Err(no_origin());
    }
    if serialised != origin {
        return Err(format!(
            "never matches a browser's Origin header, which would read {serialised:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn api_keys_are_read_but_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seeker.toml");
        std::fs::write(&file, "[server]\napi_keys = [\"sk-file-1\"]\n").unwrap();
        let config = Config::load(Some(&file), []).unwrap();
        let env = |name: &str| (name == "SEEKER_API_KEYS").then(|| "sk-env-2".to_string());
        assert_eq!(config.server.keys(env), ["sk-file-1", "sk-env-2"]);
        let printed = format!("{config:?}");
        assert!(!printed.contains("sk-file-1"), "{printed}");
        assert!(printed.contains("api_keys: [[redacted]]"));
    }

    #[test]
    fn cors_origins_that_can_never_match_are_refused() {
        let load = |raw: &str| {
            Config::load(
                None,
                [("SEEKER_SERVER__CORS_ORIGINS".to_string(), raw.to_string())],
            )
            .map(|c| c.server.cors_origins)
            .map_err(|e| e.to_string())
        };
        let listed = load(r#"["http://ok.example"]"#).unwrap_err();
        assert!(listed.contains("comma-separated"), "{listed}");
        assert!(load("ok.example").unwrap_err().contains("is not an origin"));
        let slash = load("http://ok.example/").unwrap_err();
        assert!(slash.contains(r#""http://ok.example""#), "{slash}");
        assert!(load("HTTP://OK.example").is_err());
        assert!(load("http://ok.example:80").is_err());
        assert_eq!(
            load("http://ok.example, https://b.example:8443, *").unwrap(),
            ["http://ok.example", "https://b.example:8443", "*"]
        );
        assert_eq!(load("http://[::1]:3000").unwrap(), ["http://[::1]:3000"]);
    }
}
