//! Building an [`Agent`]: a run's definition, activities, a model, reviewers, and options.
//!
//! A builder starts from an [`AgentDef`]: what it takes from a run's definition
//! (`runs::RunDef`, public as [`crate::RunDef`]), the only thing it can be made from. The engine
//! does not know the definition type (`runs` is above it); `runs` converts a definition into
//! this value, which only the crate can fill in, so a program reaches a builder through
//! [`crate::RunDef::from_goal`] (or any other definition) and never from a bare goal.
//!
//! [`AgentBuilder::build`] does the IO a run needs before it starts, through `loading`: it reads
//! delegate goal files (so a missing one is an error now, not mid-run), builds the models they
//! name, and checks that every tool's activity can run.
//!
//! Deliberately not here: what is loaded and how (`loading`), or a built run (`agent`).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::activities::Executor;
use super::agent::Agent;
use super::bus::{Clock, new_run_id, system_clock};
use super::error::AgentError;
use super::exec::{Hooks, RegistryExecutor};
use super::journal::JournalSink;
use super::loading::{
    TooDeep, build_list, build_models, chain, check_activities, collect_tools, load_config,
    resolve_specs,
};
use super::turns::Models;
use crate::approval::{Approver, Policy};
use crate::context::SanitizeLimits;
use crate::context::memory::Recall;
use crate::goal::{DelegateGoals, Goal, RecordedGoal};
use crate::grants::{Egress, SecretHosts};
use crate::llm::{Mode, Model, ModelSpec, RetryPolicy, Settings};
use crate::protocol::Tool;
use crate::tools::{Activity, Registry};

/// What an [`AgentBuilder`] takes from a run's definition: the goal as the run uses it (the
/// operator's MCP servers in place), its approval policy, its delegate goals as recorded, its
/// sanitize limits and kept-result bound, its workspace memory, its model spec and mode, and
/// the grants' shell and HTTP rules for its activities.
///
/// Made only from a [`crate::RunDef`] (`From<RunDef>`, `From<&RunDef>`): its parts are the
/// crate's to fill in, so a goal reaches a builder only after it has been defined and checked.
#[derive(Clone)]
pub struct AgentDef {
    pub(crate) goal: Goal,
    pub(crate) policy: Policy,
    pub(crate) delegate_goals: BTreeMap<String, RecordedGoal>,
    pub(crate) sanitize: SanitizeLimits,
    pub(crate) kept_result_bytes: u64,
    pub(crate) recall: Option<Arc<Recall>>,
    pub(crate) model_spec: Option<String>,
    pub(crate) mode: Option<Mode>,
    /// Whether the grants let `shell` tools run.
    pub(crate) shell: bool,
    /// The egress and secret rules of the `http` kind, None when both are open.
    pub(crate) http: Option<(Arc<Egress>, Arc<SecretHosts>)>,
}

impl AgentDef {
    /// Puts the definition's grants on `registry`'s built-in kinds.
    fn grant(&self, registry: &mut Registry) {
        registry.enable_shell(self.shell);
        if let Some((egress, secrets)) = &self.http {
            registry.set_http_grants(Some(egress.clone()), Some(secrets.clone()));
        }
    }
}

/// Builds an [`Agent`] from a run's definition ([`crate::RunDef`]).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use dagloop::{AgentBuilder, Goal, RunDef};
///
/// #[derive(serde::Deserialize)]
/// struct Refund { amount: f64 }
///
/// let goal = Goal::load("examples/refund/goal.json".as_ref())?;
/// // Defining the run checks it whole (delegate goals read, open grants): a bad goal fails here.
/// let mut agent = AgentBuilder::new(RunDef::from_goal(goal)?);
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
///
/// There is no way to a builder from a bare goal:
///
/// ```compile_fail
/// # fn demo(goal: dagloop::Goal) {
/// let _ = dagloop::AgentBuilder::new(goal);
/// # }
/// ```
pub struct AgentBuilder {
    goal: Goal,
    /// The grants' rules for the registry's built-in kinds (put on a replaced registry too).
    granted: AgentDef,
    registry: Registry,
    model: Option<Arc<dyn Model>>,
    model_spec: Option<String>,
    fallbacks: Vec<Arc<dyn Model>>,
    approver: Option<Arc<dyn Approver>>,
    /// Standing approvals given before the run starts (a decisions file's), journaled right
    /// after `start`.
    standing: Vec<crate::machine::RunInput>,
    external_review: bool,
    policy: Policy,
    hooks: Hooks,
    executor: Option<Arc<dyn Executor>>,
    journal: Option<Arc<dyn JournalSink>>,
    clock: Option<Clock>,
    run_id: Option<String>,
    cancel: CancellationToken,
    settings: Settings,
    retry: RetryPolicy,
    sanitize: SanitizeLimits,
    kept_result_bytes: u64,
    event_capacity: usize,
    mode: Option<Mode>,
    traced: bool,
    recall: Option<Arc<Recall>>,
    delegate_goals: BTreeMap<String, RecordedGoal>,
}

impl AgentBuilder {
    /// Starts from a run's definition ([`crate::RunDef`], e.g. [`crate::RunDef::from_goal`]):
    /// its goal, policy, delegate goals, sanitize limits, kept-result bound, memory, model spec
    /// and mode are the builder's defaults (the methods below override those a program may),
    /// and its grants' shell and HTTP rules are put on the registry (and on one that replaces
    /// it). Everything else has defaults.
    pub fn new(def: impl Into<AgentDef>) -> Self {
        let def = def.into();
        let mut registry = Registry::new();
        def.grant(&mut registry);
        AgentBuilder {
            goal: def.goal.clone(),
            registry,
            model: None,
            model_spec: def.model_spec.clone(),
            fallbacks: Vec::new(),
            approver: None,
            external_review: false,
            policy: def.policy.clone(),
            hooks: Hooks::default(),
            executor: None,
            journal: None,
            clock: None,
            run_id: None,
            cancel: CancellationToken::new(),
            standing: Vec::new(),
            settings: Settings::default(),
            retry: RetryPolicy::default(),
            sanitize: def.sanitize,
            kept_result_bytes: def.kept_result_bytes,
            event_capacity: super::bus::DEFAULT_CAPACITY,
            mode: def.mode,
            traced: true,
            recall: def.recall.clone(),
            delegate_goals: def.delegate_goals.clone(),
            granted: def,
        }
    }

    /// Whether the run is part of the process's traces and metrics (on by default; whether
    /// the process makes any is the operator's `OTEL_*` settings). Off, the run makes no span
    /// or metric and costs no tracing work, whatever those settings say.
    pub fn traced(mut self, on: bool) -> Self {
        self.traced = on;
        self
    }

    /// How many live batches of events (the driver sends a batch's events together) a
    /// subscriber may fall behind before it is caught up from the run's kept events or journal
    /// instead (default 1,024, [`super::bus::DEFAULT_CAPACITY`]).
    pub fn event_capacity(mut self, events: usize) -> Self {
        self.event_capacity = events.max(1);
        self
    }

    /// The activities (Rust closures, built-ins); register more through it.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Replaces the activity registry (the definition's grants are put on it).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self.granted.grant(&mut self.registry);
        self
    }

    /// Adds a tool the goal does not define, with the activity that runs its calls.
    pub fn tool(mut self, tool: Tool, activity: Arc<dyn Activity>) -> Self {
        self.registry.register(tool.name.clone(), activity);
        self.goal.tools.retain(|t| t.name != tool.name);
        self.goal.tools.push(tool);
        self
    }

    /// Uses this model instead of the goal's `model`.
    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// Uses this model spec instead of the goal's `model` (`scripted:` paths are relative to the
    /// current directory; the goal's own spec is relative to the goal file). A comma-separated
    /// list (`openai:a,anthropic:b`) names fallback models, tried in order within a turn when
    /// one fails after its retries with an error another provider could fix
    /// ([`crate::llm::Fallback`]).
    pub fn model_spec(mut self, spec: impl Into<String>) -> Self {
        self.model_spec = Some(spec.into());
        self
    }

    /// Adds a fallback model for the run's own agent, tried after the run's model (and the
    /// fallbacks added before it) within a turn when those fail after their retries with an
    /// error another provider could fix ([`crate::llm::Fallback`]).
    pub fn fallback_model(mut self, model: Arc<dyn Model>) -> Self {
        self.fallbacks.push(model);
        self
    }

    /// A reviewer that answers every approval request of the run (delegates included). It is
    /// an adapter: it reads `approval_requested` events and submits `Decide` ops.
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Standing approvals that apply from the run's start (journaled right after it, before
    /// the model is heard from), e.g. a decisions file's; a resumed run already has its standing
    /// approvals in its journal and ignores these.
    pub fn standing_approvals(
        mut self,
        standing: impl IntoIterator<
            Item = (
                crate::protocol::StandingSpec,
                Option<crate::protocol::Actor>,
            ),
        >,
    ) -> Self {
        self.standing = standing
            .into_iter()
            .map(|(standing, by)| crate::machine::RunInput::Allow { standing, by })
            .collect();
        self
    }

    /// [`AgentBuilder::standing_approvals`] under its name before a reviewer's standing
    /// approval stopped being called a grant (grants are what the operator lets a goal touch).
    #[deprecated(since = "0.1.0", note = "renamed `standing_approvals`")]
    pub fn grants(
        self,
        standing: impl IntoIterator<
            Item = (
                crate::protocol::StandingSpec,
                Option<crate::protocol::Actor>,
            ),
        >,
    ) -> Self {
        self.standing_approvals(standing)
    }

    /// Decisions arrive through [`RunHandle::submit`] (a web page, an HTTP client, a program):
    /// the run needs no approver to start.
    pub fn external_review(mut self) -> Self {
        self.external_review = true;
        self
    }

    /// The approval policy (default: the definition's: the goal's `approval`, else `auto`).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Callbacks around activities (every agent of the run).
    pub fn hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Runs activities through `executor` instead of the registry.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// Also appends the journal to `sink` (a store), awaiting it before acting on an entry.
    pub fn journal(mut self, sink: Arc<dyn JournalSink>) -> Self {
        self.journal = Some(sink);
        self
    }

    /// Reads time from `clock` (tests use tokio's paused clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Uses this run id instead of a new one.
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// Cancels the run when this token fires.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Workspace memory searched before each step of the run's own agent: the machine asks for
    /// the step's chunks ([`crate::machine::Action::Recall`]) and the engine answers from
    /// `recall`'s index, journaled; the step's context shows them.
    pub fn memory(mut self, recall: Arc<crate::context::memory::Recall>) -> Self {
        self.recall = Some(recall);
        self
    }

    /// Model settings (mode, temperature, timeouts), for every agent of the run. Their mode
    /// is used only when neither [`AgentBuilder::mode`] nor the goal's `mode` says otherwise
    /// (and a delegate goal's own `mode` wins for its nested agent).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// How the model returns its Solution, over the goal's `mode` (the run's own agent and
    /// delegates whose goals name no `mode`).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// How model errors are retried (once, whatever the nesting).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// What is shown of tool results (default: the definition's).
    pub fn sanitize(mut self, limits: SanitizeLimits) -> Self {
        self.sanitize = limits;
        self
    }

    /// The most bytes of tool results the run keeps (journals), over all its calls; a result
    /// that would take it over is kept as a `run.result_bound` failure with its size, hash and
    /// first characters (default [`super::DEFAULT_KEPT_RESULT_BYTES`]).
    pub fn kept_result_bytes(mut self, bytes: u64) -> Self {
        self.kept_result_bytes = bytes;
        self
    }

    /// Resolves the model, policy and reviewers, reads delegate goals, and checks every tool can
    /// run.
    pub fn build(mut self) -> Result<Agent, AgentError> {
        check_activities(&self.goal, &self.registry)?;
        if let Some(m) = self.mode.or(self.goal.mode) {
            self.settings.mode = m;
        }
        // The window the list states: read from the spec the run records (the command line's,
        // else the goal's), so a reader of the run knows it as the run did.
        let window_tokens = self
            .model_spec
            .as_deref()
            .or(self.goal.model.as_deref())
            .and_then(ModelSpec::window_of_list);
        let mut root_models: Vec<Arc<dyn Model>> = match (self.model.take(), &self.model_spec) {
            (Some(m), _) => vec![m],
            (None, Some(spec)) => build_list(ModelSpec::parse_list(spec)?)?,
            (None, None) => match self.goal.model.as_deref() {
                Some(spec) => build_list(resolve_specs(&self.goal, spec)?)?,
                None => return Err(AgentError::NoModel),
            },
        };
        root_models.append(&mut self.fallbacks);
        let mut models = Models {
            root: Arc::new(chain(root_models, &self.retry).ok_or(AgentError::NoModel)?),
            by_spec: BTreeMap::new(),
        };
        // Recorded by the definition; a pointer it lacks is read from its file.
        let source = DelegateGoals::Recorded(&self.delegate_goals);
        let config = load_config(&self.goal, 0, true, Some(&self.registry), "", source)?;
        build_models(&config, &self.retry, &mut models)?;
        let policy = self.policy;
        let mut tools = BTreeMap::new();
        collect_tools(&config, &mut tools);
        let asks = crate::approval::who_asks(&policy, tools.values().map(|t| &**t));
        if asks.is_some() && self.approver.is_none() && !self.external_review {
            return Err(AgentError::NoApprover);
        }
        let run_id = self.run_id.take().unwrap_or_else(new_run_id);
        let executor = match self.executor.take() {
            Some(e) => e,
            None => {
                let mut registry = self.registry.clone();
                registry.set_delegate_runner(Arc::new(TooDeep));
                Arc::new(
                    RegistryExecutor::new(registry, self.hooks.clone()).with_run_id(run_id.clone()),
                )
            }
        };
        Ok(Agent {
            config: Arc::new(config),
            policy,
            sanitize: self.sanitize,
            kept_result_bytes: self.kept_result_bytes,
            models,
            settings: self.settings,
            executor,
            approver: self.approver,
            standing: self.standing,
            tools,
            asks,
            journal: self.journal,
            clock: self.clock.unwrap_or_else(system_clock),
            run_id,
            cancel: self.cancel,
            event_capacity: self.event_capacity,
            traced: self.traced,
            recall: self.recall,
            window_tokens,
        })
    }
}
