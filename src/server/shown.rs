//! A call listed to a reviewer is shown: when the page or the API lists a run's calls awaiting a
//! decision to a principal who may decide them, each call whose reviewer deadline has not started
//! yet gets its showing journaled (`Op::Shown`), so that its deadline starts now and is in the
//! answer (`deadline_at`), the same for every later reader.
//!
//! Deliberately not here: when a deadline starts or what happens at it (the run machine's), or
//! how an op reaches a run nobody drives here (`api::submit`, shared with decisions).

use std::sync::Arc;

use serde_json::Value;

use super::principals::{Principal, Role};
use super::state::AppState;
use crate::protocol::{CallId, Op};

/// Starts the deadlines of the calls in `view` (a run's description) that a reviewer is now
/// shown, and returns the description again when any started.
pub(super) async fn show(st: &Arc<AppState>, who: &Principal, id: &str, view: Value) -> Value {
    if !who.may(Role::Review) {
        return view;
    }
    let unshown: Vec<(u64, u64)> = view["awaiting"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["timeout_ms"].is_u64() && a["deadline_at"].is_null())
        .filter_map(|a| Some((a["call_id"].as_u64()?, a["presentation"].as_u64()?)))
        .collect();
    if unshown.is_empty() {
        return view;
    }
    let mut started = false;
    for (call, presentation) in unshown {
        let op = Op::Shown {
            call: CallId(call),
            presentation,
        };
        match super::api::submit(st, id, op).await {
            Ok(_) => started = true,
            Err(e) => tracing::debug!(run = %id, call, "showing not recorded: {}", e.code),
        }
    }
    if !started {
        return view;
    }
    st.describe(id).await.unwrap_or(view)
}
