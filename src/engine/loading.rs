//! What the builder reads and builds before a run starts: each agent's configuration from its
//! goal (delegate goal files read once, nesting bounded), the model list a goal or option names,
//! and the check that every tool's activity can run.
//!
//! Deliberately not here: the builder's options (`builder`) or a built run (`agent`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::error::AgentError;
use super::turns::Models;
use crate::goal::{DelegateGoals, Goal};
use crate::llm::{Fallback, LlmError, Model, ModelSpec, RetryPolicy, Retrying};
use crate::machine::{AgentConfig, MAX_DEPTH};
use crate::protocol::Tool;
use crate::tools::{ActivityError, ActivityFuture, DelegateRunner, Registry};

/// The specs of a goal's `model` list, `scripted:` paths resolved against the goal's folder.
pub(super) fn resolve_specs(goal: &Goal, specs: &str) -> Result<Vec<ModelSpec>, LlmError> {
    Ok(ModelSpec::parse_list(specs)?
        .into_iter()
        .map(|spec| match spec {
            ModelSpec::Scripted(p) => ModelSpec::Scripted(goal.resolve_path(&p.to_string_lossy())),
            other => other,
        })
        .collect())
}

pub(super) fn build_list(specs: Vec<ModelSpec>) -> Result<Vec<Arc<dyn Model>>, LlmError> {
    specs.iter().map(ModelSpec::build).collect()
}

/// The models, each with its own retries, tried in order (None when there is none).
pub(super) fn chain(models: Vec<Arc<dyn Model>>, retry: &RetryPolicy) -> Option<Fallback> {
    let mut models = models
        .into_iter()
        .map(|m| -> Arc<dyn Model> { Arc::new(Retrying::new(m, retry.clone())) });
    let first = models.next()?;
    Some(Fallback::new(first, models.collect()))
}

/// Every tool can run: an activity registered under its name, or a kind the registry knows
/// whose check accepts the tool's configuration (`Registry::check`: the same rule `dagloop
/// validate` applies with the built-in kinds).
pub(super) fn check_activities(goal: &Goal, registry: &Registry) -> Result<(), AgentError> {
    for t in goal.tools.iter().filter(|t| !registry.has(&t.name)) {
        if t.activity.as_deref() == Some("rust") {
            return Err(AgentError::MissingActivity {
                tool: t.name.clone(),
                activity: "rust".into(),
                reason: "no Rust function is registered under this name (register one with Registry::register_fn; the command line cannot run Rust activities)".into(),
            });
        }
        registry
            .check(t, &goal.base_dir)
            .map_err(AgentError::Activity)?;
    }
    Ok(())
}

/// True when the tool runs a nested agent (the registry's answer: `tools::kind_of`).
pub(super) fn is_delegate(t: &Tool) -> bool {
    crate::tools::kind_of(t) == Some("delegate")
}

/// The configuration of `goal`'s agent with its delegates' goals taken from `delegates` (a
/// stored run's record: nothing is read from disk for what the record holds). No model is built
/// and no activity checked: a definition and a reader of a stored run need the tree, not
/// activities that can run (a program registers its own after defining the run).
pub fn config_with(
    goal: &Goal,
    delegates: DelegateGoals<'_>,
) -> Result<Arc<AgentConfig>, AgentError> {
    load_config(goal, 0, true, None, "", delegates).map(Arc::new)
}

pub(super) fn build_models(
    cfg: &AgentConfig,
    retry: &RetryPolicy,
    models: &mut Models,
) -> Result<(), AgentError> {
    if let Some(spec) = &cfg.model
        && !models.by_spec.contains_key(spec)
    {
        let list = build_list(ModelSpec::parse_list(spec)?)?;
        let m = chain(list, retry).ok_or(AgentError::NoModel)?;
        models.by_spec.insert(spec.clone(), Arc::new(m));
    }
    for d in cfg.delegates.values() {
        build_models(d, retry, models)?;
    }
    Ok(())
}

pub(super) fn spec_string(spec: &ModelSpec) -> String {
    match spec {
        ModelSpec::Scripted(p) => format!("scripted:{}", p.display()),
        ModelSpec::OpenAi(m) => format!("openai:{m}"),
        ModelSpec::Anthropic(m) => format!("anthropic:{m}"),
    }
}

/// The agent of `goal` and, recursively up to [`MAX_DEPTH`], the agents of its delegate tools;
/// each delegate's activities checked against `registry` when there is one (the builder's).
pub(super) fn load_config(
    goal: &Goal,
    depth: u32,
    own_model: bool,
    registry: Option<&Registry>,
    at: &str,
    source: DelegateGoals<'_>,
) -> Result<AgentConfig, AgentError> {
    let mut delegates = BTreeMap::new();
    if depth < MAX_DEPTH {
        for (i, t) in goal
            .tools
            .iter()
            .enumerate()
            .filter(|(_, t)| is_delegate(t) && !registry.is_some_and(|r| r.has(&t.name)))
        {
            let pointer = format!("{at}/tools/{i}/_delegate");
            let fail = |reason: String| AgentError::Delegate {
                tool: t.name.clone(),
                reason,
            };
            let target = t
                .schema
                .get("_delegate")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    fail("`_delegate` must be a goal file path or \"anonymous\"".into())
                })?;
            let (child, own) = if target == "anonymous" {
                let description = t
                    .schema
                    .get("description")
                    .and_then(Value::as_str)
                    .filter(|d| !d.trim().is_empty())
                    .unwrap_or(&t.name);
                let doc = json!({
                    "goal": description,
                    "output_schema": t.output.clone().unwrap_or_else(|| json!({})),
                });
                let g = Goal::from_json(&doc.to_string(), t.name.as_ref(), goal.base_dir.clone())
                    .map_err(|e| fail(e.to_string()))?;
                (g, false)
            } else {
                let g = source
                    .load(&pointer, &goal.resolve_path(target))
                    .map_err(|e| fail(e.to_string()))?;
                let own = g.model.is_some();
                (g, own)
            };
            if let Some(registry) = registry {
                check_activities(&child, registry)?;
            }
            let cfg = load_config(&child, depth + 1, own, registry, &pointer, source)?;
            delegates.insert(t.name.clone(), Arc::new(cfg));
        }
    }
    let mut cfg = goal.agent_config(delegates)?;
    cfg.model = None;
    if depth == 0 {
        // The run's own mode is the run's settings (`--mode` over the goal's `mode`).
        cfg.mode = None;
    }
    if depth > 0
        && own_model
        && let Some(spec) = goal.model.as_deref()
    {
        let specs = resolve_specs(goal, spec)?;
        cfg.model = Some(specs.iter().map(spec_string).collect::<Vec<_>>().join(","));
    }
    Ok(cfg)
}

pub(super) fn collect_tools(cfg: &AgentConfig, out: &mut BTreeMap<String, Arc<Tool>>) {
    for t in &cfg.tools {
        out.entry(t.name.clone())
            .or_insert_with(|| Arc::new(t.clone()));
    }
    for d in cfg.delegates.values() {
        collect_tools(d, out);
    }
}

/// Delegate calls that reach the registry are those nested too deep to be loaded.
pub(super) struct TooDeep;

impl DelegateRunner for TooDeep {
    fn run_delegate(
        &self,
        tool: &Tool,
        _call: Arc<crate::protocol::Call>,
        _scoped: serde_json::Map<String, Value>,
    ) -> ActivityFuture {
        let e = ActivityError::Config {
            tool: tool.name.clone(),
            reason: format!("delegates nest deeper than {MAX_DEPTH} levels"),
        };
        Box::pin(async move { Err(e) })
    }
}
