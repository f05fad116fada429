//! How a run is started, as recorded in the store so it can be continued the same way.

use crate::approval::{Floor, ModeName, Policy};
use crate::goal::Goal;

use super::RunsError;

/// The options a run was started with. Stored with the run; `resume` reads them back.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunOptions {
    /// The model spec (`scripted:PATH`, `openai:MODEL`, `anthropic:MODEL`); default: the goal's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `auto`, `allowlist` or `ask` over the goal's policy (stored as that string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approve: Option<ModeName>,
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
    /// The run is a fork of another (`dagloop fork`): which run, after which of its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<super::ForkedFrom>,
    /// The run is a follow-up in a session (`run --continue`): its session and the run it
    /// follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::SessionOf>,
    /// What the run was defined with beyond its goal (delegate goals by content, its MCP
    /// servers' tools, its limits): written by [`super::define`], read back by every reader of
    /// the stored run ([`super::RunDef::from_record`]). Never taken from a client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<super::DefRecord>,
    /// The operator's approval floor the run was submitted under (`[approval]`, the published
    /// agent's, the operator's MCP tools that always ask): kept with the run so a replay or a
    /// resume applies the same one. Set by the process that accepts the run, never by a client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Floor>,
    /// The published agent the run was started as (`{"agent": NAME}`): its forks choose their
    /// model among the agent's, as the run did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl RunOptions {
    /// Reads the options a run was stored with. A policy name that is not `auto`, `allowlist`
    /// or `ask` is refused (`approval.bad_mode`), never read as "no override": the run would
    /// otherwise continue under the goal's policy, or `auto`, without saying so.
    pub fn from_stored(v: &serde_json::Value) -> Result<RunOptions, RunsError> {
        if let Some(name) = v.get("approve").and_then(serde_json::Value::as_str) {
            ModeName::parse(name)?;
        }
        serde_json::from_value(v.clone()).map_err(|e| RunsError::Options {
            reason: e.to_string(),
        })
    }
}

/// The run's effective policy: the goal's (read typed with the goal), with the options'
/// `approve` over its mode, and the operator's floor (`options.floor`) under both: the gate
/// takes the strictest of the floor and the goal ([`crate::approval::evaluate`]).
pub fn policy_for(goal: &Goal, options: &RunOptions) -> Policy {
    let policy = goal.approval.clone().unwrap_or_else(Policy::auto);
    let policy = match options.approve {
        Some(name) => policy.with_mode(name),
        None => policy,
    };
    match &options.floor {
        Some(floor) => policy.with_floor(floor.clone()),
        None => policy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Stored options keep their JSON (`"approve": "ask"`), so old stores load; an unknown
    /// policy name is refused with its code instead of being ignored.
    #[test]
    fn stored_options_read_back_and_bad_names_are_refused() {
        let stored = json!({"model": "scripted:s.json", "approve": "ask", "allow_shell": false});
        let opts = RunOptions::from_stored(&stored).expect("options");
        assert_eq!(opts.approve, Some(ModeName::Ask));
        assert_eq!(serde_json::to_value(&opts).expect("json"), stored);
        let e = RunOptions::from_stored(&json!({"approve": "sometimes"})).unwrap_err();
        assert_eq!(e.code(), "approval.bad_mode");
        let e = RunOptions::from_stored(&json!({"allow_shell": "yes"})).unwrap_err();
        assert_eq!(e.code(), "runs.bad_options");
    }
}
