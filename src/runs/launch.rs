//! Starting and continuing runs: the goal's MCP servers, the agent, its store records, and the
//! decisions recorded while no process ran the run.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{RunDef, RunOptions, RunsError};
use crate::approval::Approver;
use crate::engine::{Agent, AgentBuilder, JournalSink, RunHandle};
use crate::goal::Goal;
use crate::machine::JournalEntry;
use crate::protocol::{OpError, Tool};
use crate::store::{RunRecord, RunStore};
use crate::tools::{Activity, Registry};

/// Who answers the run's approval requests.
pub enum Review {
    /// Nobody in this process: decisions arrive as ops (a terminal prompt, the server's API,
    /// `dagloop decide`).
    External,
    /// This approver (scripted decisions, a policy default).
    Approver(Arc<dyn Approver>),
    /// Nobody: a run that can ask a reviewer ([`crate::approval::may_ask`], with every tool the
    /// run can call, its MCP servers' and delegates' included) is refused before it starts
    /// (`approval.no_reviewer`); `how` says what the front-end offers instead.
    Nobody {
        /// What the user can do (`give --decisions FILE, --detach ...`).
        how: String,
    },
}

/// The MCP servers one run started for itself; they stop when dropped.
#[cfg(feature = "mcp")]
pub type Servers = crate::tools::mcp::McpServers;
/// The MCP servers one run started for itself (none without the `mcp` feature).
#[cfg(not(feature = "mcp"))]
pub type Servers = ();
/// The MCP servers a process shares between its runs.
#[cfg(feature = "mcp")]
pub type Pool = crate::tools::mcp::McpPool;
/// The MCP servers a process shares between its runs (none without the `mcp` feature).
#[cfg(not(feature = "mcp"))]
pub type Pool = ();

/// Where a run lives: the store that records it (and leases it to this process), the sink its
/// journal goes to (default: the store), and the MCP servers it may share with the process's
/// other runs (`dagloop serve`; a one-run process starts the goal's servers for itself).
#[derive(Default)]
pub struct Host {
    /// The run store.
    pub store: Option<Arc<dyn RunStore>>,
    /// Replaces the store as the journal's durable sink (the crash-test hook wraps the store).
    pub sink: Option<Arc<dyn JournalSink>>,
    /// Shared MCP servers.
    pub mcp: Option<Pool>,
    /// Answer the run's calls from this recording (`--tools-from`); with `true`, a call it does
    /// not hold runs for real instead of failing with `cassette.miss`.
    pub tools_from: Option<(Arc<super::Cassette>, bool)>,
    /// Standing approvals that apply from a new run's start (a decisions file's `allow`
    /// entries).
    pub standing: Vec<(crate::protocol::StandingSpec, Option<crate::protocol::Actor>)>,
}

/// A run that is built and recorded, not yet started.
pub struct Prepared {
    agent: Agent,
    journal: Option<Vec<JournalEntry>>,
    store: Option<Arc<dyn RunStore>>,
    servers: Option<Servers>,
    options: RunOptions,
}

/// A run that is going.
pub struct Launched {
    /// Ops in, events out.
    pub handle: RunHandle,
    /// Decisions recorded while no process ran the run that no longer apply.
    pub refused: Vec<OpError>,
    /// The goal's MCP servers; they stop when this is dropped.
    pub servers: Option<Servers>,
}

/// The MCP tools that differ between what a run recorded and what its servers announce now
/// (`mcp tool NAME added`, `removed`, `changed`: its schema, annotations or approval), by name.
/// Nothing when the run recorded none (a run recorded by an older dagloop: nothing to hold it
/// to).
fn changed_tools(recorded: &[Tool], announced: &[Tool]) -> Vec<String> {
    if recorded.is_empty() {
        return Vec::new();
    }
    let by_name = |ts: &[Tool]| -> std::collections::BTreeMap<String, Value> {
        ts.iter()
            .map(|t| (t.name.clone(), serde_json::to_value(t).unwrap_or(Value::Null)))
            .collect()
    };
    let (was, now) = (by_name(recorded), by_name(announced));
    let mut changed = Vec::new();
    for (name, t) in &was {
        match now.get(name) {
            None => changed.push(format!("mcp tool {name} removed")),
            Some(n) if n != t => changed.push(format!("mcp tool {name} changed")),
            Some(_) => {}
        }
    }
    for name in now.keys().filter(|n| !was.contains_key(*n)) {
        changed.push(format!("mcp tool {name} added"));
    }
    changed
}

/// Builds the run (`resume`: its id and journal) and records it in the host's store.
/// `registry` holds the activities a program registered for the goal's tools (Rust functions,
/// extra activity kinds; the command line and the server pass an empty one, the store benchmark
/// its own), so that a program runs a goal exactly the way the command line does.
pub async fn prepare(
    registry: Registry,
    def: &RunDef,
    resume: Option<(String, Vec<JournalEntry>)>,
    review: Review,
    cancel: CancellationToken,
    host: Host,
) -> Result<Prepared, RunsError> {
    let Host {
        store,
        sink,
        mcp: pool,
        tools_from,
        standing,
    } = host;
    let record_goal = serde_json::to_value(def.goal()).unwrap_or(Value::Null);
    // Absolute, so that the run can be continued from any directory.
    let base_dir = absolute_dir(&def.goal().base_dir).display().to_string();
    let (builder, servers, mcp_tools) = builder_and_tools(registry, def, pool.as_ref()).await?;
    // The record holds the tools the MCP servers announced now: a reader of the stored run
    // knows its calls to them without starting the servers.
    let mut options = def.options().clone();
    if let Some(r) = options.record.as_mut() {
        // The record is the truth a replay reads: a run resumed under its recorded definition
        // (not `--accept-changes`, which clears the digests) goes on only with the tools it
        // recorded. Servers that now announce other tools refuse the resume.
        if resume.is_some() && def.held_to_record() {
            let changed = changed_tools(&r.mcp_tools, &mcp_tools);
            if !changed.is_empty() {
                return Err(RunsError::DefinitionChanged { changed });
            }
        }
        r.mcp_tools = mcp_tools;
    }
    let opts = &options;
    let mut builder = builder.cancel_token(cancel).standing_approvals(standing);
    let mut nobody = None;
    builder = match review {
        Review::External => builder.external_review(),
        Review::Approver(a) => builder.approver(a),
        Review::Nobody { how } => {
            nobody = Some(how);
            builder.external_review()
        }
    };
    let (run_id, journal) = match resume {
        Some((id, j)) => (Some(id), Some(j)),
        None => (None, None),
    };
    let run_id = match (tools_from, run_id) {
        (Some((cassette, passthrough)), id) => {
            let id = id.unwrap_or_else(crate::engine::bus::new_run_id);
            let inner: Option<Arc<dyn crate::engine::Executor>> = passthrough.then(|| {
                let registry = builder.registry_mut().clone();
                Arc::new(
                    crate::engine::RegistryExecutor::new(registry, Default::default())
                        .with_run_id(id.clone()),
                ) as Arc<dyn crate::engine::Executor>
            });
            if !passthrough {
                // Every call is answered from the recording: a Rust tool needs no function in
                // this process (the command line has none), only a name for the builder's check.
                for t in &def.effective_goal().tools {
                    if t.activity.as_deref() == Some("rust") && !builder.registry_mut().has(&t.name)
                    {
                        builder
                            .registry_mut()
                            .register_fn(&t.name, |_: Value| async {
                                Err::<Value, String>("answered from the recording only".into())
                            });
                    }
                }
            }
            builder = builder.executor(Arc::new(super::CassetteExecutor::new(cassette, inner)));
            Some(id)
        }
        (None, id) => id,
    };
    if let Some(id) = &run_id {
        builder = builder.run_id(id.clone());
    }
    match (sink, &store) {
        (Some(s), _) => builder = builder.journal(s),
        (None, Some(s)) => builder = builder.journal(s.clone()),
        (None, None) => {}
    }
    let agent = builder.build()?;
    if let (Some(how), Some(asking)) = (nobody, agent.who_asks()) {
        return Err(RunsError::NoReviewer {
            asking: asking.to_string(),
            how,
        });
    }
    if let Some(s) = &store {
        let id = agent.run_id().to_string();
        match &journal {
            None => s.create(&RunRecord {
                id,
                created_at: now_ms(),
                goal: record_goal,
                base_dir,
                options: recorded(opts),
            })?,
            Some(_) => {
                // Front-ends claim a stored run before they load its journal (so that the
                // journal they continue is the one the lease covers); claiming again renews it.
                s.claim(&id)?;
                // The definition the run goes on under (new digests after accepted changes).
                s.set_options(&id, &recorded(opts))?;
            }
        }
    }
    Ok(Prepared {
        agent,
        journal,
        store,
        servers,
        options,
    })
}

/// The options as recorded with the run: a `scripted:` model path, relative to this directory
/// now, made absolute so that `resume` finds the file from anywhere.
fn recorded(opts: &RunOptions) -> Value {
    serde_json::to_value(RunOptions {
        model: opts.model.as_deref().map(absolute_model),
        ..opts.clone()
    })
    .unwrap_or(Value::Null)
}

/// The builder of a defined run: its policy, model and mode, what its grants allow the
/// activities (the shell, HTTP egress), and the tools of the goal's MCP servers (started now,
/// from `pool` when given; a server that cannot start is an error now). Every engine builds its
/// agents here, so the same definition means the same run whichever engine drives it.
pub async fn builder_for(
    registry: Registry,
    def: &RunDef,
    pool: Option<&Pool>,
) -> Result<(AgentBuilder, Option<Servers>), RunsError> {
    let (builder, servers, _) = builder_and_tools(registry, def, pool).await?;
    Ok((builder, servers))
}

/// [`builder_for`], with the tools the run's MCP servers announced (those the run can call).
async fn builder_and_tools(
    registry: Registry,
    def: &RunDef,
    pool: Option<&Pool>,
) -> Result<(AgentBuilder, Option<Servers>, Vec<Tool>), RunsError> {
    let goal = def.effective_goal().clone();
    let mcp = start_mcp(&goal, pool).await?;
    let mut builder = def.agent_builder(registry);
    let mut announced = Vec::new();
    let servers = match mcp {
        Some((tools, activities, servers)) => {
            let mut acts: BTreeMap<String, Arc<dyn Activity>> = activities.into_iter().collect();
            for t in tools {
                if let Some(a) = acts.remove(&t.name) {
                    announced.push(t.clone());
                    builder = builder.tool(t, a);
                }
            }
            Some(servers)
        }
        None => None,
    };
    Ok((builder, servers, announced))
}

impl Prepared {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.agent.run_id()
    }

    /// The options as recorded with the run: the definition's, with the tools its MCP servers
    /// announced (what a view of the live run rebuilds it from).
    pub fn options(&self) -> &RunOptions {
        &self.options
    }

    /// Why a call of the run may have to be presented to a reviewer, None when none can (see
    /// [`crate::engine::Agent::who_asks`]).
    pub fn who_asks(&self) -> Option<&str> {
        self.agent.who_asks()
    }

    /// The run's record as a store would hold it (`def` is the definition it was prepared
    /// from): what a view of the live run is rebuilt from, with or without a store.
    pub fn record(&self, def: &RunDef) -> RunRecord {
        RunRecord {
            id: self.run_id().to_string(),
            created_at: now_ms(),
            goal: serde_json::to_value(def.goal()).unwrap_or(Value::Null),
            base_dir: absolute_dir(&def.goal().base_dir).display().to_string(),
            options: recorded(&self.options),
        }
    }

    /// Starts (or continues) the run; decisions recorded while no process ran it apply first.
    pub async fn start(self) -> Result<Launched, RunsError> {
        let resumed = self.journal.is_some();
        let handle = match self.journal {
            Some(j) => self.agent.resume(j),
            None => self.agent.start(),
        };
        let mut refused = Vec::new();
        if resumed && let Some(s) = &self.store {
            for op in s.take_ops(handle.run_id())? {
                if let Err(e) = handle.submit_queued(op).await {
                    refused.push(e);
                }
            }
        }
        Ok(Launched {
            handle,
            refused,
            servers: self.servers,
        })
    }
}

/// Applies decisions recorded in the store (`dagloop decide`) while this process runs the run;
/// `refused` hears about those that no longer apply.
pub fn spawn_op_poller(
    handle: &RunHandle,
    store: Arc<dyn RunStore>,
    refused: impl Fn(OpError) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let handle = handle.clone();
    tokio::spawn(async move {
        loop {
            let id = handle.run_id().to_string();
            let s = store.clone();
            let ops = tokio::task::spawn_blocking(move || s.take_ops(&id))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            for op in ops {
                if let Err(e) = handle.submit_queued(op).await {
                    refused(e);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })
}

/// Stops a run's MCP servers (drops them; there are none without the `mcp` feature).
fn stop(_servers: Servers) {}

/// `goal` with its MCP servers' tools listed among its own (the servers are started to list
/// them, then stopped): for an engine whose run is built where the servers cannot be started
/// (a Temporal workflow), so that its calls to those tools are known. The engine that runs the
/// calls starts the servers again and puts the same tools back with their activities.
pub async fn with_mcp_tools(mut goal: Goal) -> Result<Goal, RunsError> {
    if let Some((tools, activities, servers)) = start_mcp(&goal, None).await? {
        stop(servers);
        // The tools `builder_for` gives the run: those the servers can run.
        let runnable: std::collections::BTreeSet<String> =
            activities.into_iter().map(|(name, _)| name).collect();
        for t in tools.into_iter().filter(|t| runnable.contains(&t.name)) {
            goal.tools.retain(|g| g.name != t.name);
            goal.tools.push(t);
        }
    }
    Ok(goal)
}

type McpStart = (Vec<Tool>, Vec<(String, Arc<dyn Activity>)>, Servers);

#[cfg(feature = "mcp")]
async fn start_mcp(goal: &Goal, pool: Option<&Pool>) -> Result<Option<McpStart>, RunsError> {
    if goal.mcp_servers.is_empty() {
        return Ok(None);
    }
    // MCP tools whose names clash with the goal's own are prefixed.
    let reserved: Vec<String> = goal.tools.iter().map(|t| t.name.clone()).collect();
    let servers = crate::tools::mcp::McpServers::start_in(&goal.mcp_servers, &reserved, None, pool)
        .await
        .map_err(|e| RunsError::Tools {
            code: e.code(),
            message: e.to_string(),
        })?;
    let (tools, activities) = servers
        .tools()
        .into_iter()
        .map(|(t, a)| (t.clone(), (t.name, a)))
        .unzip();
    Ok(Some((tools, activities, servers)))
}

#[cfg(not(feature = "mcp"))]
async fn start_mcp(goal: &Goal, _pool: Option<&Pool>) -> Result<Option<McpStart>, RunsError> {
    if goal.mcp_servers.is_empty() {
        return Ok(None);
    }
    Err(RunsError::Tools {
        code: "cli.feature_disabled",
        message: "this goal names MCP servers; build dagloop with the `mcp` feature".into(),
    })
}

/// `dir` made absolute (canonical when it exists): relative to the current directory, the
/// empty path being the current directory itself. Left as it is when there is no current
/// directory to anchor it to.
pub fn absolute_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_path_buf())
}

/// A model spec whose `scripted:` path is relative to the current directory, made absolute
/// (what a run records, so that `resume` finds the file from anywhere); other specs as they are.
pub fn absolute_model(spec: &str) -> String {
    // A list of fallback models: each of its specs.
    if spec.contains(',') {
        return spec
            .split(',')
            .map(|one| absolute_model(one.trim()))
            .collect::<Vec<_>>()
            .join(",");
    }
    let (bare, window) = crate::llm::ModelSpec::split_window(spec).unwrap_or((spec, None));
    match bare.strip_prefix("scripted:") {
        Some(p) if !std::path::Path::new(p).is_absolute() => {
            let path = std::path::Path::new(p);
            let abs = std::fs::canonicalize(path)
                .or_else(|_| std::path::absolute(path))
                .unwrap_or_else(|_| path.to_path_buf());
            let window = window.map_or(String::new(), |w| {
                format!("{}{w}", crate::llm::WINDOW_SUFFIX)
            });
            format!("scripted:{}{window}", abs.display())
        }
        _ => spec.to_string(),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
