//! Per-principal limits on what one client holds on the server: held waits (`GET
//! /runs/{id}/result?wait=`) and event streams (`GET /runs/{id}/events`), each at most
//! [`MAX_OPEN`] per principal at a time, and active runs (not ended: running, waiting or
//! stopped), at most the operator's `[limits] active_runs` ([`DEFAULT_ACTIVE_RUNS`]; a principal
//! with the `admin` role, the operator's own, is not held to it). One past
//! a limit is refused at once with 429 (`server.too_many_open`, `server.too_many_runs`), so a
//! client cannot take every watcher, stream, connection or run slot for itself; another
//! principal's requests are still answered. A wait's or stream's slot is given back when it
//! ends (the [`Held`] guard is dropped); a run's when the run ends.
//!
//! Active runs are counted from the store's rows (on Temporal, from the runs visibility lists),
//! so the count survives a restart and needs no bookkeeping when a run ends; runs being started
//! right now ([`Starting`]) are counted beside them, so two concurrent submissions never both
//! take the last slot.
//!
//! Deliberately not here: connection-level bounds (`conns`), the watcher shared by a run's waiters
//! (`watch`), and how a run's status is derived (`store::derive_status`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::error::ApiError;
use super::principals::Principal;
use super::state::{AppState, lock};

/// Waits, or streams, one principal may hold open at a time.
pub const MAX_OPEN: usize = 64;

/// Runs one principal may have active at a time when the operator's config sets no
/// `[limits] active_runs`.
pub const DEFAULT_ACTIVE_RUNS: usize = 32;

/// The statuses of a run that has not ended (`store::derive_status`).
const ACTIVE: [&str; 3] = ["running", "waiting", "stopped"];

/// What each principal holds open, by (principal, kind).
#[derive(Default)]
pub(super) struct Open(Arc<Mutex<BTreeMap<(String, &'static str), usize>>>);

/// One open wait or stream; dropping it gives the slot back.
pub(super) struct Held {
    open: Arc<Mutex<BTreeMap<(String, &'static str), usize>>>,
    key: (String, &'static str),
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut m = lock(&self.open);
        if let Some(n) = m.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl Open {
    /// Takes one of `who`'s slots for a `what` (`waits`, `streams`), or refuses with 429.
    pub(super) fn hold(&self, who: &Principal, what: &'static str) -> Result<Held, ApiError> {
        let key = (who.name.clone(), what);
        let mut m = lock(&self.0);
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= MAX_OPEN {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "server.too_many_open",
                format!(
                    "`{}` already holds {MAX_OPEN} open {what}, the most one principal may: close one first",
                    who.name
                ),
            ));
        }
        *n += 1;
        Ok(Held {
            open: self.0.clone(),
            key,
        })
    }
}

/// Runs being started right now, by principal (not yet, or only just, in the store).
#[derive(Default)]
pub(super) struct Starting(Arc<Mutex<BTreeMap<String, usize>>>);

/// One run being started; dropping it (once the run is in the store, or failed to start)
/// takes it out of [`Starting`].
pub(super) struct StartSlot {
    starting: Arc<Mutex<BTreeMap<String, usize>>>,
    who: String,
}

impl Drop for StartSlot {
    fn drop(&mut self) {
        let mut m = lock(&self.starting);
        if let Some(n) = m.get_mut(&self.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.who);
            }
        }
    }
}

impl AppState {
    /// A slot for one more run of `who`, or 429 `server.too_many_runs` when `who` already has
    /// as many active runs as one principal may. Keep the slot until the run is started.
    pub(super) async fn run_slot(self: &Arc<Self>, who: &Principal) -> Result<StartSlot, ApiError> {
        let max = self.active_runs;
        // Taken before the store is asked: a submission that starts later counts this one.
        let (slot, before) = {
            let mut m = lock(&self.starting.0);
            let n = m.entry(who.name.clone()).or_insert(0);
            let before = *n;
            *n += 1;
            let slot = StartSlot {
                starting: self.starting.0.clone(),
                who: who.name.clone(),
            };
            (slot, before)
        };
        // The operator's own principal (`admin`; `local` on a server without tokens) is not
        // held to it: the limit keeps one client from taking the server, not its operator.
        if who.may(super::principals::Role::Admin) {
            return Ok(slot);
        }
        let active = self.active_runs_of(&who.name, max).await?;
        let held = active.saturating_add(before);
        if held >= max {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "server.too_many_runs",
                format!(
                    "`{}` has {held} active runs (running, waiting or stopped), the most one principal may have ({max}, the server's `limits.active_runs`): one must end first",
                    who.name
                ),
            ));
        }
        Ok(slot)
    }

    /// How many of `who`'s runs have not ended, counted up to at least `enough` (past it the
    /// exact number does not matter).
    async fn active_runs_of(self: &Arc<Self>, who: &str, enough: usize) -> Result<usize, ApiError> {
        let mut q = crate::store::RunQuery {
            statuses: ACTIVE.iter().map(|s| s.to_string()).collect(),
            submitted_by: Some(who.to_string()),
            limit: crate::store::MAX_LIMIT,
            ..Default::default()
        };
        #[cfg(feature = "temporal")]
        if let Some(t) = self.temporal() {
            return Ok(super::list::temporal_rows(self, t, &q).await?.len());
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut n = 0;
            loop {
                let page = crate::runs::list_runs(&*store, &q)?;
                n += page.runs.len();
                match page.next {
                    Some(after) if n < enough => q.after = Some(after),
                    _ => return Ok(n),
                }
            }
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e: crate::runs::RunsError| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.code(), &e)
        })
    }
}
