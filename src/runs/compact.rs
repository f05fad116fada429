//! Retention and compaction of finished runs, one set of rules for `dagloop runs prune`,
//! `dagloop runs compact` and `dagloop serve` (which applies the config's `[store]` policy
//! periodically).
//!
//! Compacting a finished run keeps what `show`, `show --audit` and `GET /runs/{id}` print, made
//! here once by replaying its journal (the description, the audit entries and the standing
//! approvals), and
//! lets the store drop the journal. Deleting (retention) forgets a finished run altogether.
//! Only finished runs are ever touched: a run that is running, waiting or stopped keeps its
//! journal whatever its age.
//!
//! Deliberately not here: parsing ages (`crate::duration::age_ms`), the SQL (the store), or
//! deciding that a run is finished (the machine did, when it recorded its result).

use serde::Serialize;
use serde_json::json;

use super::RunsError;
use crate::protocol::Millis;
use crate::store::{Retention, RunStore, StoreError};

/// What a compacted run kept under `key` of its snapshot (`view`, `audit`, `standing`), `Null`
/// when nothing. A run compacted before a reviewer's standing approval got its own name kept
/// its standing approvals under `grants`.
pub fn kept<'a>(snapshot: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    match (&snapshot[key], key) {
        (serde_json::Value::Null, "standing") => &snapshot["grants"],
        (v, _) => v,
    }
}

/// What applying a retention policy did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Retained {
    /// Finished runs deleted.
    pub deleted: usize,
    /// Finished runs compacted.
    pub compacted: usize,
    /// Bytes of journal text the compactions dropped.
    pub journal_bytes_dropped: u64,
    /// Bytes of the snapshots kept in their place.
    pub snapshot_bytes: u64,
    /// Runs that could not be compacted (their id and the error's code); left as they were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<(String, String)>,
}

/// What compacting one run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactedRun {
    /// The run.
    pub run_id: String,
    /// The journal entries it had.
    pub entries: u64,
    /// Bytes of journal text dropped (0 when it was compacted already).
    pub journal_bytes_dropped: u64,
    /// Bytes of the snapshot kept.
    pub snapshot_bytes: u64,
    /// It was compacted before.
    pub already: bool,
}

/// Compacts one finished run: replays its journal once, keeps its description, audit and
/// grants, and has the store drop the journal. `store.not_finished` for a run that is not
/// finished; a run compacted already is reported as such.
pub fn compact(store: &dyn RunStore, id: &str) -> Result<CompactedRun, RunsError> {
    let stored = match store.load(id) {
        Ok(s) => s,
        Err(StoreError::Compacted { entries, .. }) => {
            let kept = store.compacted(id)?.map(|c| c.snapshot.to_string().len());
            return Ok(CompactedRun {
                run_id: id.to_string(),
                entries,
                journal_bytes_dropped: 0,
                snapshot_bytes: kept.unwrap_or(0) as u64,
                already: true,
            });
        }
        Err(e) => return Err(e.into()),
    };
    let Some(result) = &stored.result else {
        return Err(StoreError::NotFinished { id: id.into() }.into());
    };
    let rb = super::rebuild(&stored.record, &stored.journal)?;
    let view = super::describe(id, &rb, stored.journal.len(), Some(result), false);
    let snapshot = json!({
        "view": view,
        "audit": super::audit::audit(&rb.events),
        "standing": super::audit::standing(&rb.events),
    });
    let entries = stored.journal.len() as u64;
    let dropped = store.compact(id, &snapshot, entries)?;
    Ok(CompactedRun {
        run_id: id.to_string(),
        entries,
        journal_bytes_dropped: dropped,
        snapshot_bytes: snapshot.to_string().len() as u64,
        already: false,
    })
}

/// Applies `policy` at `now`: deletes the finished runs older than `retain_ms`, then compacts
/// the finished runs older than `compact_after_ms` that are left. A run that cannot be
/// compacted is listed in `failed` and left whole; a locked store stops it.
pub fn apply_retention(
    store: &dyn RunStore,
    policy: &Retention,
    now: Millis,
) -> Result<Retained, RunsError> {
    let mut done = Retained::default();
    if let Some(age) = policy.retain_ms {
        done.deleted = store.prune(now.saturating_sub(age))?;
    }
    if let Some(age) = policy.compact_after_ms {
        for id in store.finished_before(now.saturating_sub(age))? {
            match compact(store, &id) {
                Ok(c) => {
                    done.compacted += usize::from(!c.already);
                    done.journal_bytes_dropped += c.journal_bytes_dropped;
                    done.snapshot_bytes += c.snapshot_bytes;
                }
                // Pruned or changed meanwhile by another process: nothing to do.
                Err(RunsError::Store(StoreError::UnknownRun { .. })) => {}
                // The store is locked by another connection: try again next time.
                Err(RunsError::Store(e @ StoreError::Locked { .. })) => return Err(e.into()),
                Err(e) => done.failed.push((id, e.code().to_string())),
            }
        }
    }
    Ok(done)
}
