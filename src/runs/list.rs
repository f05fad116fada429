//! Listing stored runs (`dagloop runs`, `GET /runs`): one query over the runs' rows, which the
//! driver keeps current; rows an older dagloop wrote are first completed once by replaying
//! their journals.
//!
//! Deliberately not here: the query itself (the store's) or how a list is printed or served.

use super::RunsError;
use crate::store::{RunPage, RunQuery, RunStore};

/// One page of runs (see [`RunQuery`]): waiting first, then newest.
pub fn list_runs(store: &dyn RunStore, q: &RunQuery) -> Result<RunPage, RunsError> {
    derive_missing(store)?;
    Ok(store.query(q)?)
}

/// Completes the rows that do not say how many calls await a decision (written by an older
/// dagloop), by replaying their journals once. A run that cannot be rebuilt is recorded as
/// awaiting nothing (it is listed as stopped; `show` says why it cannot be read).
pub fn derive_missing(store: &dyn RunStore) -> Result<usize, RunsError> {
    let ids = store.underived()?;
    for id in &ids {
        let stored = match store.load(id) {
            Ok(s) => s,
            Err(crate::store::StoreError::UnknownRun { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let note = super::view::rebuild_note(&stored.record, &stored.journal).unwrap_or_default();
        store.set_derived(id, note)?;
    }
    Ok(ids.len())
}
