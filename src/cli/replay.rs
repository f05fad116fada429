//! `dagloop replay RUN`: a stored run's journal through fresh machines, offline; prints
//! `identical` (exit 0) or the first divergence (exit 1). The rules are in `runs::replay_run`
//! (spec/replay.md).

use serde_json::json;

use super::{CliError, pretty};
use crate::store::RunStore;

pub(super) fn replay(store: &dyn RunStore, id: &str) -> Result<i32, CliError> {
    let stored = store.load(id).map_err(|e| CliError::new(e.code(), &e))?;
    let r = crate::runs::replay_run(&stored.record, &stored.journal, stored.result.as_ref())
        .map_err(|e| CliError::new(e.code(), &e))?;
    let identical = r.divergence.is_none();
    let mut v = json!({
        "status": if identical { "identical" } else { "diverged" },
        "run_id": id,
        "entries": r.entries,
        "events": r.events,
        "events_digest": r.events_digest,
        "run_status": r.status,
    });
    if let Some(d) = &r.divergence {
        v["divergence"] = serde_json::to_value(d).unwrap_or_default();
    }
    outln!("{}", pretty(&v));
    Ok(if identical { 0 } else { 1 })
}
