//! The workflow's main loop bookkeeping: performing the machine's actions with Temporal's
//! primitives (model turns and calls as activities), a workflow timer for the machine's next
//! deadline, and what the loop waits for. Deterministic like the rest of the workflow: ordered maps, futures polled in
//! the order they were started.
//!
//! Deliberately not here: deciding anything (the machine's) and the workflow's handlers
//! (`workflow.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use temporalio_sdk::{
    ActivityExecutionError, ActivityOptions, WorkflowCancellationToken, WorkflowContext,
};
use temporalio_workflow::RetryPolicy;

use super::activities::{CallTask, DagloopActivities, NotifyTask, RecallTask, TurnDone, TurnTask};
use super::workflow::{HEARTBEAT_TIMEOUT, RunWorkflow, TurnMark};
use crate::engine::config_path;
use crate::machine::{Action, AgentConfig, FrameKey, RunError, RunInput, Timer, TimerSetting};
use crate::protocol::CallId;
use crate::scheduler::Outcome;

/// Attempts at a model turn whose worker was lost (each asks the same turn again).
pub(super) const TURN_ATTEMPTS: u32 = 5;
/// The longest a model turn may take when the goal sets no run time limit.
pub(super) const TURN_LIMIT: Duration = Duration::from_secs(3600);
/// Added to a call's own time limit (which the activity enforces) before Temporal gives up.
pub(super) const CALL_GRACE: Duration = Duration::from_secs(60);
/// The longest a worker's memory search may take.
pub(super) const RECALL_LIMIT: Duration = Duration::from_secs(300);
/// Attempts at posting one notification to the webhook.
pub(super) const NOTIFY_ATTEMPTS: u32 = 5;
/// The longest a call may take when the goal sets no per-call limit.
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// Something the main loop waited for.
pub(super) enum Done {
    Turn {
        frame: FrameKey,
        step: u32,
        result: Result<TurnDone, String>,
    },
    Call {
        id: CallId,
        result: Result<Outcome, Lost>,
    },
    /// A workflow timer armed for `at` ended: for the machine's next deadline (`timer` None),
    /// or, in a history recorded before the `timers-in-machine` patch, for one setting of the
    /// machine's `timer`.
    Timer {
        timer: Option<Timer>,
        at: u64,
    },
    /// A workspace memory search, run by a worker (a workflow reads no folder); its answer,
    /// or why there is none, is journaled as the step's `Recalled`.
    Recalled {
        frame: FrameKey,
        step: u32,
        result: Result<Vec<crate::context::memory::Chunk>, String>,
    },
    Nothing,
}

pub(super) enum Lost {
    Cancelled,
    Failed,
}

/// What the main loop waits for, polled in the order it was started. Polled with the
/// workflow's own waker: a combinator with wakers of its own (`FuturesUnordered`) wakes from
/// outside the SDK, which the SDK rightly takes for nondeterminism.
#[derive(Default)]
pub(super) struct Pending(Vec<LocalBoxFuture<'static, Done>>);

impl Pending {
    pub(super) fn push(&mut self, f: LocalBoxFuture<'static, Done>) {
        self.0.push(f);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first (in start order) of those that are ready.
    pub(super) fn next(&mut self) -> impl std::future::Future<Output = Done> + '_ {
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

/// The main loop's bookkeeping: what runs. How often each model was asked is the machine's
/// (`RunMachine::requests_made`).
#[derive(Default)]
pub(super) struct Performer {
    pub(super) pending: Pending,
    pub(super) turn_tokens: BTreeMap<FrameKey, WorkflowCancellationToken>,
    pub(super) call_tokens: BTreeMap<CallId, WorkflowCancellationToken>,
    pub(super) aborted: BTreeSet<CallId>,
    /// Turns whose activity ended before all its signals were taken: (frame, step, sent,
    /// closing input).
    pub(super) closes: Vec<(FrameKey, u32, usize, RunInput)>,
    /// Activities (turns and calls, detached ones too) started and not yet ended.
    pub(super) in_flight: usize,
    /// When the workflow timers armed for the machine's deadlines end (those not ended yet).
    pub(super) wakes: BTreeSet<u64>,
    /// What the run keeps of tool results, as the embedded engine's driver keeps it: each call
    /// is launched with its budget, and each outcome is admitted before the machine sees it.
    /// None for a history recorded before [`super::workflow::RESULT_BOUND_PATCH`]: its calls
    /// were launched without a budget and their outcomes reached the machine whole.
    pub(super) bound: Option<crate::engine::ResultBound>,
}

impl Performer {
    /// Nothing runs and nothing waits to be fed: only timers are pending, which the machine
    /// keeps (the moment a run may continue as new).
    pub(super) fn quiet(&self) -> bool {
        self.in_flight == 0 && self.closes.is_empty()
    }

    pub(super) fn perform(&mut self, ctx: &WorkflowContext<RunWorkflow>, action: Action) {
        match action {
            Action::Request {
                frame,
                step,
                messages,
                config,
                skip_calls,
                // A lost turn is asked again from the agent's first model (the worker's turn
                // activity falls back within itself).
                model: _,
                whole: _,
            } => self.request(ctx, frame, step, messages, &config, skip_calls),
            Action::Recall { frame, step, query } => {
                let task = RecallTask {
                    spec: ctx.state(|s| s.spec.clone()),
                    query,
                };
                // A folder the worker cannot read is not read on a second try.
                let opts = ActivityOptions::with_start_to_close_timeout(RECALL_LIMIT)
                    .retry_policy(RetryPolicy::builder().maximum_attempts(1).build())
                    .build();
                let c = ctx.clone();
                self.pending.push(
                    async move {
                        let r = c
                            .execute_activity(DagloopActivities::memory_search, task, opts)
                            .await;
                        Done::Recalled {
                            frame,
                            step,
                            result: r.map_err(|e| describe(&e)),
                        }
                    }
                    .boxed_local(),
                );
            }
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
                    budget: self.bound.as_ref().map(crate::engine::ResultBound::budget),
                };
                let c = ctx.clone();
                if !detached {
                    self.call_tokens.insert(id, token);
                }
                self.in_flight += 1;
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
            Action::Emit(e) => self.notify(ctx, &e),
            Action::Finished(_) => {}
        }
    }

    /// Performs `actions`; in a history recorded before the `timers-in-machine` patch, also
    /// arms a workflow timer for each of the machine's timer `settings`, at its place among the
    /// actions, as that version did (the same commands in the same order).
    pub(super) fn perform_all(
        &mut self,
        ctx: &WorkflowContext<RunWorkflow>,
        actions: Vec<Action>,
        settings: Vec<TimerSetting>,
        now: u64,
    ) {
        let mut settings = settings.into_iter().peekable();
        for (i, a) in actions.into_iter().enumerate() {
            while let Some(s) = settings.next_if(|s| s.position <= i) {
                self.arm(ctx, Some(s.timer), s.at, now);
            }
            self.perform(ctx, a);
        }
        for s in settings {
            self.arm(ctx, Some(s.timer), s.at, now);
        }
    }

    /// After the machine handled its inputs: a workflow timer for its next deadline `next`
    /// ([`crate::machine::RunMachine::poll_timeout`]) unless one is armed for that time
    /// already. One armed for a deadline since moved ends and fires nothing.
    pub(super) fn wake_at(
        &mut self,
        ctx: &WorkflowContext<RunWorkflow>,
        next: Option<u64>,
        now: u64,
    ) {
        if let Some(at) = next
            && self.wakes.insert(at)
        {
            self.arm(ctx, None, at, now);
        }
    }

    /// A workflow timer that ends at `at` ([`Done::Timer`]).
    pub(super) fn arm(
        &mut self,
        ctx: &WorkflowContext<RunWorkflow>,
        timer: Option<Timer>,
        at: u64,
        now: u64,
    ) {
        let wait = Duration::from_millis(at.saturating_sub(now).max(1));
        let c = ctx.clone();
        self.pending.push(
            async move {
                let _ = c.timer(wait).await;
                Done::Timer { timer, at }
            }
            .boxed_local(),
        );
    }

    /// An `approval_requested` of a run whose starter has a webhook: a `notify` activity posts
    /// it (retried by Temporal; its failure never touches the run).
    fn notify(&mut self, ctx: &WorkflowContext<RunWorkflow>, e: &crate::protocol::Event) {
        let crate::protocol::EventKind::ApprovalRequested {
            call,
            interrupted,
            rule,
            ..
        } = &e.kind
        else {
            return;
        };
        let (Some(id), Some(page)) = (e.call, ctx.state(|s| s.spec.notify_page.clone())) else {
            return;
        };
        let task = NotifyTask {
            run_id: e.run_id.to_string(),
            call: id.0,
            tool: call.tool.clone(),
            interrupted: *interrupted,
            rule: rule.clone(),
            page,
        };
        let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_attempts(NOTIFY_ATTEMPTS)
                    .initial_interval(Duration::from_millis(500))
                    .build(),
            )
            .build();
        let c = ctx.clone();
        self.in_flight += 1;
        self.pending.push(
            async move {
                let _ = c
                    .execute_activity(DagloopActivities::notify, task, opts)
                    .await;
                Done::Nothing
            }
            .boxed_local(),
        );
    }

    pub(super) fn request(
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
        // The machine counted this request with the action: those before it are one fewer.
        let asked_before = ctx.state(|s| {
            s.machine.as_ref().map_or(0, |m| {
                m.requests()
                    .iter()
                    .filter(|((list, _), _)| list.as_deref() == config.model.as_deref())
                    .map(|(_, r)| r.made)
                    .sum()
            })
        });
        let asked_before = asked_before.saturating_sub(1);
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
        self.in_flight += 1;
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
    pub(super) fn done(
        &mut self,
        ctx: &WorkflowContext<RunWorkflow>,
        d: Done,
        inputs: &mut Vec<RunInput>,
    ) {
        if !matches!(d, Done::Timer { .. }) {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        match d {
            Done::Nothing => {}
            Done::Recalled {
                frame,
                step,
                result,
            } => {
                let (chunks, note) = match result {
                    Ok(chunks) => (chunks, None),
                    Err(e) => (
                        Vec::new(),
                        Some(format!(
                            "the worker could not search the memory folder: {e}"
                        )),
                    ),
                };
                inputs.push(RunInput::Recalled {
                    frame,
                    step,
                    chunks,
                    note,
                })
            }
            // A history from before the `timers-in-machine` patch: the setting's own timer
            // fires the machine's only if that is still set for that time.
            Done::Timer {
                timer: Some(timer),
                at,
            } => {
                let set_for = ctx.state(|s| s.machine.as_ref().and_then(|m| m.timer_at(timer)));
                if set_for == Some(at) && !queued(inputs, timer) {
                    inputs.push(RunInput::TimerFired { timer });
                }
            }
            // The machine's next deadline came: every timer it has due by then fires.
            Done::Timer { timer: None, at } => {
                self.wakes.remove(&at);
                let due: Vec<Timer> = ctx.state(|s| {
                    s.machine.as_ref().map_or_else(Vec::new, |m| {
                        m.timers_by_due()
                            .take_while(|(due, _)| *due <= at)
                            .map(|(_, t)| t)
                            .collect()
                    })
                });
                for timer in due {
                    if !queued(inputs, timer) {
                        inputs.push(RunInput::TimerFired { timer });
                    }
                }
            }
            Done::Call { id, result } => {
                self.call_tokens.remove(&id);
                if self.aborted.remove(&id) {
                    return;
                }
                match result {
                    Ok(outcome) => inputs.push(RunInput::Outcome {
                        call: id,
                        outcome: match self.bound.as_mut() {
                            Some(bound) => bound.admit(outcome),
                            None => outcome,
                        },
                    }),
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
                                error: Some(Box::new(err)),
                                finish_reason: None,
                            },
                        )
                    }
                };
                self.closes.push((frame, step, sent, closing));
            }
        }
    }

    /// Turn ends whose signals have all been taken, in the order the turns ended.
    pub(super) fn ready_closes(&mut self, ctx: &WorkflowContext<RunWorkflow>) -> Vec<RunInput> {
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
}

/// True when `timer`'s firing already waits among `inputs`.
fn queued(inputs: &[RunInput], timer: Timer) -> bool {
    inputs
        .iter()
        .any(|i| matches!(i, RunInput::TimerFired { timer: t } if *t == timer))
}

/// An activity's failure with its causes (the worker's own message is one of them).
pub(super) fn describe(e: &ActivityExecutionError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
