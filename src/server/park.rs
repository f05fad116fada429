//! Waiting runs cost a row, not a task: a server run that can only move on when somebody
//! decides or a deadline passes is parked (its driver stops, its lease is given up, its row
//! says when it must wake), and one watcher per process wakes parked runs: at once for a
//! decision made through this server's API, within [`POLL`] for one recorded by another
//! process (`dagloop decide`, another server), and at its earliest journaled deadline. The same
//! poll takes over runs whose process stopped mid-work (their leases ran out).
//!
//! A run that some client follows over SSE is not parked while it does (its events stay live).
//!
//! Deliberately not here: what a run does when woken (its journal is replayed and its timers
//! fire as they were set, `engine`), or when a run counts as idle (its driver says).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::state::{AppState, lock};
use crate::engine::RunHandle;
use crate::goal::Goal;
use crate::runs::RunOptions;
use crate::store::RunStore;

/// How often the watcher looks for decisions that other processes recorded, runs whose
/// process stopped, and due deadlines.
pub(super) const POLL: Duration = Duration::from_millis(200);

/// How long a watched (SSE) idle run is looked at again, to park it once nobody follows it.
const WATCHED: Duration = Duration::from_secs(5);

impl AppState {
    /// Keeps a launched run until it ends (its result recorded) or waits only for decisions
    /// and deadlines (parked).
    pub(super) async fn keep(self: Arc<Self>, id: String, handle: RunHandle) {
        let stopping = self.stopping.clone();
        loop {
            let r = tokio::select! {
                r = handle.wait_or_idle() => r,
                // The server stops: the run is left as the store has it.
                () = stopping.cancelled() => return,
            };
            if let Some(result) = r {
                self.record_end(&id, result).await;
                return;
            }
            if handle.watchers() == 0 {
                // Parking and waking take turns: a request that wakes this run while it is
                // being parked would claim the lease the park is about to give up, and the
                // new driver would stop at its first append (`store.lease_lost`). The old
                // driver stops (its last handle dropped) before a wake may begin.
                let turn = self.waking.lock().await;
                if self.try_park(&id, &handle).await {
                    drop(handle);
                    drop(turn);
                    return;
                }
            }
            // Followed, or busy again: look again later (or as soon as it ends).
            tokio::select! {
                r = handle.wait() => {
                    self.record_end(&id, r).await;
                    return;
                }
                () = tokio::time::sleep(WATCHED) => {}
                () = stopping.cancelled() => return,
            }
        }
    }

    /// Records the ending the run decided; a run that stopped (its journal could not be
    /// written, its lease was lost) is left as it is, to be resumed.
    async fn record_end(&self, id: &str, result: crate::machine::RunResult) {
        let store = self.store.clone();
        let rid = id.to_string();
        let recorded = tokio::task::spawn_blocking(move || {
            if result.status.is_final() {
                // An end that cannot be recorded (the journal holds it, for the next process
                // that resumes the run) still gives the lease back.
                store
                    .finish(&rid, &result)
                    .inspect_err(|_| drop(store.release(&rid)))
            } else {
                store.release(&rid)
            }
        })
        .await;
        if !matches!(recorded, Ok(Ok(()))) {
            tracing::error!(run = %id, "could not record the run's end");
            // Its lease may still be held (the release failed too): given back later.
            lock(&self.unreleased).insert(id.to_string());
        }
        lock(&self.live).remove(id);
    }

    /// Parks an idle run: out of the live map first (so no request reaches its handle), then,
    /// once no request holds it and it is still idle, its driver stops and its lease is given
    /// up with the row marked parked. False (and the run stays live) when it got busy again.
    async fn try_park(&self, id: &str, handle: &RunHandle) -> bool {
        let Some(live) = lock(&self.live).remove(id) else {
            return false;
        };
        // Requests that found the run before it left the map finish with it first.
        for _ in 0..100 {
            if Arc::strong_count(&live) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if Arc::strong_count(&live) > 1 || !handle.is_idle() || handle.result().is_some() {
            lock(&self.live).insert(id.to_string(), live);
            return false;
        }
        drop(live);
        let store = self.store.clone();
        let rid = id.to_string();
        match tokio::task::spawn_blocking(move || store.park(&rid)).await {
            Ok(Ok(())) => true,
            _ => {
                tracing::warn!(run = %id, "could not park the run; it is taken over once its lease runs out");
                true
            }
        }
    }

    /// Wakes (continues) a server run nobody drives, if this process may take it: claims it,
    /// reads its journal again, launches it (decisions recorded meanwhile apply first).
    /// Returns whether it is live here now.
    pub(super) async fn wake(self: &Arc<Self>, id: &str) -> bool {
        self.wake_run(id, false).await.unwrap_or(false)
    }

    /// Continues a run that no process drives because a decision or a cancellation for it just
    /// came through this server, whoever started it (`dagloop run --detach` included): the
    /// server takes its lease and drives it under the server's own grants, and keeps it from
    /// then on. `Err` says why it cannot (a grant the run needs that this server lacks...): the
    /// op stays recorded for the process that can continue it.
    pub(super) async fn adopt(self: &Arc<Self>, id: &str) -> Result<bool, String> {
        self.wake_run(id, true).await
    }

    async fn wake_run(self: &Arc<Self>, id: &str, adopt: bool) -> Result<bool, String> {
        let _one = self.waking.lock().await;
        if self.live(id).is_some() {
            return Ok(true);
        }
        if !adopt && lock(&self.skip).contains(id) {
            return Ok(false);
        }
        let me = self.clone();
        let run = id.to_string();
        let loaded = tokio::task::spawn_blocking(move || {
            let stored = me.store.load(&run)?;
            let opts = RunOptions::from_stored(&stored.record.options).map_err(|e| {
                crate::store::StoreError::Io {
                    reason: format!("{e} [{}]", e.code()),
                }
            })?;
            if (!opts.server && !adopt) || stored.result.is_some() {
                return Ok(None);
            }
            // The lease decides who continues it; the journal is read again once it is ours
            // (and the lease given back when that fails).
            me.store.claim(&run)?;
            let stored = me.store.load(&run).inspect_err(|_| {
                let _ = me.store.release(&run);
            })?;
            Ok::<_, crate::store::StoreError>(Some((opts, stored)))
        })
        .await;
        let (mut opts, stored) = match loaded {
            Ok(Ok(Some(x))) => x,
            Ok(Ok(None)) => {
                if !adopt {
                    lock(&self.skip).insert(id.to_string());
                }
                return Ok(false);
            }
            Ok(Err(e)) => {
                if e.code() != "store.busy" {
                    tracing::info!(run = %id, code = e.code(), "not continued here: {e}");
                }
                return Ok(false);
            }
            Err(_) => return Ok(false),
        };
        // The reason goes to the server's log; a client hears only its code (a grant's
        // message names paths and addresses of the server's machine).
        let refuse = |e: &dyn std::fmt::Display, code: &str| {
            tracing::error!(run = %id, "cannot continue: {e}");
            if self.store.release(id).is_err() {
                lock(&self.unreleased).insert(id.to_string());
            }
            if !adopt {
                lock(&self.skip).insert(id.to_string());
            }
            Err(code.to_string())
        };
        if stored.result.is_some() {
            let _ = self.store.release(id);
            return Ok(false);
        }
        // Driving the run needs its placeholders' values here (`Goal::from_json` checks them).
        let goal = match Goal::from_json(
            &stored.record.goal.to_string(),
            std::path::Path::new(&stored.record.id),
            PathBuf::from(&stored.record.base_dir),
        ) {
            Ok(g) => g,
            Err(e) => return refuse(&e, e.code()),
        };
        // Adopted, the run is this server's from now on (continued after a restart, woken by
        // the watcher when parked).
        if adopt {
            opts.server = true;
            lock(&self.skip).remove(id);
        }
        match self
            .launch(goal, opts, Some((id.to_string(), stored.journal)))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => refuse(&e, e.code()),
        }
    }

    /// The server runs nobody drives that need a driver now (see [`crate::store::Watch`]).
    pub(super) async fn wakeable(self: &Arc<Self>) -> Vec<String> {
        let store = self.store.clone();
        let found = tokio::task::spawn_blocking(move || {
            store
                .watch()
                .and_then(|w| w.wakeable(crate::runs::now_ms()))
        })
        .await;
        match found {
            Ok(Ok(ids)) => ids
                .into_iter()
                .filter(|id| self.live(id).is_none() && !lock(&self.skip).contains(id))
                .collect(),
            Ok(Err(e)) => {
                tracing::error!("cannot read the stored runs: {e}");
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// Gives back the leases this process could not give back before (a full disk): each
    /// run that is not live here again is released; those still refused are tried at the
    /// next poll.
    async fn release_again(self: &Arc<Self>) {
        let ids: Vec<String> = std::mem::take(&mut *lock(&self.unreleased))
            .into_iter()
            .filter(|id| self.live(id).is_none())
            .collect();
        if ids.is_empty() {
            return;
        }
        let store = self.store.clone();
        let refused = tokio::task::spawn_blocking(move || {
            ids.into_iter()
                // Refused for want of room (or a lock) again; any other answer (the lease is
                // somebody else's now, the run is gone) ends the tries.
                .filter(|id| {
                    store.release(id).is_err_and(|e| {
                        matches!(
                            e,
                            crate::store::StoreError::Io { .. }
                                | crate::store::StoreError::Locked { .. }
                        )
                    })
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        lock(&self.unreleased).extend(refused);
    }

    /// The one watcher: wakes `first` (what the server found to continue at its start) in the
    /// background, then polls: decisions other processes recorded, runs whose process stopped
    /// (their leases ran out), and parked runs' deadlines, each at its time.
    pub(super) fn spawn_watcher(
        self: &Arc<Self>,
        first: Vec<String>,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            for id in first {
                me.wake(&id).await;
            }
            let store = me.store.clone();
            let watch = match tokio::task::spawn_blocking(move || store.watch()).await {
                Ok(Ok(w)) => Arc::new(std::sync::Mutex::new(w)),
                _ => {
                    tracing::error!(
                        "the watcher cannot read the store; parked runs wake only when decided here"
                    );
                    return;
                }
            };
            loop {
                me.release_again().await;
                let w = watch.clone();
                let polled = tokio::task::spawn_blocking(move || {
                    let w = lock(&w);
                    let now = crate::runs::now_ms();
                    let found = (w.wakeable(now)?, w.next_wake(now)?, now);
                    // The blocking threads an idle server keeps are the ones this poll wakes:
                    // what they freed goes back to the allocator (at its pace, `crate::idle`).
                    crate::idle::release();
                    Ok::<_, crate::store::StoreError>(found)
                })
                .await;
                let mut delay = POLL;
                if let Ok(Ok((ids, next, now))) = polled {
                    for id in ids {
                        if me.live(&id).is_none() && !lock(&me.skip).contains(&id) {
                            me.wake(&id).await;
                        }
                    }
                    if let Some(at) = next {
                        delay = delay.min(Duration::from_millis(at.saturating_sub(now)));
                    }
                }
                tokio::time::sleep(delay.max(Duration::from_millis(1))).await;
            }
        })
    }
}
