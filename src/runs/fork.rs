//! Forking a stored run (`dagloop fork`, `POST /runs/{id}/fork`): a new run that starts from
//! the original's state, plan and context as they were after one of its steps, then goes on
//! with its own model and input, recorded as a fork of the original.
//!
//! "After step N" is the moment the original run asked its own model for step N+1: every input
//! it consumed up to and including the journal entry that made it ask (so every call of steps
//! 1..N has its outcome or was settled by the policy, the state holds their results, and the
//! context holds the N turns and what came of them). The fork's journal is that prefix, copied;
//! continuing it is an ordinary resume, which replays the prefix and asks the model for step
//! N+1. After step 0 is right after the run's start.
//!
//! The copied entries are moved in time so that the last one is "now": the fork has the time
//! the original had left after step N (`limits.timeout_s`), not what is left of it today.
//!
//! Deliberately not here: what the fork may touch (the front-end's grants, through
//! [`super::define`], never anything recorded with the original), and driving the fork (the
//! front-ends resume it as they resume any run).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{RunOptions, RunsError};
use crate::goal::Goal;
use crate::machine::{Action, JournalEntry};
use crate::protocol::Millis;
use crate::store::{RunRecord, RunStore, StoredRun};

/// Where a fork comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ForkedFrom {
    /// The original run.
    pub run: String,
    /// The step of the original run it starts after.
    pub step: u32,
}

/// A fork, ready to be recorded ([`seed`]) and resumed.
#[derive(Debug, Clone)]
pub struct Fork {
    /// The new run's record (a new id; the original's goal, with the new input; the options
    /// with `forked_from`).
    pub record: RunRecord,
    /// The goal the fork runs.
    pub goal: Goal,
    /// Its options (`forked_from` set, no definition yet: the fork is defined afresh).
    pub options: RunOptions,
    /// The original's journal after step N, moved in time.
    pub journal: Vec<JournalEntry>,
}

/// How many entries of `journal` (the run `record` describes) make up the run after `step`:
/// the entries up to and including the one that made the run ask its own model for step
/// `step + 1`. `fork.no_such_step` when it never did.
pub fn fork_point(
    record: &RunRecord,
    journal: &[JournalEntry],
    step: u32,
) -> Result<usize, RunsError> {
    let (_, mut machine) = super::fresh_machine(record)?;
    let mut actions = Vec::new();
    let mut last = 0u32;
    for (i, e) in journal.iter().enumerate() {
        machine.handle_into(e.input.clone(), e.at, &mut actions);
        for a in actions.drain(..) {
            if let Action::Request {
                frame: None,
                step: s,
                ..
            } = a
            {
                if s == step.saturating_add(1) {
                    return Ok(i + 1);
                }
                last = last.max(s);
            }
        }
    }
    Err(RunsError::NoSuchStep {
        run: record.id.clone(),
        step,
        last,
    })
}

/// The goal document `doc` (folder `base`) with `input` as its input, loaded and checked
/// (`goal.invalid` when the input does not match the goal's `input_schema`).
pub fn goal_with_input(
    doc: &Value,
    input: Option<Value>,
    origin: &std::path::Path,
    base: std::path::PathBuf,
) -> Result<Goal, RunsError> {
    let mut doc = doc.clone();
    if let (Some(i), Some(m)) = (input, doc.as_object_mut()) {
        m.insert("input".into(), i);
    }
    Ok(Goal::from_json(&doc.to_string(), origin, base)?)
}

/// Plans a fork of `stored` after `step`: `options` are the front-end's (its grants decide
/// `allow_shell`; who submits it), `model` and `input` replace the original's when given.
/// Nothing is recorded yet.
pub fn fork(
    stored: &StoredRun,
    step: u32,
    model: Option<String>,
    input: Option<Value>,
    mut options: RunOptions,
    now: Millis,
) -> Result<Fork, RunsError> {
    let original = &stored.record;
    let keep = fork_point(original, &stored.journal, step)?;
    let goal = goal_with_input(
        &original.goal,
        input,
        std::path::Path::new(&original.id),
        std::path::PathBuf::from(&original.base_dir),
    )?;
    let prefix = &stored.journal[..keep];
    let shift = prefix.last().map_or(0, |e| now.saturating_sub(e.at));
    let journal = prefix
        .iter()
        .map(|e| JournalEntry {
            seq: e.seq,
            at: e.at.saturating_add(shift),
            input: e.input.clone(),
        })
        .collect();
    if model.is_some() {
        options.model = model;
    }
    options.definition.clear();
    // The fork goes on with what the original was defined with (its delegate goals and MCP
    // tools as recorded), not with the files as they are now.
    options.record = RunOptions::from_stored(&original.options)?.record;
    options.forked_from = Some(ForkedFrom {
        run: original.id.clone(),
        step,
    });
    let record = RunRecord {
        id: crate::engine::bus::new_run_id(),
        created_at: now,
        goal: serde_json::to_value(&goal).unwrap_or(Value::Null),
        base_dir: original.base_dir.clone(),
        options: serde_json::to_value(&options).unwrap_or(Value::Null),
    };
    Ok(Fork {
        record,
        goal,
        options,
        journal,
    })
}

/// Records the fork in `store` (leased to this process) with its journal, and returns it as a
/// stored run for the front-end to resume.
pub async fn seed(store: &dyn RunStore, fork: &Fork) -> Result<StoredRun, RunsError> {
    store.create(&fork.record)?;
    if !fork.journal.is_empty() {
        store
            .append(&fork.record.id, &fork.journal)
            .await
            .map_err(|e| crate::store::StoreError::Io {
                reason: e.to_string(),
            })?;
    }
    Ok(StoredRun {
        record: fork.record.clone(),
        journal: fork.journal.clone(),
        result: None,
        lease: None,
    })
}
