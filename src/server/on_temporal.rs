//! `dagloop serve --engine temporal` (feature `temporal`): the same API and page, with every
//! run a Temporal workflow and no run state in the server, so any number of servers serve the
//! same runs and any of them can be killed at any time.
//!
//! What each route reads or does here instead of the store: `POST /runs` defines the run with
//! the same code as the embedded server (`runs::define`, the operator's grants and floor) and
//! starts its workflow with the run's record as input (the submitter is in its options); a
//! run's description, approvals and result are the embedded engine's own views
//! (`runs::rebuild`, `runs::describe_view`) over the journal the workflow returns to the
//! `snapshot` query; decisions are workflow updates, checked by the workflow's validator with
//! the machine's own `bind_op` (rule 21; one decision per presentation); cancelling is
//! cancelling the workflow; events are read from the workflow's `events` query by sequence
//! range, so an SSE client can reconnect to any server with `Last-Event-ID`; the run list is
//! Temporal's visibility list, each run described by its workflow.
//!
//! Deliberately not here: any rule about runs (the machine's, checked in the workflow), who may
//! do what (`principals`, the handlers), the workflow itself (`crate::temporal`). Webhooks are
//! posted by the workers (a `notify` activity per `approval_requested`), not by a server. A fork
//! is a new workflow carrying the original's journal prefix (`runs::fork`'s rule, the same as
//! embedded). Not on this engine: cassettes (they read the store only).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use futures::stream::{self, BoxStream, StreamExt};

use super::error::ApiError;
use super::wire::OpStatus;
use crate::protocol::Op;
use crate::store::RunRecord;
use crate::temporal::{Connection, RunSpec, TemporalError};

/// Where the server's runs live on Temporal.
#[derive(Debug, Clone)]
pub struct TemporalServe {
    /// The Temporal server, `HOST:PORT`.
    pub address: String,
    /// The namespace.
    pub namespace: String,
    /// The task queue workflows and activities go to (where `dagloop worker`s poll).
    pub task_queue: String,
    /// How the cluster is reached (TLS, API key: Temporal Cloud).
    pub access: crate::temporal::Access,
}

/// How often an event stream asks the workflow for what followed.
pub const EVENT_POLL: Duration = Duration::from_millis(100);

/// How many times in a row an event stream's query may fail (no worker answering) before the
/// stream ends; the client reconnects with `Last-Event-ID`.
const QUERY_TRIES: u32 = 50;

/// The server's connection to Temporal.
pub(super) struct Engine {
    conn: Connection,
    task_queue: String,
}

/// What a keyed start found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Started {
    /// The run was started now.
    New,
    /// The key's run exists, submitted with the same body.
    Same,
    /// The key's run exists, submitted with another body.
    Other,
}

/// The run id a principal's `Idempotency-Key` stands for on Temporal: the same on every
/// server, so the key's second use finds the first's workflow wherever it is sent.
pub(super) fn keyed_run_id(principal: &str, key: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{principal}\n{key}").as_bytes(),
    );
    let hex: String = d.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("run-k{hex}")
}

/// What a run's views are rebuilt from: its record, journal and result.
pub(super) struct Source {
    pub record: RunRecord,
    pub journal: Vec<crate::machine::JournalEntry>,
    pub result: Option<crate::machine::RunResult>,
}

/// A Temporal failure as an API error: an unknown run is the store's 404, a refused op has its
/// own code and the embedded engine's status for it, the rest is 503.
pub(super) fn api_error(e: &TemporalError) -> ApiError {
    match e {
        TemporalError::UnknownRun { run } => {
            ApiError::from_store(&crate::store::StoreError::UnknownRun { id: run.clone() })
        }
        TemporalError::Refused { code, message } => {
            ApiError::new(ApiError::op_status(code), code.clone(), message)
        }
        other => {
            tracing::warn!(code = other.code(), "Temporal failed: {other}");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, other.code(), other)
        }
    }
}

impl Engine {
    pub(super) async fn connect(t: &TemporalServe) -> Result<Engine, super::ServerError> {
        let conn = Connection::connect_with(&t.address, &t.namespace, &t.access)
            .await
            .map_err(|e| super::ServerError::Temporal {
                reason: e.to_string(),
            })?;
        Ok(Engine {
            conn,
            task_queue: t.task_queue.clone(),
        })
    }

    /// Starts a defined run as a workflow; its id.
    /// With `notify_page`, the run's `approval_requested` events are posted to the workers'
    /// webhook, linking to that page.
    ///
    /// With `keyed` (a run id derived from an `Idempotency-Key`, and the submission's digest),
    /// the workflow is started under that id unless one ever was: then nothing is started and
    /// the answer says whether that run was submitted with the same body.
    pub(super) async fn start(
        &self,
        def: &crate::runs::RunDef,
        notify_page: Option<String>,
        keyed: Option<(String, String)>,
    ) -> Result<(String, Started), ApiError> {
        let Some((id, digest)) = keyed else {
            let id = crate::engine::bus::new_run_id();
            let mut spec = RunSpec::of_def(id.clone(), def);
            spec.notify_page = notify_page;
            self.conn
                .start(spec, &self.task_queue)
                .await
                .map_err(|e| api_error(&e))?;
            return Ok((id, Started::New));
        };
        let mut spec = RunSpec::of_def(id.clone(), def);
        spec.notify_page = notify_page;
        spec.body_digest = Some(digest.clone());
        let fresh = self
            .conn
            .start_once(spec, &self.task_queue)
            .await
            .map_err(|e| api_error(&e))?;
        if fresh {
            return Ok((id, Started::New));
        }
        let mut tries = 0;
        let earlier = loop {
            match self.conn.snapshot(&id).await {
                Ok(s) => break s.spec.body_digest,
                Err(e) if tries >= QUERY_TRIES => return Err(api_error(&e)),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(EVENT_POLL).await;
                }
            }
        };
        let same = earlier.as_deref() == Some(digest.as_str());
        Ok((id, if same { Started::Same } else { Started::Other }))
    }

    /// Starts a fork ([`crate::runs::fork`], defined as `def`) as a workflow that replays the
    /// original's journal prefix and resumes it; the same webhook link as [`Engine::start`].
    pub(super) async fn start_fork(
        &self,
        def: &crate::runs::RunDef,
        fork: &crate::runs::Fork,
        notify_page: Option<String>,
    ) -> Result<(), ApiError> {
        let mut spec = RunSpec::of_fork(def, fork);
        spec.notify_page = notify_page;
        self.conn
            .start(spec, &self.task_queue)
            .await
            .map_err(|e| api_error(&e))
    }

    /// The run's record, journal and result, as its workflow holds them. A query that fails
    /// (a workflow whose first task no worker took yet, a worker just lost) is asked again for
    /// up to [`QUERY_TRIES`] × [`EVENT_POLL`].
    pub(super) async fn source(&self, id: &str) -> Result<Source, ApiError> {
        let mut tries = 0;
        let snap = loop {
            match self.conn.snapshot(id).await {
                Ok(s) => break s,
                Err(e @ TemporalError::UnknownRun { .. }) => return Err(api_error(&e)),
                Err(e) if tries >= QUERY_TRIES => return Err(api_error(&e)),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(EVENT_POLL).await;
                }
            }
        };
        Ok(Source {
            record: snap.spec.record,
            journal: snap.journal,
            result: snap.result,
        })
    }

    /// A decision (an update) or a cancellation (the workflow's), refused as the embedded
    /// engine refuses it.
    pub(super) async fn submit(
        &self,
        id: &str,
        op: Op,
    ) -> Result<(StatusCode, Json<OpStatus>), ApiError> {
        match op {
            Op::Cancel { reason, .. } => {
                let snap = self.conn.snapshot(id).await.map_err(|e| api_error(&e))?;
                if let Some(r) = snap.result {
                    return Err(ApiError::from_op(&crate::protocol::OpError::RunFinished {
                        status: r.status.as_str().into(),
                    }));
                }
                self.conn
                    .cancel(id, &reason)
                    .await
                    .map_err(|e| api_error(&e))?;
            }
            op => self.conn.decide(id, op).await.map_err(|e| api_error(&e))?,
        }
        Ok((StatusCode::OK, Json(OpStatus::new("applied"))))
    }

    /// The ids of the runs visibility lists, newest first.
    pub(super) async fn list(&self, limit: usize) -> Result<Vec<String>, ApiError> {
        self.conn.list(limit).await.map_err(|e| api_error(&e))
    }

    /// The run's events after `after`, then those that follow as the workflow publishes them
    /// (asked every [`EVENT_POLL`]), until the run has ended and everything was sent.
    pub(super) fn events(
        self: &Arc<Self>,
        id: String,
        after: u64,
        frame: fn(&crate::protocol::Event) -> Result<SseEvent, Infallible>,
    ) -> BoxStream<'static, Result<SseEvent, Infallible>> {
        let state = (
            self.clone(),
            id,
            after,
            std::collections::VecDeque::new(),
            0u32,
        );
        stream::unfold(
            state,
            move |(me, id, mut after, mut buf, mut fails)| async move {
                loop {
                    if let Some(e) = buf.pop_front() {
                        return Some((frame(&e), (me, id, after, buf, fails)));
                    }
                    match me.conn.events(&id, after).await {
                        Ok(page) => {
                            fails = 0;
                            if page.dropped_through > after {
                                // Older events than the workflow keeps were asked for: say
                                // which are gone, then go on from the oldest kept.
                                let gone = SseEvent::default().event("events_dropped").data(
                                    serde_json::json!({"after": after, "through": page.dropped_through})
                                        .to_string(),
                                );
                                after = page.dropped_through;
                                return Some((Ok(gone), (me, id, after, buf, fails)));
                            }
                            if page.events.is_empty() {
                                if page.finished {
                                    return None;
                                }
                                tokio::time::sleep(EVENT_POLL).await;
                            }
                            if let Some(last) = page.events.last() {
                                after = last.seq;
                            }
                            buf.extend(page.events);
                        }
                        Err(TemporalError::UnknownRun { .. }) => return None,
                        Err(_) if fails < QUERY_TRIES => {
                            fails += 1;
                            tokio::time::sleep(EVENT_POLL).await;
                        }
                        Err(_) => return None,
                    }
                }
            },
        )
        .boxed()
    }
}
