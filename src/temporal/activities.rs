//! The run's activities on a worker: one model turn (its inputs signalled to the workflow as the
//! stream goes) and one call. Both build the run's agent from its spec with the same code as
//! the embedded engine (`runs::builder_for`), then run the engine's own turn reader or activity.
// The SDK's macros generate items (activity and handler definitions) that carry no docs.
#![allow(missing_docs)]

use std::sync::Arc;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use temporalio_client::WorkflowSignalOptions;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

use super::RunSpec;
use super::workflow::{HEARTBEAT_EVERY, RunWorkflow, TurnItem};
use crate::engine::{Parts, config_at};
use crate::goal::Goal;
use crate::machine::{FrameKey, RunInput};
use crate::protocol::{Call, CallId, Message, Tool};
use crate::runs::{Pool, RunsError, Servers, builder_for};
use crate::scheduler::Outcome;
use crate::tools::Registry;

/// A model turn to ask.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnTask {
    /// The run.
    pub spec: RunSpec,
    /// The agent.
    pub frame: FrameKey,
    /// Its step.
    pub step: u32,
    /// The delegate tool names from the run's agent to this one.
    pub path: Vec<String>,
    /// The context.
    pub messages: Vec<Message>,
    /// Requests the run already made of this model.
    pub asked_before: usize,
    /// Calls at the start of the answer already taken.
    pub skip_calls: usize,
}

/// How a model turn ended: how many inputs it signalled, and the input that closes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnDone {
    /// Inputs signalled (numbered from 0).
    pub sent: usize,
    /// The closing input (`stream_closed`).
    pub closed: RunInput,
}

/// A call to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallTask {
    /// The run.
    pub spec: RunSpec,
    /// The call's id.
    pub id: CallId,
    /// The call, references resolved (shared with the workflow's `started` event: serialized
    /// from it, never copied for the task).
    pub call: Arc<Call>,
    /// Its tool.
    pub tool: Tool,
    /// Its time limit.
    pub timeout_ms: Option<u64>,
    /// What the run could still keep of tool results when it launched the call: the activity
    /// reads no further and bounds the result by the run's rule (absent in tasks of an older
    /// dagloop: not bounded here, the workflow still bounds what it keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::tools::ResultBudget>,
}

/// A workspace memory search for one step of the run's agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallTask {
    /// The run.
    pub spec: RunSpec,
    /// The step's query (`context::memory::step_query`).
    pub query: String,
}

/// A chunk of a previous execution's journal to pull (`carry`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkTask {
    /// The previous execution's run id (the workflow id is the activity's).
    pub run_id: String,
    /// Which chunk.
    pub index: u32,
}

/// A finished run to report to this worker's OpenTelemetry pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceTask {
    /// The run.
    pub spec: RunSpec,
    /// Its whole journal.
    pub journal: Vec<crate::machine::JournalEntry>,
}

/// The activities a worker runs: built-in activity kinds, plus the Rust activities of
/// `registry`, and MCP servers shared between the runs the worker serves.
pub struct DagloopActivities {
    registry: Registry,
    pool: Option<Pool>,
    grants: Arc<crate::grants::Grants>,
    webhook: Option<crate::notify::WebhookConfig>,
}

/// One `approval_requested` to post to the worker's webhook.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotifyTask {
    /// The run.
    pub run_id: String,
    /// The call awaiting a decision.
    pub call: u64,
    /// Its tool.
    pub tool: String,
    /// Whether a restart interrupted it.
    pub interrupted: bool,
    /// The rule that asked.
    pub rule: Option<String>,
    /// The page address of the server that started the run (the worker's `page_url` wins).
    pub page: String,
}

impl DagloopActivities {
    /// Activities over `registry` (a program's Rust activities; empty for `dagloop worker`),
    /// granting runs everything (the program is the operator).
    pub fn new(registry: Registry, pool: Option<Pool>) -> Self {
        DagloopActivities {
            registry,
            pool,
            grants: Arc::new(crate::grants::Grants::open()),
            webhook: None,
        }
    }

    /// Posts runs' `approval_requested` notifications to `webhook` (the operator's
    /// `notify.webhook`); without one, a run that asks for them gets none from this worker.
    pub fn with_webhook(mut self, webhook: Option<crate::notify::WebhookConfig>) -> Self {
        self.webhook = webhook;
        self
    }

    /// Defines every run under `grants` instead.
    pub fn with_grants(mut self, grants: Arc<crate::grants::Grants>) -> Self {
        self.grants = grants;
        self
    }
}

/// The run's goal as recorded, loaded in this process (its `${VAR}` placeholders resolved here).
fn goal_of(spec: &RunSpec) -> Result<Goal, crate::goal::GoalError> {
    Goal::from_json(
        &spec.goal.to_string(),
        std::path::Path::new(&spec.id),
        std::path::PathBuf::from(&spec.base_dir),
    )
}

/// The run's agent, taken apart, with the MCP servers it started (kept while it is used).
pub(super) async fn parts(
    spec: &RunSpec,
    registry: &Registry,
    pool: Option<&Pool>,
    grants: &Arc<crate::grants::Grants>,
) -> Result<(Parts, Option<Servers>), RunsError> {
    // The process that drives the run: its `${VAR}` placeholders must be set here.
    let mut goal = goal_of(spec)?;
    // The MCP tools the spec lists (`runs::with_mcp_tools`) come back from the servers, with
    // their activities.
    if !goal.mcp_servers.is_empty() {
        goal.tools.retain(|t| t.activity.as_deref() != Some("mcp"));
    }
    let def = crate::runs::define(goal, spec.run_options()?, grants.clone())?;
    let (builder, servers) = builder_for(registry.clone(), &def, pool).await?;
    let agent = builder.external_review().run_id(spec.id.clone()).build()?;
    Ok((agent.into_parts(), servers))
}

fn fail(e: impl std::fmt::Display) -> ActivityError {
    ActivityError::application(temporalio_sdk::ApplicationFailure::new(e.to_string()))
}

#[activities]
impl DagloopActivities {
    /// Chunk `index` of the journal of this workflow's previous execution (its `carried_chunk`
    /// query), for an execution that continued as new with a journal too large to carry.
    #[activity]
    pub async fn carried_chunk(
        self: Arc<Self>,
        ctx: ActivityContext,
        task: ChunkTask,
    ) -> Result<Vec<crate::machine::JournalEntry>, ActivityError> {
        let workflow_id = ctx
            .info()
            .workflow_id
            .clone()
            .ok_or_else(|| fail("a carried chunk is pulled only inside a run's workflow"))?;
        let client = ctx.client();
        let info = temporalio_client::WorkflowExecutionInfo::builder()
            .namespace(client.options().namespace.clone())
            .workflow_id(workflow_id)
            .run_id(task.run_id)
            .build();
        temporalio_client::WorkflowHandle::<_, RunWorkflow>::new(client, info)
            .query(
                RunWorkflow::carried_chunk,
                task.index,
                temporalio_client::WorkflowQueryOptions::default(),
            )
            .await
            .map_err(fail)
    }

    /// Asks the model one turn, signalling each input to the workflow as it is read.
    #[activity]
    pub async fn model_turn(
        self: Arc<Self>,
        ctx: ActivityContext,
        task: TurnTask,
    ) -> Result<TurnDone, ActivityError> {
        let (parts, _servers) = parts(&task.spec, &self.registry, self.pool.as_ref(), &self.grants)
            .await
            .map_err(fail)?;
        let config = config_at(parts.config(), &task.path)
            .ok_or_else(|| fail(format!("no agent at {:?}", task.path)))?;
        let handle = ctx
            .workflow_handle::<RunWorkflow>()
            .ok_or_else(|| fail("a model turn runs only inside a run's workflow"))?;
        let mut stream = parts.turn(
            task.frame,
            task.step,
            config,
            task.messages,
            task.asked_before,
            task.skip_calls,
        );
        let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
        let mut sent = 0usize;
        let mut closed = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = ctx.cancelled() => return Err(ActivityError::cancelled()),
                n = stream.next() => n,
                _ = beat.tick() => {
                    let _ = ctx.record_heartbeat(sent).await;
                    continue;
                }
            };
            let Some(input) = next else { break };
            if matches!(input, RunInput::StreamClosed { .. }) {
                closed = Some(input);
                continue;
            }
            let item = TurnItem {
                frame: task.frame,
                step: task.step,
                index: sent,
                input,
            };
            handle
                .signal(
                    RunWorkflow::turn_input,
                    item,
                    WorkflowSignalOptions::default(),
                )
                .await
                .map_err(fail)?;
            sent += 1;
        }
        let closed = closed.unwrap_or(RunInput::StreamClosed {
            frame: task.frame,
            error: None,
            finish_reason: None,
        });
        Ok(TurnDone { sent, closed })
    }

    /// Searches the run's memory folder for one step: read and indexed under this worker's
    /// grants (the workflow reads no folder), so a worker not granted the folder, or one where
    /// it is gone, fails the search with the reason; the workflow journals that as the step's
    /// note.
    #[activity]
    pub async fn memory_search(
        self: Arc<Self>,
        _ctx: ActivityContext,
        task: RecallTask,
    ) -> Result<Vec<crate::context::memory::Chunk>, ActivityError> {
        let goal = goal_of(&task.spec).map_err(fail)?;
        let (source, index) = crate::runs::memory::index(&goal, &self.grants)
            .map_err(fail)?
            .ok_or_else(|| fail("the run's goal names no memory folder"))?;
        let recall = crate::context::memory::Recall {
            source,
            index: Some(index),
        };
        Ok(recall.chunks(&task.query))
    }

    /// Reports a finished run's spans and metrics from its journal through this worker's
    /// OpenTelemetry pipeline (`telemetry::report_journal`); true when something used them. The
    /// trace id is the run's, so the trace is one whichever workers ran its activities.
    #[activity]
    pub async fn report_trace(
        self: Arc<Self>,
        _ctx: ActivityContext,
        task: TraceTask,
    ) -> Result<bool, ActivityError> {
        let machine = super::workflow::machine_for(&task.spec).map_err(fail)?;
        Ok(crate::telemetry::report_journal(machine, &task.journal))
    }

    /// Posts one `approval_requested` notification to this worker's webhook (the body the
    /// embedded server sends, `notify::approval_body`); true when posted, false when this
    /// worker has no webhook.
    #[activity]
    pub async fn notify(
        self: Arc<Self>,
        _ctx: ActivityContext,
        task: NotifyTask,
    ) -> Result<bool, ActivityError> {
        let Some(hook) = &self.webhook else {
            tracing::warn!(run = %task.run_id, "a run asks for webhook notifications and this worker has no notify.webhook");
            return Ok(false);
        };
        let page = hook.page_url.as_deref().unwrap_or(&task.page);
        let body = crate::notify::approval_body(
            &task.run_id,
            task.call,
            &task.tool,
            task.interrupted,
            task.rule.as_deref(),
            page.trim_end_matches('/'),
        );
        hook.post_once(&body).await.map_err(fail)?;
        Ok(true)
    }

    /// Runs one call, saying it is alive while it runs.
    #[activity]
    pub async fn tool_call(
        self: Arc<Self>,
        ctx: ActivityContext,
        task: CallTask,
    ) -> Result<Outcome, ActivityError> {
        let (parts, servers) = parts(&task.spec, &self.registry, self.pool.as_ref(), &self.grants)
            .await
            .map_err(fail)?;
        let parts = Arc::new(parts);
        let p = parts.clone();
        let tool = Arc::new(task.tool);
        let mut work = tokio::spawn(async move {
            let _servers = servers;
            p.execute(task.id, task.call, tool, task.timeout_ms, task.budget)
                .await
        });
        let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
        loop {
            tokio::select! {
                biased;
                _ = ctx.cancelled() => {
                    work.abort();
                    return Err(ActivityError::cancelled());
                }
                r = &mut work => {
                    return r.map_err(fail);
                }
                _ = beat.tick() => {
                    let _ = ctx.record_heartbeat(()).await;
                }
            }
        }
    }
}
