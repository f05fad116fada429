//! `--engine temporal` and `dagloop worker`: runs as Temporal workflows (`crate::temporal`).
//! Without the `temporal` feature every entry point says how to get it.

use std::path::Path as FsPath;

use super::run::{Display, RunOptions};
use super::{CliError, TemporalArgs};

#[cfg(feature = "temporal")]
mod on {
    use serde_json::{Value, json};

    use super::super::run::{Display, RunOptions};
    use super::super::{CliError, pretty, runs};
    use super::{FsPath, TemporalArgs};
    use crate::goal::Goal;
    use crate::protocol::Op;
    use crate::temporal::{Connection, RunSpec, TemporalError, WorkerOptions};

    fn err(e: TemporalError) -> CliError {
        CliError::new(e.code().to_string(), e)
    }

    async fn connect(t: &TemporalArgs) -> Result<Connection, CliError> {
        Connection::connect_with(&t.address(), &t.namespace, &t.access())
            .await
            .map_err(err)
    }

    /// Starts the run as a workflow and follows it to its result (the same JSON and exit
    /// codes as the embedded engine); with `--detach`, returns once it started.
    pub async fn run(
        path: &FsPath,
        opts: RunOptions,
        grants: std::sync::Arc<crate::grants::Grants>,
        display: &Display,
        t: &TemporalArgs,
    ) -> Result<i32, CliError> {
        if display.events.is_some() || display.decisions.is_some() {
            return Err(CliError::new(
                "cli.unsupported",
                "--events and --decisions need the embedded engine; decide Temporal runs with `dagloop decide --engine temporal`",
            ));
        }
        let goal = Goal::load(path).map_err(|e| CliError::new(e.code(), &e))?;
        let goal = crate::runs::with_mcp_tools(goal)
            .await
            .map_err(|e| CliError::new(e.code(), &e))?;
        // The same definition as the embedded engine's (checked against the grants, delegate
        // goals recorded by content), before anything is started: the spec is the run's record.
        let def =
            crate::runs::define(goal, opts, grants).map_err(|e| CliError::new(e.code(), &e))?;
        crate::runs::RunDef::config(&def).map_err(|e| CliError::new(e.code(), &e))?;
        let id = crate::engine::bus::new_run_id();
        let spec = RunSpec::of_def(id.clone(), &def);
        let conn = connect(t).await?;
        conn.start(spec, &t.task_queue).await.map_err(err)?;
        follow(&conn, &id, display, t).await
    }

    /// A fork of a Temporal run (planned as the embedded engine plans one: `fork::plan`),
    /// started as a new workflow that replays the original's journal prefix and resumes, then
    /// followed as `run` follows a run.
    pub async fn fork(
        run: &str,
        over: super::super::fork::Over,
        config: Option<&crate::config::Config>,
        display: &Display,
        t: &TemporalArgs,
    ) -> Result<i32, CliError> {
        if display.decisions.is_some() || display.tools_from.is_some() {
            return Err(CliError::new(
                "cli.unsupported",
                "--decisions and --tools-from need the embedded engine; decide Temporal runs with `dagloop decide --engine temporal`",
            ));
        }
        let conn = connect(t).await?;
        let snap = conn.snapshot(run).await.map_err(err)?;
        let stored = crate::store::StoredRun {
            record: snap.spec.record,
            journal: snap.journal,
            result: snap.result,
            lease: None,
        };
        let (fork, def, _) = super::super::fork::plan(&stored, &over, config)?;
        let id = fork.record.id.clone();
        conn.start(RunSpec::of_fork(&def, &fork), &t.task_queue)
            .await
            .map_err(err)?;
        follow(&conn, &id, display, t).await
    }

    /// Says which run started, then (unless `--detach`) waits for its result and prints it
    /// with the embedded engine's exit codes; Ctrl-C cancels it.
    async fn follow(
        conn: &Connection,
        id: &str,
        display: &Display,
        t: &TemporalArgs,
    ) -> Result<i32, CliError> {
        let id = id.to_string();
        if display.json_only || display.quiet {
            errln!("{}", json!({"run_id": id}));
        } else {
            errln!(
                "dagloop: run {id} (Temporal {}, task queue {})",
                conn.address(),
                t.task_queue
            );
        }
        if display.detach {
            outln!("{}", pretty(&json!({"status": "started", "run_id": id})));
            return Ok(0);
        }
        let result = tokio::select! {
            r = conn.result(&id) => r.map_err(err)?,
            _ = tokio::signal::ctrl_c() => {
                conn.cancel(&id, "interrupted (Ctrl-C)").await.map_err(err)?;
                conn.result(&id).await.map_err(err)?
            }
        };
        let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
        value["run_id"] = json!(id);
        outln!("{}", pretty(&value));
        Ok(if result.succeeded() { 0 } else { 1 })
    }

    /// Sends a decision as an update; the workflow refuses one that does not apply.
    pub async fn decide(run: &str, op: Op, t: &TemporalArgs) -> Result<i32, CliError> {
        let conn = connect(t).await?;
        conn.decide(run, op).await.map_err(err)?;
        outln!(
            "{}",
            pretty(&json!({"status": "recorded", "run_id": run, "next": "the run applies it now"}))
        );
        Ok(0)
    }

    /// A standing approval for a Temporal run: its journal (a query) rebuilt here turns the request into
    /// the op (`runs::standing_op`, as for a stored run), sent as an update.
    pub async fn allow(
        run: &str,
        req: crate::runs::StandingRequest,
        by: Option<crate::protocol::Actor>,
        t: &TemporalArgs,
    ) -> Result<i32, CliError> {
        let conn = connect(t).await?;
        let snap = conn.snapshot(run).await.map_err(err)?;
        let rb = crate::runs::rebuild(&snap.spec, &snap.journal)
            .map_err(|e| CliError::new(e.code(), e))?;
        let op = crate::runs::standing_op(&rb.machine, req, by)
            .map_err(|e| CliError::new(e.code(), e))?;
        let covers = match &op {
            Op::Allow { standing, .. } => json!(standing),
            _ => Value::Null,
        };
        conn.decide(run, op).await.map_err(err)?;
        outln!(
            "{}",
            pretty(
                &json!({"status": "recorded", "run_id": run, "covers": covers,
                "next": "the run applies it now"})
            )
        );
        Ok(0)
    }

    /// Describes a run as its workflow describes it (a query running the embedded engine's
    /// code over the journal it holds): only the description crosses the network.
    pub async fn show(run: &str, json_out: bool, t: &TemporalArgs) -> Result<i32, CliError> {
        let conn = connect(t).await?;
        let d = conn.describe(run).await.map_err(err)?;
        if let Some(e) = &d.error {
            return Err(CliError::new(
                e["code"].as_str().unwrap_or("runs.rebuild").to_string(),
                e["message"]
                    .as_str()
                    .unwrap_or("the run could not be described"),
            ));
        }
        runs::print_description(
            &d.description,
            d.journal_entries,
            d.result.as_ref(),
            json_out,
        )
    }

    /// Runs a worker until Ctrl-C or SIGTERM.
    pub async fn worker(
        t: &TemporalArgs,
        grants: std::sync::Arc<crate::grants::Grants>,
        webhook: Option<crate::notify::WebhookConfig>,
    ) -> Result<i32, CliError> {
        let opts = WorkerOptions {
            address: t.address(),
            namespace: t.namespace.clone(),
            task_queue: t.task_queue.clone(),
            access: t.access(),
            webhook,
        };
        errln!(
            "dagloop: worker on Temporal {} (namespace {}, task queue {})",
            opts.address,
            opts.namespace,
            opts.task_queue
        );
        let stop = async {
            #[cfg(unix)]
            {
                let mut term = crate::signals::terminate();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
        };
        crate::temporal::run_worker_with(&opts, crate::tools::Registry::new(), grants, stop)
            .await
            .map_err(err)?;
        Ok(0)
    }
}

#[cfg(not(feature = "temporal"))]
fn disabled() -> CliError {
    CliError::new(
        "cli.feature_disabled",
        "this dagloop was built without Temporal; build it with `--features temporal`",
    )
}

/// `run --engine temporal`.
pub(super) async fn run(
    path: &FsPath,
    opts: RunOptions,
    grants: std::sync::Arc<crate::grants::Grants>,
    display: &Display,
    t: &TemporalArgs,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::run(path, opts, grants, display, t).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (path, opts, grants, display, t);
        Err(disabled())
    }
}

/// `fork --engine temporal`.
pub(super) async fn fork(
    run: &str,
    over: super::fork::Over,
    config: Option<&crate::config::Config>,
    display: &Display,
    t: &TemporalArgs,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::fork(run, over, config, display, t).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (run, over, config, display, t);
        Err(disabled())
    }
}

/// `decide --engine temporal`.
pub(super) async fn decide(
    run: &str,
    op: crate::protocol::Op,
    t: &TemporalArgs,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::decide(run, op, t).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (run, op, t);
        Err(disabled())
    }
}

/// `allow --engine temporal`.
pub(super) async fn allow(
    run: &str,
    req: crate::runs::StandingRequest,
    by: Option<crate::protocol::Actor>,
    t: &TemporalArgs,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::allow(run, req, by, t).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (run, req, by, t);
        Err(disabled())
    }
}

/// `show --engine temporal`.
pub(super) async fn show(run: &str, json_out: bool, t: &TemporalArgs) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::show(run, json_out, t).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (run, json_out, t);
        Err(disabled())
    }
}

/// `worker`: its runs touch only what `grants` allow.
pub(super) async fn worker(
    t: &TemporalArgs,
    grants: std::sync::Arc<crate::grants::Grants>,
    webhook: Option<crate::notify::WebhookConfig>,
) -> Result<i32, CliError> {
    #[cfg(feature = "temporal")]
    return on::worker(t, grants, webhook).await;
    #[cfg(not(feature = "temporal"))]
    {
        let _ = (t, grants, webhook);
        Err(disabled())
    }
}
