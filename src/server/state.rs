//! What the server holds: the store, the runs this process drives, and the SSE tickets.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::{ServeOptions, ServerError};
use crate::engine::RunHandle;
use crate::goal::Goal;
use crate::runs::{Review, RunOptions};
use crate::store::{RunRecord, RunStore, SqliteStore};

/// A run this process drives.
pub(super) struct LiveRun {
    pub handle: RunHandle,
    pub record: RunRecord,
    _servers: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    poller: tokio::task::JoinHandle<()>,
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

pub(super) struct AppState {
    pub store: Arc<SqliteStore>,
    pub token: Option<String>,
    /// What submitted goals may touch (the operator's config, else the closed default).
    pub grants: Arc<crate::grants::Grants>,
    /// Goal files the operator publishes by name.
    pub agents: BTreeMap<String, PathBuf>,
    pub base_dir: PathBuf,
    live: Mutex<BTreeMap<String, Arc<LiveRun>>>,
    pub tickets: super::auth::Tickets,
    /// MCP servers shared by the server's runs: started once per configuration.
    pub mcp: crate::runs::Pool,
    /// Triggered when the server stops: runs are no longer driven, and none is recorded as
    /// finished because of it.
    stopping: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl AppState {
    pub fn open(opts: &ServeOptions) -> Result<Arc<AppState>, ServerError> {
        let store = Arc::new(SqliteStore::open(&opts.store)?);
        Ok(Arc::new(AppState {
            store,
            token: opts.token.clone(),
            grants: opts.grants.clone(),
            agents: opts.agents.clone(),
            base_dir: opts.base_dir.clone(),
            live: Mutex::new(BTreeMap::new()),
            tickets: Default::default(),
            mcp: Default::default(),
            stopping: CancellationToken::new(),
        }))
    }

    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        lock(&self.live).get(id).cloned()
    }

    /// Starts (or, with `resume`, continues) a run and keeps it going until it ends.
    pub async fn launch(
        self: &Arc<Self>,
        goal: Goal,
        opts: RunOptions,
        resume: Option<(String, Vec<crate::machine::JournalEntry>)>,
    ) -> Result<String, crate::runs::RunsError> {
        let def = crate::runs::define(goal, opts, self.grants.clone())?;
        self.launch_defined(&def, resume).await
    }

    /// Starts (or continues) a defined run and keeps it going until it ends.
    pub async fn launch_defined(
        self: &Arc<Self>,
        def: &crate::runs::RunDef,
        resume: Option<(String, Vec<crate::machine::JournalEntry>)>,
    ) -> Result<String, crate::runs::RunsError> {
        let record_goal = serde_json::to_value(def.goal()).unwrap_or(Value::Null);
        let base_dir = def.goal().base_dir.display().to_string();
        let opts = def.options();
        let prepared = crate::runs::prepare(
            crate::tools::Registry::new(),
            def,
            resume,
            Review::External,
            CancellationToken::new(),
            crate::runs::Host {
                store: Some(self.store.clone()),
                sink: None,
                owner_pid: std::process::id(),
                mcp: Some(self.mcp.clone()),
                ..Default::default()
            },
        )
        .await?;
        let id = prepared.run_id().to_string();
        let launched = prepared.start().await?;
        for e in &launched.refused {
            tracing::warn!(run = %id, code = e.code(), "a recorded decision does not apply: {e}");
        }
        let handle = launched.handle;
        let run_id = id.clone();
        let poller = crate::runs::spawn_op_poller(
            &handle,
            self.store.clone(),
            move |e| tracing::warn!(run = %run_id, code = e.code(), "a recorded decision does not apply: {e}"),
        );
        let live = Arc::new(LiveRun {
            handle: handle.clone(),
            record: RunRecord {
                id: id.clone(),
                created_at: crate::runs::now_ms(),
                goal: record_goal,
                base_dir,
                options: serde_json::to_value(opts).unwrap_or(Value::Null),
            },
            _servers: Mutex::new(
                launched
                    .servers
                    .map(|s| Box::new(s) as Box<dyn std::any::Any + Send>),
            ),
            poller,
        });
        lock(&self.live).insert(id.clone(), live);
        let me = self.clone();
        let run = id.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            let result = tokio::select! {
                r = handle.wait() => r,
                // The server stops: the run is left as the store has it (resumed at the next
                // start), and this task lets go of its handle.
                () = stopping.cancelled() => return,
            };
            let store = me.store.clone();
            let rid = run.clone();
            let recorded = tokio::task::spawn_blocking(move || store.finish(&rid, &result)).await;
            if !matches!(recorded, Ok(Ok(()))) {
                tracing::error!(run = %run, "could not record the run's end");
            }
            lock(&me.live).remove(&run);
        });
        Ok(id)
    }

    /// Stops driving every run (on the way out): each run's driver stops, and with it its calls
    /// in flight (shell tools' process groups are killed); the store keeps every run resumable.
    pub fn stop_runs(&self) {
        self.stopping.cancel();
        let runs = std::mem::take(&mut *lock(&self.live));
        drop(runs);
    }

    /// Continues every run this server had started and no live process runs; returns their ids.
    pub async fn resume_stored(self: &Arc<Self>) -> Vec<String> {
        let rows = match self.store.list() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot list stored runs: {e}");
                return Vec::new();
            }
        };
        let mut resumed = Vec::new();
        for row in rows.into_iter().filter(|r| r.status == "stopped") {
            let Ok(stored) = self.store.load(&row.id) else {
                continue;
            };
            let opts: RunOptions =
                serde_json::from_value(stored.record.options.clone()).unwrap_or_default();
            if !opts.server || stored.result.is_some() {
                continue;
            }
            let goal = match Goal::from_json(
                &stored.record.goal.to_string(),
                std::path::Path::new(&stored.record.id),
                PathBuf::from(&stored.record.base_dir),
            ) {
                Ok(g) => g,
                Err(e) => {
                    tracing::error!(run = %row.id, "cannot continue: {e}");
                    continue;
                }
            };
            match self
                .launch(goal, opts, Some((row.id.clone(), stored.journal)))
                .await
            {
                Ok(id) => resumed.push(id),
                Err(e) => tracing::error!(run = %row.id, "cannot continue: {e}"),
            }
        }
        resumed
    }

    /// The run described (calls, timeline, critical path, awaiting, result), live or stored.
    pub async fn describe(self: &Arc<Self>, id: &str) -> Result<Value, ApiError> {
        let me = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || me.describe_now(&id))
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "server.internal",
                    e,
                )
            })?
    }

    fn describe_now(&self, id: &str) -> Result<Value, ApiError> {
        let (record, journal, result, live) = match self.live(id) {
            Some(l) => (
                l.record.clone(),
                l.handle.journal(),
                l.handle.result(),
                true,
            ),
            None => {
                let s = self.store.load(id).map_err(|e| ApiError::from_store(&e))?;
                let live = s.owner_pid.is_some();
                (s.record, s.journal, s.result, live)
            }
        };
        let rb = crate::runs::rebuild(&record, &journal).map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.code(), e)
        })?;
        Ok(crate::runs::describe(
            &record.id,
            &rb,
            journal.len(),
            result.as_ref(),
            live,
        ))
    }
}
