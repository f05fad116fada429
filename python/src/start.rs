//! Starting or resuming a run from Python: the spec the Python side sends (a goal document or
//! file, the model, the store, a cassette, the names of its Python tools) becomes a run defined
//! and prepared exactly as `dagloop run` / `dagloop resume` do it (`runs::define`,
//! `runs::prepare`, the same grants as the command line's).
//!
//! Deliberately not here: composing the goal from Python objects (`python/dagloop/_goal.py`)
//! or checking anything the library checks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dagloop::Goal;
use dagloop::approval::ModeName;
use dagloop::runs::{self, Host, Review, RunOptions};
use dagloop::store::{RunStore, SqliteStore};
use dagloop::tools::Registry;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::run::Run;
use super::tool::{PyTools, WorkQueue};
use super::{Failure, complete};

/// What the Python side asks for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    /// A goal document (Python-composed).
    goal: Option<Value>,
    /// Or a goal file.
    goal_path: Option<PathBuf>,
    /// Where a goal document's relative paths start (default: the current directory).
    base_dir: Option<PathBuf>,
    /// Replaces the goal's `input`.
    input: Option<Value>,
    /// The Python tools: added to a new run's goal (replacing its tools of the same name), and
    /// the `"_activity": "rust"` tools whose calls go to Python (a goal's `rust` tool without
    /// one is refused by the builder, `agent.missing_activity`).
    #[serde(default)]
    tools: Vec<dagloop::Tool>,
    /// A model spec over the goal's.
    model: Option<String>,
    /// `auto`, `allowlist` or `ask` over the goal's policy.
    approve: Option<String>,
    /// The run store (a SQLite file).
    store: Option<PathBuf>,
    /// Continue this stored run instead of starting one.
    resume: Option<String>,
    /// Start a fork of this stored run after one of its steps (`dagloop fork`).
    fork: Option<ForkSpec>,
    /// Continue this finished stored run with a follow-up (`dagloop run --continue`).
    #[serde(rename = "continue")]
    follow: Option<FollowSpec>,
    /// Answer calls from this cassette (`--tools-from`).
    tools_from: Option<PathBuf>,
    #[serde(default)]
    passthrough: bool,
    /// Someone in Python decides approvals (a callback or `run.decide`).
    #[serde(default)]
    reviewer: bool,
}

/// `dagloop fork RUN --at-step N`: the run forked and the step after which the fork starts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkSpec {
    run_id: String,
    at_step: u32,
}

/// `dagloop run --continue RUN TEXT`: the finished run followed up, the follow-up's
/// instruction, and what carries over (`state`, `history` or `both`, the default).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FollowSpec {
    run_id: String,
    text: String,
    carry: Option<String>,
    #[serde(default = "yes")]
    wait: bool,
}

fn yes() -> bool {
    true
}

fn failure(code: &str, e: impl std::fmt::Display) -> Failure {
    (code.to_string(), e.to_string())
}

/// Starts the run `spec` (JSON) describes; `done(Run | result_json, error)`: a stored run that
/// already finished gives its result's JSON instead of a run.
#[pyfunction]
pub(crate) fn start(spec: &str, done: Py<PyAny>) -> PyResult<()> {
    let spec: Spec = serde_json::from_str(spec)
        .map_err(|e| PyValueError::new_err(format!("bad run spec: {e}")))?;
    complete(done, launch(spec))
}

/// A started run, or the result of a stored one that already finished.
pub(crate) enum Started {
    Run(Run),
    Finished(String),
}

impl<'py> IntoPyObject<'py> for Started {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match self {
            Started::Run(r) => Ok(Bound::new(py, r)?.into_any()),
            Started::Finished(s) => Ok(s.into_pyobject(py)?.into_any()),
        }
    }
}

async fn launch(spec: Spec) -> Result<Started, Failure> {
    let store: Option<Arc<dyn RunStore>> = match &spec.store {
        Some(p) => Some(Arc::new(
            SqliteStore::open(p).map_err(|e| failure(e.code(), e))?,
        )),
        None => None,
    };
    let started = launch_in(&spec, store.clone()).await;
    // However a resume was refused (a goal that no longer loads, a definition that changed, no
    // reviewer), the lease does not stay with this process, as with `dagloop resume`.
    if let (Err(_), Some(s), Some(id)) = (&started, &store, &spec.resume) {
        let _ = s.release(id);
    }
    started
}

async fn launch_in(spec: &Spec, store: Option<Arc<dyn RunStore>>) -> Result<Started, Failure> {
    let tools_from = match &spec.tools_from {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    "cli.not_found"
                } else {
                    "cli.unreadable"
                };
                failure(code, format!("cannot read {}: {e}", p.display()))
            })?;
            let c = runs::Cassette::parse(&text, &p.display().to_string())
                .map_err(|e| failure(e.code(), e))?;
            Some((Arc::new(c), spec.passthrough))
        }
        None => None,
    };
    let offline = matches!(&tools_from, Some((_, false)));
    let mut opts = RunOptions {
        model: spec.model.clone(),
        ..RunOptions::default()
    };
    let grants = Arc::new(dagloop::grants::Grants::cli(false));
    let (goal, resume) = match (&spec.resume, &spec.fork, &spec.follow) {
        (None, None, Some(f)) => {
            let s = store
                .as_ref()
                .ok_or_else(|| failure("cli.no_store", "continuing a run needs its store"))?;
            let (goal, id, journal, follow_opts) = follow(s, f, spec, grants.clone()).await?;
            opts = follow_opts;
            (goal, Some((id, journal)))
        }
        (None, Some(f), _) => {
            let s = store
                .as_ref()
                .ok_or_else(|| failure("cli.no_store", "forking a run needs its store"))?;
            let (goal, id, journal, fork_opts) = fork(s, f, spec, grants.clone()).await?;
            opts = fork_opts;
            (goal, Some((id, journal)))
        }
        (Some(id), _, _) => {
            let s = store
                .as_ref()
                .ok_or_else(|| failure("cli.no_store", "resuming a run needs its store"))?;
            let stored = s.load(id).map_err(|e| failure(e.code(), e))?;
            if let Some(r) = &stored.result {
                return Ok(Started::Finished(to_json(r)));
            }
            // Claimed before the journal is read again, as `dagloop resume` does.
            s.claim(id).map_err(|e| failure(e.code(), e))?;
            let stored = s.load(id).map_err(|e| failure(e.code(), e))?;
            let mut stored_opts = RunOptions::from_stored(&stored.record.options)
                .map_err(|e| failure(e.code(), e))?;
            if opts.model.is_some() {
                stored_opts.model = opts.model.take();
            }
            opts = stored_opts;
            let doc = stored.record.goal.to_string();
            let base = PathBuf::from(&stored.record.base_dir);
            let goal =
                Goal::from_json(&doc, Path::new(id), base).map_err(|e| failure(e.code(), e))?;
            (goal, Some((id.clone(), stored.journal)))
        }
        (None, None, None) => (new_goal(spec, offline)?, None),
    };
    if let Some(a) = &spec.approve {
        opts.approve = Some(ModeName::parse(a).map_err(|e| failure(e.code(), e))?);
    }
    let (queue, watched) = WorkQueue::new()
        .map_err(|e| failure("server.internal", format!("no wake-up socket: {e}")))?;
    let queue = Arc::new(queue);
    let activity = Arc::new(PyTools {
        queue: queue.clone(),
    });
    let mut registry = Registry::new();
    for t in &spec.tools {
        registry.register(t.name.clone(), activity.clone());
    }
    let def = runs::define(goal, opts, grants).map_err(|e| failure(e.code(), e))?;
    let review = if spec.reviewer {
        Review::External
    } else {
        Review::Nobody {
            how: "give the agent an `on_approval` callback, or decide through `agent.stream()` and `run.decide`".into(),
        }
    };
    let host = Host {
        store: store.clone(),
        tools_from,
        ..Host::default()
    };
    let prepared = runs::prepare(
        registry,
        &def,
        resume,
        review,
        CancellationToken::new(),
        host,
    )
    .await
    .map_err(|e| failure(e.code(), e))?;
    let launched = prepared.start().await.map_err(|e| failure(e.code(), e))?;
    Ok(Started::Run(Run::new(
        launched,
        queue,
        watched,
        store,
        &def.effective_goal().tools,
    )))
}

/// Records a fork of a stored run as `dagloop fork` does (the original's policy and mode go on;
/// the model and input may change): its goal, id, journal and options, to be continued like a
/// resumed run.
async fn fork(
    store: &Arc<dyn RunStore>,
    f: &ForkSpec,
    spec: &Spec,
    grants: Arc<dagloop::grants::Grants>,
) -> Result<(Goal, String, Vec<dagloop::JournalEntry>, RunOptions), Failure> {
    let err = |e: runs::RunsError| failure(e.code(), e);
    let stored = store.load(&f.run_id).map_err(|e| failure(e.code(), e))?;
    let base = RunOptions::from_stored(&stored.record.options).map_err(err)?;
    let opts = RunOptions {
        model: base.model,
        approve: base.approve,
        mode: base.mode,
        floor: base.floor,
        agent: base.agent,
        ..RunOptions::default()
    };
    let fork = runs::fork(
        &stored,
        f.at_step,
        spec.model.clone(),
        spec.input.clone(),
        opts,
        runs::now_ms(),
    )
    .map_err(err)?;
    // Refused before anything is recorded: a fork the grants do not allow leaves no run.
    runs::define(fork.goal.clone(), fork.options.clone(), grants).map_err(err)?;
    let seeded = runs::seed(&**store, &fork).await.map_err(err)?;
    Ok((fork.goal, fork.record.id, seeded.journal, fork.options))
}

/// The goal of a new run: the file, or the document, with the Python tools added.
fn new_goal(spec: &Spec, offline: bool) -> Result<Goal, Failure> {
    let (mut doc, origin, base) = match (&spec.goal_path, &spec.goal) {
        (Some(p), _) => {
            let load = if offline {
                Goal::load_offline
            } else {
                Goal::load
            };
            let g = load(p).map_err(|e| failure(e.code(), e))?;
            let base = g.base_dir.clone();
            (
                serde_json::to_value(&g).map_err(|e| failure("goal.invalid", e))?,
                p.clone(),
                base,
            )
        }
        (None, Some(doc)) => {
            let base = match &spec.base_dir {
                Some(b) => b.clone(),
                None => std::env::current_dir().map_err(|e| failure("goal.invalid", e))?,
            };
            (doc.clone(), PathBuf::from("<python>"), base)
        }
        (None, None) => return Err(failure("goal.invalid", "no goal given")),
    };
    if !spec.tools.is_empty() {
        let tools = doc
            .as_object_mut()
            .ok_or_else(|| failure("goal.invalid", "the goal is not a JSON object"))?
            .entry("tools")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = tools {
            let names: Vec<&str> = spec.tools.iter().map(|t| t.name.as_str()).collect();
            list.retain(|t| {
                t.get("_tool")
                    .and_then(Value::as_str)
                    .is_none_or(|n| !names.contains(&n))
            });
            for t in &spec.tools {
                list.push(serde_json::to_value(t).map_err(|e| failure("goal.invalid", e))?);
            }
        }
    }
    runs::goal_with_input(&doc, spec.input.clone(), &origin, base).map_err(|e| failure(e.code(), e))
}

pub(crate) fn to_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Records a follow-up of a finished stored run as `dagloop run --continue` does
/// (`runs::continue_run`: the parent's model, policy, mode and floor go on unless the spec names
/// a model), to be continued like a resumed run.
async fn follow(
    store: &Arc<dyn RunStore>,
    f: &FollowSpec,
    spec: &Spec,
    grants: Arc<dagloop::grants::Grants>,
) -> Result<(Goal, String, Vec<dagloop::JournalEntry>, RunOptions), Failure> {
    let err = |e: runs::RunsError| failure(e.code(), e);
    let carry = match &f.carry {
        Some(c) => runs::Carry::parse(c).ok_or_else(|| {
            failure(
                "cli.usage",
                format!("carry is state, history or both, not `{c}`"),
            )
        })?,
        None => runs::Carry::default(),
    };
    let how = runs::Continue {
        next: runs::Next::Text(f.text.clone()),
        carry,
        wait: f.wait,
    };
    let stored = store.load(&f.run_id).map_err(|e| failure(e.code(), e))?;
    let base = RunOptions::from_stored(&stored.record.options).map_err(err)?;
    let opts = RunOptions {
        model: spec.model.clone().or(base.model),
        approve: base.approve,
        mode: base.mode,
        floor: base.floor,
        agent: base.agent,
        ..RunOptions::default()
    };
    // Refused before anything is recorded: a follow-up the grants do not allow leaves no run.
    let mut check = |fork: &runs::Fork| {
        runs::define(fork.goal.clone(), fork.options.clone(), grants.clone()).map(|_| ())
    };
    let (fork, seeded) = runs::continue_run(&**store, &f.run_id, &how, opts, &mut check)
        .await
        .map_err(err)?;
    Ok((fork.goal, fork.record.id, seeded.journal, fork.options))
}
