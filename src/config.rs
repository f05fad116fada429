//! The operator's configuration file (`--config FILE`, TOML or JSON, described by
//! `schemas/config.schema.json`): what runs in this process may touch (grants), the MCP servers
//! the operator runs for goals that name them, the agents it publishes by name (with the models
//! a client may pick for them), the approval floor under every run (`[approval]`,
//! [`crate::approval::floor`]), and for `dagloop serve` its principals and the `Host` names it
//! answers to.
//!
//! Relative paths in the file resolve against the file's folder. Unknown keys are refused, so a
//! misspelled grant never silently grants nothing or everything.
//!
//! Deliberately not here: the grant rules (`crate::grants`), checking tokens (the server).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::grants::{Egress, EnvGrant, FileRoots, Grants, SecretHosts};

/// The configuration file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// It could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a valid configuration.
    #[error("config file {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

crate::codes::has_code!(ConfigError);

impl ConfigError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "config.not_found"
            }
            ConfigError::Read { .. } => "config.unreadable",
            ConfigError::Invalid { .. } => "config.invalid",
        }
    }
}

/// What runs may touch, as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsConfig {
    /// Activity kinds goals' tools may use: `http`, `delegate`, `mcp`, `shell`, `rust` (default
    /// `http`, `delegate`, `mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<BTreeSet<String>>,
    /// Goals may define MCP servers of their own (commands to run, URLs to connect to). Default
    /// `false`: goals name the servers of `mcp_servers`.
    #[serde(default)]
    pub goal_mcp_servers: bool,
    /// Environment variables goals may read (`env` in a goal), each a name or `{name, hosts,
    /// agents}` naming where its value may be sent and, optionally, the published agents whose
    /// calls alone may send it. Default: none.
    #[serde(default)]
    pub env: Vec<EnvEntry>,
    /// Where `http` tools may connect. Default: public addresses over http and https.
    #[serde(default)]
    pub egress: Egress,
    /// Folders scripted-model files and delegate goals may be read from. Default: the working
    /// directory of the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<PathBuf>>,
    /// The most bytes of tool results one run keeps in the store, over all its calls (default
    /// 64 MiB); a result over it is kept as a `run.result_bound` failure: its size, SHA-256 and
    /// first 1,024 characters (an `http` response is read no further than the run can keep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_result_bytes: Option<u64>,
}

/// One variable of `grants.env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvEntry {
    /// A name: goals may read it; under `serve` and `worker` its value is sent to no address
    /// (an `http` request carrying it is refused, `grant.env_host`); on the command line, where
    /// the user is the operator, anywhere the egress grant reaches.
    Name(String),
    /// A name and where its value may be sent.
    Bound(EnvBinding),
}

/// `{name, hosts, agents}` in `grants.env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvBinding {
    /// The variable.
    pub name: String,
    /// Where a request may carry its value: `host[:port]`, the host a name, `*.suffix`, an
    /// address or a CIDR range (`crate::grants::secrets`).
    pub hosts: Vec<String>,
    /// The published agents (`[agents.NAME]`) whose runs' calls, delegates' included, alone may
    /// carry its value; any other run's request is refused (`grant.env_host`). Absent: any run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
}

impl EnvEntry {
    /// The variable's name.
    pub fn name(&self) -> &str {
        match self {
            EnvEntry::Name(n) => n,
            EnvEntry::Bound(b) => &b.name,
        }
    }
}

/// How long finished runs are kept (`[store]`): ages as `30d`, `12h`, `45m`, `10s`. `dagloop
/// serve` applies it at start and every hour; `dagloop runs prune` applies it once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Finished runs not updated for this long are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<String>,
    /// Finished runs not updated for this long are compacted to their result, decisions and a
    /// final snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_after: Option<String>,
}

impl StoreConfig {
    /// The policy, its ages read (`retain`, `compact_after`: the field that is not an age).
    pub fn retention(
        &self,
    ) -> Result<crate::store::Retention, (&'static str, crate::duration::AgeError)> {
        let age = |field: &'static str, v: &Option<String>| {
            v.as_deref()
                .map(crate::duration::age_ms)
                .transpose()
                .map_err(|e| (field, e))
        };
        Ok(crate::store::Retention {
            retain_ms: age("retain", &self.retain)?,
            compact_after_ms: age("compact_after", &self.compact_after)?,
        })
    }
}

/// `dagloop serve`: what one principal may hold on the server (`[limits]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// The most active (not ended: running, waiting or stopped) runs one principal may have;
    /// one more is refused with 429 `server.too_many_runs` (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_runs: Option<usize>,
}

/// An agent the operator publishes: a goal file clients start by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// The goal file.
    pub goal: PathBuf,
    /// A note for clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The model specs a client may ask for (`"model"` of `POST /runs`) besides the goal's own;
    /// any other is refused (`server.agent_model`). Default: none (the goal's model only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// The agent's floor: an approval policy as in a goal (`{policy, allow, rules, timeout_s,
    /// default_decision}`), over and above the agent goal's own policy, which is the
    /// operator's too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Value>,
}

/// What a floor layer says of a tool kind's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KindFloor {
    /// A reviewer is asked about every call of the kind.
    Ask,
    /// Every call of the kind is refused.
    Deny,
}

/// The operator's approval floor (`[approval]`): the server-wide policy (`policy`, `allow`,
/// `rules`, as in a goal), the floor per tool kind, how long a floor-asked call waits, and
/// separation of duties. The floor per MCP tool is the `approval` map of each operator MCP
/// server (its `always` entries); the floor per agent, `[agents.NAME] approval`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalConfig {
    /// `auto` (no server-wide layer, the default), `allowlist` or `ask`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::approval::ModeName>,
    /// With `allowlist`: the tools that need no reviewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<BTreeSet<String>>,
    /// Rules as in a goal's `approval.rules`; their `ask` and `deny` are the floor's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Value>,
    /// How long a reviewer may take on a call the floor asks about (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// What applies to such a call then: `reject` (default) or `approve` (only when the goal
    /// also approves by default; never earlier than `timeout_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_decision: Option<crate::approval::DefaultDecision>,
    /// Per tool kind (`http`, `mcp`, `shell`, `delegate`, `rust`): `ask` or `deny`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, KindFloor>,
    /// `dagloop serve`: a principal may not decide (nor approve ahead) calls of runs it submitted
    /// (`approval.own_run`, 403). Default false.
    #[serde(default)]
    pub separate_duties: bool,
}

/// The operator's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The JSON Schema the file declares itself against (ignored).
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<String>,
    /// What runs may touch.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// MCP servers by name (each a stdio `command` or an HTTP `url`, as in a goal's
    /// `mcp_servers` without `name`).
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, Value>,
    /// Agents published by name (`POST /runs {"agent": NAME, "input": {...}}`).
    #[serde(default)]
    pub agents: BTreeMap<String, AgentEntry>,
    /// `dagloop serve`: principals (name, SHA-256 of the token, roles).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<Value>,
    /// `dagloop serve`: extra names the `Host` header may carry (besides loopback names and the
    /// listening address).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Notifications (`notify.webhook = {url, ...}`): where `approval_requested` is posted.
    #[serde(default, skip_serializing_if = "is_default_notify")]
    pub notify: crate::notify::NotifyConfig,
    /// Retention of finished runs (`[store] retain`, `compact_after`).
    #[serde(default, skip_serializing_if = "is_default_store")]
    pub store: StoreConfig,
    /// The approval floor under every run (`[approval]`).
    #[serde(default, skip_serializing_if = "is_default_approval")]
    pub approval: ApprovalConfig,
    /// `dagloop serve`: per-principal limits (`[limits] active_runs`).
    #[serde(default, skip_serializing_if = "is_default_limits")]
    pub limits: LimitsConfig,
    /// Workspace memory for goals that name none (`[memory] path = "notes"`, relative to this
    /// file's folder; docs/memory.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::context::memory::MemorySource>,
    /// The folder relative paths resolve against (the file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn is_default_approval(a: &ApprovalConfig) -> bool {
    *a == ApprovalConfig::default()
}

fn is_default_limits(l: &LimitsConfig) -> bool {
    *l == LimitsConfig::default()
}

fn is_default_store(s: &StoreConfig) -> bool {
    *s == StoreConfig::default()
}

fn is_default_notify(n: &crate::notify::NotifyConfig) -> bool {
    *n == crate::notify::NotifyConfig::default()
}

impl Config {
    /// Reads a configuration file: TOML, or JSON when the name ends in `.json`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let json = path.extension().is_some_and(|e| e == "json");
        let value: Value = if json {
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| invalid(e.to_string()))?
        };
        let violations = crate::schema::published::Document::Config
            .validate(&value)
            .map_err(|e| invalid(e.to_string()))?;
        if let Some(v) = violations.first() {
            return Err(invalid(v.to_string()));
        }
        let mut config: Config =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        config.base_dir = abs.parent().map(Path::to_path_buf).unwrap_or_default();
        if let Some(w) = &config.notify.webhook {
            w.check()
                .map_err(|e| invalid(format!("{} [{}]", e, e.code())))?;
        }
        config
            .store
            .retention()
            .map_err(|(field, e)| invalid(format!("store.{field}: {e}")))?;
        config.grants(Path::new(".")).map_err(|e| match e {
            ConfigError::Invalid { reason, .. } => invalid(reason),
            other => other,
        })?;
        config.floor().map_err(invalid)?;
        Ok(config)
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The grants this configuration gives; `cwd` is the default file root.
    pub fn grants(&self, cwd: &Path) -> Result<Grants, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            path: self.base_dir.clone(),
            reason,
        };
        let g = &self.grants;
        let kinds: BTreeSet<String> = match &g.tools {
            Some(t) => t.clone(),
            None => ["delegate", "http", "mcp"]
                .into_iter()
                .map(String::from)
                .collect(),
        };
        for k in &kinds {
            if !(crate::protocol::KINDS.contains(&k.as_str()) || k == crate::grants::MCP) {
                return Err(invalid(format!(
                    "grants.tools: unknown kind `{k}` (delegate, http, mcp, rust, shell)"
                )));
            }
        }
        let files = match &g.files {
            Some(dirs) => {
                let dirs: Vec<PathBuf> = dirs.iter().map(|d| self.resolve(d)).collect();
                FileRoots::under(&dirs, &self.base_dir)
                    .map_err(|e| invalid(format!("grants.files: {e}")))?
            }
            None => FileRoots::under(&[cwd.to_path_buf()], cwd).map_err(invalid)?,
        };
        #[cfg(feature = "mcp")]
        let mcp_servers = {
            let mut servers = BTreeMap::new();
            for (name, v) in &self.mcp_servers {
                let mut v = v.clone();
                if let Some(m) = v.as_object_mut() {
                    m.insert("name".into(), Value::String(name.clone()));
                }
                let s = crate::protocol::McpServerConfig::from_value(v)
                    .map_err(|e| invalid(format!("mcp_servers.{name}: {e}")))?;
                if matches!(s, crate::protocol::McpServerConfig::Named(_)) {
                    return Err(invalid(format!(
                        "mcp_servers.{name}: give a `command` (stdio) or a `url` (HTTP)"
                    )));
                }
                servers.insert(name.clone(), s);
            }
            servers
        };
        #[cfg(not(feature = "mcp"))]
        if !self.mcp_servers.is_empty() {
            return Err(invalid(
                "mcp_servers: this dagloop was built without the `mcp` feature".into(),
            ));
        }
        let mut names = BTreeSet::new();
        let mut bound = BTreeMap::new();
        let mut by_agent = BTreeMap::new();
        for e in &g.env {
            if !names.insert(e.name().to_string()) {
                return Err(invalid(format!("grants.env: `{}` is listed twice", e.name())));
            }
            if let EnvEntry::Bound(b) = e {
                bound.insert(b.name.clone(), b.hosts.clone());
                if let Some(agents) = &b.agents {
                    if let Some(unknown) = agents.iter().find(|a| !self.agents.contains_key(*a)) {
                        return Err(invalid(format!(
                            "grants.env: `{}` is granted to agent `{unknown}`, which `agents` does not publish",
                            b.name
                        )));
                    }
                    by_agent.insert(b.name.clone(), agents.clone());
                }
            }
        }
        Ok(Grants {
            kinds: Some(kinds),
            goal_mcp_servers: g.goal_mcp_servers,
            #[cfg(feature = "mcp")]
            mcp_servers,
            env: EnvGrant::Only(names),
            secrets: SecretHosts::bound(bound).with_agents(by_agent),
            egress: g.egress.clone(),
            files,
            kept_result_bytes: g.kept_result_bytes,
            memory: self.memory.clone().map(|mut m| {
                m.path = self.resolve(Path::new(&m.path)).display().to_string();
                m
            }),
        })
    }

    /// The goal file of a published agent (absolute).
    pub fn agent_goal(&self, name: &str) -> Option<PathBuf> {
        self.agents.get(name).map(|a| self.resolve(&a.goal))
    }

    /// The approval floor this configuration sets (`[approval]`, `[agents.NAME] approval`,
    /// the `always` entries of its MCP servers' `approval` maps), or what is wrong with it.
    pub fn floor(&self) -> Result<crate::approval::OperatorFloor, String> {
        use crate::approval::{ModeName, OperatorFloor, Policy, RuleDecision};
        use crate::protocol::ToolApproval;
        let a = &self.approval;
        let policy = |at: &str, v: Value| {
            Policy::from_value(&v).map_err(|e| format!("{at}: {e} [{}]", e.code()))
        };
        let mut server = serde_json::Map::new();
        if let Some(p) = a.policy {
            server.insert("policy".into(), Value::String(p.as_str().into()));
        }
        if let Some(allow) = &a.allow {
            server.insert("allow".into(), serde_json::json!(allow));
        }
        if !a.rules.is_empty() {
            server.insert("rules".into(), Value::Array(a.rules.clone()));
        }
        if let Some(t) = a.timeout_s {
            server.insert("timeout_s".into(), serde_json::json!(t));
        }
        if let Some(d) = a.default_decision {
            server.insert("default_decision".into(), serde_json::json!(d));
        }
        let whole = policy("approval", Value::Object(server))?;
        let timeout = whole.timeout;
        let has_layer = a.policy.is_some_and(|p| p != ModeName::Auto) || !a.rules.is_empty();
        let mut agents = BTreeMap::new();
        for (name, entry) in &self.agents {
            if let Some(v) = &entry.approval {
                agents.insert(
                    name.clone(),
                    policy(&format!("agents.{name}.approval"), v.clone())?,
                );
            }
        }
        let mut mcp = BTreeMap::new();
        for (name, v) in &self.mcp_servers {
            let always: BTreeSet<String> = v
                .get("approval")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter(|(_, a)| {
                    serde_json::from_value::<ToolApproval>((*a).clone()).ok()
                        == Some(ToolApproval::Always)
                })
                .map(|(tool, _)| tool.clone())
                .collect();
            if !always.is_empty() {
                mcp.insert(name.clone(), always);
            }
        }
        let mut kinds = BTreeMap::new();
        for (kind, d) in &a.kinds {
            if !(crate::protocol::KINDS.contains(&kind.as_str()) || kind == crate::grants::MCP) {
                return Err(format!(
                    "approval.kinds: unknown kind `{kind}` (delegate, http, mcp, rust, shell)"
                ));
            }
            let d = match d {
                KindFloor::Ask => RuleDecision::Ask,
                KindFloor::Deny => RuleDecision::Deny,
            };
            kinds.insert(kind.clone(), d);
        }
        Ok(OperatorFloor {
            default_decision: whole.default_decision,
            server: has_layer.then_some(whole),
            kinds,
            mcp,
            agents,
            timeout,
        })
    }

    /// The models a client may ask for when it starts the published agent `name` (besides the
    /// goal's own).
    pub fn agent_models(&self, name: &str) -> Vec<String> {
        self.agents
            .get(name)
            .map(|a| a.models.clone())
            .unwrap_or_default()
    }
}
