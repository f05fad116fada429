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

mod access;
mod activities;
mod carry;
mod client;
mod perform;
mod workflow;

use serde::{Deserialize, Serialize};

/// Types this module's API reaches (a run's options, what defining it may fail with, the
/// webhook a worker posts to), nameable here whatever other features are on.
pub use crate::notify::{NotifyError, WebhookConfig};
pub use crate::runs::{DefRecord, ForkedFrom, RunOptions, RunsError, SessionOf};
pub use access::{API_KEY_ENV, Access};
pub use activities::DagloopActivities;
pub use carry::Chunked;
pub use client::{Connection, WorkerOptions, replay, run_worker, run_worker_with};
pub use workflow::{Described, EVENT_PAGE, EventPage, RunWorkflow, Snapshot, TurnItem};

use crate::goal::Goal;

/// The task queue runs and workers use unless told otherwise.
pub const DEFAULT_TASK_QUEUE: &str = "dagloop";

/// The namespace used unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Everything a workflow and its activities need to know of a run: the run's record — the very
/// type the store keeps ([`crate::store::RunRecord`]: one record of a run, whichever engine runs
/// it), flattened so its fields are the spec's — and what only a workflow needs besides: how far
/// its history may grow, what an earlier execution carried over, where notifications link to.
/// Activities define the run from the record; the workflow builds the machine from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The run's record (its id is the workflow's).
    #[serde(flatten)]
    pub record: crate::store::RunRecord,
    /// How long its workflow history and event log may grow (see [`Bounds`]).
    #[serde(default)]
    pub bounds: Bounds,
    /// What an earlier execution of the run handed over when it continued as new; taken out
    /// by the workflow as it starts (activities never see it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<Carried>,
    /// Set when the process that started the run has a webhook (`notify.webhook`): the
    /// reviewer page's address its notifications link to. Each `approval_requested` then
    /// becomes a `notify` activity, posted by a worker to its own config's webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_page: Option<String>,
    /// For a run submitted with an `Idempotency-Key` (its workflow id derived from the key):
    /// the SHA-256 of the submission, so that the key reused with another body is told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_digest: Option<String>,
}

impl std::ops::Deref for RunSpec {
    type Target = crate::store::RunRecord;
    fn deref(&self) -> &Self::Target {
        &self.record
    }
}

/// How far a run's workflow may grow: past `history_events` events in its history it
/// continues as new (at the first moment no activity is running), and its `events` query keeps
/// the last `events_kept` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    /// Continue as new once the history holds this many events (Temporal's own suggestion to
    /// continue, well below its hard limit, counts too).
    pub history_events: u32,
    /// How many of the run's latest events the workflow keeps for readers.
    pub events_kept: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            history_events: 10_000,
            events_kept: 2_048,
        }
    }
}

impl Bounds {
    /// The defaults, each overridden by its environment variable when set to a number
    /// (`DAGLOOP_TEMPORAL_HISTORY_EVENTS`, `DAGLOOP_TEMPORAL_EVENTS_KEPT`): read by the process
    /// that starts a run, never by the workflow.
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|n| *n > 0)
        };
        let d = Bounds::default();
        Bounds {
            history_events: var("DAGLOOP_TEMPORAL_HISTORY_EVENTS").unwrap_or(d.history_events),
            events_kept: var("DAGLOOP_TEMPORAL_EVENTS_KEPT").unwrap_or(d.events_kept),
        }
    }
}

/// What a run's execution hands to the next when it continues as new: its whole journal (the
/// next execution replays it into the same machine and the same events), inline or, past
/// [`carry`]'s size, as chunks the next execution pulls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Carried {
    /// Every input the run consumed so far.
    pub journal: Vec<crate::machine::JournalEntry>,
    /// True for a fork's first execution (the original's journal prefix, [`crate::runs::fork`]):
    /// the machine is told [`crate::machine::RunInput::Resumed`] once rebuilt, so the model turn
    /// the prefix ends asking for is asked, as a resumed run's is. False when a run continues
    /// as new (nothing was running then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resume: bool,
    /// Set when the journal was too large to carry inline (`journal` is then empty): the next
    /// execution pulls it in chunks from the previous one and checks it against this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunked: Option<Chunked>,
}

impl RunSpec {
    /// The spec of a new run of `goal` with `options`, under `run_id`.
    pub fn new(run_id: impl Into<String>, goal: &Goal, options: RunOptions) -> Self {
        RunSpec::of_record(crate::store::RunRecord::new(run_id, goal, options))
    }

    /// The spec of a defined run (see [`crate::store::RunRecord`]'s `of_def`), under `run_id`.
    #[cfg(any(feature = "cli", feature = "server"))]
    pub(crate) fn of_def(run_id: impl Into<String>, def: &crate::runs::RunDef) -> Self {
        RunSpec::of_record(crate::store::RunRecord::of_def(run_id, def))
    }

    /// The spec of a fork ([`crate::runs::fork`]) defined as `def`: the fork's id, with the
    /// original's journal prefix carried in, replayed and resumed by the workflow as the
    /// embedded engine resumes a seeded fork.
    #[cfg(any(feature = "cli", feature = "server"))]
    pub(crate) fn of_fork(def: &crate::runs::RunDef, fork: &crate::runs::Fork) -> Self {
        let mut spec = RunSpec::of_def(fork.record.id.clone(), def);
        spec.carried = Some(Carried {
            journal: fork.journal.clone(),
            resume: true,
            chunked: None,
        });
        spec
    }

    /// The spec of a run with this record, bounded as the environment says
    /// ([`Bounds::from_env`]), nothing carried over, no webhook, no key.
    pub fn of_record(record: crate::store::RunRecord) -> Self {
        RunSpec {
            record,
            bounds: Bounds::from_env(),
            carried: None,
            notify_page: None,
            body_digest: None,
        }
    }
}

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
