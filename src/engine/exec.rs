//! Runs calls through the tool registry for the inner loop, with the run's hooks around them.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use super::activities::Executor;
use crate::protocol::{Call, CallId, Tool};
use crate::scheduler::Outcome;
use crate::tools::{ActivityContext, ProgressSink, Registry};

/// Called before a tool runs; an `Err` fails the call with that message instead of running it.
pub type BeforeTool = Arc<dyn Fn(&Tool, &Call) -> Result<(), String> + Send + Sync>;
/// Called after a tool ran, with its outcome.
pub type AfterTool = Arc<dyn Fn(&Tool, &Call, &Outcome) + Send + Sync>;
/// Called when a tool failed, with the error object.
pub type OnError = Arc<dyn Fn(&Tool, &Call, &Value) + Send + Sync>;

/// Rust callbacks around every activity.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Before each activity.
    pub before_tool: Option<BeforeTool>,
    /// After each activity.
    pub after_tool: Option<AfterTool>,
    /// After each failed activity.
    pub on_error: Option<OnError>,
}

/// Adapts a [`Registry`] to the engine's [`Executor`], with the run's hooks around every call.
pub struct RegistryExecutor {
    registry: Registry,
    hooks: Hooks,
    run_id: Option<String>,
}

impl RegistryExecutor {
    /// Runs calls through `registry`, calling `hooks` around each.
    pub fn new(registry: Registry, hooks: Hooks) -> Self {
        RegistryExecutor {
            registry,
            hooks,
            run_id: None,
        }
    }

    /// Calls of `"_idempotent": true` tools carry the key `RUN:CALL` (builder style).
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }
}

impl Executor for RegistryExecutor {
    fn execute(&self, id: CallId, tool: &Tool, call: Call) -> BoxFuture<'static, Outcome> {
        self.execute_reporting(id, tool, call, ProgressSink::none())
    }

    fn execute_reporting(
        &self,
        id: CallId,
        tool: &Tool,
        call: Call,
        progress: ProgressSink,
    ) -> BoxFuture<'static, Outcome> {
        let hooks = self.hooks.clone();
        if let Some(before) = &hooks.before_tool
            && let Err(message) = before(tool, &call)
        {
            let err = crate::protocol::error_object("hook.before_tool", message, None);
            if let Some(on_error) = &hooks.on_error {
                on_error(tool, &call, &err);
            }
            let outcome = Outcome::error(err);
            if let Some(after) = &hooks.after_tool {
                after(tool, &call, &outcome);
            }
            return async move { outcome }.boxed();
        }
        let key = self
            .run_id
            .as_ref()
            .filter(|_| crate::scheduler::is_idempotent(tool))
            .map(|run| format!("{run}:{}", id.0));
        let cx = ActivityContext::new().with_key(key).with_progress(progress);
        // The tool and call are kept for the hooks that see the outcome, only when there are any
        // (a copy of both per call is otherwise wasted on the hot path).
        let kept = (hooks.on_error.is_some() || hooks.after_tool.is_some())
            .then(|| (tool.clone(), call.clone()));
        let fut = self.registry.run_with(tool, call, cx);
        async move {
            let outcome = match fut.await {
                Ok(out) => {
                    let mut o = Outcome::ok(out.value);
                    o.branch = out.branch;
                    o
                }
                Err(e) => Outcome::error(e.to_value()),
            };
            if let Some((tool, call)) = &kept {
                if let (Err(err), Some(on_error)) = (&outcome.result, &hooks.on_error) {
                    on_error(tool, call, err);
                }
                if let Some(after) = &hooks.after_tool {
                    after(tool, call, &outcome);
                }
            }
            outcome
        }
        .boxed()
    }
}
