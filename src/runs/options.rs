//! How a run is started, as recorded in the store so it can be continued the same way.

use crate::approval::{Mode, Policy};
use crate::goal::Goal;

use super::RunsError;

/// The options a run was started with. Stored with the run; `resume` reads them back.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunOptions {
    /// The model spec (`scripted:PATH`, `openai:MODEL`, `anthropic:MODEL`); default: the goal's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `auto`, `allowlist` or `ask` over the goal's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approve: Option<String>,
    /// The operator allowed the shell activity.
    #[serde(default)]
    pub allow_shell: bool,
    /// `structured` or `tools` (default: the goal's `mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The run was submitted to `dagloop serve`, which continues it after a restart.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub server: bool,
    /// The principal that submitted the run to `dagloop serve` (a submitter sees and cancels
    /// only its own runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// What the run was defined from, part by part (`goal`, each delegate goal by the pointer
    /// of its tool), as SHA-256 digests: `resume` refuses a run whose definition changed
    /// (`run.definition_changed`) unless told to accept the changes.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub definition: std::collections::BTreeMap<String, String>,
}

/// The run's policy: the goal's, with `approve` over it.
pub fn policy_for(goal: &Goal, approve: Option<&str>) -> Result<Policy, RunsError> {
    let mut policy: Policy = match &goal.approval {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| RunsError::Policy {
            reason: e.to_string(),
        })?,
        None => Policy::auto(),
    };
    match approve {
        Some("auto") => policy.mode = Mode::Auto,
        Some("ask") => policy.mode = Mode::Ask,
        Some("allowlist") if !matches!(policy.mode, Mode::Allowlist { .. }) => {
            policy.mode = Mode::Allowlist {
                allow: Default::default(),
            }
        }
        _ => {}
    }
    Ok(policy)
}
