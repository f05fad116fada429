//! Runs as every front-end sees them: start one from a goal and its options, continue a stored
//! one, pick up decisions recorded elsewhere, and describe a run (its calls, timeline and
//! critical path) from its journal.
//!
//! The command line (`run`, `resume`, `show`, `decide`) and the server call this module, so
//! both apply one set of rules: the same policy from the same options, the same MCP start-up,
//! the same store records, the same description of a run.
//!
//! Deliberately not here: printing, terminals, HTTP (the front-ends), and any decision about
//! a run (the machine takes them; this module only replays its journal).

mod admit;
pub mod audit;
mod cassette;
mod compact;
mod def;
mod fork;
mod standing;
mod launch;
mod list;
pub mod memory;
mod options;
mod record;
mod replay;
pub mod session;
mod view;

pub use cassette::{
    Cassette, CassetteError, CassetteExecutor, Exported, Recorded, canonical, export, params_key,
};
pub use compact::{CompactedRun, Retained, apply_retention, compact, kept};
pub use admit::{check_goal, resolve_mcp};
pub use def::{RunDef, define};
pub use fork::{Fork, ForkedFrom, fork, fork_point, goal_with_input, seed};
pub use standing::{StandingRequest, standing_op};
pub use launch::{
    Host, Launched, Pool, Prepared, Review, Servers, absolute_dir, absolute_model, builder_for,
    now_ms, prepare, spawn_op_poller, with_mcp_tools,
};
pub use list::{derive_missing, list_runs};
pub use options::{RunOptions, policy_for};
pub use record::{DefRecord, Replay};
pub use session::{
    Carry, Continue, Next, Parent, SessionOf, continue_run, follow_up, session_of,
};
pub use replay::{Divergence, Replayed, fresh_machine, replay_run};
pub use view::{
    AwaitingCall, CallView, ModelFallback, Rebuilt, RunView, Span, Thought, action_of, describe,
    describe_view,
    rebuild, rebuild_machine,
};

/// Why a run could not be started, resumed or described.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunsError {
    /// The goal is invalid.
    #[error(transparent)]
    Goal(#[from] crate::goal::GoalError),
    /// The agent could not be built from it.
    #[error(transparent)]
    Agent(#[from] crate::engine::AgentError),
    /// The store refused.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The run can ask a reviewer ([`crate::approval::may_ask`]: its policy, or a tool of the
    /// goal, of its MCP servers or of its delegates that always asks), and nobody can answer
    /// ([`Review::Nobody`]).
    #[error("the run can ask a reviewer ({asking}), but none can answer: {how}")]
    NoReviewer {
        /// The policy's mode, or the tools that always ask.
        asking: String,
        /// What the front-end offers instead.
        how: String,
    },
    /// The run's stored options name an unknown approval policy.
    #[error(transparent)]
    Approval(#[from] crate::approval::ApprovalError),
    /// The run's stored options cannot be read.
    #[error("the run's stored options cannot be read: {reason}")]
    Options {
        /// The deserializer's explanation.
        reason: String,
    },
    /// The run's definition (its goal, a delegate goal) is not what it was when the run began.
    #[error(
        "the run's definition changed since it began: {} (resume with --accept-changes to continue under the new definition)",
        changed.join(", ")
    )]
    DefinitionChanged {
        /// The parts that changed (`goal`, `delegate /tools/0/_delegate`...).
        changed: Vec<String>,
    },
    /// The goal asks for something the process does not grant.
    #[error(transparent)]
    Grant(#[from] crate::grants::GrantError),
    /// A fork names a step the run never went past (`fork.no_such_step`).
    #[error(
        "run {run} cannot be forked after step {step}: it never asked its model for step {} (it can be forked after steps 0 to {})",
        step + 1,
        last.saturating_sub(1)
    )]
    NoSuchStep {
        /// The run.
        run: String,
        /// The step asked for.
        step: u32,
        /// The last step the run asked its model for.
        last: u32,
    },
    /// The goal's workspace memory could not be read.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// A tool source (an MCP server) could not start.
    #[error("{message}")]
    Tools {
        /// The tool source's own code.
        code: &'static str,
        /// What it said.
        message: String,
    },
}

crate::codes::has_code!(RunsError);

impl RunsError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RunsError::Goal(e) => e.code(),
            RunsError::Agent(e) => e.code(),
            RunsError::Store(e) => e.code(),
            RunsError::Grant(e) => e.code(),
            RunsError::Memory(e) => e.code(),
            RunsError::DefinitionChanged { .. } => "run.definition_changed",
            RunsError::NoReviewer { .. } => "approval.no_reviewer",
            RunsError::Approval(e) => e.code(),
            RunsError::Options { .. } => "runs.bad_options",
            RunsError::Tools { code, .. } => code,
            RunsError::NoSuchStep { .. } => "fork.no_such_step",
        }
    }
}

/// Why an op for a stored run was not recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The op does not apply to the run as its journal stands (rule 21).
    #[error(transparent)]
    Op(crate::protocol::OpError),
    /// The run could not be read or rebuilt.
    #[error(transparent)]
    Runs(#[from] RunsError),
}

/// How many times [`record_op`] checks an op again when the run moved on between its check and
/// its recording, before it answers `op.stale`.
const RECORD_TRIES: usize = 8;

/// Records an op for a stored run that this process does not drive, after checking it against
/// the run rebuilt from its journal; the process that drives the run (or the next `resume`)
/// applies it. The check and the queueing are one transaction (DESIGN.md 3.6): the op is
/// queued only if the journal is still the one the check saw (otherwise it is checked again,
/// then refused `op.stale`) and no other decision holds the presentation it answers
/// (`op.already_decided`, naming that decision). A decision that names no presentation is bound
/// to the one its check saw. Returns the op as recorded and whether some process drives the
/// run now (holds an unexpired lease).
pub fn record_op(
    store: &dyn crate::store::RunStore,
    id: &str,
    op: &crate::protocol::Op,
) -> Result<(crate::protocol::Op, bool), Refused> {
    let mut moved = None;
    for _ in 0..RECORD_TRIES {
        let (stored, rb) = load_checkable(store, id)?;
        let bound = rb.machine.bind_op(op.clone()).map_err(Refused::Op)?;
        let seen = stored.journal.last().map_or(0, |e| e.seq);
        match store.push_op(id, &bound, seen).map_err(RunsError::from)? {
            crate::store::Queued::Queued => return Ok((bound, stored.lease.is_some())),
            crate::store::Queued::Moved { now } => moved = Some((seen, now)),
            crate::store::Queued::Decided { winner } => {
                let call = match &bound {
                    crate::protocol::Op::Decide { call, .. } => *call,
                    _ => crate::protocol::CallId(0),
                };
                return Err(Refused::Op(crate::protocol::OpError::decided_first(
                    call, &winner,
                )));
            }
        }
    }
    let (seen, now) = moved.unwrap_or_default();
    Err(Refused::Op(crate::protocol::OpError::Moved { seen, now }))
}

/// A stored run and its rebuilt machine, to check an op against (`op.run_finished` when the run
/// has finished, compacted runs included).
fn load_checkable(
    store: &dyn crate::store::RunStore,
    id: &str,
) -> Result<(crate::store::StoredRun, Rebuilt), Refused> {
    let stored = match store.load(id) {
        // Only finished runs are compacted.
        Err(crate::store::StoreError::Compacted { .. }) => {
            let status = store.compacted(id).map_err(RunsError::from)?.map_or_else(
                || "finished".into(),
                |c| c.result.status.as_str().to_string(),
            );
            return Err(Refused::Op(crate::protocol::OpError::RunFinished {
                status,
            }));
        }
        other => other.map_err(RunsError::from)?,
    };
    if let Some(r) = &stored.result {
        return Err(Refused::Op(crate::protocol::OpError::RunFinished {
            status: r.status.as_str().to_string(),
        }));
    }
    let rb = rebuild(&stored.record, &stored.journal)?;
    Ok((stored, rb))
}
