//! Runs as Temporal workflows (feature `temporal`): scale-out on Temporal's own server.
//!
//! A run is one workflow ([`RunWorkflow`]) whose code is the same sans-IO [`RunMachine`] the
//! embedded engine drives; the workflow performs its actions with Temporal's primitives: each
//! model turn and each call is an activity ([`DagloopActivities`]), timers are workflow timers,
//! the time is the workflow's. The model activity signals every input its stream makes as the
//! stream goes (a call starts while the model still writes, rule 9); decisions are workflow
//! updates, refused by a validator when they do not apply (rule 21); cancelling the run is
//! cancelling the workflow; a query returns the run's journal, from which `show` describes it
//! with the embedded engine's own code. Workers are `dagloop worker` processes, or a program's
//! own ([`run_worker`], with its Rust activities registered).
//!
//! A worker that dies loses nothing: Temporal keeps the workflow's history; a call whose
//! activity was lost is fed to the machine as [`RunInput::Interrupted`](crate::machine::RunInput)
//! (re-run when its tool is `_idempotent`, with the run's idempotency key, else presented to a
//! reviewer again), and a model turn whose activity was lost is asked again, the inputs it had
//! already signalled not taken twice.
//!
//! Deliberately not here: any decision about a run (the machine's), the run store (Temporal's
//! history is the record), and terminal or HTTP front-ends.
//!
//! [`RunMachine`]: crate::machine::RunMachine

mod activities;
mod client;
mod perform;
mod workflow;

pub use activities::DagloopActivities;
pub use client::{Connection, WorkerOptions, replay, run_worker, run_worker_with};
pub use workflow::{Described, EVENT_PAGE, EventPage, RunWorkflow, Snapshot, TurnItem};

/// The task queue runs and workers use unless told otherwise.
pub const DEFAULT_TASK_QUEUE: &str = "dagloop";

/// The namespace used unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Everything a workflow and its activities need to know of a run: the run's record, the very
/// type the store keeps ([`crate::store::RunRecord`]: one record of a run, whichever engine
/// runs it). Activities define the run from it; the workflow builds the machine from it.
pub type RunSpec = crate::store::RunRecord;

/// What went wrong talking to Temporal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemporalError {
    /// The server could not be reached.
    #[error("cannot reach Temporal at {address}: {reason}")]
    Connect {
        /// Where it was looked for.
        address: String,
        /// What failed.
        reason: String,
    },
    /// The server or the SDK refused a request.
    #[error("Temporal refused to {what}: {reason}")]
    Request {
        /// What was asked.
        what: &'static str,
        /// What it said.
        reason: String,
    },
    /// No run (workflow) has this id.
    #[error("no run `{run}` on Temporal")]
    UnknownRun {
        /// The id.
        run: String,
    },
    /// The workflow ended without a result (terminated, timed out, or failed).
    #[error("run `{run}` ended without a result: {reason}")]
    NoResult {
        /// The id.
        run: String,
        /// How it ended.
        reason: String,
    },
    /// An op was refused by the run (rule 21).
    #[error("{message}")]
    Refused {
        /// The op's stable code (`op.not_awaiting`...).
        code: String,
        /// Why.
        message: String,
    },
    /// The worker could not start.
    #[error("the worker failed: {reason}")]
    Worker {
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(TemporalError);

impl TemporalError {
    /// A stable code.
    pub fn code(&self) -> &str {
        match self {
            TemporalError::Connect { .. } => "temporal.connect",
            TemporalError::Request { .. } => "temporal.request",
            TemporalError::UnknownRun { .. } => "temporal.unknown_run",
            TemporalError::NoResult { .. } => "temporal.no_result",
            TemporalError::Refused { code, .. } => code,
            TemporalError::Worker { .. } => "temporal.worker",
        }
    }
}
