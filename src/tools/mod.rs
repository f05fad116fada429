//! Activities: the code that executes a call (protocol chapter 003).
//!
//! A [`Registry`] maps tools to activities: activities registered under a tool's name (typed Rust
//! closures, MCP tools), else the [`ActivityKind`] registered under the tool's `_activity`: the
//! built-in `http` and `shell` (configured in the tool schema), `delegate` (nested runs, supplied
//! by the engine through [`DelegateRunner`]), `rust`, and any kind a program adds with
//! [`Registry::register_kind`]. A tool with no activity is latent: the model fills `_output`
//! itself and nothing runs here. Each call gets an [`ActivityContext`] (idempotency key, scoped
//! parent data, a [`ProgressSink`]).
//!
//! Deliberately not here: scheduling, approval, retries or writing results to state.

mod action;
mod check;
mod context;
#[cfg(unix)]
mod group;
#[cfg(windows)]
#[path = "group_windows.rs"]
mod group;
mod http;
mod kind;
pub mod mcp;
mod shell;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::protocol::{Call, Tool};

pub use action::{Action, describe_action};
pub use check::{KINDS, check_tool, kind_of};
pub use context::{ActivityContext, HEAD_CHARS, Progress, ProgressSink, ResultBudget};
pub use group::kill_all as kill_process_groups;
pub use group::{huge_pages_back, huge_pages_for_children};
pub use http::HttpConfig;
pub use kind::ActivityKind;
pub use shell::ShellConfig;

/// What an activity produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityOutput {
    /// The result value.
    pub value: Value,
    /// For `a || b` output paths: the alternative the activity chose (None = default).
    pub branch: Option<usize>,
}

impl From<Value> for ActivityOutput {
    fn from(value: Value) -> Self {
        ActivityOutput {
            value,
            branch: None,
        }
    }
}

/// An activity failed. The message goes back to the model; the code is stable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ActivityError {
    /// No activity is registered for the tool.
    #[error("no activity for tool `{tool}` (activity `{activity}`)")]
    Unknown {
        /// The tool.
        tool: String,
        /// The activity kind the tool asked for.
        activity: String,
    },
    /// The tool's `_activity` names a kind nobody registered.
    #[error("tool `{tool}`: unknown `_activity` `{kind}` (known kinds: {known})")]
    UnknownKind {
        /// The tool.
        tool: String,
        /// The kind it names.
        kind: String,
        /// The registered kinds, comma-separated.
        known: String,
    },
    /// The params do not fit the activity.
    #[error("bad params for `{tool}`: {reason}")]
    BadParams {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The tool's activity configuration is wrong (`_http`, `_shell`...).
    #[error("tool `{tool}` is misconfigured: {reason}")]
    Config {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The shell activity is disabled (it must be enabled by the goal and the operator).
    #[error("tool `{tool}` needs the shell activity, which is disabled (enable it explicitly)")]
    ShellDisabled {
        /// The tool.
        tool: String,
    },
    /// The activity ran and reported a failure.
    #[error("{message}")]
    Failed {
        /// Human-readable message.
        message: String,
        /// Structured details (HTTP status and body, exit code and stderr...).
        details: Value,
    },
    /// The activity took too long.
    #[error("timed out after {seconds}s")]
    Timeout {
        /// The limit.
        seconds: f64,
    },
    /// The result was longer than the run could still keep: the activity stopped reading it
    /// ([`ResultBudget::over`] wrote the message and details).
    #[error("{message}")]
    ResultBound {
        /// Human-readable message.
        message: String,
        /// The record: size read, SHA-256, head, the bound.
        details: Value,
    },
}

crate::codes::has_code!(ActivityError);

impl ActivityError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            ActivityError::Unknown { .. } => "activity.unknown",
            ActivityError::UnknownKind { .. } => "activity.unknown_kind",
            ActivityError::BadParams { .. } => "activity.bad_params",
            ActivityError::Config { .. } => "activity.config",
            ActivityError::ShellDisabled { .. } => "activity.shell_disabled",
            ActivityError::Failed { .. } => "activity.failed",
            ActivityError::Timeout { .. } => "activity.timeout",
            ActivityError::ResultBound { .. } => "run.result_bound",
        }
    }

    /// The error object written to state and shown to the model.
    pub fn to_value(&self) -> Value {
        let details = match self {
            ActivityError::Failed { details, .. } | ActivityError::ResultBound { details, .. } => {
                Some(details.clone())
            }
            _ => None,
        };
        crate::protocol::error_object(self.code(), self.to_string(), details)
    }
}

/// The future an activity returns.
pub type ActivityFuture = BoxFuture<'static, Result<ActivityOutput, ActivityError>>;

/// Code that executes calls of one tool.
pub trait Activity: Send + Sync {
    /// Runs one call. `params` are resolved (references replaced by values). The call is shared
    /// with the run (its `started` event holds it): read it through the `Arc`; an activity that
    /// must own its params takes them with `Arc::unwrap_or_clone`, which copies only when shared.
    fn run(&self, tool: &Tool, call: Arc<Call>) -> ActivityFuture;

    /// Runs one call with its context (idempotency key, progress sink). The default ignores the
    /// context and calls [`Activity::run`]; activities that report progress override it.
    fn run_with(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        let _ = cx;
        self.run(tool, call)
    }
}

/// An activity that is handed the shared call itself (what `Registry::register_fn` registers).
struct CallFn<F>(F);

impl<F> Activity for CallFn<F>
where
    F: Fn(Arc<Call>) -> ActivityFuture + Send + Sync,
{
    fn run(&self, _tool: &Tool, call: Arc<Call>) -> ActivityFuture {
        (self.0)(call)
    }
}

/// Runs a nested agent for a tool with `_delegate` (implemented by the engine).
pub trait DelegateRunner: Send + Sync {
    /// Runs the delegate described by `tool` for `call`; `scoped` is the parent context the
    /// call's `_scopes` allow (kind name → value).
    fn run_delegate(
        &self,
        tool: &Tool,
        call: Arc<Call>,
        scoped: Map<String, Value>,
    ) -> ActivityFuture;
}

/// Tools' activities by name, and activity kinds by `_activity` name.
#[derive(Clone)]
pub struct Registry {
    by_name: BTreeMap<String, Arc<dyn Activity>>,
    kinds: BTreeMap<String, Arc<dyn ActivityKind>>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut r = Registry {
            by_name: BTreeMap::new(),
            kinds: BTreeMap::new(),
        };
        r.register_kind("http", Arc::new(kind::HttpKind::default()))
            .register_kind("shell", Arc::new(kind::ShellKind { enabled: false }))
            .register_kind("delegate", Arc::new(kind::DelegateKind::default()))
            .register_kind("rust", Arc::new(kind::RustKind));
        r
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.by_name.keys().collect::<Vec<_>>())
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Registry {
    /// A registry with the built-in kinds (`http`, `shell` disabled, `delegate` with no runner,
    /// `rust`) and no named activities.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers an activity kind: tools whose `_activity` is `name` are checked and run by it.
    /// A later registration of the same name wins (a program may replace a built-in).
    pub fn register_kind(
        &mut self,
        name: impl Into<String>,
        kind: Arc<dyn ActivityKind>,
    ) -> &mut Self {
        self.kinds.insert(name.into(), kind);
        self
    }

    /// The registered kind names, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.kinds.keys().map(String::as_str).collect()
    }

    /// The kind registered under `name`.
    pub fn kind(&self, name: &str) -> Option<&Arc<dyn ActivityKind>> {
        self.kinds.get(name)
    }

    /// Registers an activity for a tool name. A later registration of the same name wins.
    pub fn register(&mut self, name: impl Into<String>, activity: Arc<dyn Activity>) -> &mut Self {
        self.by_name.insert(name.into(), activity);
        self
    }

    /// Registers a typed async Rust function: params are deserialized into `P`, the result
    /// serialized from `R`; an `Err(e)` becomes a failed call with `e`'s message.
    ///
    /// ```
    /// # use dagloop::tools::Registry;
    /// #[derive(serde::Deserialize)]
    /// struct Add { a: i64, b: i64 }
    /// let mut tools = Registry::new();
    /// tools.register_fn("add", |p: Add| async move { Ok::<_, String>(p.a + p.b) });
    /// assert!(tools.has("add"));
    /// ```
    pub fn register_fn<P, R, E, Fut, F>(&mut self, name: impl Into<String>, f: F) -> &mut Self
    where
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        F: Fn(P) -> Fut + Send + Sync + 'static,
    {
        let name = name.into();
        let tool_name = name.clone();
        let f = Arc::new(f);
        let wrapped = move |call: Arc<Call>| -> ActivityFuture {
            let tool_name = tool_name.clone();
            let f = f.clone();
            Box::pin(async move {
                // Deserialized from the call's own map, in place: a `&Map` is a serde
                // deserializer, so the shared call's params are never copied.
                let params: &Map<String, Value> = &call.params;
                let p = P::deserialize(params).map_err(|e| ActivityError::BadParams {
                    tool: tool_name.clone(),
                    reason: e.to_string(),
                })?;
                drop(call);
                let r = f(p).await.map_err(|e| ActivityError::Failed {
                    message: e.to_string(),
                    details: Value::Null,
                })?;
                let value = serde_json::to_value(r).map_err(|e| ActivityError::Failed {
                    message: format!("result of `{tool_name}` is not JSON: {e}"),
                    details: Value::Null,
                })?;
                Ok(value.into())
            })
        };
        self.register(name, Arc::new(CallFn(wrapped)))
    }

    /// Allows the built-in shell activity (off by default). Installs the built-in `shell` kind.
    pub fn enable_shell(&mut self, on: bool) -> &mut Self {
        self.register_kind("shell", Arc::new(kind::ShellKind { enabled: on }))
    }

    /// Checks every request of the built-in `http` kind against `egress` (names resolved once,
    /// the checked address connected to, redirects checked alike). Installs the built-in kind.
    pub fn set_egress(&mut self, egress: Arc<crate::grants::Egress>) -> &mut Self {
        self.set_http_grants(Some(egress), None)
    }

    /// [`set_egress`](Self::set_egress) (when given), and a request that carries a `${VAR}`
    /// value only to where `secrets` grants the variable (`grant.env_host`).
    pub fn set_http_grants(
        &mut self,
        egress: Option<Arc<crate::grants::Egress>>,
        secrets: Option<Arc<crate::grants::SecretHosts>>,
    ) -> &mut Self {
        self.register_kind(
            "http",
            Arc::new(kind::HttpKind::with_grants(egress, secrets)),
        )
    }

    /// Installs the runner for delegate tools (the built-in `delegate` kind).
    pub fn set_delegate_runner(&mut self, runner: Arc<dyn DelegateRunner>) -> &mut Self {
        self.register_kind(
            "delegate",
            Arc::new(kind::DelegateKind {
                runner: Some(runner),
            }),
        )
    }

    /// True when an activity is registered under this tool name.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// True when calls to `tool` are executed (not latent).
    pub fn executes(&self, tool: &Tool) -> bool {
        self.has(&tool.name) || check::kind_of(tool).is_some()
    }

    /// Runs a call: a registered activity first, then the tool's `_activity` kind.
    /// `scoped` is the parent context for delegates.
    pub fn run(&self, tool: &Tool, call: Arc<Call>, scoped: Map<String, Value>) -> ActivityFuture {
        self.run_with(tool, call, ActivityContext::new().with_scoped(scoped))
    }

    /// Like [`Registry::run`], with an idempotency key: the same for every attempt at one call
    /// (the engine uses run id + call id for tools declared `"_idempotent": true`); the `http`
    /// activity sends it as the `Idempotency-Key` header.
    pub fn run_keyed(
        &self,
        tool: &Tool,
        call: Arc<Call>,
        scoped: Map<String, Value>,
        key: Option<&str>,
    ) -> ActivityFuture {
        let cx = ActivityContext::new()
            .with_scoped(scoped)
            .with_key(key.map(str::to_string));
        self.run_with(tool, call, cx)
    }

    /// Runs a call with its context: the activity registered under the tool's name, else the
    /// kind its `_activity` names (an unknown kind fails with `activity.unknown_kind`, a latent
    /// tool with `activity.unknown`).
    pub fn run_with(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        if let Some(a) = self.by_name.get(&tool.name) {
            return a.run_with(tool, call, cx);
        }
        let e = match check::kind_of(tool) {
            Some(name) => match self.kinds.get(name) {
                Some(k) => return k.run(tool, call, cx),
                None => ActivityError::UnknownKind {
                    tool: tool.name.clone(),
                    kind: name.to_string(),
                    known: self.kinds().join(", "),
                },
            },
            None => ActivityError::Unknown {
                tool: tool.name.clone(),
                activity: "latent".into(),
            },
        };
        Box::pin(async move { Err(e) })
    }
}

pub use crate::protocol::env_placeholders;

/// Replaces every `${VAR}` in `text` by the environment variable's value; an unset variable
/// is an error naming it (never a value).
pub(crate) fn fill_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("${") {
        let after = &rest[open + 2..];
        let Some(close) = after.find('}') else {
            break;
        };
        let var = &after[..close];
        let value = std::env::var(var)
            .map_err(|_| format!("the environment variable `{var}` is not set"))?;
        out.push_str(&rest[..open]);
        out.push_str(&value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Replaces `{name}` in a template with the param's value (strings as-is, others as JSON).
pub(crate) fn fill_template(template: &str, params: &Map<String, Value>, encode: bool) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + close];
        out.push_str(&rest[..open]);
        match params.get(name) {
            Some(v) => {
                let s = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if encode {
                    out.push_str(&percent_encode(&s));
                } else {
                    out.push_str(&s);
                }
            }
            None => out.push_str(&rest[open..open + close + 1]),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_fill_known_params_and_keep_unknown_ones() {
        let params: Map<String, Value> =
            serde_json::from_value(json!({"id": "a b/c", "n": 3})).unwrap();
        assert_eq!(
            fill_template("/u/{id}?n={n}&x={x}", &params, true),
            "/u/a%20b%2Fc?n=3&x={x}"
        );
        assert_eq!(fill_template("echo {id}", &params, false), "echo a b/c");
    }

    #[tokio::test]
    async fn typed_closures_get_params_and_report_errors() {
        #[derive(serde::Deserialize)]
        struct Add {
            a: i64,
            b: i64,
        }
        let mut r = Registry::new();
        r.register_fn("add", |p: Add| async move {
            if p.b == 0 {
                Err("b must not be zero".to_string())
            } else {
                Ok(p.a + p.b)
            }
        });
        let tool = Tool::new("add");
        let ok = r
            .run(
                &tool,
                Arc::new(Call::new("add").param("a", 2).param("b", 3)),
                Map::new(),
            )
            .await;
        assert_eq!(ok.unwrap().value, json!(5));
        // Read from a call shared with another holder (as with its `started` event): in place.
        let shared = Arc::new(Call::new("add").param("a", 4).param("b", 5));
        let held = shared.clone();
        let ok = r.run(&tool, shared, Map::new()).await;
        assert_eq!(ok.unwrap().value, json!(9));
        assert_eq!(Arc::strong_count(&held), 1, "the activity keeps no share");
        let bad_call = Call::new("add").param("a", "x");
        let bad = r
            .run(&tool, Arc::new(bad_call.clone()), Map::new())
            .await
            .unwrap_err();
        assert_eq!(bad.code(), "activity.bad_params");
        // The same reason as deserializing an owned copy of the params gave.
        let owned = serde_json::to_value(&bad_call.params).and_then(serde_json::from_value::<Add>);
        let reason = owned.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(reason, "invalid type: string \"x\", expected i64");
        assert_eq!(
            bad.to_value()["message"],
            json!(format!("bad params for `add`: {reason}"))
        );
        let failed = r
            .run(
                &tool,
                Arc::new(Call::new("add").param("a", 1).param("b", 0)),
                Map::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            failed.to_value(),
            json!({"code": "activity.failed", "message": "b must not be zero"})
        );
    }

    #[tokio::test]
    async fn shell_is_disabled_unless_enabled_and_unknown_activities_fail() {
        let r = Registry::new();
        let mut tool = Tool::new("ls");
        tool.activity = Some("shell".into());
        let e = r
            .run(&tool, Arc::new(Call::new("ls")), Map::new())
            .await
            .unwrap_err();
        assert_eq!(e.code(), "activity.shell_disabled");
        tool.activity = Some("teleport".into());
        let e = r
            .run(&tool, Arc::new(Call::new("ls")), Map::new())
            .await
            .unwrap_err();
        assert_eq!(e.code(), "activity.unknown_kind");
        assert!(e.to_string().contains("delegate, http, rust, shell"), "{e}");
    }
}
