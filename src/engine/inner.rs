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

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

pub use super::activities::Executor;
use super::activities::{Activities, panic_message};
use super::bus::EventBus;
use crate::approval::{ApprovalRequest, Approver};
#[allow(unused_imports)]
use crate::protocol::Tool;
use crate::protocol::{Call, CallId, Decision};
use crate::scheduler::{Action, Input, Scheduler, StepReport};
use crate::state::State;

/// How the driver runs a step.
#[derive(Debug, Clone, Default)]
pub struct DriveOptions {
    /// Each activity is failed with a timeout error after this long.
    pub call_timeout: Option<Duration>,
    /// The id given to the first call that arrives; later calls count up from it.
    pub first_call_id: u64,
}

struct Driver<'a> {
    executor: Arc<dyn Executor>,
    approver: Arc<dyn Approver>,
    bus: &'a EventBus,
    opts: DriveOptions,
    step: u32,
    activities: Activities,
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
                } => self.activities.launch(
                    &self.executor,
                    id,
                    *call,
                    tool,
                    detached,
                    self.opts.call_timeout,
                ),
                Action::Ask {
                    id,
                    call,
                    tool,
                    timeout,
                    ..
                } => self.ask(ApprovalRequest::new(id, *call, tool), timeout),
                Action::Abort { id } => self.activities.abort(id),
                Action::Drained => {}
            }
        }
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
    let mut next_id = opts.first_call_id;
    let mut d = Driver {
        executor,
        approver,
        bus,
        opts,
        step: scheduler.step(),
        activities: Activities::default(),
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
                Some(call) => {
                    let id = CallId(next_id);
                    next_id += 1;
                    Input::CallArrived { id, call: call.map(Arc::new).map_err(Into::into) }
                }
                None => {
                    stream_done = true;
                    Input::StreamClosed
                }
            },
            Some((id, outcome)) = d.activities.next(), if !d.activities.is_empty() => {
                Input::Finished { id, outcome }
            }
            Some(input) = d.approvals.next(), if !d.approvals.is_empty() => input,
            else => break,
        };
        scheduler.handle_into(input, bus.now(), &mut out);
        d.perform(&mut out);
        // Completions that are already in are handled without another trip through select.
        while !scheduler.is_drained()
            && let Some((id, outcome)) = d.activities.try_next()
        {
            scheduler.handle_into(Input::Finished { id, outcome }, bus.now(), &mut out);
            d.perform(&mut out);
        }
    }
    d.activities.shutdown().await;
    scheduler.finish()
}
