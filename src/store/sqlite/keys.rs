//! Idempotency keys of run submissions and who submitted each run (the server's), in a table of
//! their own beside the runs.
//!
//! Deliberately not here: the runs and their journals.

use super::*;

/// Idempotency keys and run owners, for `dagloop serve`. The keys' table is made on first use
/// (`CREATE TABLE IF NOT EXISTS`), outside the numbered migrations: stores without it are read
/// as having no keys, and nothing else in the store depends on it.
pub(super) const IDEMPOTENCY_TABLE: &str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (principal, key)
) WITHOUT ROWID";

impl SqliteStore {
    fn keys_connection(&self) -> Result<Connection, StoreError> {
        let c = connect(&self.path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        c.execute_batch(IDEMPOTENCY_TABLE).map_err(io)?;
        Ok(c)
    }

    /// The run an earlier request of `principal` with this `Idempotency-Key` created, if that
    /// run is still in the store.
    pub fn idempotent_run(&self, principal: &str, key: &str) -> Result<Option<String>, StoreError> {
        self.keys_connection()?
            .query_row(
                "SELECT k.run_id FROM idempotency_keys k JOIN runs r ON r.id = k.run_id
                 WHERE k.principal = ?1 AND k.key = ?2",
                params![principal, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(io)
    }

    /// Remembers that `principal`'s request with this `Idempotency-Key` created `run` (the first
    /// one recorded wins).
    pub fn remember_idempotent(
        &self,
        principal: &str,
        key: &str,
        run: &str,
    ) -> Result<(), StoreError> {
        self.keys_connection()?
            .execute(
                "INSERT OR IGNORE INTO idempotency_keys (principal, key, run_id, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![principal, key, run, now_ms() as i64],
            )
            .map(|_| ())
            .map_err(io)
    }

    /// Who submitted each stored run (`options.submitted_by` of its record; None for runs
    /// recorded without one), by run id.
    pub fn submitters(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Option<String>>, StoreError> {
        let c = self.reader()?;
        let mut stmt = c
            .prepare("SELECT id, json_extract(record, '$.options.submitted_by') FROM runs")
            .map_err(io)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1).ok())))
            .map_err(io)?;
        rows.collect::<Result<_, _>>().map_err(io)
    }

    /// Who submitted one run; `store.unknown_run` when there is no such run.
    pub fn submitter(&self, id: &str) -> Result<Option<String>, StoreError> {
        let c = self.reader()?;
        let row: Option<Option<String>> = c
            .query_row(
                "SELECT json_extract(record, '$.options.submitted_by') FROM runs WHERE id = ?1",
                params![id],
                |r| Ok(r.get(0).ok()),
            )
            .optional()
            .map_err(io)?;
        row.ok_or_else(|| StoreError::UnknownRun { id: id.into() })
    }
}
