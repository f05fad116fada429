//! The inner-loop driver: performs a [`Scheduler`]'s actions for one step.
//!
//! [`drive`] selects over the model's call stream, the running activities (a tokio `JoinSet`),
//! pending approvals (each raced against the policy timeout) and the cancellation token, feeding
//! each occurrence to the scheduler as an [`Input`] and doing what the resulting [`Action`]s say.
//! The stream keeps being read while calls run. It takes no decisions of its own: which call
//! runs, when and with what is the scheduler's.
//!
//! Activity panics are caught (`JoinError::is_panic`) and reported as failures; each activity
//! runs under the per-call timeout; cancellation aborts running activities (they are reported
//! cancelled) and ends the step.
//!
//! Deliberately not here: the outer loop (requests, retries, termination) and the model stream's
//! parsing.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::bus::EventBus;
use crate::approval::{ApprovalRequest, Approver};
use crate::protocol::{Call, CallId, Decision, Tool};
use crate::scheduler::{Action, Input, Outcome, Scheduler, StepReport};
use crate::state::State;

/// Runs activities. The engine calls `execute` inside a spawned task, so a panic anywhere in it
/// is caught and reported as the call's failure.
pub trait Executor: Send + Sync {
    /// Executes one call (params already resolved) of `tool`.
    fn execute(&self, id: CallId, tool: &Tool, call: Call) -> BoxFuture<'static, Outcome>;
}

/// How the driver runs a step.
#[derive(Debug, Clone, Default)]
pub struct DriveOptions {
    /// Each activity is failed with a timeout error after this long.
    pub call_timeout: Option<Duration>,
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

struct Driver<'a> {
    executor: Arc<dyn Executor>,
    approver: Arc<dyn Approver>,
    bus: &'a EventBus,
    opts: DriveOptions,
    step: u32,
    running: JoinSet<Outcome>,
    tasks: HashMap<tokio::task::Id, CallId>,
    handles: HashMap<CallId, AbortHandle>,
    approvals: FuturesUnordered<BoxFuture<'static, Input>>,
}

impl Driver<'_> {
    fn perform(&mut self, actions: &mut Vec<Action>) {
        for action in actions.drain(..) {
            match action {
                Action::Event { call, kind } => {
                    self.bus.publish(self.step, call, kind);
                }
                Action::Launch {
                    id,
                    call,
                    tool,
                    detached,
                } => self.launch(id, call, tool, detached),
                Action::Ask {
                    id,
                    call,
                    tool,
                    timeout,
                } => self.ask(ApprovalRequest { id, call, tool }, timeout),
                Action::Abort { id } => {
                    if let Some(h) = self.handles.remove(&id) {
                        h.abort();
                    }
                }
                Action::Drained => {}
            }
        }
    }

    fn launch(&mut self, id: CallId, call: Call, tool: Arc<Tool>, detached: bool) {
        let executor = self.executor.clone();
        let limit = self.opts.call_timeout;
        let task = async move {
            let work = executor.execute(id, &tool, call);
            match limit {
                Some(d) => tokio::time::timeout(d, work)
                    .await
                    .unwrap_or_else(|_| Outcome::timeout(d)),
                None => work.await,
            }
        };
        if detached {
            tokio::spawn(task);
            return;
        }
        let handle = self.running.spawn(task);
        self.tasks.insert(handle.id(), id);
        self.handles.insert(id, handle);
    }

    fn ask(&mut self, req: ApprovalRequest, timeout: Option<Duration>) {
        let id = req.id;
        let approver = self.approver.clone();
        let decision = match std::panic::catch_unwind(AssertUnwindSafe(|| approver.decide(req))) {
            Ok(fut) => AssertUnwindSafe(fut).catch_unwind().boxed(),
            Err(_) => futures::future::ready(Err(Box::new("approver panicked") as _)).boxed(),
        };
        let decided = move |r: Result<Decision, Box<dyn std::any::Any + Send>>| Input::Decided {
            id,
            decision: r.unwrap_or_else(|p| Decision::Reject {
                reason: format!("the approver failed: {}", panic_message(p)),
            }),
        };
        let fut = async move {
            match timeout {
                Some(t) => tokio::select! {
                    r = decision => decided(r),
                    _ = tokio::time::sleep(t) => Input::ApprovalTimedOut { id },
                },
                None => decided(decision.await),
            }
        };
        self.approvals.push(fut.boxed());
    }

    fn joined(
        &mut self,
        joined: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>,
    ) -> Option<Input> {
        let (task, outcome) = match joined {
            Ok((task, outcome)) => (task, outcome),
            Err(e) if e.is_panic() => {
                let task = e.id();
                (task, Outcome::panic(panic_message(e.into_panic())))
            }
            Err(e) => (e.id(), Outcome::cancelled()),
        };
        let id = self.tasks.remove(&task)?;
        self.handles.remove(&id);
        Some(Input::Finished { id, outcome })
    }
}

/// Drives one step: reads `calls` until it ends, runs what the scheduler launches through
/// `executor`, asks `approver` what the scheduler presents, publishes every event on `bus`, and
/// returns the final state and the step report once the scheduler has drained (or `cancel` fired).
pub async fn drive<S>(
    mut scheduler: Scheduler,
    mut calls: S,
    executor: Arc<dyn Executor>,
    approver: Arc<dyn Approver>,
    bus: &EventBus,
    cancel: CancellationToken,
    opts: DriveOptions,
) -> (State, StepReport)
where
    S: Stream<Item = Result<Call, String>> + Unpin,
{
    let mut d = Driver {
        executor,
        approver,
        bus,
        opts,
        step: scheduler.step(),
        running: JoinSet::new(),
        tasks: HashMap::new(),
        handles: HashMap::new(),
        approvals: FuturesUnordered::new(),
    };
    let mut out = Vec::new();
    let mut stream_done = false;
    let mut cancelled = false;
    while !scheduler.is_drained() {
        let input = tokio::select! {
            biased;
            _ = cancel.cancelled(), if !cancelled => {
                cancelled = true;
                Input::Cancel
            }
            item = calls.next(), if !stream_done => match item {
                Some(call) => Input::CallArrived(call),
                None => {
                    stream_done = true;
                    Input::StreamClosed
                }
            },
            Some(joined) = d.running.join_next_with_id(), if !d.running.is_empty() => {
                match d.joined(joined) {
                    Some(input) => input,
                    None => continue,
                }
            }
            Some(input) = d.approvals.next(), if !d.approvals.is_empty() => input,
            else => break,
        };
        scheduler.handle_into(input, bus.now(), &mut out);
        d.perform(&mut out);
        // Completions that are already in are handled without another trip through select.
        while !scheduler.is_drained()
            && let Some(joined) = d.running.try_join_next_with_id()
        {
            if let Some(input) = d.joined(joined) {
                scheduler.handle_into(input, bus.now(), &mut out);
                d.perform(&mut out);
            }
        }
    }
    d.running.shutdown().await;
    scheduler.finish()
}
