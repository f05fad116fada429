//! Goal admission: what a goal (and every delegate goal it names, read only once its path is
//! inside the granted roots) asks for, compared with what the process grants, before anything
//! is spawned, opened or connected; and the operator's MCP servers a goal names by reference
//! put in place of the references. `runs::define` calls both for `run`, `resume`, `validate`,
//! `serve` and `worker` alike; `dagloop policy` resolves references the same way.
//!
//! A refusal is a [`GrantError`] with a stable `grant.*` code and the JSON pointer of what asked.
//!
//! Deliberately not here: the granted values themselves, where a path may be read from
//! ([`Grants::file`]) and the connect-time egress and secret checks of the `http` activity
//! (all in `crate::grants`); reading the operator's config; building or starting anything.

#[cfg(feature = "mcp")]
use crate::protocol::McpServerConfig;
use serde_json::Value;
use std::path::Path;

use crate::goal::{DelegateGoals, Goal};
use crate::grants::{EnvGrant, GrantError, Grants, MCP};

#[cfg(feature = "mcp")]
fn known_mcp(grants: &Grants) -> String {
    if grants.mcp_servers.is_empty() {
        " (it configures none)".into()
    } else {
        let names: Vec<&str> = grants.mcp_servers.keys().map(String::as_str).collect();
        format!(" (configured: {})", names.join(", "))
    }
}

/// Checks everything `goal` asks for (with `model`, the run's model spec when it is not the
/// goal's own), its delegate goals included (each read only once its path is granted), taken
/// from `delegates`: their files, or a stored run's record (what is checked is what the run
/// will use, not the files as they are now). Returns the delegate goals read, by the pointer
/// of the tool that names them.
pub fn check_goal(
    grants: &Grants,
    goal: &Goal,
    model: Option<&str>,
    delegates: DelegateGoals<'_>,
) -> Result<Vec<(String, Goal)>, GrantError> {
    if let Some(spec) = model {
        check_model(grants, "/model", spec, &std::env::current_dir().unwrap_or_default())?;
    }
    let mut found = Vec::new();
    check_one(grants, goal, "", 0, delegates, &mut found)?;
    Ok(found)
}

/// Every `scripted:` file of a model spec (or comma-separated list of fallback specs) is
/// under a granted root.
fn check_model(grants: &Grants, pointer: &str, spec: &str, base: &Path) -> Result<(), GrantError> {
    for one in spec.split(',') {
        let (one, _) = crate::llm::ModelSpec::split_window(one.trim()).unwrap_or((one, None));
        if let Some(path) = one.trim().strip_prefix("scripted:") {
            grants.file(pointer, path, base)?;
        }
    }
    Ok(())
}

fn check_one(
    grants: &Grants,
    goal: &Goal,
    at: &str,
    depth: u32,
    source: DelegateGoals<'_>,
    delegates: &mut Vec<(String, Goal)>,
) -> Result<(), GrantError> {
    if let Some(spec) = &goal.model {
        check_model(grants, &format!("{at}/model"), spec, &goal.base_dir)?;
    }
    if let EnvGrant::Only(vars) = &grants.env {
        for (i, v) in goal.env.iter().enumerate() {
            if !vars.contains(v) {
                return Err(GrantError::Env {
                    pointer: format!("{at}/env/{i}"),
                    var: v.clone(),
                });
            }
        }
    }
    if let Some(m) = &goal.memory {
        grants.file(&format!("{at}/memory/path"), &m.path, &goal.base_dir)?;
    }
    check_mcp(grants, goal, at)?;
    for (i, t) in goal.tools.iter().enumerate() {
        let pointer = format!("{at}/tools/{i}");
        let kind = crate::protocol::kind_of(t);
        // A kind dagloop does not define is the registry's to refuse (or a program's own).
        let known = |k: &str| crate::protocol::KINDS.contains(&k) || k == MCP;
        if let Some(kind) = kind
            && known(kind)
            && !grants.grants_kind(kind)
        {
            return Err(GrantError::Kind {
                pointer,
                tool: t.name.clone(),
                kind: kind.to_string(),
                hint: if kind == "shell" {
                    " (start it with --allow-shell, or grant `shell` in its config)"
                } else {
                    " (grant it in the operator's config)"
                },
            });
        }
        if kind == Some("http")
            && let Some(url) = t
                .schema
                .get("_http")
                .and_then(|h| h.get("url"))
                .and_then(Value::as_str)
            && !url.contains('{')
        {
            grants.egress
                .check_str(url)
                .map_err(|reason| GrantError::Egress {
                    pointer: format!("{pointer}/_http/url"),
                    reason,
                })?;
        }
        if kind == Some("delegate")
            && depth < crate::machine::MAX_DEPTH
            && let Some(target) = t.schema.get("_delegate").and_then(Value::as_str)
            && target != "anonymous"
        {
            let ptr = format!("{pointer}/_delegate");
            let path = grants.file(&ptr, target, &goal.base_dir)?;
            // A delegate goal that cannot be read is the builder's and `validate`'s to
            // report (with their own codes); nothing it would ask for is touched.
            if let Ok(child) = source.load(&ptr, &path) {
                check_one(grants, &child, &ptr, depth + 1, source, delegates)?;
                delegates.push((ptr, child));
            }
        }
    }
    Ok(())
}

#[cfg(feature = "mcp")]
fn check_mcp(grants: &Grants, goal: &Goal, at: &str) -> Result<(), GrantError> {
    for (i, s) in goal.mcp_servers.iter().enumerate() {
        let pointer = format!("{at}/mcp_servers/{i}");
        match s {
            McpServerConfig::Named(n) => {
                if !grants.mcp_servers.contains_key(&n.name) {
                    return Err(GrantError::UnknownMcpServer {
                        pointer,
                        name: n.name.clone(),
                        known: known_mcp(grants),
                    });
                }
            }
            other if !grants.goal_mcp_servers => {
                return Err(GrantError::McpServer {
                    pointer,
                    name: other.name().to_string(),
                    known: known_mcp(grants),
                });
            }
            other => {
                if let EnvGrant::Only(vars) = &grants.env {
                    for (j, v) in other.env_allowed().iter().enumerate() {
                        if !vars.contains(v) {
                            return Err(GrantError::Env {
                                pointer: format!("{pointer}/from_env/{j}"),
                                var: v.clone(),
                            });
                        }
                    }
                }
                if let McpServerConfig::Http(h) = other
                    && !h.url.contains('{')
                {
                    grants.egress
                        .check_str(&h.url)
                        .map_err(|reason| GrantError::Egress {
                            pointer: format!("{pointer}/url"),
                            reason,
                        })?;
                }
            }
        }
        if !grants.grants_kind("mcp") {
            return Err(GrantError::Kind {
                pointer,
                tool: s.name().to_string(),
                kind: "mcp".into(),
                hint: " (grant it in the operator's config)",
            });
        }
    }
    Ok(())
}

#[cfg(not(feature = "mcp"))]
fn check_mcp(_grants: &Grants, _goal: &Goal, _at: &str) -> Result<(), GrantError> {
    Ok(())
}

/// `goal`'s MCP servers with each reference to an operator's server replaced by that
/// server's configuration (the goal's approval overrides over the operator's).
#[cfg(feature = "mcp")]
pub fn resolve_mcp(grants: &Grants, goal: &mut Goal) -> Result<(), GrantError> {
    for (i, s) in goal.mcp_servers.iter_mut().enumerate() {
        if let McpServerConfig::Named(n) = s {
            let Some(cfg) = grants.mcp_servers.get(&n.name) else {
                return Err(GrantError::UnknownMcpServer {
                    pointer: format!("/mcp_servers/{i}"),
                    name: n.name.clone(),
                    known: known_mcp(grants),
                });
            };
            let mut cfg = cfg.clone();
            cfg.set_name(&n.name);
            for (tool, a) in &n.approval {
                cfg.approval_overrides_mut().insert(tool.clone(), *a);
            }
            *s = cfg;
        }
    }
    Ok(())
}

/// Without MCP support there is nothing to resolve.
#[cfg(not(feature = "mcp"))]
pub fn resolve_mcp(_grants: &Grants, _goal: &mut Goal) -> Result<(), GrantError> {
    Ok(())
}
