//! Parked runs: a run that waits only for decisions and deadlines gives its lease up and is
//! marked parked, so that it holds no task, thread or timer anywhere; what wakes it is on its
//! row (queued ops, the earliest deadline). A server's watcher asks [`Watch::wakeable`] a few
//! times a second: three small index reads, whatever the number of parked runs; once a second
//! also one read of the leases held by other processes of this host, so that runs whose owner
//! is gone (a server killed and started again) are taken over at once.
//!
//! Deliberately not here: waking a run (the server launches it) or deciding that a run can be
//! parked (its driver says it is idle).

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{Done, SqliteStore, connect, io};
use crate::protocol::Millis;
use crate::store::StoreError;

/// `Write::Park`: the lease given up (this owner's only) and the run marked parked.
pub(super) fn park(c: &Connection, owner: &str, id: &str) -> Result<Done, StoreError> {
    c.execute(
        "UPDATE runs SET owner = NULL, lease_expires_at = NULL, parked = 1,
         lease_host = NULL, lease_pid = NULL, lease_started = NULL
         WHERE id = ?1 AND owner = ?2 AND status IN ('running', 'stopped')",
        params![id, owner],
    )
    .map_err(io)?;
    Ok(Done::Unit)
}

/// A read connection kept open for a watcher's polls.
pub struct Watch {
    c: Connection,
    /// When the leases of other processes of this host were last looked at.
    owners_seen: std::cell::Cell<Millis>,
}

/// How often [`Watch::wakeable`] looks for runs whose owner on this host is gone.
const OWNERS_EVERY_MS: Millis = 1000;

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl SqliteStore {
    /// A connection for a watcher's polls.
    pub fn watch(&self) -> Result<Watch, StoreError> {
        watch_at(&self.path)
    }
}

fn watch_at(path: &Path) -> Result<Watch, StoreError> {
    Ok(Watch {
        c: connect(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?,
        owners_seen: std::cell::Cell::new(0),
    })
}

impl Watch {
    /// Unfinished server runs nobody drives (no unexpired lease at `now`) that need a driver: those
    /// not parked (their process stopped mid-work), parked ones whose earliest deadline is due,
    /// and those with queued ops (decisions), oldest first; then (looked for once a second)
    /// server runs whose lease is held by a process of this host that is gone.
    pub fn wakeable(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        let mut ids = self.unleased(now)?;
        if now.saturating_sub(self.owners_seen.get()) >= OWNERS_EVERY_MS {
            self.owners_seen.set(now);
            for id in self.owners_gone()? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// Unfinished server runs whose lease names a process of this host (not this one) that is
    /// gone: claiming them takes them over at once.
    fn owners_gone(&self) -> Result<Vec<String>, StoreError> {
        let Some(me) = crate::store::OwnerProcess::current() else {
            return Ok(Vec::new());
        };
        let owners: Vec<(i64, i64)> = self
            .c
            .prepare_cached(
                "SELECT DISTINCT lease_pid, lease_started FROM runs
                 WHERE lease_host = ?1 AND lease_pid != ?2",
            )
            .and_then(|mut s| {
                s.query_map(params![me.host, i64::from(me.pid)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            })
            .map_err(io)?;
        let mut ids = Vec::new();
        for (pid, started) in owners {
            let (Ok(p), Ok(s)) = (u32::try_from(pid), u64::try_from(started)) else {
                continue;
            };
            let owner = crate::store::OwnerProcess {
                host: me.host.clone(),
                pid: p,
                started: s,
            };
            if !owner.is_gone() {
                continue;
            }
            let mut stmt = self
                .c
                .prepare_cached(
                    "SELECT id FROM runs WHERE lease_host = ?1 AND lease_pid = ?2
                     AND lease_started = ?3 AND status IN ('running', 'stopped')
                     AND json_extract(record, '$.options.server') = 1
                     ORDER BY created_at, id",
                )
                .map_err(io)?;
            let gone: Vec<String> = stmt
                .query_map(params![me.host, pid, started], |r| r.get(0))
                .map_err(io)?
                .collect::<Result<_, _>>()
                .map_err(io)?;
            ids.extend(gone);
        }
        Ok(ids)
    }

    fn unleased(&self, now: Millis) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .c
            .prepare_cached(
                "SELECT id FROM runs WHERE id IN (
                    SELECT id FROM runs WHERE parked = 0 AND status IN ('running', 'stopped')
                    UNION SELECT id FROM runs WHERE wake_at <= ?1
                    UNION SELECT run_id FROM ops)
                 AND status IN ('running', 'stopped')
                 AND json_extract(record, '$.options.server') = 1
                 AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?1)
                 ORDER BY created_at, id",
            )
            .map_err(io)?;
        stmt.query_map(params![now as i64], |r| r.get(0))
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)
    }

    /// The earliest deadline of a parked run still to come after `now`, if any.
    pub fn next_wake(&self, now: Millis) -> Result<Option<Millis>, StoreError> {
        self.c
            .query_row(
                "SELECT wake_at FROM runs WHERE wake_at > ?1 AND parked = 1
                 ORDER BY wake_at LIMIT 1",
                params![now as i64],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|w| w.map(|w| w.max(0) as u64))
            .map_err(io)
    }
}
