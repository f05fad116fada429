//! A run's definition: the goal as asked, the options it runs with and the grants of the process
//! that runs it, checked together once, with everything the run will use recorded (its
//! delegate goals by content, the tools its MCP servers announce, its sanitize limits). Every
//! front-end (`run`, `resume`, `validate`, `serve`, `worker`) defines its runs here, so a goal is
//! held to the same grants whichever of them reads it; every reader of a stored run gets it
//! back from the record alone ([`RunDef::from_record`], in `record`).
//!
//! Deliberately not here: building the agent or starting anything (`launch`), and the grant
//! rules themselves (`crate::grants`).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::{DefRecord, RunOptions, RunsError, policy_for};
use crate::approval::Policy;
use crate::context::memory::Recall;
use crate::goal::{DelegateGoals, Goal, RecordedGoal};
use crate::grants::Grants;
use crate::engine::AgentDef;
use crate::machine::AgentConfig;

/// One run, defined: what it asks, how it runs, what it may touch, and what it was defined
/// with (the record every reader replays).
#[derive(Debug, Clone)]
pub struct RunDef {
    pub(super) asked: Goal,
    pub(super) effective: Goal,
    pub(super) options: RunOptions,
    pub(super) grants: Arc<Grants>,
    pub(super) policy: Policy,
    /// The root agent's configuration, built on first use ([`RunDef::config`]).
    pub(super) config: Arc<OnceLock<Arc<AgentConfig>>>,
    /// A stored run held to what it recorded (not `--accept-changes`): its MCP servers must
    /// announce the tools it recorded (`launch`).
    pub(super) held: bool,
    /// The workspace memory the run's engine searches before each step (a run defined to
    /// drive it; a reader of a stored run has none and never searches).
    pub(super) recall: Option<Arc<Recall>>,
}

/// Defines a run of `goal` under `options` in a process that grants `grants`: everything the
/// goal (and its delegate goals) asks is checked against the grants before anything is
/// spawned, opened or connected, the approval policy is read, the operator's MCP servers the
/// goal names are put in place of its references, and what the run is defined with is recorded
/// in its options ([`RunOptions::record`]).
///
/// A run that carries a record (a stored run resumed) is held to it: its delegate goals come
/// from the record, not from their files, and must be what they were when the run began
/// (`run.definition_changed` otherwise). `${VAR}` placeholders must be set in this process:
/// it is the one that will drive the run.
pub fn define(
    goal: Goal,
    mut options: RunOptions,
    grants: Arc<Grants>,
) -> Result<RunDef, RunsError> {
    let previous = options.record.take();
    let source = match &previous {
        Some(r) => DelegateGoals::Recorded(&r.delegates),
        None => DelegateGoals::Files,
    };
    let delegates = super::admit::check_goal(&grants, &goal, options.model.as_deref(), source)?;
    // The root goal was read for driving (`Goal::from_json` checks its placeholders); delegate
    // goals taken from a record were not.
    for (pointer, g) in &delegates {
        g.check_env().map_err(|reason| crate::goal::GoalError::Invalid {
            path: format!("{} (delegate {pointer})", g.base_dir.display()).into(),
            reason,
        })?;
    }
    let policy = policy_for(&goal, &options);
    let recorded = std::mem::take(&mut options.definition);
    let held = !recorded.is_empty();
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
    // A new run's bound is this process's; a recorded run keeps the one it was defined with.
    let kept_result_bytes = match &previous {
        Some(p) => p.kept_result_bytes,
        None => grants.kept_result_bytes,
    };
    // Workspace memory is searched before each step, by the engine, from the folder indexed
    // here; what each step got is journaled. A run recorded before that shows the chunks it
    // recorded at every step; a resumed run whose folder is gone recalls nothing new.
    let (memory, recall) = match &previous {
        Some(r) => {
            let recall = r.recall.clone().map(|source| {
                let index = super::memory::index(&goal, &grants)
                    .ok()
                    .flatten()
                    .map(|(_, index)| index);
                Arc::new(Recall { source, index })
            });
            (r.memory.clone(), recall)
        }
        None => {
            let recall = super::memory::index(&goal, &grants)?.map(|(source, index)| {
                Arc::new(Recall {
                    source,
                    index: Some(index),
                })
            });
            (Vec::new(), recall)
        }
    };
    let previous = previous.unwrap_or_default();
    options.record = Some(DefRecord {
        version: DefRecord::VERSION,
        delegates: delegates
            .iter()
            .map(|(p, g)| (p.clone(), RecordedGoal::of(g)))
            .collect(),
        // Filled in when the run's MCP servers have said what they offer (`launch`); a resumed
        // run keeps what it recorded until then.
        mcp_tools: previous.mcp_tools,
        sanitize: previous.sanitize,
        kept_result_bytes,
        memory,
        recall: recall.as_ref().map(|r| r.source.clone()),
    });
    let mut effective = goal.clone();
    super::admit::resolve_mcp(&grants, &mut effective)?;
    with_memory(&mut effective, options.record.as_ref());
    Ok(RunDef {
        asked: goal,
        effective,
        options,
        grants,
        policy,
        config: Arc::default(),
        held,
        recall,
    })
}

/// Adds the context message of the workspace memory chunks `record` holds to `goal`'s context
/// (after the goal's own messages): the run's agent and every reader of the run build their
/// context from the same record.
pub(super) fn with_memory(goal: &mut Goal, record: Option<&DefRecord>) {
    if let Some(m) = record.and_then(|r| crate::context::memory::message(&r.memory)) {
        goal.context.push(m);
    }
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

    /// The options, with what the run is defined with recorded ([`RunOptions::record`]).
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

    /// A library caller's run of `goal`: default options, open grants ([`Grants::open`]),
    /// checked whole before anything runs: every delegate goal read (and the agent tree built
    /// from them) and whatever the goal asks held to the grants, so a bad goal fails here with
    /// its code ([`RunsError::code`]: `agent.delegate` for a delegate goal that cannot be read,
    /// a `grant.*` or `goal.*` code for the rest). [`crate::AgentBuilder::new`] takes the result.
    pub fn from_goal(goal: Goal) -> Result<RunDef, RunsError> {
        let def = define(goal, RunOptions::default(), Arc::new(Grants::open()))?;
        def.config()?;
        Ok(def)
    }

    /// The agent builder of this run, set as the run is defined (see [`AgentDef`]), with
    /// `registry`'s activities. What it does not do is start the run's MCP servers:
    /// `runs::prepare` does (and records what they announce), or a library caller registers the
    /// tools itself.
    pub fn agent_builder(&self, registry: crate::tools::Registry) -> crate::engine::AgentBuilder {
        crate::engine::AgentBuilder::new(self).registry(registry)
    }

    /// What the builder takes from this definition.
    fn agent_def(&self) -> AgentDef {
        let grants = &self.grants;
        // The env grant as it holds for this run's calls (its delegates' included): those of the
        // published agent it was started as, if any.
        let http = (!grants.egress.is_open() || !grants.secrets.is_open()).then(|| {
            let secrets = grants.secrets.for_agent(self.options.agent.as_deref());
            (Arc::new(grants.egress.clone()), Arc::new(secrets))
        });
        AgentDef {
            goal: self.effective.clone(),
            policy: self.policy.clone(),
            delegate_goals: self.record().delegates.clone(),
            sanitize: self.sanitize(),
            kept_result_bytes: self.kept_result_bytes(),
            recall: self.recall.clone(),
            model_spec: self.options.model.clone(),
            mode: self.options.mode.as_deref().map(|m| {
                if m == "tools" {
                    crate::llm::Mode::ToolCalls
                } else {
                    crate::llm::Mode::StructuredOutput
                }
            }),
            shell: grants.allows_shell(),
            http,
        }
    }

    /// Whether the run is held to its record: a stored run resumed without `--accept-changes`
    /// (its MCP servers must announce the tools it recorded, `launch`).
    pub fn held_to_record(&self) -> bool {
        self.held
    }

    /// What the run was defined with: its delegate goals, its MCP servers' tools, its limits.
    pub fn record(&self) -> &DefRecord {
        static EMPTY: OnceLock<DefRecord> = OnceLock::new();
        self.options
            .record
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(DefRecord::default))
    }

    /// Records the tools the run's MCP servers announced (what a reader of the stored run needs
    /// to know its calls to them). The agent tree is built again on next use.
    pub fn set_mcp_tools(&mut self, tools: Vec<crate::protocol::Tool>) {
        let record = self.options.record.get_or_insert_with(DefRecord::default);
        record.version = DefRecord::VERSION;
        record.mcp_tools = tools;
        self.config = Arc::default();
    }
}

impl From<&RunDef> for AgentDef {
    fn from(def: &RunDef) -> AgentDef {
        def.agent_def()
    }
}

impl From<RunDef> for AgentDef {
    fn from(def: RunDef) -> AgentDef {
        def.agent_def()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library caller starts from a definition: `RunDef::from_goal`, then its builder runs the
    /// goal as defined (its recorded bound and limits included).
    #[tokio::test]
    async fn a_library_run_starts_from_its_definition() {
        let dir = tempfile::tempdir().expect("dir");
        let script = dir.path().join("s.json");
        std::fs::write(
            &script,
            serde_json::json!({"turns": [{"solution": {"calls": [], "output": {"ok": true}}}]})
                .to_string(),
        )
        .expect("script");
        let text = serde_json::json!({"goal": "say ok",
            "model": format!("scripted:{}", script.display()),
            "output_schema": {"type": "object", "required": ["ok"]}})
        .to_string();
        let goal = Goal::from_json(&text, std::path::Path::new("goal.json"), dir.path().into())
            .expect("goal");
        let def = RunDef::from_goal(goal).expect("defined");
        assert_eq!(
            def.kept_result_bytes(),
            crate::engine::DEFAULT_KEPT_RESULT_BYTES
        );
        let result = def
            .agent_builder(crate::tools::Registry::new())
            .build()
            .expect("built")
            .run()
            .await;
        assert_eq!(result.output, serde_json::json!({"ok": true}), "{result:?}");
    }
}
