//! MCP server configuration as written in a goal's `mcp_servers` and the operator's config:
//! the values and their checks, part of the protocol so that a goal, the grants and the run's
//! record can hold them without reaching up into `tools`.
//!
//! Deliberately not here: starting or talking to a server (`tools::mcp`), and reading the
//! environment: [`McpServerConfig::expand`] takes the lookup, `tools::mcp` passes the process's
//! environment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::protocol::ToolApproval;

/// A server config that cannot be used, found without starting anything. `tools::mcp::McpError`
/// carries each variant on under the same name and code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum McpConfigError {
    /// The config is unusable (bad name, URL, timeout, header).
    #[error("MCP server `{server}`: {reason}")]
    Config {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// `${VAR}` names a variable the config does not list in `from_env`.
    #[error("MCP server `{server}`: `${{{var}}}` is not listed in `from_env`")]
    EnvNotListed {
        /// The server.
        server: String,
        /// The variable.
        var: String,
    },
    /// A listed variable is not set.
    #[error("MCP server `{server}`: environment variable `{var}` is not set")]
    EnvMissing {
        /// The server.
        server: String,
        /// The variable.
        var: String,
    },
}

crate::codes::has_code!(McpConfigError);

impl McpConfigError {
    /// A stable code (the same as `tools::mcp::McpError`'s for the same failure).
    pub fn code(&self) -> &'static str {
        match self {
            McpConfigError::Config { .. } => "mcp.config",
            McpConfigError::EnvNotListed { .. } => "mcp.env_not_listed",
            McpConfigError::EnvMissing { .. } => "mcp.env_missing",
        }
    }
}

/// One MCP server: a child process speaking stdio, or a streamable HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum McpServerConfig {
    /// `{"name", "command", "args", "env"}`: a child process speaking MCP over stdio.
    Stdio(StdioServer),
    /// `{"name", "url", "headers"}`: a streamable HTTP endpoint.
    Http(HttpServer),
    /// `{"name"}` alone (and optional `approval`): the operator's server of that name
    /// (the operator's grants), the only kind a goal submitted to a server may use by default.
    Named(NamedServer),
}

/// A goal's reference to a server the operator configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedServer {
    /// The operator's name for the server.
    pub name: String,
    /// Approval overrides by MCP tool name, over the operator's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approval: BTreeMap<String, ToolApproval>,
}

/// Fields every server has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdioServer {
    /// The server's name (tool-name prefix on clashes, error messages).
    pub name: String,
    /// The program to run (`${VAR}` allowed, as in `args` and `env` values).
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables; values may be `${VAR}` for a variable listed in `from_env`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Environment variables of dagloop's process that `${VAR}` may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_env: Vec<String>,
    /// Per-call limit in seconds (the MCP request is cancelled); default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Limit for starting and the initialize handshake, in seconds; default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_s: Option<f64>,
    /// Approval overrides by MCP tool name (`"*"` for every tool of this server); they win over
    /// the default taken from the tool's annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approval: BTreeMap<String, ToolApproval>,
}

/// A streamable HTTP server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServer {
    /// The server's name.
    pub name: String,
    /// The endpoint (`http://127.0.0.1:3001/mcp`).
    pub url: String,
    /// Extra request headers; values may be `${VAR}` for a variable listed in `from_env`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Environment variables of dagloop's process that `${VAR}` may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_env: Vec<String>,
    /// Per-call limit in seconds (the MCP request is cancelled); default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Limit for connecting and the initialize handshake, in seconds; default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_s: Option<f64>,
    /// Approval overrides by MCP tool name (`"*"` for every tool of this server).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approval: BTreeMap<String, ToolApproval>,
}

impl McpServerConfig {
    /// Parses one server config with a precise message (an object with `url` is an HTTP server,
    /// any other a stdio server) and [`check`](Self::check)s it.
    pub fn from_value(v: serde_json::Value) -> Result<McpServerConfig, McpConfigError> {
        let server = v
            .get("name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("?")
            .to_string();
        let parsed = if v.get("url").is_some() {
            serde_json::from_value(v).map(McpServerConfig::Http)
        } else if v.get("command").is_none() {
            serde_json::from_value(v).map(McpServerConfig::Named)
        } else {
            serde_json::from_value(v).map(McpServerConfig::Stdio)
        };
        let config = parsed.map_err(|e| McpConfigError::Config {
            server,
            reason: e.to_string(),
        })?;
        config.check()?;
        Ok(config)
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        match self {
            McpServerConfig::Stdio(s) => &s.name,
            McpServerConfig::Http(h) => &h.name,
            McpServerConfig::Named(n) => &n.name,
        }
    }

    /// Renames the server (an operator's server takes the name a goal refers to it by).
    pub fn set_name(&mut self, name: &str) {
        match self {
            McpServerConfig::Stdio(s) => s.name = name.to_string(),
            McpServerConfig::Http(h) => h.name = name.to_string(),
            McpServerConfig::Named(n) => n.name = name.to_string(),
        }
    }

    /// Per-call limit in seconds.
    pub fn call_timeout_s(&self) -> f64 {
        match self {
            McpServerConfig::Stdio(s) => s.timeout_s,
            McpServerConfig::Http(h) => h.timeout_s,
            McpServerConfig::Named(_) => None,
        }
        .unwrap_or(300.0)
    }

    /// Startup limit in seconds.
    pub fn startup_timeout_s(&self) -> f64 {
        match self {
            McpServerConfig::Stdio(s) => s.startup_timeout_s,
            McpServerConfig::Http(h) => h.startup_timeout_s,
            McpServerConfig::Named(_) => None,
        }
        .unwrap_or(30.0)
    }

    /// Approval overrides by MCP tool name.
    pub fn approval_overrides(&self) -> &BTreeMap<String, ToolApproval> {
        match self {
            McpServerConfig::Stdio(s) => &s.approval,
            McpServerConfig::Http(h) => &h.approval,
            McpServerConfig::Named(n) => &n.approval,
        }
    }

    /// Approval overrides by MCP tool name, to change.
    pub fn approval_overrides_mut(&mut self) -> &mut BTreeMap<String, ToolApproval> {
        match self {
            McpServerConfig::Stdio(s) => &mut s.approval,
            McpServerConfig::Http(h) => &mut h.approval,
            McpServerConfig::Named(n) => &mut n.approval,
        }
    }

    /// The environment variables `${VAR}` in this config may read.
    pub fn env_allowed(&self) -> &[String] {
        match self {
            McpServerConfig::Stdio(s) => &s.from_env,
            McpServerConfig::Http(h) => &h.from_env,
            McpServerConfig::Named(_) => &[],
        }
    }

    /// Replaces every `${VAR}` in `value` by what `lookup` says of it (the process's
    /// environment, for `tools::mcp`), refusing variables the config does not list in
    /// `from_env` and listed ones that are unset.
    pub fn expand(
        &self,
        value: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<String, McpConfigError> {
        expand_with(self.name(), value, self.env_allowed(), lookup)
    }

    /// Checks what can be checked without starting anything.
    pub fn check(&self) -> Result<(), McpConfigError> {
        let name = self.name();
        let bad = |reason: String| McpConfigError::Config {
            server: name.to_string(),
            reason,
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad(format!(
                "server name `{name}` must be non-empty ASCII letters, digits, `-` or `_`"
            )));
        }
        for t in [self.call_timeout_s(), self.startup_timeout_s()] {
            if !(t.is_finite() && t > 0.0) {
                return Err(bad(format!("timeouts must be positive seconds, got {t}")));
            }
        }
        match self {
            McpServerConfig::Stdio(s) if s.command.trim().is_empty() => {
                Err(bad("`command` is empty".into()))
            }
            McpServerConfig::Http(h)
                if !(h.url.starts_with("http://") || h.url.starts_with("https://")) =>
            {
                Err(bad(format!("`url` must be http(s), got `{}`", h.url)))
            }
            McpServerConfig::Http(h) => match h
                .headers
                .keys()
                .find(|k| RESERVED_HEADERS.iter().any(|r| k.eq_ignore_ascii_case(r)))
            {
                Some(k) => Err(bad(format!(
                    "header `{k}` is set by the MCP transport itself"
                ))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// Headers the streamable HTTP transport sets itself.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

fn expand_with(
    server: &str,
    value: &str,
    allowed: &[String],
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, McpConfigError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(open) = rest.find("${") {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let var = &rest[open + 2..open + close];
        out.push_str(&rest[..open]);
        if !allowed.iter().any(|a| a == var) {
            return Err(McpConfigError::EnvNotListed {
                server: server.to_string(),
                var: var.to_string(),
            });
        }
        let v = lookup(var).ok_or_else(|| McpConfigError::EnvMissing {
            server: server.to_string(),
            var: var.to_string(),
        })?;
        out.push_str(&v);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_parse_by_shape_and_refuse_unknown_fields() {
        let s: McpServerConfig = serde_json::from_value(serde_json::json!(
            {"name": "fs", "command": "npx", "args": ["-y", "x"], "env": {"A": "1"}}
        ))
        .unwrap();
        assert!(matches!(s, McpServerConfig::Stdio(_)));
        let h: McpServerConfig = serde_json::from_value(serde_json::json!(
            {"name": "web", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer ${T}"}, "from_env": ["T"]}
        ))
        .unwrap();
        assert!(matches!(h, McpServerConfig::Http(_)));
        let bad = serde_json::from_value::<McpServerConfig>(
            serde_json::json!({"name": "x", "command": "y", "colour": "red"}),
        );
        assert!(bad.is_err());
        let e = McpServerConfig::from_value(
            serde_json::json!({"name": "x", "command": "y", "colour": "red"}),
        )
        .unwrap_err();
        assert_eq!(e.code(), "mcp.config");
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn transport_headers_and_bad_urls_are_refused() {
        let h = |url: &str, header: &str| {
            McpServerConfig::Http(HttpServer {
                name: "web".into(),
                url: url.into(),
                headers: [(header.to_string(), "x".to_string())].into(),
                ..HttpServer::default()
            })
        };
        assert!(h("http://127.0.0.1:1/mcp", "Authorization").check().is_ok());
        let e = h("http://127.0.0.1:1/mcp", "Mcp-Session-Id").check();
        assert_eq!(e.map_err(|e| e.code()), Err("mcp.config"));
        let e = h("ftp://x", "A").check();
        assert_eq!(e.map_err(|e| e.code()), Err("mcp.config"));
        // The MCP client shares dagloop's TLS set-up (`crate::net`), so https is accepted.
        assert!(h("https://mcp.example.com/mcp", "A").check().is_ok());
    }

    #[test]
    fn variables_expand_only_when_listed_and_set() {
        let allowed = vec!["TOKEN".to_string()];
        let look = |k: &str| (k == "TOKEN").then(|| "s3cret".to_string());
        assert_eq!(
            expand_with("w", "Bearer ${TOKEN}!", &allowed, look).unwrap(),
            "Bearer s3cret!"
        );
        let e = expand_with("w", "${HOME}", &allowed, look).unwrap_err();
        assert_eq!(e.code(), "mcp.env_not_listed");
        let e = expand_with("w", "${TOKEN}", &allowed, |_| None).unwrap_err();
        assert_eq!(e.code(), "mcp.env_missing");
        assert_eq!(expand_with("w", "plain", &[], look).unwrap(), "plain");
    }
}
