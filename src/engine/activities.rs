//! Running activities for a driver: each launched call is a task in a `JoinSet` owned by the
//! run, under its per-call time limit; a panic becomes the call's failure; an abort cancels the
//! task. Fire-and-forget calls are tasks of the run too, so nothing outlives it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::task::{AbortHandle, JoinSet};

use crate::protocol::{Call, CallId, Tool};
use crate::scheduler::Outcome;

/// Runs activities. The engine calls `execute` inside a spawned task, so a panic anywhere in it
/// is caught and reported as the call's failure.
pub trait Executor: Send + Sync {
    /// Executes one call (params already resolved) of `tool`.
    fn execute(&self, id: CallId, tool: &Tool, call: Call) -> BoxFuture<'static, Outcome>;
}

pub(super) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// The activities of one run (or one step, for the step driver).
#[derive(Default)]
pub(super) struct Activities {
    running: JoinSet<Outcome>,
    tasks: HashMap<tokio::task::Id, CallId>,
    handles: HashMap<CallId, AbortHandle>,
    detached: JoinSet<()>,
}

impl Activities {
    pub fn launch(
        &mut self,
        executor: &Arc<dyn Executor>,
        id: CallId,
        call: Call,
        tool: Arc<Tool>,
        detached: bool,
        limit: Option<Duration>,
    ) {
        let executor = executor.clone();
        let task = async move {
            // `execute` itself may panic before returning a future.
            let work = match std::panic::catch_unwind(AssertUnwindSafe(|| {
                executor.execute(id, &tool, call)
            })) {
                Ok(w) => w,
                Err(p) => return Outcome::panic(panic_message(p)),
            };
            match limit {
                Some(d) => tokio::time::timeout(d, work)
                    .await
                    .unwrap_or_else(|_| Outcome::timeout(d)),
                None => work.await,
            }
        };
        if detached {
            while self.detached.try_join_next().is_some() {}
            self.detached.spawn(task.map(|_| ()));
            return;
        }
        let handle = self.running.spawn(task);
        self.tasks.insert(handle.id(), id);
        self.handles.insert(id, handle);
    }

    pub fn abort(&mut self, id: CallId) {
        if let Some(h) = self.handles.remove(&id) {
            h.abort();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The next activity to end (None when none is running).
    pub async fn next(&mut self) -> Option<(CallId, Outcome)> {
        loop {
            let joined = self.running.join_next_with_id().await?;
            if let Some(done) = self.joined(joined) {
                return Some(done);
            }
        }
    }

    /// An activity that has already ended, without waiting.
    pub fn try_next(&mut self) -> Option<(CallId, Outcome)> {
        loop {
            let joined = self.running.try_join_next_with_id()?;
            if let Some(done) = self.joined(joined) {
                return Some(done);
            }
        }
    }

    fn joined(
        &mut self,
        joined: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>,
    ) -> Option<(CallId, Outcome)> {
        let (task, outcome) = match joined {
            Ok((task, outcome)) => (task, outcome),
            Err(e) if e.is_panic() => {
                let task = e.id();
                (task, Outcome::panic(panic_message(e.into_panic())))
            }
            Err(e) => (e.id(), Outcome::cancelled()),
        };
        let id = self.tasks.remove(&task)?;
        // An aborted call's outcome is no longer wanted.
        self.handles.remove(&id)?;
        Some((id, outcome))
    }

    pub async fn shutdown(&mut self) {
        self.running.shutdown().await;
        self.detached.shutdown().await;
    }
}
