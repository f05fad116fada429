//! What an agent is, fixed before its run starts: goal text, data, tools, limits, compiled
//! schemas and the nested agents its delegate tools run.
//!
//! Built from an [`AgentSpec`] (what a goal says of its agent) without IO: the caller reads
//! delegate goals and passes their configurations in. The machine knows nothing of goal files.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::approval::Policy;
use crate::protocol::{Call, Limits, Message, OutputMethod, Path, Tool};
use crate::scheduler::{self, Scheduler, SchedulerOptions, ValidationError};
use crate::schema::{self, OutputValidator, SchemaError, ToolValidators};
use crate::state::State;

/// An agent's configuration (the run's own, or a delegate's).
#[derive(Debug)]
pub struct AgentConfig {
    /// What to achieve.
    pub goal: String,
    /// The input (`†input.*`) and its schema.
    pub input: Option<(Value, Option<Value>)>,
    /// The initial state and its schema.
    pub state: (Value, Option<Value>),
    /// Extra context messages.
    pub context: Vec<Message>,
    /// Calls run before the first Request.
    pub plan: Vec<Call>,
    /// Tools offered to the model.
    pub tools: Vec<Tool>,
    /// Limits, with durations already checked.
    pub limits: CheckedLimits,
    /// The composed Solution schema sent to the model.
    pub composed: Value,
    /// The user's output schema, compiled.
    pub output: OutputValidator,
    /// Params schemas, compiled.
    pub params: ToolValidators,
    /// `_output` schemas of latent tools, compiled (rule 20).
    pub latent_outputs: BTreeMap<String, OutputValidator>,
    /// The nested agent each delegate tool runs, by tool name.
    pub delegates: BTreeMap<String, Arc<AgentConfig>>,
    /// The model spec of this agent when it names its own (None: the run's model).
    pub model: Option<String>,
    /// How this agent's model returns its Solution when its goal says so (a delegate goal's
    /// `mode`); None: the run's mode. Kept here, with the rest of the agent, so that a turn
    /// asked again after a restart uses the same mode.
    pub mode: Option<crate::llm::Mode>,
}

/// [`Limits`] with their durations converted to milliseconds once, so nothing later can fail.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedLimits {
    /// Most Requests.
    pub max_steps: u32,
    /// Run time limit.
    pub timeout_ms: Option<u64>,
    /// Token budget.
    pub token_budget: Option<u64>,
    /// Invalid outputs sent back before failing.
    pub max_output_retries: u32,
    /// Consecutive empty turns before stopping.
    pub empty_turns: u32,
    /// Consecutive identical steps before stopping.
    pub doom_loop: u32,
    /// Per-call time limit.
    pub call_timeout_ms: Option<u64>,
}

pub use crate::duration::MAX_SECONDS;

/// A configuration that cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A duration is negative, not finite or absurdly large.
    #[error("`{field}` must be a number of seconds between 0 and {MAX_SECONDS}, found {value}")]
    BadDuration {
        /// The field (`limits.timeout_s`...).
        field: String,
        /// The value given.
        value: f64,
    },
    /// A schema does not compile or cannot be composed.
    #[error("{context}: {source}")]
    Schema {
        /// Where (`output_schema`, `tools[2]._output`...).
        context: String,
        /// Why.
        source: SchemaError,
    },
}

crate::codes::has_code!(ConfigError);

impl ConfigError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::BadDuration { .. } => "goal.invalid",
            ConfigError::Schema { source, .. } => source.code(),
        }
    }
}

/// Converts seconds to whole milliseconds with [`crate::duration::seconds`], refusing what no
/// clock can represent.
pub fn checked_ms(field: &str, seconds: f64) -> Result<u64, ConfigError> {
    crate::duration::seconds(field, seconds)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .map_err(|_| ConfigError::BadDuration {
            field: field.to_string(),
            value: seconds,
        })
}

impl CheckedLimits {
    /// Checks a goal's limits.
    pub fn new(l: &Limits) -> Result<Self, ConfigError> {
        let ms = |field: &str, v: Option<f64>| v.map(|s| checked_ms(field, s)).transpose();
        Ok(CheckedLimits {
            max_steps: l.max_steps,
            timeout_ms: ms("limits.timeout_s", l.timeout_s)?,
            token_budget: l.token_budget,
            max_output_retries: l.max_output_retries,
            empty_turns: l.empty_turns,
            doom_loop: l.doom_loop,
            call_timeout_ms: ms("limits.call_timeout_s", l.call_timeout_s)?,
        })
    }
}

/// What an agent is made of, as a goal (or a program) writes it: what [`AgentConfig::new`]
/// checks and compiles.
#[derive(Debug, Clone, Copy)]
pub struct AgentSpec<'a> {
    /// What to achieve.
    pub goal: &'a str,
    /// The input and its schema.
    pub input: Option<&'a Value>,
    /// The input's schema.
    pub input_schema: Option<&'a Value>,
    /// The initial state (None: `{}`).
    pub state: Option<&'a Value>,
    /// The state's schema.
    pub state_schema: Option<&'a Value>,
    /// Extra context messages.
    pub context: &'a [Message],
    /// Calls run before the first Request.
    pub plan: &'a [Call],
    /// Tools offered to the model.
    pub tools: &'a [Tool],
    /// Limits, as written.
    pub limits: &'a Limits,
    /// The user's output schema.
    pub output_schema: &'a Value,
    /// The agent's own model spec, if it names one.
    pub model: Option<&'a str>,
    /// How its model returns its Solution, if it says.
    pub mode: Option<crate::llm::Mode>,
}

impl AgentConfig {
    /// The configuration of the agent `spec` describes; `delegates` are the nested agents of its
    /// delegate tools (already built by the caller, which reads their goals).
    pub fn new(
        spec: AgentSpec<'_>,
        delegates: BTreeMap<String, Arc<AgentConfig>>,
    ) -> Result<Self, ConfigError> {
        let schema_err = |context: &str| {
            let context = context.to_string();
            move |source| ConfigError::Schema { context, source }
        };
        let composed =
            schema::compose(spec.tools, spec.output_schema).map_err(schema_err("the goal"))?;
        let output =
            OutputValidator::new(spec.output_schema).map_err(schema_err("output_schema"))?;
        let params = ToolValidators::new(spec.tools).map_err(schema_err("tools"))?;
        let mut latent_outputs = BTreeMap::new();
        for t in spec.tools.iter().filter(|t| t.is_latent()) {
            if let Some(out) = &t.output {
                let v = OutputValidator::new(out)
                    .map_err(schema_err(&format!("tool `{}` _output", t.name)))?;
                latent_outputs.insert(t.name.clone(), v);
            }
        }
        Ok(AgentConfig {
            goal: spec.goal.to_string(),
            input: spec.input.cloned().map(|i| (i, spec.input_schema.cloned())),
            state: (
                spec.state.cloned().unwrap_or_else(|| json!({})),
                spec.state_schema.cloned(),
            ),
            context: spec.context.to_vec(),
            plan: spec.plan.to_vec(),
            tools: spec.tools.to_vec(),
            limits: CheckedLimits::new(spec.limits)?,
            composed,
            output,
            params,
            latent_outputs,
            delegates,
            model: spec.model.map(str::to_string),
            mode: spec.mode,
        })
    }

    /// The scheduler of one step of this agent: its tools, the run's `policy`, and the checks
    /// every call goes through once its references resolve (params against the tool's schema;
    /// a latent call's `_output` against the tool's `_output`, rule 20). The run's machine and
    /// `dagloop validate` both take their schedulers from here, so they cannot disagree.
    pub(crate) fn scheduler(
        cfg: &Arc<AgentConfig>,
        state: State,
        policy: Policy,
        step: u32,
        keep_launched: bool,
    ) -> Scheduler {
        let params_cfg = cfg.clone();
        let validate: scheduler::Validator = Arc::new(move |tool, params| {
            ValidationError::check(params_cfg.params.validate_value(&tool.name, params)?)
        });
        let latent_cfg = cfg.clone();
        let validate_latent: scheduler::Validator = Arc::new(move |tool, params| {
            let Some(v) = latent_cfg.latent_outputs.get(&tool.name) else {
                return Ok(());
            };
            ValidationError::check(v.validate(params.get("_output").unwrap_or(&Value::Null)))
        });
        Scheduler::new(
            state,
            cfg.tools.iter().cloned(),
            policy,
            SchedulerOptions {
                step,
                validate: Some(validate),
                validate_latent: Some(validate_latent),
                keep_launched,
            },
        )
    }

    /// The agent's state before anything runs: `input` (the run's input, or a delegate call's
    /// params) and the initial `state`, written at `now`.
    pub fn initial_state(&self, input: Option<&Value>, now: u64) -> State {
        let mut state = State::new();
        if let Some(input) = input {
            state.write(
                Path::root("input"),
                input.clone(),
                OutputMethod::Set,
                None,
                now,
            );
        }
        state.write(
            Path::root("state"),
            self.state.0.clone(),
            OutputMethod::Set,
            None,
            now,
        );
        state
    }

    /// The nested agent a tool runs, when it is a delegate.
    pub fn delegate(&self, tool: &str) -> Option<&Arc<AgentConfig>> {
        self.delegates.get(tool)
    }
}
