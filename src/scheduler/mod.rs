//! The inner loop (rules 3, 5–14) as a sans-IO state machine.
//!
//! [`Scheduler::handle`] takes one [`Input`] (a call arrived, the stream closed, a reviewer
//! decided, an activity finished, cancel) and the current time, updates the pending-call graph
//! and state, and returns [`Action`]s (ask, launch, abort, publish an event, drained). It spawns
//! nothing, reads no clock and iterates no hash map, so the same inputs always give the same
//! actions: every rule is testable without timing, and a step can be replayed from its inputs.
//!
//! Work is incremental: when a call finishes, only the waiting readers of the paths it could
//! write are looked at again, and a reader that was blocked re-checks the paths it waited on,
//! starting where it left off, before resolving its params in full.
//!
//! Deliberately not here: running activities, timers, the approval conversation (the run's
//! machine and driver, `machine` and `engine`), or deciding what the model sees next (the outer
//! loop turns the [`StepReport`] into plan and observations).

mod complete;
mod core;
mod gate;
mod resolve;
mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

pub use types::{
    Action, CallReport, CallStatus, EditError, Input, Outcome, OutcomeKind, Parsed,
    SchedulerError, StepReport, UnreadableCall, ValidationError,
};

use crate::approval::Policy;
use crate::fxhash::FxHashMap;
use crate::graph::{CallGraph, PathId};
use crate::protocol::{Call, CallId, Expression, Millis, Tool};
use crate::state::State;

/// Checks a call's resolved params (the params object, meta keys such as `_output` included)
/// against its tool before it is presented or launched (typically JSON Schema validation); an
/// `Err` refuses the call with that reason. The params are handed over as one JSON object, so a
/// validator checks them in place, with no copy.
pub type Validator = Arc<dyn Fn(&Tool, &Value) -> Result<(), ValidationError> + Send + Sync>;

/// How a scheduler is set up for one step.
#[derive(Clone, Default)]
pub struct SchedulerOptions {
    /// The step (Request number), stamped on events.
    pub step: u32,
    /// Optional params check run on every call once its references are resolved.
    pub validate: Option<Validator>,
    /// Optional check of a latent call's `_output` against its tool's `_output` schema (rule
    /// 20); an `Err` fails the call and nothing is written.
    pub validate_latent: Option<Validator>,
    /// Keep a copy of each launched call while it runs, so that it can be re-presented or
    /// re-launched if the run is rebuilt after a stop (`Input::Interrupted`). Off on the hot
    /// path of a fresh run; a rebuilt run turns it on before replaying its journal.
    pub keep_launched: bool,
}

impl std::fmt::Debug for SchedulerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerOptions")
            .field("step", &self.step)
            .field("validate", &self.validate.is_some())
            .field("validate_latent", &self.validate_latent.is_some())
            .field("keep_launched", &self.keep_launched)
            .finish()
    }
}

#[derive(Debug, Clone)]
struct ToolEntry {
    tool: Arc<Tool>,
    detached: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Asking,
    Running,
    Done(CallStatus),
}

#[derive(Debug)]
struct Entry {
    id: CallId,
    written: Option<Arc<Call>>,
    revised: Option<Box<Call>>,
    tool: Option<ToolEntry>,
    target: Option<Expression>,
    phase: Phase,
    /// A reviewer already approved (edit/replace): launch without asking again.
    approved: bool,
    /// A decision (or the timeout default) was applied to this call.
    decided: bool,
    /// A `blocked` event was published for the current blocking episode.
    announced: bool,
    /// The paths the call waited on at its last full check; `watch` is the first that may still
    /// be blocking.
    waiting_on: Vec<resolve::RefAt>,
    watch: usize,
    /// The resolved call shown to the reviewer.
    presented: Option<Arc<Call>>,
    /// It is presented because a restart interrupted it (it may be marked done).
    interrupted: bool,
    /// The references in the current call's params, parsed once.
    refs: resolve::Refs,
    /// The ids in the graph's path table of every path the references may read (in the order
    /// of `refs`, alternatives in order), then of every path the output target may write:
    /// interned once, when the call is accepted.
    paths: Vec<PathId>,
    /// How many of `paths` are reads.
    reads: usize,
    /// The result (status done) or the error object (any other finished status), shared with
    /// the state and the call's events.
    value: Option<Arc<Value>>,
    /// The calls whose writes its params were resolved from (named by `started`).
    read_from: Vec<CallId>,
}

impl Entry {
    fn current(&self) -> Option<&Call> {
        self.revised.as_deref().or(self.written.as_deref())
    }
}

/// The inner loop of one step. See the module docs.
#[derive(Debug)]
pub struct Scheduler {
    state: State,
    tools: BTreeMap<String, ToolEntry>,
    policy: Policy,
    opts: SchedulerOptions,
    graph: CallGraph,
    entries: Vec<Entry>,
    /// Where each call's entry sits (ids are allocated by the caller, unique across the run).
    index: FxHashMap<CallId, usize>,
    stream_open: bool,
    cancelled: bool,
    drained: bool,
    waiting: usize,
    asking: usize,
    running: usize,
    recheck: BTreeSet<CallId>,
    resolutions: u64,
    /// Return after each launch while calls still wait to be checked ([`Scheduler::set_eager`]).
    eager: bool,
}

/// True when the tool declares its calls safe to run twice (`"_idempotent": true`): a call
/// interrupted by a crash is then retried without asking.
pub fn is_idempotent(tool: &Tool) -> bool {
    tool.schema.get("_idempotent").and_then(Value::as_bool) == Some(true)
}

/// True when the tool is marked fire-and-forget (`"_detached": true` in its definition).
pub fn is_detached(tool: &Tool) -> bool {
    tool.schema.get("_detached").and_then(Value::as_bool) == Some(true)
}

impl Scheduler {
    /// A scheduler for one step over `state`, with the run's tools and approval policy.
    /// A tool is fire-and-forget when its definition has `"_detached": true` (rule 11).
    pub fn new(
        state: State,
        tools: impl IntoIterator<Item = Tool>,
        policy: Policy,
        opts: SchedulerOptions,
    ) -> Self {
        let tools = tools
            .into_iter()
            .map(|t| {
                let detached = is_detached(&t);
                (
                    t.name.clone(),
                    ToolEntry {
                        tool: Arc::new(t),
                        detached,
                    },
                )
            })
            .collect();
        Scheduler {
            state,
            tools,
            policy,
            opts,
            graph: CallGraph::new(),
            entries: Vec::new(),
            index: FxHashMap::default(),
            stream_open: true,
            cancelled: false,
            drained: false,
            waiting: 0,
            asking: 0,
            running: 0,
            recheck: BTreeSet::new(),
            resolutions: 0,
            eager: false,
        }
    }

    /// Handles one input at time `now`; returns what to do.
    pub fn handle(&mut self, input: Input, now: Millis) -> Vec<Action> {
        let mut out = Vec::new();
        self.handle_into(input, now, &mut out);
        out
    }

    /// Like [`Scheduler::handle`], appending the actions to `out` (to reuse one buffer).
    pub fn handle_into(&mut self, input: Input, now: Millis, out: &mut Vec<Action>) {
        if self.drained {
            return;
        }
        match input {
            Input::CallArrived { id, call, parsed } => self.arrive(id, call, parsed, now, out),
            Input::StreamClosed => self.close(),
            Input::Decided { id, decision } => self.decided(id, decision, false, now, out),
            Input::ApprovalTimedOut { id } => self.timed_out(id, now, out),
            Input::Finished { id, outcome } => self.finished(id, outcome, now, out),
            Input::Cancel => self.cancel(out),
            Input::Interrupted { id } => self.interrupted(id, out),
            Input::Settle => {}
        }
        self.settle(now, out);
    }

    /// With `eager`, handling an input returns right after a call is launched while other calls
    /// still wait to be checked ([`Scheduler::unsettled`]), so the caller can start that
    /// activity before the rest are checked; [`Input::Settle`] goes on where it stopped. The
    /// inputs, and what they lead to, are the same either way: only where the output is cut
    /// differs.
    pub fn set_eager(&mut self, eager: bool) {
        self.eager = eager;
    }

    /// True when handling stopped after a launch with calls still to check (eager only):
    /// [`Input::Settle`] must come before any other input.
    pub fn unsettled(&self) -> bool {
        self.eager && !self.drained && !self.recheck.is_empty()
    }

    /// The state as it stands.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Gives the state back (at the end of the step).
    pub fn into_state(self) -> State {
        self.state
    }

    /// The calls whose activities are running, in arrival order.
    pub fn running(&self) -> Vec<CallId> {
        self.entries
            .iter()
            .filter(|e| e.phase == Phase::Running)
            .map(|e| e.id)
            .collect()
    }

    /// The step number given in the options.
    pub fn step(&self) -> u32 {
        self.opts.step
    }

    /// How many calls arrived so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True before the first call arrives.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The call as presented to a reviewer, while it awaits a decision.
    pub fn awaiting(&self, id: CallId) -> Option<&Call> {
        let e = &self.entries[self.ix(id)?];
        match e.phase {
            Phase::Asking => e.presented.as_deref(),
            _ => None,
        }
    }

    /// What a call of this step is doing, in words (`blocked`, `awaiting approval`, `running`,
    /// or its final status); None for an id this step never saw.
    pub fn status_of(&self, id: CallId) -> Option<String> {
        let e = &self.entries[self.ix(id)?];
        Some(match e.phase {
            Phase::Waiting => "blocked".into(),
            Phase::Asking => "awaiting approval".into(),
            Phase::Running => "running".into(),
            Phase::Done(s) => s.as_str().to_string(),
        })
    }

    /// The call as it stands (a reviewer's revision, else as written).
    pub fn call_of(&self, id: CallId) -> Option<&Call> {
        self.entries[self.ix(id)?].current()
    }

    /// True once [`Action::Drained`] was emitted.
    pub fn is_drained(&self) -> bool {
        self.drained
    }

    /// Calls waiting on references, waiting for a reviewer, and running.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.waiting, self.asking, self.running)
    }

    /// How many times a waiting call's params were resolved in full so far (a measure of the
    /// scheduler's work: it grows with the number of calls and edges, never quadratically).
    pub fn resolutions(&self) -> u64 {
        self.resolutions
    }

    /// The pending-call graph (read-only, for inspection and tests).
    pub fn graph(&self) -> &CallGraph {
        &self.graph
    }

    /// What became of every call so far, in arrival order.
    pub fn report(&self) -> StepReport {
        StepReport {
            calls: self
                .entries
                .iter()
                .map(|e| report_of(e, e.clone_parts()))
                .collect(),
        }
    }

    /// Ends the step: the final state and the report, moving (not copying) what the calls hold.
    pub fn finish(self) -> (State, StepReport) {
        let Scheduler {
            state,
            entries,
            graph,
            ..
        } = self;
        drop(graph);
        let calls = entries
            .into_iter()
            .map(|mut e| {
                let parts = (
                    e.written.take(),
                    e.revised.take().map(|c| *c),
                    e.value.take(),
                );
                report_of(&e, parts)
            })
            .collect();
        (state, StepReport { calls })
    }
}

type Parts = (Option<Arc<Call>>, Option<Call>, Option<Arc<Value>>);

impl Entry {
    fn clone_parts(&self) -> Parts {
        (
            self.written.clone(),
            self.revised.as_deref().cloned(),
            self.value.clone(),
        )
    }
}

fn report_of(e: &Entry, (call, revised, value): Parts) -> CallReport {
    let status = match e.phase {
        Phase::Waiting | Phase::Asking => CallStatus::Pending,
        Phase::Running => CallStatus::Running,
        Phase::Done(s) => s,
    };
    let missing = match (&value, status) {
        (Some(v), CallStatus::Unresolved) => v["details"]["missing"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let (result, error) = match status {
        CallStatus::Done => (value, None),
        _ => (None, value),
    };
    CallReport {
        id: e.id,
        call,
        revised,
        status,
        result,
        error,
        missing,
    }
}

#[cfg(test)]
mod tests;
