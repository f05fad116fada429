//! Compaction of finished runs: the journal rows (and any queued ops) of a finished run are
//! deleted and a snapshot the front-end made from them is kept on the run's row (`compacted`,
//! schema version 5), with the bytes of journal text dropped (`compacted_bytes`). The row keeps
//! its record, result and `entries`, so the list, `show` and the audit go on working.
//!
//! Deliberately not here: what the snapshot holds (the front-end derives it by replay; the
//! store only keeps it), and when runs are compacted (the retention policy's caller decides).

use rusqlite::{Connection, OptionalExtension, params};

use super::{Done, SqliteStore, io};
use crate::machine::RunResult;
use crate::protocol::Millis;
use crate::store::{Compacted, RunRecord, StoreError};

/// `Write::Compact`, inside the writer's transaction: refused for an unknown or unfinished run,
/// or one whose journal is no longer `entries` long; a run compacted already is left as it is.
pub(super) fn compact(
    c: &Connection,
    id: &str,
    snapshot: &str,
    entries: u64,
) -> Result<Done, StoreError> {
    let row: Option<(bool, bool, i64)> = c
        .query_row(
            "SELECT result IS NOT NULL, compacted IS NOT NULL, entries FROM runs WHERE id = ?1",
            params![id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(io)?;
    let Some((finished, compacted, stored)) = row else {
        return Err(StoreError::UnknownRun { id: id.into() });
    };
    if !finished {
        return Err(StoreError::NotFinished { id: id.into() });
    }
    if compacted {
        return Ok(Done::Bytes(0));
    }
    if stored.max(0) as u64 != entries {
        return Err(io(format!(
            "run {id} has {stored} journal entries, not the {entries} its snapshot was made from"
        )));
    }
    let bytes: i64 = c
        .query_row(
            "SELECT ifnull(sum(length(CAST(inputs AS BLOB))), 0) FROM journal WHERE run_id = ?1",
            params![id],
            |r| r.get(0),
        )
        .map_err(io)?;
    c.execute("DELETE FROM journal WHERE run_id = ?1", params![id])
        .map_err(io)?;
    c.execute("DELETE FROM ops WHERE run_id = ?1", params![id])
        .map_err(io)?;
    c.execute(
        "UPDATE runs SET compacted = ?2, compacted_bytes = ?3 WHERE id = ?1",
        params![id, snapshot, bytes],
    )
    .map_err(io)?;
    Ok(Done::Bytes(bytes.max(0) as u64))
}

impl SqliteStore {
    /// Finished runs last updated before `before` and not compacted, oldest first.
    pub(super) fn finished_ids(&self, before: Millis) -> Result<Vec<String>, StoreError> {
        let c = self.reader()?;
        let mut stmt = c
            .prepare(
                "SELECT id FROM runs WHERE result IS NOT NULL AND compacted IS NULL AND updated_at < ?1
                 ORDER BY updated_at, id",
            )
            .map_err(io)?;
        stmt.query_map(params![before as i64], |r| r.get(0))
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)
    }

    /// What a compacted run kept; None when it is not compacted.
    pub(super) fn compacted_run(&self, id: &str) -> Result<Option<Compacted>, StoreError> {
        let c = self.reader()?;
        type Row = (String, Option<String>, Option<String>, i64, Option<i64>);
        let row: Option<Row> = c
            .query_row(
                "SELECT record, result, compacted, entries, compacted_bytes FROM runs WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(io)?;
        let Some((record, result, snapshot, entries, bytes)) = row else {
            return Err(StoreError::UnknownRun { id: id.into() });
        };
        let (Some(result), Some(snapshot)) = (result, snapshot) else {
            return Ok(None);
        };
        let record: RunRecord = serde_json::from_str(&record).map_err(io)?;
        let result: RunResult = serde_json::from_str(&result).map_err(io)?;
        Ok(Some(Compacted {
            record,
            result,
            entries: entries.max(0) as u64,
            snapshot: serde_json::from_str(&snapshot).map_err(io)?,
            journal_bytes: bytes.unwrap_or(0).max(0) as u64,
        }))
    }
}
