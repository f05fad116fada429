//! Running activities for a driver: each launched call is polled once on the driver and, unless
//! it answered then, becomes a task in a `JoinSet` owned by the run, under its per-call time
//! limit; a panic becomes the call's failure; an abort cancels the task (or drops an answer not
//! yet handed over). Fire-and-forget calls are tasks of the run too, so nothing outlives it.

use crate::fxhash::FxHashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::task::{AbortHandle, JoinSet};

use crate::protocol::{Call, CallId, Tool};
use crate::scheduler::Outcome;
use crate::tools::{ProgressSink, ResultBudget};

/// Runs activities. A panic anywhere in `execute` or its future is caught and reported as the
/// call's failure. The engine polls the returned future once on the run's driver: one that
/// answers then (a lookup, a computation that does not wait) ends with no task spawned for it;
/// one that waits is spawned and polled on its own task from then on. So the first poll must
/// not block: CPU-heavy or blocking work belongs in `tokio::task::spawn_blocking`, as anywhere
/// on tokio.
pub trait Executor: Send + Sync {
    /// Executes one call (params already resolved) of `tool`. The call is shared (its `started`
    /// event holds it too): read it through the `Arc`, and take an owned copy
    /// (`Arc::unwrap_or_clone`) only where the activity must own its params.
    fn execute(&self, id: CallId, tool: &Tool, call: Arc<Call>) -> BoxFuture<'static, Outcome>;

    /// Executes one call, handing the activity a sink for progress reports (the run driver turns
    /// them into `call_progress` events). The default drops the sink and calls `execute`.
    fn execute_reporting(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
    ) -> BoxFuture<'static, Outcome> {
        let _ = progress;
        self.execute(id, tool, call)
    }
    /// Executes one call as [`execute_reporting`](Executor::execute_reporting) does, telling the
    /// activity what the run can still keep of its result (`budget`), so one that streams its
    /// result stops reading there. The default ignores the budget (the run bounds the result
    /// once it has it).
    fn execute_within(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
        budget: Option<ResultBudget>,
    ) -> BoxFuture<'static, Outcome> {
        let _ = budget;
        self.execute_reporting(id, tool, call, progress)
    }
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

/// Closes a call's progress sink when dropped.
struct CloseOnDrop(ProgressSink);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// One call's activity under its time limit (and told what the run can still keep of its
/// result, `budget`), its progress sink closed when it ends however it ends; a panic in
/// `execute` itself (before it returns a future) is the call's failure. A panic inside the
/// future is caught by whoever spawns it.
pub(super) fn run_call(
    executor: Arc<dyn Executor>,
    id: CallId,
    call: Arc<Call>,
    tool: Arc<Tool>,
    limit: Option<Duration>,
    progress: ProgressSink,
    budget: Option<ResultBudget>,
) -> impl Future<Output = Outcome> + Send + 'static {
    let closing = CloseOnDrop(progress.clone());
    async move {
        let _closing = closing;
        // The call is shared with its `started` event and handed over as it is: no copy of it
        // is made for the activity (one that must own its params takes them itself).
        let work = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            executor.execute_within(id, &tool, call, progress, budget)
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
    }
}

/// The activities of one run.
#[derive(Default)]
pub(super) struct Activities {
    running: JoinSet<Outcome>,
    tasks: FxHashMap<tokio::task::Id, CallId>,
    handles: FxHashMap<CallId, AbortHandle>,
    detached: JoinSet<()>,
    /// Calls whose activity ended on its first poll, on the driver, before any task was
    /// spawned for it (a tool that answers without waiting on anything).
    ready: VecDeque<(CallId, Outcome)>,
    /// What the run keeps of results: each outcome passes it before the machine sees it.
    bound: super::bound::ResultBound,
}

impl Activities {
    /// No activity yet, under `bound`.
    pub fn bounded(bound: super::bound::ResultBound) -> Activities {
        Activities {
            bound,
            ..Activities::default()
        }
    }

    /// Runs a call's activity (under `limit`, reporting progress to `progress`); a detached
    /// one is not awaited.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_reporting(
        &mut self,
        executor: &Arc<dyn Executor>,
        id: CallId,
        call: Arc<Call>,
        tool: Arc<Tool>,
        detached: bool,
        limit: Option<Duration>,
        progress: ProgressSink,
    ) {
        let budget = Some(self.bound.budget());
        let task = run_call(executor.clone(), id, call, tool, limit, progress, budget);
        if detached {
            while self.detached.try_join_next().is_some() {}
            self.detached.spawn(task.map(|_| ()));
            return;
        }
        // Polled once here first: an activity that answers without waiting (a lookup, a
        // computation) ends without a task, a wake-up or a thread hop; one that waits is
        // spawned and polled again there (a future may be polled again with a new waker).
        let mut task = Box::pin(task);
        let mut cx = Context::from_waker(Waker::noop());
        match std::panic::catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(&mut cx))) {
            Ok(Poll::Ready(outcome)) => {
                self.ready.push_back((id, outcome));
                return;
            }
            Ok(Poll::Pending) => {}
            Err(p) => {
                self.ready.push_back((id, Outcome::panic(panic_message(p))));
                return;
            }
        }
        let handle = self.running.spawn(task);
        self.tasks.insert(handle.id(), id);
        self.handles.insert(id, handle);
    }

    pub fn abort(&mut self, id: CallId) {
        if let Some(h) = self.handles.remove(&id) {
            h.abort();
        }
        self.ready.retain(|(c, _)| *c != id);
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.ready.is_empty()
    }

    /// The next activity to end (None when none is running).
    pub async fn next(&mut self) -> Option<(CallId, Outcome)> {
        if let Some((id, outcome)) = self.ready.pop_front() {
            return Some((id, self.bound.admit(outcome)));
        }
        loop {
            let joined = self.running.join_next_with_id().await?;
            if let Some(done) = self.joined(joined) {
                return Some(done);
            }
        }
    }

    /// An activity that has already ended, without waiting.
    pub fn try_next(&mut self) -> Option<(CallId, Outcome)> {
        if let Some((id, outcome)) = self.ready.pop_front() {
            return Some((id, self.bound.admit(outcome)));
        }
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
        Some((id, self.bound.admit(outcome)))
    }

    pub async fn shutdown(&mut self) {
        self.running.shutdown().await;
        self.detached.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Progress;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Reports once, then keeps its sink past the end of the call.
    struct Leaky(Mutex<Option<ProgressSink>>);

    impl Executor for Leaky {
        fn execute(&self, _: CallId, _: &Tool, _: Arc<Call>) -> BoxFuture<'static, Outcome> {
            async { Outcome::ok(serde_json::Value::Null) }.boxed()
        }

        fn execute_reporting(
            &self,
            _: CallId,
            _: &Tool,
            _: Arc<Call>,
            progress: ProgressSink,
        ) -> BoxFuture<'static, Outcome> {
            progress.report(Progress::new(1.0, None));
            if let Ok(mut kept) = self.0.lock() {
                *kept = Some(progress);
            }
            async { Outcome::ok(serde_json::Value::Null) }.boxed()
        }
    }

    /// Answers at once, or after a yield (`wait`), or panics in its first poll; records the
    /// task it ran in.
    struct Where {
        wait: bool,
        panic: bool,
        seen: Arc<Mutex<Vec<Option<tokio::task::Id>>>>,
    }

    impl Executor for Where {
        fn execute(&self, _: CallId, _: &Tool, _: Arc<Call>) -> BoxFuture<'static, Outcome> {
            let (wait, panic, seen) = (self.wait, self.panic, self.seen.clone());
            async move {
                if panic {
                    panic!("boom");
                }
                if wait {
                    tokio::task::yield_now().await;
                }
                if let Ok(mut s) = seen.lock() {
                    s.push(tokio::task::try_id());
                }
                Outcome::ok(serde_json::Value::Null)
            }
            .boxed()
        }
    }

    /// Keeps the call it is handed, and how many holders it had then.
    #[derive(Default)]
    struct Keeps(Mutex<Option<(Arc<Call>, usize)>>);

    impl Executor for Keeps {
        fn execute(&self, _: CallId, _: &Tool, call: Arc<Call>) -> BoxFuture<'static, Outcome> {
            let holders = Arc::strong_count(&call);
            if let Ok(mut kept) = self.0.lock() {
                *kept = Some((call, holders));
            }
            async { Outcome::ok(serde_json::Value::Null) }.boxed()
        }
    }

    #[tokio::test]
    async fn an_executor_is_handed_the_launched_call_itself_not_a_copy() {
        let keeps = Arc::new(Keeps::default());
        let executor: Arc<dyn Executor> = keeps.clone();
        let call = Arc::new(Call::new("t").param("big", "x".repeat(1000)));
        // What the call's `started` event holds while the activity runs.
        let started = crate::protocol::LaunchedParams::of(call.clone());
        let mut a = Activities::default();
        a.launch_reporting(
            &executor,
            CallId(1),
            call,
            Arc::new(Tool::new("t")),
            false,
            None,
            ProgressSink::none(),
        );
        assert_eq!(a.next().await.map(|(id, _)| id), Some(CallId(1)));
        let kept = keeps.0.lock().ok().and_then(|k| k.clone());
        let Some((received, holders)) = kept else {
            panic!("the executor ran");
        };
        assert!(started.is_of(&received), "the same Arc, not a copy");
        assert!(
            holders >= 2,
            "shared with the event when handed over ({holders})"
        );
    }

    fn launch(a: &mut Activities, executor: &Arc<dyn Executor>, id: u64) {
        a.launch_reporting(
            executor,
            CallId(id),
            Arc::new(Call::new("t")),
            Arc::new(Tool::new("t")),
            false,
            None,
            ProgressSink::new(|_| {}),
        );
    }

    async fn ids(wait: bool) -> (Option<tokio::task::Id>, Vec<Option<tokio::task::Id>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let executor: Arc<dyn Executor> = Arc::new(Where {
            wait,
            panic: false,
            seen: seen.clone(),
        });
        let task = tokio::spawn(async move {
            let mut a = Activities::default();
            launch(&mut a, &executor, 1);
            launch(&mut a, &executor, 2);
            let mut done = Vec::new();
            while let Some((id, _)) = a.next().await {
                done.push(id);
            }
            assert_eq!(done.len(), 2, "both calls end");
            tokio::task::try_id()
        });
        let driver = task.await.ok().flatten();
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        (driver, seen)
    }

    #[tokio::test]
    async fn a_call_that_answers_at_once_ends_on_the_driver_without_a_task() {
        let (driver, seen) = ids(false).await;
        assert!(driver.is_some());
        assert_eq!(
            seen,
            vec![driver, driver],
            "both ran in the driver's own task"
        );
    }

    #[tokio::test]
    async fn a_call_that_waits_runs_in_a_task_of_its_own() {
        let (driver, seen) = ids(true).await;
        assert_eq!(seen.len(), 2);
        assert!(
            seen.iter().all(|t| t.is_some() && *t != driver),
            "{seen:?} vs {driver:?}"
        );
        assert_ne!(seen[0], seen[1], "one task per call");
    }

    #[tokio::test]
    async fn a_panic_in_the_first_poll_is_the_calls_failure_and_an_aborted_answer_is_dropped() {
        let executor: Arc<dyn Executor> = Arc::new(Where {
            wait: false,
            panic: true,
            seen: Arc::default(),
        });
        let mut a = Activities::default();
        launch(&mut a, &executor, 1);
        launch(&mut a, &executor, 2);
        a.abort(CallId(2));
        let (id, outcome) = a.next().await.unwrap_or((CallId(0), Outcome::cancelled()));
        assert_eq!(id, CallId(1));
        assert!(matches!(outcome.kind, crate::scheduler::OutcomeKind::Panic));
        assert!(a.is_empty(), "the aborted call's answer is not delivered");
        assert!(a.try_next().is_none());
    }

    #[tokio::test]
    async fn a_calls_progress_sink_closes_when_its_activity_ends() {
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let sink = ProgressSink::new(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
        });
        let leaky = Arc::new(Leaky(Mutex::new(None)));
        let executor: Arc<dyn Executor> = leaky.clone();
        let mut a = Activities::default();
        let tool = Arc::new(Tool::new("t"));
        a.launch_reporting(
            &executor,
            CallId(1),
            Arc::new(Call::new("t")),
            tool,
            false,
            None,
            sink,
        );
        assert_eq!(a.next().await.map(|(id, _)| id), Some(CallId(1)));
        let kept = leaky.0.lock().ok().and_then(|k| k.clone());
        assert!(kept.is_some());
        if let Some(k) = kept {
            k.report(Progress::new(2.0, None));
        }
        assert_eq!(
            seen.load(Ordering::SeqCst),
            1,
            "the late report was dropped"
        );
    }
}
