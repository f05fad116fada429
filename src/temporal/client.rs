//! Talking to Temporal: start a run and wait for its result, decide, cancel, read its journal
//! and history; and run a worker.

use std::sync::Arc;

use temporalio_client::{
    Client, ClientOptions, ConnectionOptions, WorkflowCancelOptions, WorkflowExecuteUpdateOptions,
    WorkflowFetchHistoryOptions, WorkflowGetResultOptions, WorkflowQueryOptions,
    WorkflowStartOptions,
};
use temporalio_sdk::{Runtime, Worker};

use super::access::Access;
use super::activities::DagloopActivities;
use super::workflow::{Described, EventPage, RunWorkflow, Snapshot};
use super::{RunSpec, TemporalError};
use crate::machine::RunResult;
use crate::protocol::Op;
use crate::runs::Pool;
use crate::tools::Registry;

/// A connection to a Temporal server, bound to a namespace.
#[derive(Clone)]
pub struct Connection {
    client: Client,
    address: String,
}

fn request(what: &'static str) -> impl Fn(String) -> TemporalError {
    move |reason| TemporalError::Request { what, reason }
}

impl Connection {
    /// Connects to `address` (`HOST:PORT`, or a URL) in `namespace`, over plain TCP.
    pub async fn connect(address: &str, namespace: &str) -> Result<Self, TemporalError> {
        Connection::connect_with(address, namespace, &Access::default()).await
    }

    /// [`Connection::connect`], reaching the cluster as `access` says (TLS, mutual TLS, an API
    /// key: Temporal Cloud).
    pub async fn connect_with(
        address: &str,
        namespace: &str,
        access: &Access,
    ) -> Result<Self, TemporalError> {
        let connect = |reason: String| TemporalError::Connect {
            address: address.to_string(),
            reason,
        };
        let resolved = access.resolve(address)?;
        let url = if address.contains("://") {
            address.to_string()
        } else if resolved.tls.is_some() {
            format!("https://{address}")
        } else {
            format!("http://{address}")
        };
        let url = temporalio_client::Url::parse(&url).map_err(|e| connect(e.to_string()))?;
        let opts = ConnectionOptions::new(url)
            .identity(format!("dagloop@{}", std::process::id()))
            .connect_timeout(std::time::Duration::from_secs(10))
            .maybe_tls_options(resolved.tls)
            .maybe_api_key(resolved.api_key)
            .build();
        let conn = temporalio_client::Connection::connect(opts)
            .await
            .map_err(|e| connect(e.to_string()))?;
        let client = Client::new(conn, ClientOptions::new(namespace.to_string()).build())
            .map_err(|e| connect(e.to_string()))?;
        Ok(Connection {
            client,
            address: address.to_string(),
        })
    }

    /// The address it was made to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Starts a run as a workflow (its id is the run's) on `task_queue`.
    pub async fn start(&self, spec: RunSpec, task_queue: &str) -> Result<(), TemporalError> {
        let id = spec.id.clone();
        self.client
            .start_workflow(
                RunWorkflow::run,
                spec,
                WorkflowStartOptions::new(task_queue.to_string(), id).build(),
            )
            .await
            .map_err(|e| request("start the run")(e.to_string()))?;
        Ok(())
    }

    /// Starts a run whose id is derived from an `Idempotency-Key`: false, starting nothing,
    /// when a workflow with this id runs or ever ran (Temporal's `RejectDuplicate` reuse
    /// policy), so that of any number of servers exactly one starts it.
    pub async fn start_once(&self, spec: RunSpec, task_queue: &str) -> Result<bool, TemporalError> {
        use temporalio_client::errors::WorkflowStartError;
        let id = spec.id.clone();
        let opts = WorkflowStartOptions::new(task_queue.to_string(), id)
            .id_reuse_policy(temporalio_client::WorkflowIdReusePolicy::RejectDuplicate)
            .build();
        match self
            .client
            .start_workflow(RunWorkflow::run, spec, opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(WorkflowStartError::AlreadyStarted { .. }) => Ok(false),
            Err(e) => Err(request("start the run")(e.to_string())),
        }
    }

    /// Waits for a run's result.
    pub async fn result(&self, run: &str) -> Result<RunResult, TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .get_result(WorkflowGetResultOptions::default())
            .await
            .map_err(|e| {
                let reason = e.to_string();
                if reason.contains("not found") {
                    TemporalError::UnknownRun {
                        run: run.to_string(),
                    }
                } else {
                    TemporalError::NoResult {
                        run: run.to_string(),
                        reason,
                    }
                }
            })
    }

    /// Submits a decision; refused with the op's own code when it does not apply (rule 21).
    pub async fn decide(&self, run: &str, op: Op) -> Result<(), TemporalError> {
        use temporalio_client::errors::WorkflowUpdateError;
        let mut tries = 0;
        loop {
            let r = self
                .client
                .get_workflow_handle::<RunWorkflow>(run)
                .execute_update(
                    RunWorkflow::decide,
                    op.clone(),
                    WorkflowExecuteUpdateOptions::default(),
                )
                .await;
            match r {
                Ok(_) => return Ok(()),
                Err(WorkflowUpdateError::Failed(f)) => return Err(refused(&f.message)),
                // A finished workflow takes no updates: say why, as the embedded engine does.
                // One that was continuing as new takes it in its next execution: ask again.
                Err(e) => match self.snapshot(run).await {
                    Ok(Snapshot {
                        result: Some(r), ..
                    }) => {
                        return Err(TemporalError::Refused {
                            code: "op.run_finished".into(),
                            message: format!("the run has finished ({})", r.status.as_str()),
                        });
                    }
                    Err(TemporalError::UnknownRun { run }) => {
                        return Err(TemporalError::UnknownRun { run });
                    }
                    _ if tries < UPDATE_TRIES => tries += 1,
                    _ => return Err(request("record the decision")(e.to_string())),
                },
            }
        }
    }

    /// Cancels a run (the machine stops it: nothing more launches, running calls are aborted).
    pub async fn cancel(&self, run: &str, reason: &str) -> Result<(), TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .cancel(
                WorkflowCancelOptions::builder()
                    .reason(reason.to_string())
                    .build(),
            )
            .await
            .map_err(|e| request("cancel the run")(e.to_string()))
    }

    /// The run's spec, journal and result, as the workflow holds them.
    pub async fn snapshot(&self, run: &str) -> Result<Snapshot, TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .query(RunWorkflow::snapshot, (), WorkflowQueryOptions::default())
            .await
            .map_err(|e| query_failed(run, e.to_string()))
    }

    /// The run described inside its workflow, as `dagloop show` prints it.
    pub async fn describe(&self, run: &str) -> Result<Described, TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .query(RunWorkflow::describe, (), WorkflowQueryOptions::default())
            .await
            .map_err(|e| query_failed(run, e.to_string()))
    }

    /// The run's events after sequence number `after`, a page at a time (the `events` query).
    pub async fn events(&self, run: &str, after: u64) -> Result<EventPage, TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .query(RunWorkflow::events, after, WorkflowQueryOptions::default())
            .await
            .map_err(|e| query_failed(run, e.to_string()))
    }

    /// The ids of the runs (workflows of type `RunWorkflow`) Temporal's visibility lists, newest
    /// first, at most `limit`. Visibility is eventually consistent: a run started a moment ago
    /// may be missing for a moment.
    pub async fn list(&self, limit: usize) -> Result<Vec<String>, TemporalError> {
        use futures::StreamExt;
        let mut stream = self.client.list_workflows(
            "WorkflowType = 'RunWorkflow'",
            temporalio_client::WorkflowListOptions::builder()
                .limit(limit)
                .build(),
        );
        let mut ids: Vec<String> = Vec::new();
        while let Some(w) = stream.next().await {
            let w = w.map_err(|e| request("list the runs")(e.to_string()))?;
            // A run that continued as new is listed once per execution.
            if !ids.iter().any(|i| i == w.id()) {
                ids.push(w.id().to_string());
            }
        }
        Ok(ids)
    }

    /// The run's workflow history, as JSON (what the replay tester reads).
    pub async fn history_json(&self, run: &str) -> Result<Vec<u8>, TemporalError> {
        self.client
            .get_workflow_handle::<RunWorkflow>(run)
            .fetch_history(WorkflowFetchHistoryOptions::default())
            .to_json()
            .await
            .map_err(|e| request("fetch the history")(e.to_string()))
    }
}

/// How many times a decision is sent again when the run's execution ended without a result
/// under it (it continued as new).
const UPDATE_TRIES: u32 = 3;

/// An op refused by the workflow's validator, whose message starts with the op's code.
fn refused(message: &str) -> TemporalError {
    match message.split_once(": ") {
        Some((code, rest)) if code.starts_with("op.") => TemporalError::Refused {
            code: code.to_string(),
            message: rest.to_string(),
        },
        _ => TemporalError::Refused {
            code: "op.refused".into(),
            message: message.to_string(),
        },
    }
}

/// Where a worker polls.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The server (`HOST:PORT`).
    pub address: String,
    /// The namespace.
    pub namespace: String,
    /// The task queue.
    pub task_queue: String,
    /// How the cluster is reached (TLS, API key).
    pub access: Access,
    /// The operator's webhook (`notify.webhook`): runs started by a server with one have
    /// their `approval_requested` events posted to it by the worker.
    pub webhook: Option<crate::notify::WebhookConfig>,
}

/// Runs a worker for runs' workflows and activities (with `registry`'s Rust activities) until
/// `stop` resolves, then shuts it down, letting running activities finish. The program is the
/// operator: its runs may touch everything ([`Grants::open`](crate::grants::Grants::open));
/// [`run_worker_with`] grants less.
pub async fn run_worker(
    opts: &WorkerOptions,
    registry: Registry,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), TemporalError> {
    run_worker_with(
        opts,
        registry,
        Arc::new(crate::grants::Grants::open()),
        stop,
    )
    .await
}

/// [`run_worker`], its runs defined under `grants` (`dagloop worker` passes its config's): a
/// workflow whose goal asks for more fails its activities with the `grant.*` refusal.
pub async fn run_worker_with(
    opts: &WorkerOptions,
    registry: Registry,
    grants: Arc<crate::grants::Grants>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), TemporalError> {
    let worker_err = |reason: String| TemporalError::Worker { reason };
    let conn = Connection::connect_with(&opts.address, &opts.namespace, &opts.access).await?;
    let runtime =
        Runtime::from_current_tokio(Default::default()).map_err(|e| worker_err(e.to_string()))?;
    // Without the `mcp` feature the pool is `()`.
    #[cfg(feature = "mcp")]
    let pool = Some(Pool::default());
    #[cfg(not(feature = "mcp"))]
    let pool: Option<Pool> = Some(());
    let activities = DagloopActivities::new(registry, pool)
        .with_grants(grants)
        .with_webhook(opts.webhook.clone());
    let options = temporalio_sdk::WorkerOptions::new(opts.task_queue.clone())
        .register_activities(activities)
        .register_workflow::<RunWorkflow>()
        .map_err(|e| worker_err(e.to_string()))?
        .build();
    let mut worker =
        Worker::new(&runtime, conn.client, options).map_err(|e| worker_err(e.to_string()))?;
    let shutdown = worker.shutdown_handle();
    let shutdown = Arc::new(shutdown);
    let s = shutdown.clone();
    let run = worker.run();
    futures::pin_mut!(run);
    let stopper = async move {
        stop.await;
        s();
        std::future::pending::<()>().await
    };
    futures::pin_mut!(stopper);
    match futures::future::select(run, stopper).await {
        futures::future::Either::Left((r, _)) => r.map_err(|e| worker_err(e.to_string())),
        futures::future::Either::Right(_) => Ok(()),
    }
}

/// Replays a run's recorded history (from [`Connection::history_json`]) through this build's
/// workflow code; an error means the code no longer makes the decisions the history recorded.
pub async fn replay(history_json: &[u8]) -> Result<(), TemporalError> {
    use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};
    let fail = |reason: String| TemporalError::Request {
        what: "replay the history",
        reason,
    };
    let history = temporalio_client::WorkflowHistory::from_json(history_json)
        .map_err(|e| fail(e.to_string()))?;
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<RunWorkflow>()
        .map_err(|e| fail(e.to_string()))?
        .build();
    let replayer = WorkflowReplayer::new(options).map_err(|e| fail(e.to_string()))?;
    replayer
        .replay_workflow(history)
        .await
        .map_err(|e| fail(e.to_string()))
}

/// A query that failed: the run is unknown, or Temporal could not be asked.
fn query_failed(run: &str, reason: String) -> TemporalError {
    if reason.contains("not found") {
        TemporalError::UnknownRun {
            run: run.to_string(),
        }
    } else {
        request("query the run")(reason)
    }
}
