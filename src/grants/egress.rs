//! HTTP egress: which URLs and addresses a run's `http` tools may reach.
//!
//! A URL is checked before a request is made (scheme, host name, port, and the address when the
//! host is an IP literal, in any spelling the URL parser accepts: decimal, octal and hex IPv4,
//! IPv4-mapped and -compatible IPv6). A host name is resolved once, by [`EgressResolver`], which
//! hands the HTTP client only the addresses the grant allows, so the address that was checked is
//! the address connected to and DNS cannot rebind it. Redirects go through the same checks.
//!
//! Deliberately not here: building the HTTP client (`tools::http`), reading the operator's
//! configuration (`crate::config`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Where a run's `http` tools may connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// URL schemes allowed (default `http` and `https`).
    #[serde(default = "default_schemes")]
    pub schemes: BTreeSet<String>,
    /// Host names allowed (`api.example.com`, `*.example.com` for any subdomain), IP addresses
    /// and CIDR ranges (`10.1.2.3`, `10.0.0.0/8`, `::1`). An address or range listed here is
    /// granted even when it is loopback or private. Absent: any host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Ports allowed. Absent: any port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<BTreeSet<u16>>,
    /// Loopback, private, link-local, unique-local, shared and other non-global addresses are
    /// reachable. Default `false`: only public addresses (and those listed in `hosts`).
    #[serde(default)]
    pub private: bool,
}

fn default_schemes() -> BTreeSet<String> {
    ["http", "https"].into_iter().map(String::from).collect()
}

impl Default for Egress {
    /// Public addresses only, over http and https, any host and port.
    fn default() -> Self {
        Egress {
            schemes: default_schemes(),
            hosts: None,
            ports: None,
            private: false,
        }
    }
}

/// Why a URL or address may not be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    /// The URL does not parse.
    #[error("the URL is invalid: {reason}")]
    BadUrl {
        /// The parser's reason.
        reason: String,
    },
    /// The scheme is not granted.
    #[error("scheme `{scheme}` is not granted (granted: {granted})")]
    Scheme {
        /// The URL's scheme.
        scheme: String,
        /// The granted schemes.
        granted: String,
    },
    /// The host is not granted.
    #[error("host `{host}` is not granted")]
    Host {
        /// The host.
        host: String,
    },
    /// The port is not granted.
    #[error("port {port} is not granted")]
    Port {
        /// The port.
        port: u16,
    },
    /// The address is loopback, private or otherwise not public, and not granted.
    #[error("address {addr} of host `{host}` is {class} and not granted")]
    Address {
        /// The host as written.
        host: String,
        /// The address it names or resolves to.
        addr: IpAddr,
        /// What kind of address it is (`loopback`, `private`...).
        class: &'static str,
    },
    /// A non-public address listed in `hosts` asked on a port other than 80 and 443, with no
    /// `ports` list that grants it.
    #[error(
        "address {addr} of host `{host}` is granted on ports 80 and 443 only (list `ports` in the egress grant to grant others)"
    )]
    InternalPort {
        /// The host as written.
        host: String,
        /// The address.
        addr: IpAddr,
    },
    /// The name resolved to no address.
    #[error("host `{host}` could not be resolved: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(EgressError);

impl EgressError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            EgressError::BadUrl { .. } => "grant.egress_url",
            EgressError::Resolve { .. } => "http.resolve",
            _ => "grant.egress",
        }
    }
}

/// The kind of a non-public address, or `None` for a public one. IPv4 addresses embedded in
/// IPv6 (mapped, compatible, NAT64, 6to4) are judged by the IPv4 address they carry.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, b, _) if (16..32).contains(&b) => "private",
        (169, 254, _) => "link-local",
        (100, b, _) if (64..128).contains(&b) => "shared (carrier-grade NAT)",
        (192, 0, 0) | (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "reserved",
        (198, b, _) if b == 18 || b == 19 => "reserved",
        (a, _, _) if (224..240).contains(&a) => "multicast",
        (a, _, _) if a >= 240 => "reserved",
        _ => return None,
    })
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    // IPv4-mapped (::ffff:a.b.c.d): the IPv4 address it carries.
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return non_public_v4(embedded_v4(s[6], s[7]));
    }
    // IPv4-compatible (::a.b.c.d): deprecated, and never a public destination.
    if s[..6] == [0; 6] {
        return Some("IPv4-compatible");
    }
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        return non_public_v4(embedded_v4(s[6], s[7]));
    }
    // 6to4 (2002::/16) carries one in bits 16..48.
    if s[0] == 0x2002 {
        return non_public_v4(embedded_v4(s[1], s[2]));
    }
    Some(match s[0] {
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x2001 if s[1] == 0x0db8 => "reserved",
        0x0100 if s[1..4] == [0; 3] => "reserved",
        _ => return None,
    })
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

/// A host entry of [`Egress::hosts`], parsed.
pub(super) enum HostRule {
    /// A name or `*.suffix` ([`name_matches`]).
    Name,
    /// An address or a CIDR range.
    Net(IpAddr, u8),
}

pub(super) fn rule(entry: &str) -> HostRule {
    let entry = entry.trim();
    if let Some((addr, len)) = entry.split_once('/')
        && let (Ok(ip), Ok(len)) = (addr.parse::<IpAddr>(), len.parse::<u8>())
    {
        return HostRule::Net(ip, len);
    }
    let bare = entry.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        let len = if ip.is_ipv4() { 32 } else { 128 };
        return HostRule::Net(ip, len);
    }
    HostRule::Name
}

/// `ip` is in the range `net/len` (IPv4-mapped IPv6 addresses compared as IPv4).
pub(super) fn in_net(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (canon(ip), canon(net)) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let len = u32::from(len.min(32));
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let len = u32::from(len.min(128));
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn same_name(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

/// The host name `name` matches the entry `rule`: the same name (case and a final dot aside),
/// or, for `*.suffix`, a name below the suffix.
pub(super) fn name_matches(rule: &str, name: &str) -> bool {
    let name = name.trim_end_matches('.');
    match rule.trim().strip_prefix("*.") {
        Some(suffix) => {
            let (n, s) = (
                name.to_ascii_lowercase(),
                suffix.trim_end_matches('.').to_ascii_lowercase(),
            );
            n.len() > s.len() && n.ends_with(&s) && n[..n.len() - s.len()].ends_with('.')
        }
        None => same_name(rule.trim(), name),
    }
}

impl Egress {
    /// Everything: any scheme the client speaks, host, port and address (the command line's
    /// default, where the user is the operator).
    pub fn open() -> Egress {
        Egress {
            private: true,
            ..Egress::default()
        }
    }

    /// The host name is allowed by `hosts` (always, when `hosts` is absent).
    fn name_allowed(&self, name: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        hosts
            .iter()
            .any(|h| matches!(rule(h), HostRule::Name) && name_matches(h, name))
    }

    /// The address is granted explicitly by a `hosts` entry.
    fn addr_listed(&self, ip: IpAddr) -> bool {
        self.hosts.as_ref().is_some_and(|hosts| {
            hosts.iter().any(|h| match rule(h) {
                HostRule::Net(net, len) => in_net(ip, net, len),
                _ => false,
            })
        })
    }

    /// A non-public address listed in `hosts` is granted on 80 and 443 only: there is no
    /// `ports` list and `private` is off. (Granting one internal service must not grant every
    /// port of its machine, dagloop's own API included.)
    pub fn internal_ports_limited(&self) -> bool {
        self.ports.is_none()
            && !self.private
            && self.hosts.as_ref().is_some_and(|hosts| {
                hosts.iter().any(|h| match rule(h) {
                    HostRule::Net(ip, _) => non_public(ip).is_some(),
                    HostRule::Name => false,
                })
            })
    }

    /// Checks one address `host` names or resolves to, for a connection on 80 or 443
    /// (`standard_port`) or on another port.
    pub fn check_addr_on(
        &self,
        host: &str,
        ip: IpAddr,
        standard_port: bool,
    ) -> Result<(), EgressError> {
        if self.addr_listed(ip) {
            if !standard_port && self.internal_ports_limited() && non_public(ip).is_some() {
                return Err(EgressError::InternalPort {
                    host: host.to_string(),
                    addr: ip,
                });
            }
            return Ok(());
        }
        match non_public(ip) {
            Some(class) if !self.private => Err(EgressError::Address {
                host: host.to_string(),
                addr: ip,
                class,
            }),
            _ => Ok(()),
        }
    }

    /// Checks a URL before any connection: scheme, port, host name or literal address.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), EgressError> {
        let scheme = url.scheme();
        if !self.schemes.contains(scheme) {
            return Err(EgressError::Scheme {
                scheme: scheme.to_string(),
                granted: self.schemes.iter().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        let host = url.host().ok_or_else(|| EgressError::BadUrl {
            reason: "it has no host".into(),
        })?;
        if let Some(ports) = &self.ports {
            let port = url.port_or_known_default().unwrap_or(0);
            if !ports.contains(&port) {
                return Err(EgressError::Port { port });
            }
        }
        match host {
            url::Host::Domain(name) => {
                if !self.name_allowed(name) {
                    return Err(EgressError::Host {
                        host: name.to_string(),
                    });
                }
                Ok(())
            }
            url::Host::Ipv4(ip) => self.check_literal(IpAddr::V4(ip), standard_port(url)),
            url::Host::Ipv6(ip) => self.check_literal(IpAddr::V6(ip), standard_port(url)),
        }
    }

    fn check_literal(&self, ip: IpAddr, standard_port: bool) -> Result<(), EgressError> {
        if self.hosts.is_some() && !self.addr_listed(ip) {
            return Err(EgressError::Host {
                host: ip.to_string(),
            });
        }
        self.check_addr_on(&ip.to_string(), ip, standard_port)
    }

    /// Parses and checks a URL as written (`check_url`).
    pub fn check_str(&self, url: &str) -> Result<reqwest::Url, EgressError> {
        let parsed = reqwest::Url::parse(url).map_err(|e| EgressError::BadUrl {
            reason: e.to_string(),
        })?;
        self.check_url(&parsed)?;
        Ok(parsed)
    }

    /// Everything is reachable: no check could refuse.
    pub fn is_open(&self) -> bool {
        self.private && self.hosts.is_none() && self.ports.is_none()
    }
}

/// The URL's port (or its scheme's) is 80 or 443.
pub fn standard_port(url: &reqwest::Url) -> bool {
    url.port_or_known_default()
        .is_some_and(|p| p == 80 || p == 443)
}

/// Resolves host names for the `http` activity's client and keeps only the addresses the
/// grant allows; a name whose every address is refused fails to resolve with the reason. A
/// resolver does not see the port: the client uses one made for ports 80 and 443 and another
/// for the rest (which refuses listed internal addresses, `Egress::internal_ports_limited`).
pub struct EgressResolver {
    egress: Arc<Egress>,
    standard_port: bool,
}

impl EgressResolver {
    /// A resolver for this grant, for connections on 80 and 443 (`standard_port`) or others.
    pub fn new(egress: Arc<Egress>, standard_port: bool) -> EgressResolver {
        EgressResolver {
            egress,
            standard_port,
        }
    }
}

impl reqwest::dns::Resolve for EgressResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.egress.clone();
        let standard_port = self.standard_port;
        let host = name.as_str().to_string();
        Box::pin(async move {
            if !egress.name_allowed(&host) {
                let e: Box<dyn std::error::Error + Send + Sync> =
                    Box::new(EgressError::Host { host });
                return Err(e);
            }
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| {
                    Box::new(EgressError::Resolve {
                        host: host.clone(),
                        reason: e.to_string(),
                    }) as Box<dyn std::error::Error + Send + Sync>
                })?
                .collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(
                    |a| match egress.check_addr_on(&host, a.ip(), standard_port) {
                        Ok(()) => true,
                        Err(e) => {
                            refused.get_or_insert(e);
                            false
                        }
                    },
                )
                .collect();
            if allowed.is_empty() {
                let e = refused.unwrap_or(EgressError::Resolve {
                    host,
                    reason: "no address".into(),
                });
                return Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// The redirect policy of a checked client: at most 10 hops, each target checked like the
/// first URL (its name is resolved through the same resolver when it is connected); with
/// `same_origin`, only to the first URL's scheme, host and port (a request that carries a
/// granted secret in a header would carry it to any other host too). `standard_port`: the
/// client's resolver is the one for ports 80 and 443, so a redirect to a name on another port
/// is refused when listed internal addresses are limited to those.
pub fn redirect_policy(
    egress: Arc<Egress>,
    same_origin: bool,
    standard_port: bool,
) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("too many redirects");
        }
        if standard_port
            && !self::standard_port(attempt.url())
            && egress.internal_ports_limited()
            && matches!(attempt.url().host(), Some(url::Host::Domain(_)))
        {
            let port = attempt.url().port_or_known_default().unwrap_or(0);
            return attempt.error(EgressError::Port { port });
        }
        if same_origin
            && let Some(first) = attempt.previous().first()
            && first.origin() != attempt.url().origin()
        {
            return attempt.error(super::SecretHostError::Redirect);
        }
        match egress.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(e) => attempt.error(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed() -> Egress {
        Egress::default()
    }

    #[test]
    fn loopback_and_private_literals_are_refused_in_every_spelling() {
        let e = closed();
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://0x7f.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[2002:7f00:1::]/",
            "http://user:pw@127.0.0.1:8080/",
            "http://10.0.0.1/",
            "http://172.16.5.4/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://0.0.0.0/",
            "http://100.64.0.1/",
        ] {
            let r = e.check_str(url);
            assert!(
                matches!(r, Err(EgressError::Address { .. })),
                "{url}: {r:?}"
            );
        }
    }

    #[test]
    fn public_literals_and_names_pass_a_default_grant() {
        let e = closed();
        for url in [
            "http://93.184.216.34/",
            "https://example.com/x",
            "http://[2606:4700::1111]/",
        ] {
            assert!(e.check_str(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn schemes_ports_and_hosts_are_checked() {
        let e = Egress {
            hosts: Some(vec![
                "api.example.com".into(),
                "*.corp.example".into(),
                "127.0.0.1".into(),
            ]),
            ports: Some([443, 9000].into_iter().collect()),
            ..Egress::default()
        };
        assert!(e.check_str("https://api.example.com/").is_ok());
        assert!(e.check_str("https://API.example.com./").is_ok());
        assert!(e.check_str("https://x.corp.example/").is_ok());
        assert!(matches!(
            e.check_str("https://corp.example/"),
            Err(EgressError::Host { .. })
        ));
        assert!(matches!(
            e.check_str("https://evilcorp.example/"),
            Err(EgressError::Host { .. })
        ));
        assert!(matches!(
            e.check_str("http://api.example.com/"),
            Err(EgressError::Port { port: 80 })
        ));
        assert!(matches!(
            e.check_str("file:///etc/passwd"),
            Err(EgressError::Scheme { .. })
        ));
        assert!(matches!(
            e.check_str("ftp://api.example.com:443/"),
            Err(EgressError::Scheme { .. })
        ));
        // A listed address is granted although it is loopback; another loopback one is not.
        assert!(e.check_str("http://127.0.0.1:9000/").is_ok());
        assert!(e.check_str("http://[::ffff:127.0.0.1]:9000/").is_ok());
        assert!(e.check_str("http://127.0.0.2:9000/").is_err());
    }

    #[test]
    fn a_private_grant_opens_non_public_ranges() {
        let e = Egress {
            private: true,
            ..Egress::default()
        };
        assert!(e.check_str("http://127.0.0.1:1/").is_ok());
        assert!(e.check_str("http://[fd00::1]/").is_ok());
    }

    #[test]
    fn a_listed_internal_address_without_ports_is_granted_on_80_and_443_only() {
        let e = Egress {
            hosts: Some(vec!["10.1.2.3".into(), "127.0.0.0/8".into()]),
            ..Egress::default()
        };
        assert!(e.internal_ports_limited());
        for ok in [
            "http://10.1.2.3/",
            "https://10.1.2.3/",
            "http://127.0.0.1:443/",
        ] {
            assert!(e.check_str(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://10.1.2.3:8080/",
            "http://127.0.0.1:7777/",
            "http://2130706433:22/",
        ] {
            assert!(
                matches!(e.check_str(bad), Err(EgressError::InternalPort { .. })),
                "{bad}"
            );
        }
        // A ports list, or `private`, says which ports.
        let listed = Egress {
            ports: Some([8080].into_iter().collect()),
            ..e.clone()
        };
        assert!(listed.check_str("http://10.1.2.3:8080/").is_ok());
        // A public address listed is not limited.
        let public = Egress {
            hosts: Some(vec!["93.184.216.34".into()]),
            ..Egress::default()
        };
        assert!(!public.internal_ports_limited());
        assert!(public.check_str("http://93.184.216.34:8080/").is_ok());
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_listed_internal_address_is_refused_off_80_and_443() {
        use reqwest::dns::Resolve;
        let e = Arc::new(Egress {
            hosts: Some(vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]),
            ..Egress::default()
        });
        let standard = EgressResolver::new(e.clone(), true);
        assert!(
            standard
                .resolve("localhost".parse().expect("name"))
                .await
                .is_ok()
        );
        let other = EgressResolver::new(e, false);
        let err = other
            .resolve("localhost".parse().expect("name"))
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("80 and 443"), "{err}");
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_that_resolve_to_loopback() {
        use reqwest::dns::Resolve;
        let r = EgressResolver::new(Arc::new(closed()), true);
        for name in ["localhost"] {
            let out = r.resolve(name.parse().expect("name")).await;
            let err = out.err().expect("refused").to_string();
            assert!(err.contains("loopback"), "{name}: {err}");
        }
        let open = EgressResolver::new(Arc::new(Egress::open()), true);
        let addrs: Vec<SocketAddr> = open
            .resolve("localhost".parse().expect("name"))
            .await
            .expect("resolves")
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
