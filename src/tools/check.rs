//! The static check of a tool's activity: the same rules the run applies, before anything runs.
//!
//! [`check_tool`] refuses an unknown `_activity` kind and a configuration the activity would
//! refuse at call time (`_http` without `url` or with unknown keys, `_shell` with unknown keys,
//! timeouts out of range, a delegate goal file that is missing or invalid). It does not know which
//! Rust functions a program registers: `"rust"` passes here and is the builder's concern.

use std::path::Path as FsPath;

use super::{ActivityError, HttpConfig, ShellConfig};
use crate::protocol::Tool;

/// The activity kinds a tool may name in `_activity`.
pub const KINDS: [&str; 4] = ["http", "shell", "delegate", "rust"];

/// Checks a tool's activity kind and configuration. `base_dir` is the goal's folder (delegate goal
/// paths are relative to it). `dagloop validate` and the engine's builder call this same function.
pub fn check_tool(tool: &Tool, base_dir: &FsPath) -> Result<(), ActivityError> {
    let config = |reason: String| ActivityError::Config {
        tool: tool.name.clone(),
        reason,
    };
    let kind = match tool.activity.as_deref() {
        Some(k) => k,
        None if tool.schema.contains_key("_delegate") => "delegate",
        None => {
            for key in ["_http", "_shell"] {
                if tool.schema.contains_key(key) {
                    return Err(config(format!(
                        "`{key}` is given but `_activity` is not set (add `\"_activity\": \"{}\"`)",
                        &key[1..]
                    )));
                }
            }
            return Ok(());
        }
    };
    match kind {
        "http" => HttpConfig::from_tool(tool).map(drop),
        "shell" => ShellConfig::from_tool(tool).map(drop),
        "delegate" => check_delegate(tool, base_dir),
        "rust" => Ok(()),
        other => Err(config(format!(
            "unknown `_activity` `{other}` (expected one of {})",
            KINDS.join(", ")
        ))),
    }
}

fn check_delegate(tool: &Tool, base_dir: &FsPath) -> Result<(), ActivityError> {
    let config = |reason: String| ActivityError::Config {
        tool: tool.name.clone(),
        reason,
    };
    let target = tool
        .schema
        .get("_delegate")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| config("`_delegate` must be a goal file path or \"anonymous\"".into()))?;
    if target == "anonymous" {
        return Ok(());
    }
    crate::goal::Goal::load(&base_dir.join(target))
        .map(drop)
        .map_err(|e| config(format!("`_delegate`: {e}")))
}
