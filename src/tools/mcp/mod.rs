//! Tools from MCP servers: each tool a Model Context Protocol server lists becomes a dagloop
//! [`Tool`] backed by an [`Activity`](crate::tools::Activity) that calls `tools/call` (client side of the official Rust
//! SDK, `rmcp`; cargo feature `mcp`, on by default).
//!
//! What it does:
//! - reads server configs from a goal's `mcp_servers` ([`McpServerConfig`]: stdio `command`/`args`/
//!   `env`, or streamable HTTP `url`/`headers`; `${VAR}` in command, args, env and header values
//!   only from variables listed in `from_env`);
//! - [`McpServers::start`] connects to every server, initialises, lists tools and fails with a
//!   coded [`McpError`] naming the server before anything runs (missing command, garbage on
//!   stdout, no handshake within `startup_timeout_s`);
//! - names: a tool keeps its MCP name unless another server or a goal tool has the same name,
//!   then it is `server__tool` ([`SEPARATOR`]); `description` and `inputSchema` become the tool's
//!   description and params schema; MCP `annotations` are kept under `annotations`;
//! - results: `structuredContent` when present, else the text blocks joined with `\n` (parsed when
//!   the joined text is a JSON object or array, else kept as a string), else the raw content array;
//!   `isError: true` is [`ActivityError::Failed`](crate::tools::ActivityError::Failed) with the same value in `details.result`;
//! - progress notifications (`notifications/progress`, matched to the call by its progress token)
//!   go to the calling activity's [`ProgressSink`](crate::tools::ProgressSink) (a run publishes
//!   them as `call_progress` events) and to an optional [`ProgressFn`] for all servers; a call that exceeds the server's
//!   `timeout_s` is cancelled on the server (`notifications/cancelled`) and fails as
//!   [`ActivityError::Timeout`](crate::tools::ActivityError::Timeout);
//! - a server that dies mid-run fails the call in flight; the next call restarts it;
//! - one process running many runs (`dagloop serve`) shares servers through an [`McpPool`]: a
//!   server is started once per configuration and kept for the runs after it;
//! - approval defaults: `destructiveHint: true` gives `_approval: "always"` unless the config's
//!   `approval` map says otherwise; [`is_read_only`] lets an allowlist admit tools by annotation.
//!
//! What it does not do: resources, prompts, sampling, elicitation, roots, OAuth, the legacy SSE
//! transport, or re-listing tools when a server says its list changed.

#[cfg(feature = "mcp")]
mod client;
#[cfg(feature = "mcp")]
mod mapping;
#[cfg(feature = "mcp")]
mod pool;
#[cfg(feature = "mcp")]
mod server;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::protocol::{Tool, ToolApproval};

pub use crate::protocol::mcp_server::{
    HttpServer, McpConfigError, McpServerConfig, NamedServer, StdioServer,
};

#[cfg(feature = "mcp")]
pub use client::McpServers;
#[cfg(feature = "mcp")]
pub use pool::McpPool;
#[cfg(feature = "mcp")]
pub use server::{ProgressFn, ProgressUpdate};

/// Joins a server name and a tool name when tool names clash: `files__read_file`.
pub const SEPARATOR: &str = "__";

/// Why MCP servers could not be used. Every variant names the server.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpError {
    /// The config is unusable (bad name, URL, timeout, header).
    #[error("MCP server `{server}`: {reason}")]
    Config {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// Two servers have the same name.
    #[error("two MCP servers are named `{server}`")]
    DuplicateServer {
        /// The server.
        server: String,
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
    /// The server's process could not be started.
    #[error("MCP server `{server}`: cannot start `{command}`: {reason}")]
    SpawnFailed {
        /// The server.
        server: String,
        /// The command.
        command: String,
        /// The OS error.
        reason: String,
    },
    /// The initialize handshake failed (the process exited, printed something that is not MCP,
    /// or the HTTP endpoint refused).
    #[error("MCP server `{server}`: initialize handshake failed: {reason}")]
    Handshake {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// No handshake or answer within the limit.
    #[error("MCP server `{server}`: no answer within {seconds}s ({during})")]
    Timeout {
        /// The server.
        server: String,
        /// The limit.
        seconds: f64,
        /// What was waited for.
        during: String,
    },
    /// `tools/list` failed.
    #[error("MCP server `{server}`: listing tools failed: {reason}")]
    ListTools {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// The same final tool name would be produced twice.
    #[error("MCP server `{server}`: tool name `{tool}` clashes even with the server prefix")]
    ToolClash {
        /// The server.
        server: String,
        /// The clashing name.
        tool: String,
    },
}

crate::codes::has_code!(McpError);

impl From<McpConfigError> for McpError {
    fn from(e: McpConfigError) -> Self {
        match e {
            McpConfigError::Config { server, reason } => McpError::Config { server, reason },
            McpConfigError::EnvNotListed { server, var } => McpError::EnvNotListed { server, var },
            McpConfigError::EnvMissing { server, var } => McpError::EnvMissing { server, var },
        }
    }
}

/// A config's `${VAR}` values filled from this process's environment (only the variables the
/// config lists in `from_env`; see [`McpServerConfig::expand`]).
pub fn expand_env(config: &McpServerConfig, value: &str) -> Result<String, McpError> {
    Ok(config.expand(value, |k| std::env::var(k).ok())?)
}

impl McpError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Config { .. } => "mcp.config",
            McpError::DuplicateServer { .. } => "mcp.duplicate_server",
            McpError::EnvNotListed { .. } => "mcp.env_not_listed",
            McpError::EnvMissing { .. } => "mcp.env_missing",
            McpError::SpawnFailed { .. } => "mcp.spawn_failed",
            McpError::Handshake { .. } => "mcp.handshake",
            McpError::Timeout { .. } => "mcp.timeout",
            McpError::ListTools { .. } => "mcp.list_tools",
            McpError::ToolClash { .. } => "mcp.tool_clash",
        }
    }

    /// The server the error is about.
    pub fn server(&self) -> &str {
        match self {
            McpError::Config { server, .. }
            | McpError::DuplicateServer { server }
            | McpError::EnvNotListed { server, .. }
            | McpError::EnvMissing { server, .. }
            | McpError::SpawnFailed { server, .. }
            | McpError::Handshake { server, .. }
            | McpError::Timeout { server, .. }
            | McpError::ListTools { server, .. }
            | McpError::ToolClash { server, .. } => server,
        }
    }
}

/// The MCP `annotations` a tool carries (`readOnlyHint`, `destructiveHint`...), if any.
pub fn annotations(tool: &Tool) -> Option<&serde_json::Map<String, Value>> {
    tool.schema.get("annotations").and_then(Value::as_object)
}

/// True when the tool's MCP annotations say `readOnlyHint: true`. A pure function the approval
/// side can use to allowlist read-only tools by annotation (hints come from the server: trust
/// them only as far as you trust the server).
pub fn is_read_only(tool: &Tool) -> bool {
    annotations(tool)
        .and_then(|a| a.get("readOnlyHint"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// True when the tool's MCP annotations say `destructiveHint: true`.
pub fn is_destructive(tool: &Tool) -> bool {
    annotations(tool)
        .and_then(|a| a.get("destructiveHint"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// The `_approval` an MCP tool gets: the config's override for the tool (then for `"*"`), else
/// `always` for destructive tools, else none (the run's policy decides).
pub fn default_approval(
    mcp_name: &str,
    annotations: Option<&serde_json::Map<String, Value>>,
    overrides: &BTreeMap<String, ToolApproval>,
) -> Option<ToolApproval> {
    if let Some(a) = overrides.get(mcp_name).or_else(|| overrides.get("*")) {
        return Some(*a);
    }
    let destructive = annotations
        .and_then(|a| a.get("destructiveHint"))
        .and_then(Value::as_bool);
    (destructive == Some(true)).then_some(ToolApproval::Always)
}

/// Final tool names: `(server, tool)` pairs in order, prefixed `server__tool` only when the
/// tool name is also listed by another server or is in `reserved` (the goal's own tools).
pub fn final_names(listed: &[(String, String)], reserved: &[String]) -> Vec<String> {
    listed
        .iter()
        .map(|(server, tool)| {
            let clash = reserved.iter().any(|r| r == tool)
                || listed.iter().any(|(s, t)| t == tool && s != server);
            if clash {
                format!("{server}{SEPARATOR}{tool}")
            } else {
                tool.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_prefixed_only_on_clashes() {
        let listed = vec![
            ("a".to_string(), "read".to_string()),
            ("b".to_string(), "read".to_string()),
            ("a".to_string(), "echo".to_string()),
            ("b".to_string(), "plan".to_string()),
        ];
        assert_eq!(
            final_names(&listed, &["plan".to_string()]),
            vec!["a__read", "b__read", "echo", "b__plan"]
        );
    }

    #[test]
    fn destructive_tools_ask_unless_overridden_and_read_only_is_visible() {
        let ann = json!({"destructiveHint": true});
        let ann = ann.as_object();
        let mut over = BTreeMap::new();
        assert_eq!(
            default_approval("rm", ann, &over),
            Some(ToolApproval::Always)
        );
        assert_eq!(default_approval("ls", None, &over), None);
        over.insert("*".to_string(), ToolApproval::Never);
        assert_eq!(
            default_approval("rm", ann, &over),
            Some(ToolApproval::Never)
        );
        over.insert("rm".to_string(), ToolApproval::Always);
        assert_eq!(
            default_approval("rm", ann, &over),
            Some(ToolApproval::Always)
        );

        let mut t = Tool::new("ls");
        assert!(!is_read_only(&t));
        t.schema
            .insert("annotations".into(), json!({"readOnlyHint": true}));
        assert!(is_read_only(&t));
        assert!(!is_destructive(&t));
    }

    #[test]
    fn codes_are_stable_and_name_the_server() {
        let e = McpError::SpawnFailed {
            server: "fs".into(),
            command: "nope".into(),
            reason: "not found".into(),
        };
        assert_eq!(e.code(), "mcp.spawn_failed");
        assert_eq!(e.server(), "fs");
        assert!(e.to_string().contains("`fs`"));
    }
}
