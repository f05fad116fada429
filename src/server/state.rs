//! What the server holds: the store, the runs this process drives, the principals and the SSE
//! tickets, the `Host` allowlist, and the `Idempotency-Key`s it has seen; and who may see which
//! run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::principals::Principal;
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
    pub principals: super::principals::Principals,
    pub hosts: super::guard::HostAllowlist,
    /// Runs created with an `Idempotency-Key`, by (principal, key); also kept in the store.
    pub idempotent: Mutex<BTreeMap<(String, String), String>>,
    /// Held while a request with an `Idempotency-Key` is checked and its run created, so two
    /// requests with the same key never both start one.
    pub idempotent_create: tokio::sync::Mutex<()>,
    /// What submitted goals may touch (the operator's config, else the closed default).
    pub grants: Arc<crate::grants::Grants>,
    /// Goal files the operator publishes by name.
    pub agents: BTreeMap<String, PathBuf>,
    /// The models a client may ask for, by published agent (besides the goal's own).
    pub agent_models: BTreeMap<String, Vec<String>>,
    /// The operator's approval floor, narrowed to each run as it is submitted.
    pub floor: crate::approval::OperatorFloor,
    /// Separation of duties: nobody decides calls of runs it submitted.
    pub separate_duties: bool,
    pub base_dir: PathBuf,
    pub(super) live: Mutex<BTreeMap<String, Arc<LiveRun>>>,
    /// Stored runs this server does not continue: started by `dagloop run` (not submitted to a
    /// server), or that could not be continued here once already.
    pub(super) skip: Mutex<std::collections::BTreeSet<String>>,
    /// Runs whose lease this process could not give back (the store's disk was full, its
    /// reserve spent): the watcher tries again at each poll until it can.
    pub(super) unreleased: Mutex<std::collections::BTreeSet<String>>,
    /// Held while a run is woken, so one process never launches a run twice.
    pub(super) waking: tokio::sync::Mutex<()>,
    pub tickets: super::tickets::Tickets,
    /// The runs clients wait on, one watcher each.
    pub(super) watches: super::watch::Watches,
    /// The waits and streams each principal holds open (`limits`).
    pub(super) open: super::limits::Open,
    /// The most active runs one principal may have (`[limits] active_runs`).
    pub(super) active_runs: usize,
    /// Runs being started, counted beside the store's active runs (`limits`).
    pub(super) starting: super::limits::Starting,
    /// MCP servers shared by the server's runs: started once per configuration.
    #[cfg(feature = "mcp")]
    pub mcp: crate::runs::Pool,
    /// Posts `approval_requested` to the operator's webhook, with links to the page at `page`.
    notifier: Option<crate::notify::Notifier>,
    page: String,
    /// Triggered when the server stops: runs are no longer driven, and none is recorded as
    /// finished because of it.
    pub(super) stopping: CancellationToken,
    /// With `--engine temporal`: where every run lives (this process drives none).
    #[cfg(feature = "temporal")]
    pub(super) temporal: std::sync::OnceLock<Arc<super::on_temporal::Engine>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl AppState {
    pub fn open(
        opts: &ServeOptions,
        listening: std::net::SocketAddr,
    ) -> Result<Arc<AppState>, ServerError> {
        let principals =
            super::principals::Principals::new(&opts.principals, opts.token.as_deref())?;
        let tickets = super::tickets::Tickets::new(&principals);
        let store = Arc::new(SqliteStore::open(&opts.store)?);
        let notifier = match &opts.webhook {
            Some(w) => Some(crate::notify::Notifier::start(w)?),
            None => None,
        };
        Ok(Arc::new(AppState {
            notifier,
            page: format!("http://{listening}"),
            store,
            principals,
            hosts: super::guard::HostAllowlist::new(listening, &opts.allowed_hosts),
            idempotent: Mutex::new(BTreeMap::new()),
            idempotent_create: tokio::sync::Mutex::new(()),
            grants: opts.grants.clone(),
            agents: opts.agents.clone(),
            agent_models: opts.agent_models.clone(),
            floor: opts.floor.clone(),
            separate_duties: opts.separate_duties,
            base_dir: opts.base_dir.clone(),
            live: Mutex::new(BTreeMap::new()),
            skip: Mutex::new(Default::default()),
            unreleased: Mutex::new(Default::default()),
            waking: tokio::sync::Mutex::new(()),
            tickets,
            watches: Default::default(),
            open: Default::default(),
            active_runs: opts.active_runs,
            starting: Default::default(),
            #[cfg(feature = "mcp")]
            mcp: Default::default(),
            stopping: CancellationToken::new(),
            #[cfg(feature = "temporal")]
            temporal: std::sync::OnceLock::new(),
        }))
    }

    /// The page address notifications link to, when this server has a webhook.
    #[cfg(feature = "temporal")]
    pub(super) fn notify_page(&self) -> Option<String> {
        self.notifier
            .as_ref()
            .map(|n| n.page(&self.page).trim_end_matches('/').to_string())
    }

    /// The Temporal engine, when the server serves runs on Temporal.
    #[cfg(feature = "temporal")]
    pub(super) fn temporal(&self) -> Option<&Arc<super::on_temporal::Engine>> {
        self.temporal.get()
    }

    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        lock(&self.live).get(id).cloned()
    }

    /// Who submitted a run (None for runs recorded without a submitter); 404 for no such run.
    pub async fn submitter(&self, id: &str) -> Result<Option<String>, ApiError> {
        #[cfg(feature = "temporal")]
        if let Some(t) = self.temporal() {
            let s = t.source(id).await?;
            return Ok(s.record.options["submitted_by"]
                .as_str()
                .map(str::to_string));
        }
        if let Some(l) = self.live(id) {
            return Ok(l.record.options["submitted_by"]
                .as_str()
                .map(str::to_string));
        }
        let store = self.store.clone();
        let run = id.to_string();
        tokio::task::spawn_blocking(move || store.submitter(&run))
            .await
            .map_err(|e| {
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "server.internal",
                    e,
                )
            })?
            .map_err(|e| ApiError::from_store(&e))
    }

    /// Refuses a principal that may not read the run with the same 404 as a run that does not
    /// exist, so a submitter cannot tell other submitters' runs from nothing.
    pub async fn readable(&self, who: &Principal, id: &str) -> Result<(), ApiError> {
        let owner = self.submitter(id).await?;
        if who.may_read(owner.as_deref()) {
            Ok(())
        } else {
            Err(ApiError::from_store(
                &crate::store::StoreError::UnknownRun { id: id.to_string() },
            ))
        }
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
        let resume_flag = resume.is_some();
        let prepared = crate::runs::prepare(
            crate::tools::Registry::new(),
            def,
            resume,
            Review::External,
            CancellationToken::new(),
            crate::runs::Host {
                store: Some(self.store.clone()),
                sink: None,
                // Without the `mcp` feature the pool is `()`, and the default says none.
                #[cfg(feature = "mcp")]
                mcp: Some(self.mcp.clone()),
                ..Default::default()
            },
        )
        .await?;
        let id = prepared.run_id().to_string();
        // What the run's views rebuild it from: its record, with its MCP servers' tools.
        let opts = prepared.options().clone();
        // A resumed run's earlier requests were notified by the process that made them.
        let since = if resume_flag {
            crate::runs::now_ms()
        } else {
            0
        };
        let launched = prepared.start().await?;
        for e in &launched.refused {
            tracing::warn!(run = %id, code = e.code(), "a recorded decision does not apply: {e}");
        }
        let handle = launched.handle;
        if let Some(n) = &self.notifier {
            n.watch_for(&handle, &self.page, since, opts.submitted_by.as_deref());
        }
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
                options: serde_json::to_value(&opts).unwrap_or(Value::Null),
            },
            _servers: Mutex::new(
                launched
                    .servers
                    .map(|s| Box::new(s) as Box<dyn std::any::Any + Send>),
            ),
            poller,
        });
        lock(&self.live).insert(id.clone(), live);
        tokio::spawn(self.clone().keep(id.clone(), handle));
        Ok(id)
    }

    /// Stops driving every run (on the way out): each run's driver stops, and with it its calls
    /// in flight (shell tools' process groups are killed); the store keeps every run resumable,
    /// and their leases are given up, so that another server (or this one started again) takes
    /// them over at once.
    pub fn stop_runs(&self) {
        self.stopping.cancel();
        let runs = std::mem::take(&mut *lock(&self.live));
        let ids: Vec<String> = runs.keys().cloned().collect();
        drop(runs);
        // A driver that appends after this finds the lease gone and writes nothing.
        for id in ids {
            if let Err(e) = self.store.release(&id) {
                tracing::warn!(run = %id, "could not release the run's lease: {e}");
            }
        }
    }

    /// The run described (calls, timeline, critical path, awaiting, result), live or stored.
    pub async fn describe(self: &Arc<Self>, id: &str) -> Result<Value, ApiError> {
        let view = self.describe_view(id).await?;
        serde_json::to_value(view).map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server.internal",
                e,
            )
        })
    }

    /// [`AppState::describe`], typed.
    pub async fn describe_view(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<crate::runs::RunView, ApiError> {
        #[cfg(feature = "temporal")]
        if let Some(t) = self.temporal() {
            let s = t.source(id).await?;
            return blocking(move || {
                let rb = rebuild(&s.record, &s.journal)?;
                Ok(crate::runs::describe_view(
                    &s.record.id,
                    &rb,
                    s.journal.len(),
                    s.result.as_ref(),
                    s.result.is_none(),
                ))
            })
            .await;
        }
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

    /// `f` of the run rebuilt from its journal (off the async threads).
    pub async fn with_rebuilt<T: Send + 'static>(
        self: &Arc<Self>,
        id: &str,
        f: impl FnOnce(&crate::runs::Rebuilt) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        #[cfg(feature = "temporal")]
        if let Some(t) = self.temporal() {
            let s = t.source(id).await?;
            return blocking(move || Ok(f(&rebuild(&s.record, &s.journal)?))).await;
        }
        let me = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            let (record, journal) = match me.live(&id) {
                Some(l) => (l.record.clone(), l.handle.journal()),
                None => {
                    let s = me.store.load(&id).map_err(|e| ApiError::from_store(&e))?;
                    (s.record, s.journal)
                }
            };
            let rb = crate::runs::rebuild(&record, &journal).map_err(|e| {
                ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.code(), e)
            })?;
            Ok(f(&rb))
        })
        .await
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server.internal",
                e,
            )
        })?
    }

    /// What a compacted run kept under `key` of its snapshot (`view`, `audit`, `standing`);
    /// `e` (the store's `store.compacted`) when it kept nothing there.
    pub(super) fn kept(
        &self,
        id: &str,
        key: &str,
        e: &crate::store::StoreError,
    ) -> Result<Value, ApiError> {
        match self.store.compacted(id) {
            Ok(Some(c)) if !crate::runs::kept(&c.snapshot, key).is_null() => {
                Ok(crate::runs::kept(&c.snapshot, key).clone())
            }
            Ok(_) => Err(ApiError::from_store(e)),
            Err(e) => Err(ApiError::from_store(&e)),
        }
    }

    /// [`AppState::with_rebuilt`], or what a compacted run kept under `key` of its snapshot.
    pub async fn rebuilt_or_kept<T: serde::Serialize + Send + 'static>(
        self: &Arc<Self>,
        id: &str,
        key: &'static str,
        f: impl FnOnce(&crate::runs::Rebuilt) -> T + Send + 'static,
    ) -> Result<Value, ApiError> {
        match self.with_rebuilt(id, f).await {
            Ok(v) => Ok(serde_json::to_value(v).unwrap_or(Value::Null)),
            Err(e) if e.code == "store.compacted" => {
                let me = self.clone();
                let id = id.to_string();
                tokio::task::spawn_blocking(move || {
                    me.kept(
                        &id,
                        key,
                        &crate::store::StoreError::Compacted {
                            id: id.clone(),
                            entries: 0,
                        },
                    )
                })
                .await
                .map_err(|e| {
                    ApiError::new(
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        "server.internal",
                        e,
                    )
                })?
            }
            Err(e) => Err(e),
        }
    }

    fn describe_now(&self, id: &str) -> Result<crate::runs::RunView, ApiError> {
        let (record, journal, result, live) = match self.live(id) {
            Some(l) => (
                l.record.clone(),
                l.handle.journal(),
                l.handle.result(),
                true,
            ),
            None => match self.store.load(id) {
                Ok(s) => {
                    let live = s.lease.is_some();
                    (s.record, s.journal, s.result, live)
                }
                // A compacted run: the description it kept.
                Err(e @ crate::store::StoreError::Compacted { .. }) => {
                    return self.kept(id, "view", &e).and_then(|v| {
                        serde_json::from_value(v).map_err(|e| {
                            ApiError::new(
                                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                                "server.internal",
                                e,
                            )
                        })
                    });
                }
                Err(e) => return Err(ApiError::from_store(&e)),
            },
        };
        let rb = crate::runs::rebuild(&record, &journal).map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.code(), e)
        })?;
        Ok(crate::runs::describe_view(
            &record.id,
            &rb,
            journal.len(),
            result.as_ref(),
            live,
        ))
    }
}

/// A run rebuilt from its record and journal, or why not (500 with the run's code).
#[cfg(feature = "temporal")]
fn rebuild(
    record: &RunRecord,
    journal: &[crate::machine::JournalEntry],
) -> Result<crate::runs::Rebuilt, ApiError> {
    crate::runs::rebuild(record, journal)
        .map_err(|e| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.code(), e))
}

/// `f` off the async threads.
#[cfg(feature = "temporal")]
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "server.internal",
            e,
        )
    })?
}
