//! Per-principal limits on what one client holds open on the server: held waits (`GET
//! /runs/{id}/result?wait=`) and event streams (`GET /runs/{id}/events`), each at most
//! [`MAX_OPEN`] per principal at a time. One past it is refused at once with 429
//! `server.too_many_open`, so a client cannot take every watcher, stream and
//! connection for itself; another principal's requests are still answered. A slot is given
//! back when its wait ends or its stream closes (the [`Held`] guard is dropped).
//!
//! Deliberately not here: connection-level bounds (`conns`), the watcher shared by a run's waiters
//! (`watch`), and a limit on how many runs a principal may start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::error::ApiError;
use super::principals::Principal;
use super::state::lock;

/// Waits, or streams, one principal may hold open at a time.
pub const MAX_OPEN: usize = 64;

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
