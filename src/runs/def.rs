//! A run's definition: the goal as asked, the options it runs with and the grants of the process
//! that runs it, checked together once. Every front-end (`run`, `resume`, `validate`, `serve`,
//! `worker`) defines its runs here, so a goal is held to the same grants whichever of them
//! reads it.
//!
//! Deliberately not here: building the agent or starting anything (`launch`), and the grant
//! rules themselves (`crate::grants`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{RunOptions, RunsError, policy_for};
use crate::approval::Policy;
use crate::goal::Goal;
use crate::grants::Grants;

/// One run, defined: what it asks, how it runs, what it may touch.
#[derive(Debug, Clone)]
pub struct RunDef {
    asked: Goal,
    effective: Goal,
    options: RunOptions,
    grants: Arc<Grants>,
    policy: Policy,
}

/// Defines a run of `goal` under `options` in a process that grants `grants`: everything the
/// goal (and its delegate goals) asks is checked against the grants before anything is
/// spawned, opened or connected, the approval policy is read, and the operator's MCP servers
/// the goal names are put in place of its references.
pub fn define(
    goal: Goal,
    mut options: RunOptions,
    grants: Arc<Grants>,
) -> Result<RunDef, RunsError> {
    let delegates = grants.check_goal(&goal, options.model.as_deref())?;
    let policy = policy_for(&goal, &options);
    let recorded = std::mem::take(&mut options.definition);
    options.definition = fingerprint(&goal, &delegates);
    if !recorded.is_empty() {
        let changed: Vec<String> = options
            .definition
            .keys()
            .chain(recorded.keys())
            .filter(|k| options.definition.get(*k) != recorded.get(*k))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !changed.is_empty() {
            return Err(RunsError::DefinitionChanged { changed });
        }
    }
    let mut effective = goal.clone();
    grants.resolve_mcp(&mut effective)?;
    Ok(RunDef {
        asked: goal,
        effective,
        options,
        grants,
        policy,
    })
}

/// The digest of each part a run is defined from.
fn fingerprint(goal: &Goal, delegates: &[(String, Goal)]) -> BTreeMap<String, String> {
    let digest = |g: &Goal| {
        let text = serde_json::to_vec(g).unwrap_or_default();
        let d = ring::digest::digest(&ring::digest::SHA256, &text);
        d.as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let mut parts = BTreeMap::new();
    parts.insert("goal".to_string(), digest(goal));
    for (pointer, g) in delegates {
        parts.insert(format!("delegate {pointer}"), digest(g));
    }
    parts
}

impl RunDef {
    /// The goal as submitted (what the store records; MCP servers still by name).
    pub fn goal(&self) -> &Goal {
        &self.asked
    }

    /// The goal the run's agent is built from (the operator's MCP servers in place).
    pub fn effective_goal(&self) -> &Goal {
        &self.effective
    }

    /// The options.
    pub fn options(&self) -> &RunOptions {
        &self.options
    }

    /// What the run may touch.
    pub fn grants(&self) -> &Arc<Grants> {
        &self.grants
    }

    /// The approval policy (the goal's, with the options' `approve` over it).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}
