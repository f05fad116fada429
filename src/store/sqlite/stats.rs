//! What the store holds and how big it is (`dagloop runs --stats`): the database and WAL
//! files' sizes, runs by status, and the bytes their journals take.
//!
//! Deliberately not here: shrinking anything (checkpoints are the writer's; forgetting runs is
//! `prune`, compacting them `compact`).

use std::collections::BTreeMap;

use super::{SqliteStore, io, now_ms};
use crate::store::StoreError;

/// The store's size and contents.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoreStats {
    /// The database file.
    pub path: String,
    /// Its size in bytes.
    pub db_bytes: u64,
    /// The write-ahead log's size in bytes (0 when there is none).
    pub wal_bytes: u64,
    /// Runs by status (as the list derives it).
    pub runs: BTreeMap<String, u64>,
    /// Bytes of journal text (the entries as stored).
    pub journal_bytes: u64,
    /// Journal entries.
    pub journal_entries: u64,
    /// Decisions queued for runs nobody drives.
    pub queued_ops: u64,
    /// Finished runs compacted to their result, decisions and a final snapshot.
    pub compacted_runs: u64,
    /// Bytes of journal text their compaction dropped.
    pub compacted_journal_bytes: u64,
    /// Bytes of the snapshots kept in their place.
    pub compacted_snapshot_bytes: u64,
    /// What compaction saved: the journal bytes dropped less the snapshots kept (negative
    /// when the snapshots are larger, as for very short runs).
    pub compaction_saved_bytes: i64,
}

impl SqliteStore {
    /// The store's size and contents.
    pub fn stats(&self) -> Result<StoreStats, StoreError> {
        let c = self.reader()?;
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let mut runs = BTreeMap::new();
        let mut stmt = c
            .prepare(&format!(
                "SELECT {}, count(*) FROM runs GROUP BY 1",
                super::query::STATUS
            ))
            .map_err(io)?;
        let rows = stmt
            .query_map([now_ms() as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(io)?;
        for row in rows {
            let (status, n) = row.map_err(io)?;
            runs.insert(status, n.max(0) as u64);
        }
        let (journal_bytes, journal_entries): (i64, i64) = c
            .query_row(
                "SELECT ifnull(sum(length(CAST(inputs AS BLOB))), 0), ifnull(sum(n), 0) FROM journal",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(io)?;
        let queued_ops: i64 = c
            .query_row("SELECT count(*) FROM ops", [], |r| r.get(0))
            .map_err(io)?;
        let (compacted_runs, dropped, kept): (i64, i64, i64) = c
            .query_row(
                "SELECT count(*), ifnull(sum(compacted_bytes), 0),
                        ifnull(sum(length(CAST(compacted AS BLOB))), 0)
                 FROM runs WHERE compacted IS NOT NULL",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(io)?;
        Ok(StoreStats {
            path: self.path.display().to_string(),
            db_bytes: size(&self.path),
            wal_bytes: size(std::path::Path::new(&wal)),
            runs,
            journal_bytes: journal_bytes.max(0) as u64,
            journal_entries: journal_entries.max(0) as u64,
            queued_ops: queued_ops.max(0) as u64,
            compacted_runs: compacted_runs.max(0) as u64,
            compacted_journal_bytes: dropped.max(0) as u64,
            compacted_snapshot_bytes: kept.max(0) as u64,
            compaction_saved_bytes: dropped - kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::JournalSink;
    use crate::machine::{JournalEntry, RunInput};
    use crate::store::{RunRecord, RunStore};

    /// Writes go through the WAL; once the store is idle, the WAL is copied into the database
    /// and truncated to nothing, and the stats say so.
    #[tokio::test]
    async fn an_idle_store_truncates_its_wal_and_reports_its_size() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).expect("open");
        store
            .create(&RunRecord {
                id: "r".into(),
                created_at: 1,
                goal: serde_json::json!({"goal": "g"}),
                base_dir: ".".into(),
                options: serde_json::json!({}),
            })
            .expect("create");
        let big = "x".repeat(1000);
        for b in 0..50u64 {
            let entries: Vec<_> = (1..=10)
                .map(|i| JournalEntry {
                    seq: b * 10 + i,
                    at: b,
                    input: RunInput::Cancel {
                        reason: big.clone(),
                        by: None,
                    },
                })
                .collect();
            store.append("r", &entries).await.expect("append");
        }
        let busy = store.stats().expect("stats");
        assert!(busy.wal_bytes > 100_000, "{busy:?}");
        assert_eq!(busy.journal_entries, 500);
        assert!(busy.journal_bytes >= 500_000, "{busy:?}");
        assert_eq!(busy.runs.get("running"), Some(&1));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let s = store.stats().expect("stats");
            if s.wal_bytes == 0 {
                assert!(s.db_bytes >= 500_000, "{s:?}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never truncated: {s:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}
