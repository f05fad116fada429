//! `dagloop [--config FILE] policy explain [GOAL] --call JSON [--agent NAME] [--server NAME]`:
//! which rule decides a call and which layer it belongs to (the operator's floor: server-wide,
//! agent, MCP tool, tool kind; or the goal, or the client's `--approve`), and why, evaluated by
//! the same code the scheduler runs (`approval::explain`) on the policy a run would get
//! (`runs::policy_for`, with the floor the config sets).
//!
//! Deliberately not here: starting MCP servers to learn their tools' annotations (a call to an
//! MCP tool is explained as the tool of `--server`, or of the goal's only MCP server, with the
//! approval maps of the goal and the config, and no annotations).

use std::path::Path as FsPath;

use serde_json::{Value, json};

use super::{CliError, pretty};
use crate::approval::ModeName;
use crate::goal::Goal;
use crate::protocol::{Call, Tool};

/// What `policy explain` was asked.
pub(super) struct ExplainArgs<'a> {
    /// The goal file (else the agent's, from the config).
    pub goal: Option<&'a FsPath>,
    /// The call, as JSON.
    pub call: &'a str,
    /// The client's `approve`.
    pub approve: Option<ModeName>,
    /// Explain it as a run of this published agent.
    pub agent: Option<&'a str>,
    /// The MCP server the call's tool belongs to.
    pub server: Option<&'a str>,
    /// Print JSON.
    pub json: bool,
}

/// Prints the deciding rule and its layer (exit 0), or the error with its code.
pub(super) fn explain(
    config: Option<&crate::config::Config>,
    a: ExplainArgs<'_>,
) -> Result<i32, CliError> {
    let path = match (a.goal, a.agent) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(name)) => config.and_then(|c| c.agent_goal(name)).ok_or_else(|| {
            CliError::new(
                "server.unknown_agent",
                format!("no agent named `{name}` is published by the config (give --config)"),
            )
        })?,
        (None, None) => {
            return Err(CliError::new(
                "cli.usage",
                "give the goal file, or --agent NAME with --config",
            ));
        }
    };
    let goal = Goal::load(&path).map_err(|e| CliError::new(e.code(), &e))?;
    let value: Value = serde_json::from_str(a.call)
        .map_err(|e| CliError::new("cli.bad_call", format!("--call is not JSON: {e}")))?;
    let call = Call::parse(value).map_err(|e| CliError::new(e.code(), format!("--call: {e}")))?;
    let floor = match config {
        Some(c) => c.floor().map_err(|e| CliError::new("config.invalid", e))?,
        None => Default::default(),
    };
    let options = crate::runs::RunOptions {
        approve: a.approve,
        floor: floor.for_run(a.agent.map(|name| (name, goal.approval.as_ref()))),
        ..Default::default()
    };
    let policy = crate::runs::policy_for(&goal, &options);
    let tool = match goal.tools.iter().find(|t| t.name == call.tool) {
        Some(t) => t.clone(),
        None => mcp_tool(config, &goal, &call.tool, a.server)?,
    };
    let mut e = crate::approval::explain(&tool, &call, &policy);
    // The goal's mode, replaced by `--approve`, is the client's say.
    if e.layer == "goal" && a.approve.is_some() && e.rule.starts_with("policy:") {
        e.layer = "client".into();
    }
    if a.json {
        outln!("{}", pretty(&json!(e)));
        return Ok(0);
    }
    for s in &e.skipped {
        outln!("  skipped {}: {}", s.rule, s.why);
    }
    outln!(
        "{} by {} ({}): {}",
        e.decision.as_str(),
        e.rule,
        e.layer,
        e.reason
    );
    if let Some(g) = &e.goal {
        outln!("  the goal alone: {g}");
    }
    Ok(0)
}

/// The tool a call names that the goal does not define: a tool of the MCP server `server` (or
/// of the goal's only MCP server), with the approval the goal's and the operator's maps give it;
/// else a tool without annotations.
#[cfg(feature = "mcp")]
fn mcp_tool(
    config: Option<&crate::config::Config>,
    goal: &Goal,
    name: &str,
    server: Option<&str>,
) -> Result<Tool, CliError> {
    let server = match (server, goal.mcp_servers.as_slice()) {
        (Some(s), _) => s.to_string(),
        (None, [one]) => one.name().to_string(),
        _ => return Ok(Tool::new(name)),
    };
    let cwd = std::env::current_dir().unwrap_or_default();
    let grants = match config {
        Some(c) => c.grants(&cwd).map_err(|e| CliError::new(e.code(), e))?,
        None => crate::grants::Grants::cli(false),
    };
    let mut resolved = goal.clone();
    // The goal's own maps over the operator's, as a run resolves them.
    if crate::runs::resolve_mcp(&grants, &mut resolved).is_err() {
        resolved = goal.clone();
    }
    let overrides = resolved
        .mcp_servers
        .iter()
        .find(|s| s.name() == server)
        .map(|s| s.approval_overrides().clone())
        .unwrap_or_default();
    let mut t = Tool::new(name);
    t.activity = Some("mcp".into());
    t.approval = crate::tools::mcp::default_approval(name, None, &overrides);
    t.schema
        .insert("_mcp".into(), json!({"server": server, "tool": name}));
    Ok(t)
}

#[cfg(not(feature = "mcp"))]
fn mcp_tool(
    _config: Option<&crate::config::Config>,
    _goal: &Goal,
    name: &str,
    _server: Option<&str>,
) -> Result<Tool, CliError> {
    Ok(Tool::new(name))
}
