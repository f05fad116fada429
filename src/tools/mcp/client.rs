//! The MCP servers of one goal, started together: names checked, servers started (or taken from
//! an [`McpPool`]), their tools listed and named (prefixed where two clash), and each tool's
//! activity. One server's connection is `server.rs`; the goal that lists the servers is not
//! known here (its callers pass the configurations and the names to keep clear of).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::protocol::Tool;
use crate::tools::{Activity, ActivityError, ProgressSink};
use serde_json::{Map, Value};

use super::mapping::to_tool;
use super::pool::McpPool;
use super::server::{McpActivity, ProgressFn, Server};
use super::{McpError, McpServerConfig, final_names};

/// Running MCP servers and the tools they offer. Dropping it stops the servers too.
pub struct McpServers {
    servers: Vec<Arc<Server>>,
    tools: Vec<(Tool, Arc<dyn Activity>)>,
    /// The servers belong to an [`McpPool`], which stops them.
    pooled: bool,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServers")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(|s| s.config.name())
                    .collect::<Vec<_>>(),
            )
            .field(
                "tools",
                &self.tools.iter().map(|(t, _)| &t.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl McpServers {
    /// Starts every server, performs the handshake and lists its tools. Tool names are
    /// prefixed only when two servers list the same name.
    pub async fn start(configs: &[McpServerConfig]) -> Result<McpServers, McpError> {
        McpServers::start_with(configs, &[], None).await
    }

    /// [`McpServers::start`], also prefixing MCP tools whose names are in `reserved` (the
    /// goal's own tools) and sending progress notifications to `progress`.
    pub async fn start_with(
        configs: &[McpServerConfig],
        reserved: &[String],
        progress: Option<ProgressFn>,
    ) -> Result<McpServers, McpError> {
        McpServers::start_in(configs, reserved, progress, None).await
    }

    /// [`McpServers::start_with`], taking servers from `pool` (and leaving new ones there)
    /// when one is given: a server whose configuration the pool already runs is not started
    /// again, and it keeps running after these [`McpServers`] are dropped or shut down.
    pub async fn start_in(
        configs: &[McpServerConfig],
        reserved: &[String],
        progress: Option<ProgressFn>,
        pool: Option<&McpPool>,
    ) -> Result<McpServers, McpError> {
        let mut seen = BTreeMap::new();
        for c in configs {
            c.check()?;
            if seen.insert(c.name().to_string(), ()).is_some() {
                return Err(McpError::DuplicateServer {
                    server: c.name().to_string(),
                });
            }
        }
        let servers: Vec<Arc<Server>> = configs
            .iter()
            .map(|c| match pool {
                // A shared server has no run-wide progress function: each call's progress
                // still reaches that call's own sink.
                Some(pool) => pool.get_or_insert(c, || Server::new(c, None)),
                None => Server::new(c, progress.clone()),
            })
            .collect();
        let mut out = McpServers {
            servers,
            tools: Vec::new(),
            pooled: pool.is_some(),
        };
        // Start every server at once; report the first failure in config order.
        let listed = futures::future::join_all(out.servers.iter().map(|s| s.list_tools())).await;
        // Each tool is described with this run's configuration (its approval map): a pooled
        // server may have been started for another run's.
        let mut all = Vec::new();
        for ((server, config), tools) in out.servers.iter().zip(configs).zip(listed) {
            for t in tools? {
                all.push((server.clone(), config, t));
            }
        }
        let pairs: Vec<(String, String)> = all
            .iter()
            .map(|(s, _, t)| (s.config.name().to_string(), t.name.to_string()))
            .collect();
        let names = final_names(&pairs, reserved);
        let mut taken: Vec<&String> = reserved.iter().collect();
        for (name, (server, config, t)) in names.iter().zip(&all) {
            if taken.contains(&name) {
                return Err(McpError::ToolClash {
                    server: server.config.name().to_string(),
                    tool: name.clone(),
                });
            }
            taken.push(name);
            let activity: Arc<dyn Activity> = Arc::new(McpActivity {
                server: server.clone(),
                tool: t.name.to_string(),
            });
            out.tools.push((to_tool(name, config, t), activity));
        }
        Ok(out)
    }

    /// Calls a tool of a server directly, by its MCP name (what every tool's activity does).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        args: Map<String, Value>,
    ) -> Result<Value, ActivityError> {
        match self.servers.iter().find(|s| s.config.name() == server) {
            Some(s) => s.call(tool, args, ProgressSink::none()).await,
            None => Err(ActivityError::Unknown {
                tool: tool.to_string(),
                activity: format!("mcp server `{server}`"),
            }),
        }
    }

    /// Every tool with the activity that calls it.
    pub fn tools(&self) -> Vec<(Tool, Arc<dyn Activity>)> {
        self.tools.clone()
    }

    /// Stops every server cleanly (stdio servers: their stdin is closed and the process is
    /// killed if it does not exit). Dropping [`McpServers`] stops them too, without waiting.
    /// Servers taken from an [`McpPool`] are left running: the pool stops them.
    pub async fn shutdown(self) {
        let servers = if self.pooled {
            Vec::new()
        } else {
            self.servers.clone()
        };
        drop(self);
        for s in servers {
            s.shutdown().await;
        }
    }
}
