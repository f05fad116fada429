//! The run as a Temporal workflow: the machine inside, its actions performed with workflow
//! primitives, one workflow timer armed for the machine's next deadline. Everything here is
//! deterministic: the time is the workflow's, maps are ordered, and the order inputs reach the
//! machine is the order Temporal delivered them in.
//!
//! Versions: a history recorded before the [`TIMERS_PATCH`] patch (when the machine announced
//! each timer setting as an action and the workflow armed one workflow timer per setting)
//! replays the way it was recorded: `ctx.patched` says which a history is. So does one recorded
//! before the [`RESULT_BOUND_PATCH`] patch (when the workflow handed the machine each tool
//! result whole): its results are not bounded on replay.
// The SDK's macros generate items (activity and handler definitions) that carry no docs.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{FutureExt, select_biased};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ContinueAsNewOptions, LocalActivityOptions, SyncWorkflowContext, WorkflowContext,
    WorkflowContextView, WorkflowResult,
};
use temporalio_workflow::RetryPolicy;

use super::RunSpec;
use super::perform::Performer;
use crate::machine::{
    Action, FrameKey, JournalEntry, RunError, RunInput, RunMachine, RunResult, TimerSetting,
};
use crate::protocol::{Event, Op, OpError};

/// The patch (Temporal's workflow versioning) under which the workflow arms one workflow timer
/// for the machine's next deadline; a history without its marker arms one per timer setting.
pub(super) const TIMERS_PATCH: &str = "timers-in-machine";

/// The patch under which the workflow bounds what the run keeps of tool results (each call
/// launched with its budget, each outcome admitted before the machine sees it); a history
/// without its marker handed the machine every result whole. Never renamed: recorded
/// histories carry the name.
pub(super) const RESULT_BOUND_PATCH: &str = "result-bound";

/// How long a worker may go silent before its activity counts as lost.
pub(super) const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often activities say they are alive.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// One input a model activity read from its stream, numbered within its turn.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnItem {
    /// The agent.
    pub frame: FrameKey,
    /// The turn (the agent's step).
    pub step: u32,
    /// Its position in the turn, from 0.
    pub index: usize,
    /// The input.
    pub input: RunInput,
}

/// What a query returns: the run's spec, its journal so far and its result once it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The run.
    pub spec: RunSpec,
    /// Every input the machine consumed, in order.
    pub journal: Vec<JournalEntry>,
    /// The result, once the run ended.
    pub result: Option<RunResult>,
}

/// What `dagloop show` prints of a run, computed inside the workflow from its journal by the
/// same code as for a stored run: status, steps, the calls with their decisions, errors and
/// timings, the critical path, state and output. Small, whatever the journal's length.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Described {
    /// The description (`runs::describe`); null when the run could not be described.
    pub description: Value,
    /// Why it could not be: `{code, message}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// How many inputs the journal holds.
    pub journal_entries: usize,
    /// The result, once the run ended.
    pub result: Option<RunResult>,
}

/// How far a model turn's signals got.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnMark {
    pub(super) step: u32,
    pub(super) received: usize,
    pub(super) open: bool,
}

/// A run of dagloop as a workflow. See the module docs.
#[workflow]
pub struct RunWorkflow {
    pub(super) spec: RunSpec,
    /// None when the spec did not make a machine: the run then ended at once,
    /// [`crate::machine::RunStatus::SetupFailed`] (its result is set).
    pub(super) machine: Option<RunMachine>,
    /// Inputs that arrived by signal or update, waiting for the main loop.
    pub(super) inbox: Vec<RunInput>,
    pub(super) turns: BTreeMap<FrameKey, TurnMark>,
    pub(super) journal: Vec<JournalEntry>,
    pub(super) result: Option<RunResult>,
    /// The run's latest events as the machine emitted them (ephemeral ones left out), at
    /// most `spec.bounds.events_kept` of them, for the `events` query: any server reads them
    /// by sequence range.
    pub(super) events: Vec<Event>,
    /// The highest sequence number no longer kept in `events` (0: none dropped).
    pub(super) dropped_through: u64,
    /// True when this execution continues an earlier one (its journal was carried over).
    pub(super) continued: bool,
    /// The previous execution's run id and the plan of the journal to pull from it, until
    /// pulled (`carry`).
    pub(super) pull: Option<(String, super::Chunked)>,
}

/// The most events one `events` query returns.
pub const EVENT_PAGE: usize = 256;

/// What the `events` query returns: the events after a sequence number (at most
/// [`EVENT_PAGE`]), and whether the run has ended (then nothing follows the last page).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventPage {
    /// Events with `seq` above the one asked for, in order.
    pub events: Vec<Event>,
    /// True once the run ended: with an empty page, the stream is over.
    pub finished: bool,
    /// The highest sequence number the workflow no longer keeps (0: it keeps them all). A
    /// reader that asked for events after an earlier one missed those in between.
    #[serde(default)]
    pub dropped_through: u64,
}

#[workflow_methods]
impl RunWorkflow {
    #[init]
    fn new(ctx: &WorkflowContextView, mut spec: RunSpec) -> Self {
        let carried = spec.carried.take();
        // A fork's first execution is told it resumes (its first input after the prefix).
        let resume = carried.as_ref().is_some_and(|c| c.resume);
        // A journal too large to carry is pulled from the previous execution first (`run`).
        let pull = carried
            .as_ref()
            .and_then(|c| c.chunked.clone())
            .map(|plan| {
                let from = ctx.continued_from_run_id().unwrap_or_default().to_string();
                (from, plan)
            });
        let journal = carried.map(|c| c.journal).unwrap_or_default();
        let continued = !journal.is_empty() || pull.is_some();
        let (machine, result, events) = if pull.is_some() {
            (None, None, Vec::new())
        } else if continued {
            match continue_from(&spec, &journal) {
                Ok((m, events)) => (Some(m), None, events),
                Err(e) => (
                    None,
                    Some(RunResult::setup_failed(&RunError::new(
                        e.code(),
                        e.to_string(),
                    ))),
                    Vec::new(),
                ),
            }
        } else {
            let (m, r) = set_up(&spec);
            (m, r, Vec::new())
        };
        let mut w = RunWorkflow {
            spec,
            machine,
            inbox: match resume {
                true => vec![RunInput::Resumed],
                false => Vec::new(),
            },
            turns: BTreeMap::new(),
            journal,
            result,
            events,
            dropped_through: 0,
            continued,
            pull,
        };
        w.trim_events();
        w
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<RunResult> {
        if let Some((from, plan)) = ctx.state(|s| s.pull.clone()) {
            let pulled = super::carry::pull(ctx, &from, &plan).await;
            ctx.state_mut(|s| s.install(pulled, &plan));
        }
        if let Some(r) = ctx.state(|s| s.machine.is_none().then(|| s.result.clone()).flatten()) {
            return Ok(r);
        }
        // A history recorded before the patch kept every result whole.
        let bounded = ctx.patched(RESULT_BOUND_PATCH);
        let mut p = Performer {
            bound: bounded.then(|| ctx.state(|s| result_bound(&s.spec, &s.journal))),
            ..Performer::default()
        };
        let mut inputs = Vec::new();
        // A history recorded before the patch arms a workflow timer per timer setting.
        let per_setting = !ctx.patched(TIMERS_PATCH);
        if per_setting {
            ctx.state_mut(|s| {
                if let Some(m) = s.machine.as_mut() {
                    m.log_timer_settings();
                }
            });
        }
        if ctx.state(|s| s.continued) {
            // A continued run: the machine was rebuilt from the carried journal, nothing was
            // running when the last execution ended; only its timers wait (the next deadline
            // is armed after the first feed, or each timer here for an old history).
            let now = now_ms(ctx);
            if per_setting {
                let timers =
                    ctx.state(|s| s.machine.as_ref().map(|m| m.timers().collect::<Vec<_>>()));
                for (timer, at) in timers.unwrap_or_default() {
                    p.arm(ctx, Some(timer), at, now);
                }
            }
        } else {
            inputs.push(RunInput::Start);
        }
        let mut cancel_seen = false;
        loop {
            let now = now_ms(ctx);
            inputs.extend(p.ready_closes(ctx));
            let (actions, settings) = ctx.state_mut(|s| s.feed(std::mem::take(&mut inputs), now));
            p.perform_all(ctx, actions, settings, now);
            if !per_setting {
                let next = ctx.state(|s| s.machine.as_ref().and_then(RunMachine::poll_timeout));
                p.wake_at(ctx, next, now);
            }
            if let Some(r) = ctx.state(|s| s.result.clone()) {
                report(ctx).await;
                return Ok(r);
            }
            // A long run continues as new once its history is long, at a moment nothing runs
            // (so nothing in flight is lost) and nothing waits in the inbox: the next execution
            // gets the journal and rebuilds the same machine and events from it.
            let long = ctx.state(|s| s.spec.bounds.history_events) <= ctx.history_length()
                || ctx.continue_as_new_suggested();
            if long && !cancel_seen && p.quiet() && ctx.state(|s| s.inbox.is_empty()) {
                let next = ctx.state(|s| s.carry());
                ctx.continue_as_new(next, ContinueAsNewOptions::default())?;
            }
            let idle = p.pending.is_empty();
            let done = {
                let mut next = if idle {
                    futures::future::pending().boxed_local()
                } else {
                    p.pending.next().map(Some).boxed_local()
                }
                .fuse();
                let cancelled = ctx.cancelled().fuse();
                let mail = ctx.wait_condition(|s: &Self| !s.inbox.is_empty()).fuse();
                futures::pin_mut!(cancelled, mail);
                select_biased! {
                    reason = cancelled => {
                        if cancel_seen { None } else {
                            cancel_seen = true;
                            inputs.push(RunInput::Cancel {
                                reason: reason.unwrap_or_else(|| "the workflow was cancelled".into()),
                                by: None,
                            });
                            None
                        }
                    }
                    _ = mail => None,
                    d = next => d,
                }
            };
            inputs.extend(ctx.state_mut(|s| std::mem::take(&mut s.inbox)));
            if let Some(d) = done {
                p.done(ctx, d, &mut inputs);
            }
        }
    }

    /// A model activity read an input from its stream.
    #[signal]
    pub fn turn_input(&mut self, _ctx: &mut SyncWorkflowContext<Self>, item: TurnItem) {
        let Some(mark) = self.turns.get_mut(&item.frame) else {
            return;
        };
        // Inputs of a closed or earlier turn, and those an earlier attempt already sent, are
        // dropped; a later one cannot come before its predecessors (the activity signals in
        // order, waiting for each).
        if !mark.open || mark.step != item.step || item.index != mark.received {
            return;
        }
        mark.received += 1;
        self.inbox.push(item.input);
    }

    #[update_validator(decide)]
    fn validate_decide(
        &self,
        _ctx: &WorkflowContextView,
        op: &Op,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if matches!(op, Op::Cancel { .. }) {
            return Err(
                "decisions, standing approvals and revokes are updates: cancel the workflow to cancel the run"
                    .into(),
            );
        }
        if let Some(r) = &self.result {
            return Err(format!(
                "op.run_finished: the run has finished ({})",
                r.status.as_str()
            )
            .into());
        }
        let refused = |e: OpError| format!("{}: {e}", e.code()).into();
        match &self.machine {
            Some(m) => {
                let bound = m.bind_op(op.clone()).map_err(refused)?;
                match self.pending_winner(&bound) {
                    Some(e) => Err(refused(e)),
                    None => Ok(()),
                }
            }
            None => Err("op.unavailable: the run could not be set up".into()),
        }
    }

    /// A reviewer's decision, standing approval or revocation (checked by the validator first: rule 21).
    /// A cancellation goes through the workflow's cancellation instead.
    #[update]
    pub fn decide(&mut self, _ctx: &mut SyncWorkflowContext<Self>, op: Op) -> bool {
        match op {
            Op::Cancel { .. } => false,
            op => {
                // Bound to the presentation its validator saw, as the store binds an op it
                // records (`RunMachine::bind_op`).
                let op = match &self.machine {
                    Some(m) => m.bind_op(op.clone()).unwrap_or(op),
                    None => op,
                };
                self.inbox.push(RunInput::from_op(op));
                true
            }
        }
    }

    /// The run's spec, journal and result.
    /// The run described as `dagloop show` describes it (see [`Described`]).
    #[query]
    pub fn describe(&self, _ctx: &WorkflowContextView) -> Described {
        let (description, error) = match crate::runs::rebuild(&self.spec, &self.journal) {
            Ok(rb) => (
                crate::runs::describe(
                    &self.spec.id,
                    &rb,
                    self.journal.len(),
                    self.result.as_ref(),
                    self.result.is_none(),
                ),
                None,
            ),
            Err(e) => (
                Value::Null,
                Some(json!({"code": e.code(), "message": e.to_string()})),
            ),
        };
        Described {
            description,
            error,
            journal_entries: self.journal.len(),
            result: self.result.clone(),
        }
    }

    /// The run's events after sequence number `after` (at most [`EVENT_PAGE`]).
    #[query]
    pub fn events(&self, _ctx: &WorkflowContextView, after: u64) -> EventPage {
        let from = self.events.partition_point(|e| e.seq <= after);
        EventPage {
            events: self.events[from..]
                .iter()
                .take(EVENT_PAGE)
                .cloned()
                .collect(),
            finished: self.result.is_some(),
            dropped_through: self.dropped_through,
        }
    }

    /// The run's spec, whole journal and result.
    /// Chunk `index` of the journal, for the next execution when it was too large to carry
    /// (`carry`).
    #[query]
    pub fn carried_chunk(&self, _ctx: &WorkflowContextView, index: u32) -> Vec<JournalEntry> {
        super::carry::chunk(&self.journal, index)
    }

    #[query]
    pub fn snapshot(&self, _ctx: &WorkflowContextView) -> Snapshot {
        Snapshot {
            spec: self.spec.clone(),
            journal: self.journal.clone(),
            result: self.result.clone(),
        }
    }
}

impl RunWorkflow {
    /// The spec the next execution starts from: this one's, with the journal carried.
    fn carry(&self) -> RunSpec {
        let mut next = self.spec.clone();
        next.carried = Some(super::carry::carry(&self.journal));
        next
    }

    /// Rebuilds the machine and events from the journal pulled from the previous execution
    /// (`carry`), or ends the run set up failed when it could not be pulled whole.
    fn install(&mut self, pulled: Result<Vec<JournalEntry>, String>, plan: &super::Chunked) {
        self.pull = None;
        let built = pulled
            .and_then(|j| match super::carry::matches(plan, &j) {
                true => Ok(j),
                false => Err("the journal pulled does not match its digest".into()),
            })
            .and_then(|j| {
                continue_from(&self.spec, &j)
                    .map(|(m, events)| (j, m, events))
                    .map_err(|e| e.to_string())
            });
        match built {
            Ok((journal, machine, events)) => {
                self.journal = journal;
                self.machine = Some(machine);
                self.events = events;
                self.trim_events();
            }
            Err(reason) => {
                self.result = Some(RunResult::setup_failed(&RunError::new(
                    "temporal.carried",
                    format!(
                        "the run's journal could not be carried to its next execution: {reason}"
                    ),
                )));
            }
        }
    }

    /// Drops the oldest events past `spec.bounds.events_kept`, remembering the last dropped.
    fn trim_events(&mut self) {
        let keep = usize::try_from(self.spec.bounds.events_kept.max(1)).unwrap_or(usize::MAX);
        // Trimmed in batches, so that a long run does not shift the log at every event.
        if self.events.len() <= keep.saturating_add(keep / 4) {
            return;
        }
        let cut = self.events.len() - keep;
        if let Some(last) = self.events.get(cut - 1) {
            self.dropped_through = last.seq;
        }
        self.events.drain(..cut);
    }

    /// A decision already accepted (an update taken, not yet fed to the machine) for the same
    /// presentation of the same call as `op`: `op.already_decided`, naming it. The machine
    /// refuses decisions it has seen ([`RunMachine::check_op`]); this covers those still in
    /// the inbox, so of two concurrent updates exactly one is accepted.
    fn pending_winner(&self, op: &Op) -> Option<OpError> {
        let Op::Decide {
            call, presentation, ..
        } = op
        else {
            return None;
        };
        self.inbox.iter().find_map(|i| match i {
            RunInput::Decided {
                call: c,
                decision,
                by,
                presentation: p,
            } if c == call && p == presentation => Some(OpError::AlreadyDecided {
                call: *call,
                decision: decision.name().into(),
                by: by.as_ref().map(|b| b.principal.clone()),
            }),
            _ => None,
        })
    }

    /// Journals `inputs` and hands them to the machine; returns what it asks for, and the
    /// timer settings it logged (only for a history from before [`TIMERS_PATCH`]).
    fn feed(&mut self, inputs: Vec<RunInput>, now: u64) -> (Vec<Action>, Vec<TimerSetting>) {
        let mut out = Vec::new();
        let Some(m) = self.machine.as_mut() else {
            return (out, Vec::new());
        };
        for input in inputs {
            let seq = self.journal.len() as u64 + 1;
            self.journal.push(JournalEntry {
                seq,
                at: now,
                input: input.clone(),
            });
            m.handle_into(input, now, &mut out);
        }
        let settings = m.take_timer_settings();
        for a in &out {
            match a {
                Action::Finished(r) => self.result = Some((**r).clone()),
                Action::Emit(e) if !e.kind.is_ephemeral() => self.events.push(e.clone()),
                _ => {}
            }
        }
        self.trim_events();
        (out, settings)
    }
}

/// The run's machine after `journal` (a continued run's; empty for a new run) and the events
/// the journal produced (ephemeral ones left out), built from its spec alone as
/// [`machine_for`] builds it.
fn continue_from(
    spec: &RunSpec,
    journal: &[JournalEntry],
) -> Result<(RunMachine, Vec<Event>), crate::runs::RunsError> {
    if journal.is_empty() {
        return Ok((machine_for(spec)?, Vec::new()));
    }
    let r = crate::runs::RunDef::from_record(&spec.record)?.replay(&spec.id, journal)?;
    let events = r
        .events
        .into_iter()
        .filter(|e| !e.kind.is_ephemeral())
        .collect();
    Ok((r.machine, events))
}

/// What the run keeps of tool results: its bound, and what its journal (a continued run's
/// carried one) already kept.
fn result_bound(spec: &RunSpec, journal: &[JournalEntry]) -> crate::engine::ResultBound {
    let limit = crate::runs::RunDef::from_record(spec)
        .map_or(crate::engine::DEFAULT_KEPT_RESULT_BYTES, |d| {
            d.kept_result_bytes()
        });
    crate::engine::ResultBound::resumed(limit, journal)
}

/// The run's machine, built from its spec alone (no model, no activity, no environment
/// variable: nothing the workflow must not do), as every reader of a run builds it
/// ([`crate::runs::RunDef::from_record`]).
pub(super) fn machine_for(spec: &RunSpec) -> Result<RunMachine, crate::runs::RunsError> {
    crate::runs::RunDef::from_record(spec)?.machine(&spec.id)
}

/// The run's machine, or the ending of a run whose spec makes none: a goal that does not load
/// (or a record this version cannot read) ends the run [`crate::machine::RunStatus::SetupFailed`], its error's
/// cause saying why, not as a model error.
pub(super) fn set_up(spec: &RunSpec) -> (Option<RunMachine>, Option<RunResult>) {
    match machine_for(spec) {
        Ok(m) => (Some(m), None),
        Err(e) => (
            None,
            Some(RunResult::setup_failed(&RunError::new(
                e.code(),
                e.to_string(),
            ))),
        ),
    }
}

/// Has the run's trace reported by the worker that ends it (a local activity: the journal is
/// not sent to Temporal's server, and a replay does not report it again). Telemetry never
/// fails a run: an error here is ignored.
async fn report(ctx: &mut WorkflowContext<RunWorkflow>) {
    let task = ctx.state(|s| super::activities::TraceTask {
        spec: s.spec.clone(),
        journal: s.journal.clone(),
    });
    let opts = LocalActivityOptions::builder()
        .start_to_close_timeout(Duration::from_secs(30))
        .retry_policy(RetryPolicy::builder().maximum_attempts(1).build())
        .build();
    let _ = ctx
        .execute_local_activity(super::DagloopActivities::report_trace, task, opts)
        .await;
}

pub(super) fn now_ms(ctx: &WorkflowContext<RunWorkflow>) -> u64 {
    ctx.workflow_time()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
