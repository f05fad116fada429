//! A run is its record: what a run was defined with is recorded when it starts ([`DefRecord`],
//! kept with the run's options in the store and in Temporal's spec), and every reader of a
//! stored run — `show`, `replay`, `export`, `fork`, `decide`, the audit, the trace, the server's
//! views — gets the run's machine from that record alone ([`RunDef::from_record`], then
//! [`RunDef::machine`] or [`RunDef::replay`]). None of them needs an environment variable, a
//! file on disk or an MCP server.
//!
//! Deliberately not here: checking a run against grants (`def`: a reader grants nothing, and
//! a process that drives a stored run defines it again under its own grants) or running it.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{RunDef, RunOptions, RunsError, policy_for};
use crate::context::SanitizeLimits;
use crate::goal::{DelegateGoals, Goal, RecordedGoal};
use crate::machine::{AgentConfig, JournalEntry, RunMachine};
use crate::protocol::{Event, Tool};
use crate::store::RunRecord;

/// What a run was defined with, beyond its goal and options: recorded when it starts so that a
/// reader of the stored run rebuilds it from the record alone. Environment placeholders stay by
/// name in the goals (their values are never recorded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefRecord {
    /// The record's format ([`DefRecord::VERSION`]; runs recorded before it have no record).
    pub version: u32,
    /// The delegate goals, by content, by the pointer of the `_delegate` that names each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub delegates: BTreeMap<String, RecordedGoal>,
    /// The tools the run's MCP servers announced when it started (names as the run saw them,
    /// params schemas, annotations and approval), so that its calls to them are known without
    /// the servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_tools: Vec<Tool>,
    /// What is shown of tool results.
    #[serde(default)]
    pub sanitize: SanitizeLimits,
    /// The most bytes of tool results the run keeps (the grants' `kept_result_bytes` when it
    /// was defined; None: the engine's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_result_bytes: Option<u64>,
    /// The workspace memory chunks the run's context shows (`runs::memory`), chosen when the
    /// run began: readers and replays use these, never the folder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<crate::context::memory::Chunk>,
    /// The workspace memory the run's agent searches before each step (the chunks each step
    /// got are journaled, `RunInput::Recalled`). Runs recorded before memory was searched per
    /// step have none and show [`DefRecord::memory`] at every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<crate::context::memory::MemorySource>,
}

impl DefRecord {
    /// The current format.
    pub const VERSION: u32 = 1;
}

impl Default for DefRecord {
    fn default() -> Self {
        DefRecord {
            version: DefRecord::VERSION,
            delegates: BTreeMap::new(),
            mcp_tools: Vec::new(),
            sanitize: SanitizeLimits::default(),
            kept_result_bytes: None,
            memory: Vec::new(),
            recall: None,
        }
    }
}

impl RunRecord {
    /// The record of a new run of `goal` with `options`, under `id`, created now (what
    /// `temporal::RunSpec::new` is), for a library caller starting a Temporal run itself.
    #[cfg(any(feature = "temporal", feature = "test-util"))]
    pub fn new(id: impl Into<String>, goal: &Goal, options: RunOptions) -> RunRecord {
        RunRecord::of(id.into(), goal, &options)
    }

    /// The record of a defined run (its goal with delegate goals by content, its options),
    /// under `id`, for a Temporal workflow: workers define the run again from it for every
    /// activity (their goal lists the MCP tools apart), so the digests of the goal as the
    /// starting process saw it are not kept.
    #[cfg(feature = "temporal")]
    pub(crate) fn of_def(id: impl Into<String>, def: &RunDef) -> RunRecord {
        let mut options = def.options().clone();
        options.definition.clear();
        RunRecord::of(id.into(), def.goal(), &options)
    }

    #[cfg(any(feature = "temporal", feature = "test-util"))]
    fn of(id: String, goal: &Goal, options: &RunOptions) -> RunRecord {
        RunRecord {
            id,
            created_at: super::now_ms(),
            goal: serde_json::to_value(goal).unwrap_or(serde_json::Value::Null),
            base_dir: goal.base_dir.display().to_string(),
            options: serde_json::to_value(options).unwrap_or(serde_json::Value::Null),
        }
    }

    /// The options again, typed.
    #[cfg(feature = "temporal")]
    pub(crate) fn run_options(&self) -> Result<RunOptions, RunsError> {
        RunOptions::from_stored(&self.options)
    }
}

/// A stored run's machine after its journal, and the events it published.
pub struct Replay {
    /// The machine after the whole journal (what awaits a decision, whether an op applies).
    pub machine: RunMachine,
    /// The events the run published (live-only ones excepted), in order.
    pub events: Vec<Event>,
}

/// A method of [`RunDef`] (public at the crate root) whose types are the crate's own (the
/// machine): public with the `test-util` feature, for the crate's tests, the crate's otherwise.
macro_rules! crate_pub {
    ($(#[$meta:meta])* fn $($rest:tt)*) => {
        $(#[$meta])*
        #[cfg(feature = "test-util")]
        pub fn $($rest)*
        $(#[$meta])*
        #[cfg(not(feature = "test-util"))]
        pub(crate) fn $($rest)*
    };
}

impl RunDef {
    /// The definition of a stored run, from its record alone: the goal as recorded (its
    /// placeholders by name), its options, its delegate goals and MCP tools as recorded. It
    /// grants nothing: a process that drives the run defines it again ([`super::define`]) under
    /// its own grants. A run recorded by an older dagloop (no [`DefRecord`]) reads its delegate
    /// goals from their files, as it always did, until a process that drives it records them.
    pub fn from_record(record: &RunRecord) -> Result<RunDef, RunsError> {
        let base = PathBuf::from(&record.base_dir);
        let goal = Goal::from_record(&record.goal, FsPath::new(&record.id), base.clone())?;
        let options = RunOptions::from_stored(&record.options)?;
        let policy = policy_for(&goal, &options);
        Ok(RunDef {
            effective: goal.clone(),
            asked: goal,
            options,
            grants: Arc::new(crate::grants::Grants::closed(&base)),
            policy,
            config: Arc::default(),
            held: true,
            recall: None,
        })
    }

    /// The run's own agent with its nested agents, as the run was defined: the goal's tools with
    /// its MCP servers' recorded tools after them (as the builder adds them), delegate goals from
    /// the record.
    pub fn config(&self) -> Result<Arc<AgentConfig>, RunsError> {
        if let Some(c) = self.config.get() {
            return Ok(c.clone());
        }
        let mut goal = self.asked.clone();
        let record = self.options.record.as_ref();
        super::def::with_memory(&mut goal, record);
        for t in record.map(|r| r.mcp_tools.as_slice()).unwrap_or_default() {
            goal.tools.retain(|g| g.name != t.name);
            goal.tools.push(t.clone());
        }
        let source = match record {
            Some(r) => DelegateGoals::Recorded(&r.delegates),
            None => DelegateGoals::Files,
        };
        let config = crate::engine::config_with(&goal, source)?;
        Ok(self.config.get_or_init(|| config).clone())
    }

    /// What is shown of tool results in this run.
    pub fn sanitize(&self) -> SanitizeLimits {
        self.options
            .record
            .as_ref()
            .map(|r| r.sanitize)
            .unwrap_or_default()
    }

    /// The most bytes of tool results the run keeps (what it was defined with).
    pub fn kept_result_bytes(&self) -> u64 {
        self.record()
            .kept_result_bytes
            .unwrap_or(crate::engine::DEFAULT_KEPT_RESULT_BYTES)
    }

    /// What the run's machines are built from, as it was defined.
    pub(crate) fn machine_def(&self) -> Result<crate::engine::MachineDef, RunsError> {
        Ok(crate::engine::MachineDef {
            config: self.config()?,
            policy: self.policy.clone(),
            sanitize: self.sanitize(),
            recall: self.record().recall.is_some(),
            window_tokens: self
                .options
                .model
                .as_deref()
                .or(self.asked.model.as_deref())
                .and_then(crate::llm::ModelSpec::window_of_list),
        })
    }

    crate_pub! {
        /// A fresh machine for the run, nothing consumed yet, that keeps what a replay needs (see
        /// [`RunMachine::replaying`]). Built, like the engine's own, by
        /// [`crate::engine::MachineDef::machine`]: the one way outside the core to a machine.
        fn machine(&self, run_id: &str) -> Result<RunMachine, RunsError> {
            Ok(self
                .machine_def()?
                .machine(run_id, crate::engine::MachineUse::Replay))
        }
    }

    crate_pub! {
        /// The run's machine after `journal`, and the events it published.
        fn replay(&self, run_id: &str, journal: &[JournalEntry]) -> Result<Replay, RunsError> {
            let (machine, events) = self.machine_def()?.replay(run_id, journal);
            Ok(Replay { machine, events })
        }
    }
}
