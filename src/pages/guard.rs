//! What a page action may fetch: the URL policy and the address check that
//! keeps a model-chosen URL from reaching seeker's own network.
//!
//! A server that fetches URLs chosen by a model (and so, indirectly, by any
//! text the model read) is a server-side request forgery risk (OWASP SSRF
//! prevention cheat sheet). Every fetch goes through two checks:
//! 1. [`UrlPolicy::check_url`] before any connection: only `http`/`https`, no
//!    user info, a host, not on the deny list, on the allow list when one is
//!    given; a host written as an IP address (in any form the WHATWG URL
//!    parser accepts: `2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`) is checked
//!    as an address right away.
//! 2. [`GuardedResolver`], the HTTP client's only resolver: each address a
//!    name resolves to is checked, and refused ones are never returned, so the
//!    client connects only to addresses that passed (no window between check
//!    and connect; a DNS answer that changes between two lookups is checked
//!    each time). Redirects are followed by the reader itself, each target
//!    checked again.
//!
//! Refused address ranges ([`refused_reason`]): unspecified, loopback,
//! private (RFC 1918, IPv6 unique-local), link-local (cloud metadata at
//! 169.254.169.254 and `fd00:ec2::254` included), shared address space
//! (RFC 6598), multicast, broadcast, benchmarking, documentation and reserved
//! ranges, and IPv6 forms that embed an IPv4 address (mapped, compatible,
//! NAT64, 6to4, Teredo) by the address they embed. `allow_networks` opens
//! chosen ranges again (a local page server for tests or an intranet);
//! `deny_networks` refuses more.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Longest URL fetched, in bytes (browsers and servers commonly stop near 8 KiB).
pub const MAX_URL_BYTES: usize = 4096;

/// Why a URL is not fetched. The message is what the trace shows; the
/// policy reads its own failure text instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// Hosts and networks a page action may or may not reach (`[pages]`).
#[derive(Clone, Debug, Default)]
pub struct UrlPolicy {
    /// When non-empty, only these hosts are fetched: `example.org` (that host)
    /// or `*.example.org` (its subdomains and itself). Lower case.
    pub allow_hosts: Vec<String>,
    /// Hosts never fetched, same forms; checked first.
    pub deny_hosts: Vec<String>,
    /// Networks allowed although [`refused_reason`] refuses them
    /// (`127.0.0.1/32` for a local test page server).
    pub allow_networks: Vec<IpNet>,
    /// Networks refused as well.
    pub deny_networks: Vec<IpNet>,
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host == suffix
                || (host.len() > suffix.len()
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.')
        }
        None => host == pattern,
    }
}

impl UrlPolicy {
    /// Checks a URL before anything is fetched.
    ///
    /// # Errors
    /// A [`Refusal`] naming the rule: length ([`MAX_URL_BYTES`]), scheme,
    /// credentials, a missing host, the host lists, or the address of a host
    /// written as an IP.
    pub fn check_url(&self, url: &url::Url) -> Result<(), Refusal> {
        if url.as_str().len() > MAX_URL_BYTES {
            return Err(Refusal(format!(
                "the URL is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(Refusal(format!("scheme `{other}` is not http or https"))),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal("URLs with credentials are not fetched".into()));
        }
        let host = match url.host() {
            Some(h) => h,
            None => return Err(Refusal("the URL has no host".into())),
        };
        let name = match &host {
            url::Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
            url::Host::Ipv4(a) => a.to_string(),
            url::Host::Ipv6(a) => a.to_string(),
        };
        // An IPv6 literal that carries an IPv4 address is also that address
        // (`[::ffff:93.184.216.34]` is on a list that names 93.184.216.34).
        let names: Vec<String> = match host {
            url::Host::Ipv6(a) => std::iter::once(name.clone())
                .chain(embedded_v4(a).map(|v4| v4.to_string()))
                .collect(),
            _ => vec![name.clone()],
        };
        let listed = |list: &[String]| {
            list.iter()
                .any(|p| names.iter().any(|n| host_matches(p, n)))
        };
        if listed(&self.deny_hosts) {
            return Err(Refusal(format!("host {name} is on the deny list")));
        }
        // An allow list opens exactly what it names: another spelling of an
        // allowed address is not allowed by it.
        if !self.allow_hosts.is_empty() && !self.allow_hosts.iter().any(|p| host_matches(p, &name))
        {
            return Err(Refusal(format!("host {name} is not on the allow list")));
        }
        match host {
            url::Host::Ipv4(a) => self.check_ip(IpAddr::V4(a)),
            url::Host::Ipv6(a) => self.check_ip(IpAddr::V6(a)),
            url::Host::Domain(d) => {
                // `localhost` and its subdomains never need DNS to be loopback.
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if d == "localhost" || d.ends_with(".localhost") {
                    self.check_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Checks one address a host resolved to (or was written as).
    ///
    /// # Errors
    /// A [`Refusal`] naming the range.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        // A denied network is denied in every spelling: also by the IPv4
        // address an IPv6 form carries (the one the connection reaches). An
        // allowed network opens exactly the addresses written in it.
        let v4 = match ip {
            IpAddr::V6(a) => embedded_v4(a).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        if self
            .deny_networks
            .iter()
            .any(|n| n.contains(&ip) || v4.is_some_and(|a| n.contains(&a)))
        {
            return Err(Refusal(format!("address {ip} is in a denied network")));
        }
        if self.allow_networks.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        match refused_reason(ip) {
            Some(range) => Err(Refusal(format!("address {ip} is {range}"))),
            None => Ok(()),
        }
    }
}

/// The IPv4 address an IPv6 address carries and reaches: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, not `::` or `::1`),
/// NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::/48`).
pub fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let low = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !a.is_unspecified() && !a.is_loopback() {
        return Some(low());
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low());
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// Why an address is not on the public internet, or `None` when it is.
/// Sources: the IANA IPv4 and IPv6 special-purpose address registries
/// (RFC 6890 and its updates).
pub fn refused_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => refused_v4(a),
        IpAddr::V6(a) => refused_v6(a),
    }
}

fn refused_v4(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    Some(match o {
        [0, ..] => "unspecified (0.0.0.0/8)",
        [127, ..] => "loopback",
        [10, ..] => "private (10.0.0.0/8)",
        [172, b, ..] if (16..32).contains(&b) => "private (172.16.0.0/12)",
        [192, 168, ..] => "private (192.168.0.0/16)",
        [169, 254, ..] => "link-local (cloud metadata lives here)",
        [100, b, ..] if (64..128).contains(&b) => "shared address space (100.64.0.0/10)",
        [192, 0, 0, _] => "IETF protocol assignments (192.0.0.0/24)",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking (198.18.0.0/15)",
        [192, 88, 99, _] => "6to4 relay anycast",
        [b, ..] if b >= 224 => {
            if a.is_broadcast() {
                "broadcast"
            } else if b < 240 {
                "multicast"
            } else {
                "reserved (240.0.0.0/4)"
            }
        }
        _ => return None,
    })
}

fn refused_v6(a: Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        return Some("unspecified (::)");
    }
    if a.is_loopback() {
        return Some("loopback (::1)");
    }
    let s = a.segments();
    // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d): the
    // connection goes to the IPv4 address.
    if let Some(v4) = a.to_ipv4_mapped() {
        return refused_v4(v4).or(None);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return Some(refused_v4(v4).unwrap_or("IPv4-compatible (deprecated)"));
    }
    // NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48): the gateway
    // connects to the embedded IPv4 address.
    if s[0] == 0x64 && s[1] == 0xff9b {
        if s[2..6] == [0, 0, 0, 0] {
            let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
            return refused_v4(v4);
        }
        return Some("local-use NAT64 (64:ff9b:1::/48)");
    }
    // 6to4 (2002::/16) embeds an IPv4 address in bits 16..48.
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return refused_v4(v4);
    }
    Some(match s[0] {
        // Teredo (2001::/32) tunnels to an obfuscated address: refused whole.
        0x2001 if s[1] == 0 => "Teredo (2001::/32)",
        0x2001 if s[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x2001 if s[1] < 0x0200 => "IETF protocol assignments (2001::/23)",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        x if x & 0xfe00 == 0xfc00 => "unique-local (fc00::/7, fd00:ec2::254 metadata included)",
        x if x & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        x if x & 0xffc0 == 0xfec0 => "site-local (fec0::/10, deprecated)",
        x if x & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        // Global unicast is 2000::/3; everything else is reserved.
        x if x & 0xe000 != 0x2000 => "reserved (outside 2000::/3)",
        _ => return None,
    })
}

/// How the resolver looks a name up: the system's resolver in production,
/// a fixed table in tests.
pub trait Lookup: Send + Sync + 'static {
    /// The addresses of `host` (port 0).
    fn lookup(
        &self,
        host: String,
    ) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>>;
}

/// The system resolver (`getaddrinfo`, through tokio).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(
        &self,
        host: String,
    ) -> futures::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// The HTTP client's resolver: looks names up and returns only addresses the
/// policy allows; a name with none left fails to resolve, with the refusal
/// as the error (see the module docs).
#[derive(Clone)]
pub struct GuardedResolver {
    policy: Arc<UrlPolicy>,
    lookup: Arc<dyn Lookup>,
}

impl GuardedResolver {
    /// A resolver checking each answer of `lookup` against `policy`.
    pub fn new(policy: Arc<UrlPolicy>, lookup: Arc<dyn Lookup>) -> Self {
        Self { policy, lookup }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let lookup = self.lookup.lookup(name.as_str().to_string());
        let host = name.as_str().to_string();
        Box::pin(async move {
            let ips = lookup.await?;
            let mut allowed = Vec::new();
            let mut refusal = None;
            for ip in ips {
                match policy.check_ip(ip) {
                    Ok(()) => allowed.push(SocketAddr::new(ip, 0)),
                    Err(r) => refusal = Some(r),
                }
            }
            if allowed.is_empty() {
                let reason = match refusal {
                    Some(r) => format!("{host} resolves to a refused address: {r}"),
                    None => format!("{host} has no address"),
                };
                return Err(Box::new(Refusal(reason)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> bool {
        let policy = UrlPolicy::default();
        match url::Url::parse(url) {
            Ok(u) => policy.check_url(&u).is_err(),
            Err(_) => true,
        }
    }

    #[test]
    fn addresses_outside_the_public_internet_are_refused() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "127.255.255.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "192.0.0.170",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2001::1",
            "2001:db8::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(refused_reason(ip).is_some(), "{ip} should be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(refused_reason(ip), None, "{ip} should pass");
        }
    }

    #[test]
    fn every_spelling_of_loopback_in_a_url_is_refused() {
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[0:0:0:0:0:ffff:7f00:1]/",
            "http://localhost:8080/metrics",
            "http://LOCALHOST./",
            "http://api.localhost/",
            "http://0/",
            "http://169.254.169.254/latest/meta-data/",
            "file:///etc/passwd",
            "gopher://example.org/",
            "ftp://example.org/",
            "http://user:pass@example.org/",
            "javascript:alert(1)",
            "http://[::]/",
            "http://[fe80::1%25eth0]/",
        ] {
            assert!(refused(url), "{url} should be refused");
        }
        assert!(!refused("https://example.org/page"));
    }

    #[test]
    fn host_lists_and_networks_apply() {
        let policy = UrlPolicy {
            allow_hosts: vec!["*.example.org".into(), "127.0.0.1".into()],
            deny_hosts: vec!["bad.example.org".into()],
            allow_networks: vec!["127.0.0.1/32".parse().unwrap()],
            deny_networks: vec!["8.8.8.0/24".parse().unwrap()],
        };
        let check = |u: &str| policy.check_url(&url::Url::parse(u).unwrap());
        assert!(check("https://example.org/").is_ok());
        assert!(check("https://a.example.org/").is_ok());
        assert!(check("http://127.0.0.1:9000/page").is_ok());
        assert!(check("https://bad.example.org/").is_err());
        assert!(check("https://notexample.org/").is_err());
        assert!(check("http://127.0.0.2/").is_err());
        assert!(policy.check_ip("8.8.8.8".parse().unwrap()).is_err());
        // IPv6 spellings of a denied (public) IPv4 address are denied too,
        // by network and by host.
        for url in [
            "http://[::ffff:8.8.8.8]/",
            "http://[::ffff:808:808]/",
            "http://[64:ff9b::8.8.8.8]/",
            "http://[2002:808:808::1]/",
        ] {
            assert!(check(url).is_err(), "{url}");
            let ip: IpAddr = url[8..url.len() - 2].parse().unwrap();
            assert!(policy.check_ip(ip).is_err(), "{url}");
        }
        let by_host = UrlPolicy {
            deny_hosts: vec!["93.184.216.34".into()],
            ..UrlPolicy::default()
        };
        assert!(by_host
            .check_url(&url::Url::parse("http://[::ffff:93.184.216.34]/").unwrap())
            .is_err());
        assert!(by_host
            .check_url(&url::Url::parse("http://93.184.216.35/").unwrap())
            .is_ok());
    }
}
