//! `dagloop policy explain GOAL --call JSON`: which rule of the goal's approval policy decides a
//! call, and why, evaluated by the same code the scheduler runs (`approval::explain`).
//!
//! Deliberately not here: starting MCP servers to learn their tools' annotations (a call to a
//! tool the goal does not define is explained as a tool without annotations).

use std::path::Path as FsPath;

use serde_json::{Value, json};

use super::{CliError, pretty};
use crate::approval::ModeName;
use crate::goal::Goal;
use crate::protocol::{Call, Tool};

/// Prints the deciding rule (exit 0), or the error with its code.
pub(super) fn explain(
    goal_path: &FsPath,
    call: &str,
    approve: Option<ModeName>,
    json_out: bool,
) -> Result<i32, CliError> {
    let goal = Goal::load(goal_path).map_err(|e| CliError::new(e.code(), &e))?;
    let value: Value = serde_json::from_str(call)
        .map_err(|e| CliError::new("cli.bad_call", format!("--call is not JSON: {e}")))?;
    let call = Call::parse(value).map_err(|e| CliError::new(e.code(), format!("--call: {e}")))?;
    let policy = crate::runs::policy_for(&goal, approve);
    let tool = goal
        .tools
        .iter()
        .find(|t| t.name == call.tool)
        .cloned()
        .unwrap_or_else(|| Tool::new(call.tool.clone()));
    let e = crate::approval::explain(&tool, &call, &policy);
    if json_out {
        outln!("{}", pretty(&json!(e)));
        return Ok(0);
    }
    for s in &e.skipped {
        outln!("  skipped {}: {}", s.rule, s.why);
    }
    outln!("{} by {}: {}", e.decision.as_str(), e.rule, e.reason);
    Ok(0)
}
