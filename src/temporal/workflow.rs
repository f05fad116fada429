//! The run as a Temporal workflow: the machine inside, its actions performed with workflow
//! primitives. Everything here is deterministic: the time is the workflow's, maps are ordered,
//! and the order inputs reach the machine is the order Temporal delivered them in.
// The SDK's macros generate items (activity and handler definitions) that carry no docs.
#![allow(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::{FutureExt, select_biased};
use serde::{Deserialize, Serialize};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ActivityExecutionError, ActivityOptions, SyncWorkflowContext, WorkflowCancellationToken,
    WorkflowContext, WorkflowContextView, WorkflowResult,
};
use temporalio_workflow::RetryPolicy;

use super::RunSpec;
use super::activities::{CallTask, DagloopActivities, TurnDone, TurnTask};
use crate::engine::config_path;
use crate::machine::{
    Action, AgentConfig, FrameKey, JournalEntry, RunError, RunInput, RunMachine, RunResult,
    RunStatus, Timer, Usage,
};
use crate::protocol::{CallId, Op};
use crate::scheduler::Outcome;

/// How long a worker may go silent before its activity counts as lost.
pub(super) const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often activities say they are alive.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Attempts at a model turn whose worker was lost (each asks the same turn again).
const TURN_ATTEMPTS: u32 = 5;
/// The longest a model turn may take when the goal sets no run time limit.
const TURN_LIMIT: Duration = Duration::from_secs(3600);
/// Added to a call's own time limit (which the activity enforces) before Temporal gives up.
const CALL_GRACE: Duration = Duration::from_secs(60);
/// The longest a call may take when the goal sets no per-call limit.
const CALL_LIMIT: Duration = Duration::from_secs(24 * 3600);

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

/// How far a model turn's signals got.
#[derive(Debug, Clone, Copy)]
struct TurnMark {
    step: u32,
    received: usize,
    open: bool,
}

/// A run of dagloop as a workflow. See the module docs.
#[workflow]
pub struct RunWorkflow {
    spec: RunSpec,
    machine: Option<RunMachine>,
    setup: Option<RunError>,
    /// Inputs that arrived by signal or update, waiting for the main loop.
    inbox: Vec<RunInput>,
    turns: BTreeMap<FrameKey, TurnMark>,
    journal: Vec<JournalEntry>,
    result: Option<RunResult>,
}

/// Something the main loop waited for.
enum Done {
    Turn {
        frame: FrameKey,
        step: u32,
        result: Result<TurnDone, String>,
    },
    Call {
        id: CallId,
        result: Result<Outcome, Lost>,
    },
    Timer {
        timer: Timer,
        generation: u64,
    },
    Nothing,
}

enum Lost {
    Cancelled,
    Failed,
}

#[workflow_methods]
impl RunWorkflow {
    #[init]
    fn new(_ctx: &WorkflowContextView, spec: RunSpec) -> Self {
        let (machine, setup) = match machine_for(&spec) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(RunError::new(e.code(), e.to_string()))),
        };
        RunWorkflow {
            spec,
            machine,
            setup,
            inbox: Vec::new(),
            turns: BTreeMap::new(),
            journal: Vec::new(),
            result: None,
        }
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<RunResult> {
        if let Some(err) = ctx.state(|s| s.setup.clone()) {
            return Ok(failed(err));
        }
        let mut p = Performer::default();
        let mut inputs = vec![RunInput::Start];
        let mut cancel_seen = false;
        loop {
            let now = now_ms(ctx);
            inputs.extend(p.ready_closes(ctx));
            for i in &inputs {
                if let RunInput::Retry { frame, .. } = i {
                    p.count_retry(*frame);
                }
            }
            let actions = ctx.state_mut(|s| s.feed(std::mem::take(&mut inputs), now));
            for a in actions {
                p.perform(ctx, a, now);
            }
            if let Some(r) = ctx.state(|s| s.result.clone()) {
                return Ok(r);
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
        if !matches!(op, Op::Decide { .. }) {
            return Err("only decisions are updates: cancel the workflow to cancel the run".into());
        }
        if let Some(r) = &self.result {
            return Err(format!(
                "op.run_finished: the run has finished ({})",
                r.status.as_str()
            )
            .into());
        }
        match &self.machine {
            Some(m) => m
                .check_op(op)
                .map_err(|e| format!("{}: {e}", e.code()).into()),
            None => Err("op.unavailable: the run could not be set up".into()),
        }
    }

    /// A reviewer's decision (checked by the validator first: rule 21).
    #[update]
    pub fn decide(&mut self, _ctx: &mut SyncWorkflowContext<Self>, op: Op) -> bool {
        match op {
            Op::Decide { call, decision, .. } => {
                self.inbox.push(RunInput::Decided { call, decision });
                true
            }
            Op::Cancel { .. } => false,
        }
    }

    /// The run's spec, journal and result.
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
    /// Journals `inputs` and hands them to the machine; returns what it asks for.
    fn feed(&mut self, inputs: Vec<RunInput>, now: u64) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(m) = self.machine.as_mut() else {
            return out;
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
        for a in &out {
            if let Action::Finished(r) = a {
                self.result = Some((**r).clone());
            }
        }
        out
    }
}

/// What the main loop waits for, polled in the order it was started. Polled with the
/// workflow's own waker: a combinator with wakers of its own (`FuturesUnordered`) wakes from
/// outside the SDK, which the SDK rightly takes for nondeterminism.
#[derive(Default)]
struct Pending(Vec<LocalBoxFuture<'static, Done>>);

impl Pending {
    fn push(&mut self, f: LocalBoxFuture<'static, Done>) {
        self.0.push(f);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first (in start order) of those that are ready.
    fn next(&mut self) -> impl std::future::Future<Output = Done> + '_ {
        futures::future::poll_fn(move |cx| {
            for i in 0..self.0.len() {
                if let std::task::Poll::Ready(d) = self.0[i].as_mut().poll(cx) {
                    drop(self.0.remove(i));
                    return std::task::Poll::Ready(d);
                }
            }
            std::task::Poll::Pending
        })
    }
}

/// The main loop's bookkeeping: what runs, and what each model was asked so far.
#[derive(Default)]
struct Performer {
    pending: Pending,
    /// Requests made of each model (by its spec; None: the run's), retries included: a script
    /// answers the next of its turns.
    asked: BTreeMap<Option<String>, usize>,
    frame_model: BTreeMap<FrameKey, Option<String>>,
    turn_tokens: BTreeMap<FrameKey, WorkflowCancellationToken>,
    call_tokens: BTreeMap<CallId, WorkflowCancellationToken>,
    aborted: BTreeSet<CallId>,
    timers: BTreeMap<Timer, u64>,
    generation: u64,
    /// Turns whose activity ended before all its signals were taken: (frame, step, sent,
    /// closing input).
    closes: Vec<(FrameKey, u32, usize, RunInput)>,
}

impl Performer {
    fn perform(&mut self, ctx: &WorkflowContext<RunWorkflow>, action: Action, now: u64) {
        match action {
            Action::Request {
                frame,
                step,
                messages,
                config,
                skip_calls,
            } => self.request(ctx, frame, step, messages, &config, skip_calls),
            Action::CloseStream { frame } => {
                ctx.state_mut(|s| {
                    if let Some(m) = s.turns.get_mut(&frame) {
                        m.open = false;
                    }
                });
                if let Some(t) = self.turn_tokens.remove(&frame) {
                    t.cancel();
                }
                self.closes.retain(|c| c.0 != frame);
            }
            Action::Launch {
                id,
                call,
                tool,
                detached,
                timeout_ms,
            } => {
                let spec = ctx.state(|s| s.spec.clone());
                let limit = timeout_ms.map_or(CALL_LIMIT, |ms| {
                    Duration::from_millis(ms).saturating_add(CALL_GRACE)
                });
                let token = ctx.cancellation_token().child_token();
                let opts = ActivityOptions::with_start_to_close_timeout(limit)
                    .heartbeat_timeout(HEARTBEAT_TIMEOUT)
                    // The machine decides what a lost call becomes (rule: never silently run
                    // twice), so Temporal never retries a call on its own.
                    .retry_policy(RetryPolicy::builder().maximum_attempts(1).build())
                    .cancellation_token(token.clone())
                    .activity_id(format!("call-{}", id.0))
                    .build();
                let task = CallTask {
                    spec,
                    id,
                    call,
                    tool: (*tool).clone(),
                    timeout_ms,
                };
                let c = ctx.clone();
                if !detached {
                    self.call_tokens.insert(id, token);
                }
                self.pending.push(
                    async move {
                        let r = c
                            .execute_activity(DagloopActivities::tool_call, task, opts)
                            .await;
                        if detached {
                            return Done::Nothing;
                        }
                        let result = r.map_err(|e| match e {
                            ActivityExecutionError::Cancelled(_) => Lost::Cancelled,
                            other if other.as_cancelled().is_some() => Lost::Cancelled,
                            _ => Lost::Failed,
                        });
                        Done::Call { id, result }
                    }
                    .boxed_local(),
                );
            }
            Action::Abort { id } => {
                self.aborted.insert(id);
                if let Some(t) = self.call_tokens.remove(&id) {
                    t.cancel();
                }
            }
            Action::SetTimer { timer, at } => {
                self.generation += 1;
                let generation = self.generation;
                self.timers.insert(timer, generation);
                let wait = Duration::from_millis(at.saturating_sub(now).max(1));
                let c = ctx.clone();
                self.pending.push(
                    async move {
                        let _ = c.timer(wait).await;
                        Done::Timer { timer, generation }
                    }
                    .boxed_local(),
                );
            }
            Action::ClearTimer { timer } => {
                self.timers.remove(&timer);
            }
            Action::Emit(_) | Action::Finished(_) => {}
        }
    }

    fn request(
        &mut self,
        ctx: &WorkflowContext<RunWorkflow>,
        frame: FrameKey,
        step: u32,
        messages: Vec<crate::protocol::Message>,
        config: &std::sync::Arc<AgentConfig>,
        skip_calls: usize,
    ) {
        let (spec, path) = ctx.state(|s| {
            let root = s.machine.as_ref().map(|m| m.root().clone());
            let path = root
                .and_then(|r| config_path(&r, config))
                .unwrap_or_default();
            (s.spec.clone(), path)
        });
        let model = config.model.clone();
        let asked = self.asked.entry(model.clone()).or_default();
        let asked_before = *asked;
        *asked += 1;
        self.frame_model.insert(frame, model);
        ctx.state_mut(|s| {
            s.turns.insert(
                frame,
                TurnMark {
                    step,
                    received: 0,
                    open: true,
                },
            );
        });
        let limit = config
            .limits
            .timeout_ms
            .map_or(TURN_LIMIT, Duration::from_millis);
        let token = ctx.cancellation_token().child_token();
        self.turn_tokens.insert(frame, token.clone());
        let opts = ActivityOptions::with_start_to_close_timeout(limit)
            .heartbeat_timeout(HEARTBEAT_TIMEOUT)
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_attempts(TURN_ATTEMPTS)
                    .initial_interval(Duration::from_millis(200))
                    .build(),
            )
            .cancellation_token(token)
            .build();
        let task = TurnTask {
            spec,
            frame,
            step,
            path,
            messages,
            asked_before,
            skip_calls,
        };
        let c = ctx.clone();
        self.pending.push(
            async move {
                let r = c
                    .execute_activity(DagloopActivities::model_turn, task, opts)
                    .await;
                Done::Turn {
                    frame,
                    step,
                    result: r.map_err(|e| describe(&e)),
                }
            }
            .boxed_local(),
        );
    }

    /// What a finished activity or timer means for the machine.
    fn done(&mut self, ctx: &WorkflowContext<RunWorkflow>, d: Done, inputs: &mut Vec<RunInput>) {
        match d {
            Done::Nothing => {}
            Done::Timer { timer, generation } => {
                if self.timers.get(&timer) == Some(&generation) {
                    self.timers.remove(&timer);
                    inputs.push(RunInput::TimerFired { timer });
                }
            }
            Done::Call { id, result } => {
                self.call_tokens.remove(&id);
                if self.aborted.remove(&id) {
                    return;
                }
                match result {
                    Ok(outcome) => inputs.push(RunInput::Outcome { call: id, outcome }),
                    // Nobody asked for it to stop: the run was cancelled, which the machine
                    // hears about by itself.
                    Err(Lost::Cancelled) => {}
                    Err(Lost::Failed) => inputs.push(RunInput::Interrupted { call: id }),
                }
            }
            Done::Turn {
                frame,
                step,
                result,
            } => {
                let open = ctx.state(|s| {
                    s.turns
                        .get(&frame)
                        .is_some_and(|m| m.open && m.step == step)
                });
                if !open {
                    return;
                }
                self.turn_tokens.remove(&frame);
                let (sent, closing) = match result {
                    Ok(TurnDone { sent, closed }) => (sent, closed),
                    Err(reason) => {
                        let mut err =
                            RunError::new("run.model_error", format!("the model failed: {reason}"));
                        err.cause = Some(serde_json::json!({
                            "code": "temporal.model_activity",
                            "message": reason,
                        }));
                        let received = ctx.state(|s| s.turns.get(&frame).map_or(0, |m| m.received));
                        (
                            received,
                            RunInput::StreamClosed {
                                frame,
                                error: Some(err),
                            },
                        )
                    }
                };
                self.closes.push((frame, step, sent, closing));
            }
        }
    }

    /// Turn ends whose signals have all been taken, in the order the turns ended.
    fn ready_closes(&mut self, ctx: &WorkflowContext<RunWorkflow>) -> Vec<RunInput> {
        let mut ready = Vec::new();
        let mut keep = Vec::new();
        for (frame, step, sent, input) in std::mem::take(&mut self.closes) {
            let got = ctx.state(|s| {
                s.turns
                    .get(&frame)
                    .filter(|m| m.step == step)
                    .map(|m| m.received)
            });
            match got {
                Some(n) if n >= sent => {
                    ctx.state_mut(|s| {
                        if let Some(m) = s.turns.get_mut(&frame) {
                            m.open = false;
                        }
                    });
                    ready.push(input);
                }
                Some(_) => keep.push((frame, step, sent, input)),
                None => {}
            }
        }
        self.closes = keep;
        ready
    }

    /// A retry inside a turn asked the model once more.
    fn count_retry(&mut self, frame: FrameKey) {
        if let Some(model) = self.frame_model.get(&frame) {
            *self.asked.entry(model.clone()).or_default() += 1;
        }
    }
}

/// The run's machine, built from its spec alone (no model, no activity: nothing the workflow
/// must not do). Delegate goal files are read here: they must not change while the run lives.
fn machine_for(spec: &RunSpec) -> Result<RunMachine, crate::runs::RunsError> {
    let goal = spec.goal()?;
    let policy = crate::runs::policy_for(&goal, spec.options.approve.as_deref())?;
    let config = crate::engine::config_for(&goal)?;
    let mut m = RunMachine::new(
        spec.run_id.clone(),
        config,
        policy,
        crate::context::SanitizeLimits::default(),
    );
    m.keep_launched(true);
    Ok(m)
}

/// An activity's failure with its causes (the worker's own message is one of them).
fn describe(e: &ActivityExecutionError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn now_ms(ctx: &WorkflowContext<RunWorkflow>) -> u64 {
    ctx.workflow_time()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn failed(err: RunError) -> RunResult {
    RunResult {
        status: RunStatus::ModelError,
        output: serde_json::Value::Null,
        state: serde_json::Value::Null,
        steps: 0,
        usage: Usage::default(),
        calls: Vec::new(),
        error: Some(err),
    }
}
