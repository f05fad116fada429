//! Building an [`Agent`]: a goal, activities, a model, an approver, and options.

use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::agent::Agent;
use super::bus::EventBus;
use super::delegate::Delegates;
use super::exec::Hooks;
use crate::approval::{Approver, Decision, Mode, Policy, ScriptedApprover};
use crate::context::SanitizeLimits;
use crate::goal::Goal;
use crate::llm::{LlmError, Model, ModelSpec, RetryPolicy, Retrying, Settings};
use crate::tools::Registry;

/// The agent could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Neither the goal nor the caller named a model.
    #[error(
        "no model: give one with --model or the goal's `model` field (scripted:PATH, openai:MODEL, anthropic:MODEL)"
    )]
    NoModel,
    /// The model spec is unknown or the model cannot be set up.
    #[error(transparent)]
    Model(#[from] LlmError),
    /// A tool's params schema cannot be compiled.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// The goal's `approval` field is not a valid policy.
    #[error("invalid approval policy: {0}")]
    Policy(String),
    /// A tool names an activity that cannot run here (a Rust activity nobody registered, or an
    /// unknown kind).
    #[error("tool `{tool}` needs activity `{activity}`: {reason}")]
    MissingActivity {
        /// The tool.
        tool: String,
        /// Its `_activity`.
        activity: String,
        /// What is missing.
        reason: String,
    },
    /// The policy asks a reviewer but none was given.
    #[error("the approval policy asks a reviewer, but no approver is configured")]
    NoApprover,
}

impl AgentError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::NoModel => "agent.no_model",
            AgentError::Model(e) => e.code(),
            AgentError::Schema(e) => e.code(),
            AgentError::Policy(_) => "agent.invalid_policy",
            AgentError::MissingActivity { .. } => "agent.missing_activity",
            AgentError::NoApprover => "agent.no_approver",
        }
    }
}

/// Builds an [`Agent`] from a goal.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use dagloop::engine::AgentBuilder;
/// use dagloop::goal::Goal;
///
/// #[derive(serde::Deserialize)]
/// struct Refund { amount: f64 }
///
/// let goal = Goal::load("examples/refund/goal.json".as_ref())?;
/// let mut agent = AgentBuilder::new(goal);
/// // Every `"_activity": "rust"` tool of the goal needs a registered function.
/// agent.registry_mut()
///     .register_fn("checkBillingHistory", |p: serde_json::Value| async move {
///         Ok::<_, String>(serde_json::json!({"customerId": p["customerId"], "lastOrder": {"id": "o1", "refundable": 40.0}}))
///     })
///     .register_fn("issueRefund", |p: Refund| async move {
///         Ok::<_, String>(serde_json::json!({"refunded": p.amount}))
///     });
/// let result = agent.build()?.run().await;
/// println!("{}", serde_json::to_string_pretty(&result)?);
/// # Ok(()) }
/// ```
pub struct AgentBuilder {
    goal: Goal,
    registry: Registry,
    model: Option<Arc<dyn Model>>,
    model_spec: Option<String>,
    approver: Option<Arc<dyn Approver>>,
    policy: Option<Policy>,
    hooks: Hooks,
    bus: Option<Arc<EventBus>>,
    cancel: CancellationToken,
    settings: Settings,
    retry: RetryPolicy,
    sanitize: SanitizeLimits,
    depth: u32,
}

impl AgentBuilder {
    /// Starts from a goal; everything else has defaults.
    pub fn new(goal: Goal) -> Self {
        AgentBuilder {
            goal,
            registry: Registry::new(),
            model: None,
            model_spec: None,
            approver: None,
            policy: None,
            hooks: Hooks::default(),
            bus: None,
            cancel: CancellationToken::new(),
            settings: Settings::default(),
            retry: RetryPolicy::default(),
            sanitize: SanitizeLimits::default(),
            depth: 0,
        }
    }

    /// The activities (Rust closures, built-ins); register more through it.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Replaces the activity registry.
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Uses this model instead of the goal's `model`.
    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// Uses this model spec instead of the goal's `model` (`scripted:` paths are relative to the
    /// current directory; the goal's own spec is relative to the goal file).
    pub fn model_spec(mut self, spec: impl Into<String>) -> Self {
        self.model_spec = Some(spec.into());
        self
    }

    /// Who decides about calls the policy asks about.
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// The approval policy (default: the goal's `approval`, else `auto`).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Callbacks around activities.
    pub fn hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Publishes events on this bus (subscribe to it before running).
    pub fn bus(mut self, bus: Arc<EventBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// Cancels the run when this token fires.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Model settings (mode, temperature, timeouts).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// How model errors are retried.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// What is shown of tool results.
    pub fn sanitize(mut self, limits: SanitizeLimits) -> Self {
        self.sanitize = limits;
        self
    }

    pub(super) fn depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }

    /// Resolves the model, policy and approver, and checks every tool can run.
    pub fn build(mut self) -> Result<Agent, AgentError> {
        for t in &self.goal.tools {
            let Some(kind) = t.activity.as_deref() else {
                continue;
            };
            if self.registry.has(&t.name) {
                continue;
            }
            let reason = match kind {
                "http" | "shell" | "delegate" => continue,
                "rust" => {
                    "no Rust function is registered under this name (register one with Registry::register_fn; the command line cannot run Rust activities)"
                }
                _ => {
                    "unknown activity kind (expected http, shell, delegate, or a registered Rust function)"
                }
            };
            return Err(AgentError::MissingActivity {
                tool: t.name.clone(),
                activity: kind.to_string(),
                reason: reason.to_string(),
            });
        }
        let model: Arc<dyn Model> = match (self.model.take(), &self.model_spec, &self.goal.model) {
            (Some(m), _, _) => m,
            (None, Some(spec), _) => ModelSpec::parse(spec)?.build()?,
            (None, None, Some(spec)) => {
                let parsed = match ModelSpec::parse(spec)? {
                    ModelSpec::Scripted(p) => {
                        ModelSpec::Scripted(self.goal.resolve_path(&p.to_string_lossy()))
                    }
                    other => other,
                };
                parsed.build()?
            }
            (None, None, None) => return Err(AgentError::NoModel),
        };
        let model: Arc<dyn Model> = Arc::new(Retrying::new(model, self.retry.clone()));
        let policy = match (self.policy.take(), &self.goal.approval) {
            (Some(p), _) => p,
            (None, Some(v)) => serde_json::from_value::<Policy>(v.clone())
                .map_err(|e| AgentError::Policy(e.to_string()))?,
            (None, None) => Policy::auto(),
        };
        let asks = policy.mode != Mode::Auto
            || self
                .goal
                .tools
                .iter()
                .any(|t| t.approval == Some(crate::protocol::ToolApproval::Always));
        let approver: Arc<dyn Approver> = match self.approver.take() {
            Some(a) => a,
            None if asks => return Err(AgentError::NoApprover),
            None => Arc::new(ScriptedApprover::new().otherwise(Decision::Approve)),
        };
        let bus = self
            .bus
            .take()
            .unwrap_or_else(|| Arc::new(EventBus::default()));
        let mut registry = self.registry.clone();
        registry.set_delegate_runner(Arc::new(Delegates {
            base_dir: self.goal.base_dir.clone(),
            registry: self.registry.clone(),
            model: model.clone(),
            approver: approver.clone(),
            cancel: self.cancel.clone(),
            depth: self.depth,
        }));
        let tools = self.goal.tools.clone();
        let validators = Arc::new(crate::schema::ToolValidators::new(&tools)?);
        Ok(Agent {
            validators,
            goal: self.goal,
            tools,
            registry,
            model,
            approver,
            policy,
            bus,
            hooks: self.hooks,
            cancel: self.cancel,
            settings: self.settings,
            sanitize: self.sanitize,
        })
    }
}

/// Reads a JSON value's string field (helper for delegate configuration).
pub(super) fn str_field<'a>(v: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}
