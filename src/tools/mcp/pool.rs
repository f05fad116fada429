//! MCP servers shared by the runs of one process (`dagloop serve`).
//!
//! A server is keyed by what makes its process (name, command or URL, arguments, environment,
//! headers, timeouts) as canonical JSON, not by a run's approval map (each run's tools carry its
//! own): the first run whose goal names it starts it, later runs with the same definition use
//! the same process or connection, whatever their approval maps, and it stays up between runs. A server that died is restarted by the next call, as for a single run.
//!
//! Deliberately not here: stopping idle servers or bounding how many run; the pool lives as long
//! as the process and [`McpPool::shutdown`] stops everything it started.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::McpServerConfig;
use super::server::Server;

/// Servers by configuration, shared by every run that is started with the pool.
#[derive(Clone, Default)]
pub struct McpPool {
    servers: Arc<Mutex<BTreeMap<String, Arc<Server>>>>,
}

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPool")
            .field("servers", &self.len())
            .finish()
    }
}

impl McpPool {
    /// An empty pool.
    pub fn new() -> McpPool {
        McpPool::default()
    }

    /// How many server configurations the pool holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no server was started through the pool yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pool's server for `config`, made with `make` the first time.
    pub(super) fn get_or_insert(
        &self,
        config: &McpServerConfig,
        make: impl FnOnce() -> Arc<Server>,
    ) -> Arc<Server> {
        // A run's approval map says how its calls are gated, not which process serves them:
        // runs with different maps share one server.
        let mut process = config.clone();
        process.approval_overrides_mut().clear();
        let key = crate::protocol::canonical(&serde_json::to_value(&process).unwrap_or_default())
            .to_string();
        self.lock().entry(key).or_insert_with(make).clone()
    }

    /// Stops every server the pool started and empties it.
    pub async fn shutdown(&self) {
        let servers: Vec<Arc<Server>> = std::mem::take(&mut *self.lock()).into_values().collect();
        for s in servers {
            s.shutdown().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Server>>> {
        match self.servers.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}
