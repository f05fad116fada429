//! Activity kinds: what a tool's `_activity` names. Each kind is an [`ActivityKind`] registered
//! under its name in the [`Registry`](super::Registry) (`Registry::register_kind`), which checks a
//! tool's configuration before anything runs and runs its calls. The built-ins (`http`, `shell`,
//! `delegate`, `rust`) are registered the same way, so a new tool source plugs in without editing
//! the core.
//!
//! Deliberately not here: looking kinds up or refusing unknown ones (the registry does, in one
//! place for `dagloop validate` and the builder), and the activities' own code (`http.rs`,
//! `shell.rs`, the engine's delegate runner).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::{
    ActivityContext, ActivityError, ActivityFuture, DelegateRunner, HttpConfig, ShellConfig, http,
    shell,
};
use crate::protocol::{Call, Tool};

/// One `_activity` kind: checks tools that name it and runs their calls.
///
/// ```
/// use std::sync::Arc;
/// use dagloop::protocol::{Call, Tool};
/// use dagloop::tools::{ActivityContext, ActivityError, ActivityFuture, ActivityKind, Registry};
///
/// /// `"_activity": "upper"`: the call's `text` param in capitals.
/// struct Upper;
/// impl ActivityKind for Upper {
///     fn run(&self, _tool: &Tool, call: Arc<Call>, _cx: ActivityContext) -> ActivityFuture {
///         let text = call.params.get("text").and_then(|v| v.as_str()).unwrap_or("").to_uppercase();
///         Box::pin(async move { Ok(serde_json::json!(text).into()) })
///     }
/// }
/// let mut tools = Registry::new();
/// tools.register_kind("upper", Arc::new(Upper));
/// assert!(tools.kinds().contains(&"upper"));
/// ```
pub trait ActivityKind: Send + Sync {
    /// Checks a tool's configuration for this kind, before anything runs (`dagloop validate` and
    /// `AgentBuilder::build` both call it). `base_dir` is the goal's folder. Accepts by default.
    fn check(&self, tool: &Tool, base_dir: &Path) -> Result<(), ActivityError> {
        let _ = (tool, base_dir);
        Ok(())
    }

    /// Runs one call of `tool` (params resolved: references replaced by values).
    fn run(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture;
}

fn fail(e: ActivityError) -> ActivityFuture {
    Box::pin(async move { Err(e) })
}

/// `http`: one HTTP request per call (`_http`). The client is made on first use; with an
/// egress grant, every request is checked by it (`crate::grants::egress`).
#[derive(Default)]
pub(super) struct HttpKind {
    client: OnceLock<http::Client>,
    egress: Option<Arc<crate::grants::Egress>>,
    secrets: Option<Arc<crate::grants::SecretHosts>>,
}

impl HttpKind {
    /// A kind whose requests `egress` checks, and `secrets` those that carry a `${VAR}` value.
    pub(super) fn with_grants(
        egress: Option<Arc<crate::grants::Egress>>,
        secrets: Option<Arc<crate::grants::SecretHosts>>,
    ) -> HttpKind {
        HttpKind {
            client: OnceLock::new(),
            egress,
            secrets,
        }
    }
}

impl ActivityKind for HttpKind {
    fn check(&self, tool: &Tool, _base_dir: &Path) -> Result<(), ActivityError> {
        HttpConfig::from_tool(tool).map(drop)
    }

    fn run(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        match HttpConfig::from_tool(tool) {
            Ok(mut cfg) => {
                if let Some(k) = cx.idempotency_key {
                    cfg.headers.insert("Idempotency-Key".into(), k);
                }
                self.client
                    .get_or_init(|| http::Client::new(self.egress.clone(), self.secrets.clone()))
                    .run(cfg, tool.name.clone(), call, cx.result_budget)
            }
            Err(e) => fail(e),
        }
    }
}

/// `shell`: runs a program (`_shell`); refused unless the operator enabled it.
pub(super) struct ShellKind {
    pub enabled: bool,
}

impl ActivityKind for ShellKind {
    fn check(&self, tool: &Tool, _base_dir: &Path) -> Result<(), ActivityError> {
        ShellConfig::from_tool(tool).map(drop)
    }

    fn run(&self, tool: &Tool, call: Arc<Call>, _cx: ActivityContext) -> ActivityFuture {
        if !self.enabled {
            return fail(ActivityError::ShellDisabled {
                tool: tool.name.clone(),
            });
        }
        match ShellConfig::from_tool(tool) {
            Ok(cfg) => shell::run(cfg, tool.name.clone(), call),
            Err(e) => fail(e),
        }
    }
}

/// `delegate`: a nested agent (`_delegate`), run by the engine's [`DelegateRunner`].
#[derive(Default)]
pub(super) struct DelegateKind {
    pub runner: Option<Arc<dyn DelegateRunner>>,
}

impl ActivityKind for DelegateKind {
    /// The shape only: the goal file `_delegate` names is read, and reported when it cannot be,
    /// by the goal's loaders (`Goal::delegate_file`), not by an activity kind.
    fn check(&self, tool: &Tool, _base_dir: &Path) -> Result<(), ActivityError> {
        match tool.schema.get("_delegate") {
            Some(serde_json::Value::String(_)) => Ok(()),
            _ => Err(ActivityError::Config {
                tool: tool.name.clone(),
                reason: "`_delegate` must be a goal file path or \"anonymous\"".into(),
            }),
        }
    }

    fn run(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        match &self.runner {
            Some(d) => d.run_delegate(tool, call, cx.scoped),
            None => fail(ActivityError::Unknown {
                tool: tool.name.clone(),
                activity: "delegate".into(),
            }),
        }
    }
}

/// `rust`: a function the program registers under the tool's name. The kind itself only answers
/// calls nobody registered a function for (the builder refuses those tools before a run).
pub(super) struct RustKind;

impl ActivityKind for RustKind {
    fn run(&self, tool: &Tool, _call: Arc<Call>, _cx: ActivityContext) -> ActivityFuture {
        fail(ActivityError::Unknown {
            tool: tool.name.clone(),
            activity: "rust".into(),
        })
    }
}
