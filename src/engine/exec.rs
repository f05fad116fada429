//! Runs calls through the tool registry for the inner loop, with the run's hooks around them.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use super::activities::Executor;
use crate::protocol::{Call, CallId, Tool};
use crate::scheduler::Outcome;
use crate::tools::{ActivityContext, ProgressSink, Registry, ResultBudget};

/// Called before a tool runs; an `Err` fails the call with a [`HookError`] instead of running
/// it. A message converts into one (`Err("not today".into())`).
pub type BeforeTool = Arc<dyn Fn(&Tool, &Call) -> Result<(), HookError> + Send + Sync>;

/// Why a [`BeforeTool`] hook refused a call. The call fails with the error object
/// `{"code": "hook.before_tool", "message", "details"?}` ([`HookError::to_value`]); `details`
/// carries whatever structure the hook wants to give (a reason code of its own, a limit...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct HookError {
    /// What the model and the reviewer are told.
    pub message: String,
    /// More about it, as JSON (left out of the error object when `None`).
    pub details: Option<Value>,
}

crate::codes::has_code!(HookError);

impl HookError {
    /// A refusal saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        HookError {
            message: message.into(),
            details: None,
        }
    }

    /// Adds `details` to the error object (builder style).
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The stable code: `hook.before_tool`.
    pub fn code(&self) -> &'static str {
        "hook.before_tool"
    }

    /// The call's error object ([`crate::protocol::error_object`]).
    pub fn to_value(&self) -> Value {
        crate::protocol::error_object(self.code(), self.message.clone(), self.details.clone())
    }
}

impl From<String> for HookError {
    fn from(message: String) -> Self {
        HookError::new(message)
    }
}

impl From<&str> for HookError {
    fn from(message: &str) -> Self {
        HookError::new(message)
    }
}
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
    fn execute(&self, id: CallId, tool: &Tool, call: Arc<Call>) -> BoxFuture<'static, Outcome> {
        self.execute_reporting(id, tool, call, ProgressSink::none())
    }

    fn execute_reporting(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
    ) -> BoxFuture<'static, Outcome> {
        self.execute_within(id, tool, call, progress, None)
    }

    fn execute_within(
        &self,
        id: CallId,
        tool: &Tool,
        call: Arc<Call>,
        progress: ProgressSink,
        budget: Option<ResultBudget>,
    ) -> BoxFuture<'static, Outcome> {
        let hooks = self.hooks.clone();
        if let Some(before) = &hooks.before_tool
            && let Err(refusal) = before(tool, &call)
        {
            let err = refusal.to_value();
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
        let cx = ActivityContext::new()
            .with_key(key)
            .with_progress(progress)
            .with_result_budget(budget);
        // The tool and call are kept for the hooks that see the outcome, only when there are any
        // (a copy of the tool per call is otherwise wasted on the hot path); the call is shared,
        // not copied.
        let kept = (hooks.on_error.is_some() || hooks.after_tool.is_some())
            .then(|| (tool.clone(), Arc::clone(&call)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{Activity, ActivityFuture};
    use serde_json::json;
    use std::sync::Mutex;

    /// Keeps the call it is handed.
    #[derive(Default)]
    struct Keeps(Mutex<Option<Arc<Call>>>);

    impl Activity for Keeps {
        fn run(&self, _: &Tool, call: Arc<Call>) -> ActivityFuture {
            if let Ok(mut kept) = self.0.lock() {
                *kept = Some(call);
            }
            Box::pin(async { Ok(Value::Null.into()) })
        }
    }

    #[tokio::test]
    async fn the_activity_and_the_hooks_after_it_see_the_launched_call_itself() {
        let keeps = Arc::new(Keeps::default());
        let mut registry = Registry::new();
        registry.register("t", keeps.clone());
        let seen = Arc::new(Mutex::new(Vec::<usize>::new()));
        let s = seen.clone();
        let hooks = Hooks {
            after_tool: Some(Arc::new(move |_: &Tool, call: &Call, _: &Outcome| {
                if let Ok(mut s) = s.lock() {
                    s.push(std::ptr::from_ref(call) as usize);
                }
            })),
            ..Hooks::default()
        };
        let executor = RegistryExecutor::new(registry, hooks);
        let call = Arc::new(Call::new("t").param("a", 1));
        let outcome = executor
            .execute(CallId(1), &Tool::new("t"), call.clone())
            .await;
        assert!(outcome.result.is_ok(), "{outcome:?}");
        let kept = keeps.0.lock().ok().and_then(|k| k.clone());
        assert!(
            kept.is_some_and(|k| Arc::ptr_eq(&k, &call)),
            "no copy for the activity"
        );
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(
            seen,
            vec![Arc::as_ptr(&call) as usize],
            "no copy for the hook"
        );
    }

    #[test]
    fn a_hook_refusal_is_the_before_tool_error_object() {
        let plain: HookError = "13 is unlucky".into();
        assert_eq!(
            plain.to_value(),
            json!({"code": "hook.before_tool", "message": "13 is unlucky"})
        );
        let detailed = HookError::new(String::from("over quota")).with_details(json!({"limit": 3}));
        assert_eq!(
            detailed.to_value(),
            json!({"code": "hook.before_tool", "message": "over quota", "details": {"limit": 3}})
        );
    }
}
