//! Where the value of a granted environment variable may be sent: an operator's env grant names
//! the destinations (`host[:port]`) of each variable and, optionally, the published agents whose
//! calls may carry it, and the `http` activity checks every request that carries a `${VAR}`
//! placeholder against them before it is made, on the URL as the parser reads it (an address in
//! any spelling is the address it names).
//!
//! The agent of a call is the published agent its run was started as (`RunOptions::agent`, set
//! by the server, never by a client); a delegate's calls are its run's, so they are held to the
//! same agent. A run that is no published agent's (a client's own goal, a delegate goal file it
//! names included) carries no agent and may not send a variable bound to agents. On the command
//! line, where the user is the operator ([`SecretHosts::with_unbound_anywhere`]), the agents are
//! not checked (the hosts still are).
//!
//! A destination is a host name (`api.weather.example`), `*.suffix`, an IP address or a CIDR
//! range, with an optional port (`api.weather.example:443`, `[::1]:8443`); without a port it is
//! the scheme's default port (80 for `http`, 443 for `https`). A name matches the URL's host name
//! and an address matches a URL that is that address: a name is never resolved to match an
//! address entry, so DNS cannot move a secret to another machine.
//!
//! Deliberately not here: whether a goal may read the variable at all (`crate::runs::check_goal`,
//! `grant.env`), where a request may connect at all (`egress`), filling placeholders
//! (`tools::fill_env`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Where each granted variable's value may be sent in a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretHosts {
    /// Variables bound to destinations.
    bound: BTreeMap<String, Vec<String>>,
    /// Variables bound to published agents besides their destinations: only calls of runs of
    /// these agents may carry them.
    agents: BTreeMap<String, Vec<String>>,
    /// A variable not in `bound` may be sent anywhere the egress grant reaches (the command line,
    /// where the user is the operator); otherwise nowhere. The command line checks no agents.
    unbound_anywhere: bool,
    /// The published agent whose run's calls are checked ([`SecretHosts::for_agent`]); None: a
    /// run that is no published agent's.
    agent: Option<String>,
}

/// A request would carry a variable's value to a destination it is not granted to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretHostError {
    /// The variable is bound to other destinations (or, unbound under a server, to none).
    #[error(
        "`${{{var}}}` may not be sent to this address; the operator grants it to {granted} (the request was not sent)"
    )]
    NotGranted {
        /// The variable.
        var: String,
        /// The destinations it is granted to, for the user (`no address` when none).
        granted: String,
    },
    /// The variable is bound to published agents, and the call's run is none of theirs.
    #[error(
        "`${{{var}}}` may be sent only by the calls of the operator's agents {agents}; this run {run} (the request was not sent)"
    )]
    NotForAgent {
        /// The variable.
        var: String,
        /// The agents it is granted to.
        agents: String,
        /// What this run is, for the user (`runs agent `x`` or `is no published agent's`).
        run: String,
    },
    /// A request that carries a variable's value was redirected to another host.
    #[error(
        "a request carrying a granted variable is not redirected to another scheme, host or port"
    )]
    Redirect,
}

crate::codes::has_code!(SecretHostError);

impl SecretHostError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        "grant.env_host"
    }
}

/// `host[:port]` split; `[v6]:port` and bare IPv6 addresses are understood.
fn split_port(entry: &str) -> (&str, Option<u16>) {
    let entry = entry.trim();
    if let Some(rest) = entry.strip_prefix('[')
        && let Some((host, after)) = rest.split_once(']')
    {
        return (host, after.strip_prefix(':').and_then(|p| p.parse().ok()));
    }
    match entry.rsplit_once(':') {
        // One colon: `host:port` (a bare IPv6 address has several, a CIDR none after `/`).
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host, Some(p)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

/// The entry's host part (a name, `*.suffix`, an address or a range) matches the URL's host.
fn host_matches(rule: &str, host: &url::Host<&str>) -> bool {
    use super::egress::{HostRule, in_net, name_matches};
    match (host, super::egress::rule(rule)) {
        (url::Host::Domain(name), HostRule::Name) => name_matches(rule, name),
        (url::Host::Ipv4(ip), HostRule::Net(net, len)) => in_net(IpAddr::V4(*ip), net, len),
        (url::Host::Ipv6(ip), HostRule::Net(net, len)) => in_net(IpAddr::V6(*ip), net, len),
        _ => false,
    }
}

impl SecretHosts {
    /// Every variable may be sent anywhere the egress grant reaches (the command line's default
    /// and a program's `Grants::open`).
    pub fn anywhere() -> SecretHosts {
        SecretHosts {
            unbound_anywhere: true,
            ..SecretHosts::default()
        }
    }

    /// Only the bound variables, each to its destinations; any other to none (a server's).
    pub fn bound(bound: BTreeMap<String, Vec<String>>) -> SecretHosts {
        SecretHosts {
            bound,
            ..SecretHosts::default()
        }
    }

    /// Binds variables to the published agents whose calls alone may carry them (each also
    /// bound to destinations, [`SecretHosts::bound`]).
    pub fn with_agents(mut self, agents: BTreeMap<String, Vec<String>>) -> SecretHosts {
        self.agents = agents;
        self
    }

    /// The grant as it applies to the calls of one run: of the published agent `agent`, or
    /// (None) of no published agent. Every front-end scopes it so when it builds a run's agent
    /// (`RunDef::agent_builder`).
    pub fn for_agent(&self, agent: Option<&str>) -> SecretHosts {
        SecretHosts {
            agent: agent.map(str::to_string),
            ..self.clone()
        }
    }

    /// Variables without destinations of their own may be sent anywhere the egress reaches
    /// (the command line with `--config`: the user at the terminal is the operator).
    pub fn with_unbound_anywhere(mut self) -> SecretHosts {
        self.unbound_anywhere = true;
        self
    }

    /// Nothing is restricted: no check could refuse.
    pub fn is_open(&self) -> bool {
        self.unbound_anywhere && self.bound.is_empty()
    }

    /// The variables bound to destinations, with them.
    pub fn bindings(&self) -> &BTreeMap<String, Vec<String>> {
        &self.bound
    }

    /// The variables bound to published agents, with them.
    pub fn agent_bindings(&self) -> &BTreeMap<String, Vec<String>> {
        &self.agents
    }

    /// Checks that a request to `url` may carry the values of `vars`.
    pub fn check<'a>(
        &self,
        vars: impl IntoIterator<Item = &'a str>,
        url: &reqwest::Url,
    ) -> Result<(), SecretHostError> {
        let seen: BTreeSet<&str> = vars.into_iter().collect();
        for var in seen {
            if let Some(agents) = self.agents.get(var)
                && !self.unbound_anywhere
                && !self
                    .agent
                    .as_ref()
                    .is_some_and(|a| agents.iter().any(|g| g == a))
            {
                return Err(SecretHostError::NotForAgent {
                    var: var.to_string(),
                    agents: agents.join(", "),
                    run: match &self.agent {
                        Some(a) => format!("runs agent `{a}`"),
                        None => "is no published agent's".into(),
                    },
                });
            }
            let granted = match self.bound.get(var) {
                Some(hosts) => hosts.as_slice(),
                None if self.unbound_anywhere => continue,
                None => &[],
            };
            let port = url.port_or_known_default();
            let ok = url.host().is_some_and(|host| {
                granted.iter().any(|entry| {
                    let (rule, p) = split_port(entry);
                    let want = p.or(match url.scheme() {
                        "https" => Some(443),
                        "http" => Some(80),
                        _ => None,
                    });
                    want.is_some() && want == port && host_matches(rule, &host)
                })
            });
            if !ok {
                return Err(SecretHostError::NotGranted {
                    var: var.to_string(),
                    granted: if granted.is_empty() {
                        "no address (write {name, hosts} in the operator's `grants.env`)".into()
                    } else {
                        granted.join(", ")
                    },
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).expect("url")
    }

    fn hosts(var: &str, list: &[&str]) -> SecretHosts {
        SecretHosts::bound(
            [(
                var.to_string(),
                list.iter().map(|s| s.to_string()).collect(),
            )]
            .into_iter()
            .collect(),
        )
    }

    #[test]
    fn a_bound_variable_goes_only_to_its_hosts_and_ports() {
        let s = hosts(
            "K",
            &[
                "api.weather.example:443",
                "127.0.0.1:8080",
                "*.corp.example",
            ],
        );
        let ok = |u: &str| s.check(["K"], &url(u)).is_ok();
        assert!(ok("https://api.weather.example/v1"));
        assert!(ok("https://API.weather.example./v1"));
        assert!(!ok("http://api.weather.example/v1"), "port 80 is not 443");
        assert!(!ok("https://api.weather.example.evil.example/"));
        assert!(ok("http://127.0.0.1:8080/x"));
        assert!(
            ok("http://2130706433:8080/x"),
            "the address in another spelling"
        );
        assert!(!ok("http://127.0.0.1:8081/x"));
        assert!(
            !ok("http://localhost:8080/x"),
            "a name never matches an address"
        );
        assert!(ok("https://a.corp.example/"));
        assert!(ok("http://a.corp.example/"));
        assert!(!ok("https://a.corp.example:8443/"));
        // Another variable is not bound: under a server it goes nowhere.
        assert!(
            s.check(["OTHER"], &url("https://api.weather.example/"))
                .is_err()
        );
        assert!(
            s.clone()
                .with_unbound_anywhere()
                .check(["OTHER"], &url("https://evil.example/"))
                .is_ok()
        );
        let e = s
            .check(["K"], &url("https://evil.example/"))
            .expect_err("refused");
        assert_eq!(e.code(), "grant.env_host");
        assert!(!e.to_string().contains("evil"), "{e}");
    }

    #[test]
    fn a_variable_bound_to_agents_goes_only_with_their_runs_calls() {
        let s = hosts("K", &["127.0.0.1:8080"])
            .with_agents([("K".to_string(), vec!["weather".to_string()])].into());
        let u = url("http://127.0.0.1:8080/x");
        assert!(s.for_agent(Some("weather")).check(["K"], &u).is_ok());
        for other in [s.for_agent(Some("refunds")), s.for_agent(None), s.clone()] {
            let e = other.check(["K"], &u).expect_err("refused");
            assert_eq!(e.code(), "grant.env_host");
            assert!(e.to_string().contains("weather"), "{e}");
        }
        // The agent's runs still send it only to its hosts.
        let elsewhere = url("http://127.0.0.1:8081/x");
        assert!(
            s.for_agent(Some("weather"))
                .check(["K"], &elsewhere)
                .is_err()
        );
        // The command line (the user is the operator) checks the hosts only.
        let cli = s.clone().with_unbound_anywhere();
        assert!(cli.check(["K"], &u).is_ok());
        assert!(cli.check(["K"], &elsewhere).is_err());
    }

    #[test]
    fn ports_split_from_names_and_addresses() {
        assert_eq!(split_port("h:1"), ("h", Some(1)));
        assert_eq!(split_port("h"), ("h", None));
        assert_eq!(split_port("[::1]:8443"), ("::1", Some(8443)));
        assert_eq!(split_port("::1"), ("::1", None));
        assert_eq!(split_port("10.0.0.0/8"), ("10.0.0.0/8", None));
        let s = hosts("K", &["[::1]:8443", "10.0.0.0/8:80"]);
        assert!(s.check(["K"], &url("http://[::1]:8443/")).is_ok());
        assert!(s.check(["K"], &url("http://10.2.3.4/")).is_ok());
    }
}
