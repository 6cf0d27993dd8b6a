//! `[pages]`: [`PagesConfig`], the page reader's settings, and their checks
//! ([`PagesConfig::settings`] turns them into `crate::pages::PageSettings`).
//! Used by `search::setup` and `eval`, which build the page reader from it.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[pages]`: the page reader behind page actions (`<access>`, `visit`).
/// Corpus documents always open; web pages only with `web = true`. What the
/// checks protect against: docs/pages.md "Reading pages".
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PagesConfig {
    /// Fetch http(s) pages (default off).
    pub web: bool,
    /// Deadline of one page, redirects and reading included, milliseconds.
    pub timeout_ms: u64,
    /// Bytes of a body read at most.
    pub max_bytes: usize,
    /// Redirects followed.
    pub max_redirects: usize,
    /// Fetches in flight across all requests.
    pub concurrency: usize,
    /// HTML pages turned into text at once (blocking threads); the others wait.
    pub extract_concurrency: usize,
    /// Fetches started per second per host; 0 = no limit.
    pub host_requests_per_second: u32,
    /// Fetches started per second in all; 0 = no limit.
    pub requests_per_second: u32,
    /// Seconds a page stays cached; 0 turns the cache off.
    pub cache_ttl_s: u64,
    /// Bytes the page cache holds.
    pub cache_max_bytes: u64,
    /// Seconds a failed page is answered with its failure without a new
    /// fetch; 0 = never.
    pub failure_ttl_s: u64,
    /// Only these hosts when non-empty: `example.org` or `*.example.org`.
    pub allow_hosts: Vec<String>,
    /// Never these hosts (same forms).
    pub deny_hosts: Vec<String>,
    /// Networks (CIDR) allowed although private, loopback or link-local.
    pub allow_networks: Vec<String>,
    /// Networks (CIDR) refused besides the built-in ranges.
    pub deny_networks: Vec<String>,
}

impl Default for PagesConfig {
    fn default() -> Self {
        let d = crate::pages::PageSettings::default();
        Self {
            web: d.web,
            timeout_ms: d.timeout.as_millis() as u64,
            max_bytes: d.max_bytes,
            max_redirects: d.max_redirects,
            concurrency: d.concurrency,
            extract_concurrency: d.extract_concurrency,
            host_requests_per_second: d.host_requests_per_second,
            requests_per_second: d.requests_per_second,
            cache_ttl_s: d.cache_ttl.as_secs(),
            cache_max_bytes: d.cache_max_bytes,
            failure_ttl_s: d.failure_ttl.as_secs(),
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            allow_networks: Vec::new(),
            deny_networks: Vec::new(),
        }
    }
}

impl PagesConfig {
    /// The reader's settings.
    ///
    /// # Errors
    /// A network that is not CIDR notation or an address, a host that is
    /// empty or not a host name, a zero timeout or byte cap; the message
    /// names the key.
    pub fn settings(&self) -> Result<crate::pages::PageSettings, ConfigError> {
        let nets = |key: &str, list: &[String]| {
            list.iter()
                .map(|n| {
                    n.parse::<ipnet::IpNet>()
                        .or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| {
                            ConfigError::Invalid(format!(
                                "pages.{key}: {n:?} is not a network such as 10.0.0.0/8 or an address"
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        if self.timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "pages.timeout_ms must be positive".into(),
            ));
        }
        if self.max_bytes == 0 {
            return Err(ConfigError::Invalid(
                "pages.max_bytes must be positive".into(),
            ));
        }
        let hosts = |key: &str, list: &[String]| {
            list.iter()
                .map(|h| {
                    let host = h.trim().to_ascii_lowercase();
                    let bare = host.strip_prefix("*.").unwrap_or(&host);
                    if bare.is_empty() || bare.contains(['/', ':', ' ']) {
                        return Err(ConfigError::Invalid(format!(
                            "pages.{key}: {h:?} is not a host such as example.org or *.example.org"
                        )));
                    }
                    Ok(host)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(crate::pages::PageSettings {
            web: self.web,
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            max_bytes: self.max_bytes,
            max_redirects: self.max_redirects,
            concurrency: self.concurrency.max(1),
            extract_concurrency: self.extract_concurrency.max(1),
            host_requests_per_second: self.host_requests_per_second,
            requests_per_second: self.requests_per_second,
            cache_ttl: std::time::Duration::from_secs(self.cache_ttl_s),
            cache_max_bytes: self.cache_max_bytes,
            failure_ttl: std::time::Duration::from_secs(self.failure_ttl_s),
            policy: crate::pages::UrlPolicy {
                allow_hosts: hosts("allow_hosts", &self.allow_hosts)?,
                deny_hosts: hosts("deny_hosts", &self.deny_hosts)?,
                allow_networks: nets("allow_networks", &self.allow_networks)?,
                deny_networks: nets("deny_networks", &self.deny_networks)?,
            },
            ..crate::pages::PageSettings::default()
        })
    }

    /// Checks the settings: [`PagesConfig::settings`] without its result.
    ///
    /// # Errors
    /// As [`PagesConfig::settings`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.settings().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pages_settings_name_their_key() {
        let bad = |edit: fn(&mut PagesConfig)| {
            let mut p = PagesConfig::default();
            edit(&mut p);
            p.settings().unwrap_err().to_string()
        };
        assert!(bad(|p| p.deny_hosts = vec!["".into()]).contains("pages.deny_hosts"));
        assert!(bad(|p| p.allow_hosts = vec!["http://a.org/".into()]).contains("pages.allow_hosts"));
        assert!(
            bad(|p| p.allow_networks = vec!["nonsense".into()]).contains("pages.allow_networks")
        );
        let timeout = bad(|p| p.timeout_ms = 0);
        assert!(timeout.contains("pages.timeout_ms") && !timeout.contains("max_bytes"));
        assert!(bad(|p| p.max_bytes = 0).contains("pages.max_bytes"));
        let ok = PagesConfig {
            allow_hosts: vec![" *.Example.org ".into()],
            allow_networks: vec!["10.0.0.1".into()],
            ..PagesConfig::default()
        };
        let settings = ok.settings().unwrap();
        assert_eq!(settings.policy.allow_hosts, ["*.example.org"]);
        assert_eq!(settings.policy.allow_networks[0].to_string(), "10.0.0.1/32");
    }
}
