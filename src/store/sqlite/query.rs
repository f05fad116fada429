//! The run list in SQL: one query over the runs' rows (an index covers it), no journal read.
//! The status is derived in SQL exactly as [`crate::store::derive_status`] derives it (a test
//! below checks every case against it).
//!
//! Deliberately not here: what a status means or who may list what (the caller filters by
//! submitter through [`RunQuery::submitted_by`]).

use rusqlite::params_from_iter;
use rusqlite::types::Value as Sql;
#[cfg(test)]
use rusqlite::{OptionalExtension, params};

use super::{SqliteStore, Write, io, now_ms};
use crate::engine::RunNote;
use crate::store::{Cursor, DEFAULT_LIMIT, MAX_LIMIT, RunPage, RunQuery, RunSummary, StoreError};

/// `derive_status` in SQL, over a `runs` row; `?1` is now. An unfinished run's `status`
/// column is `running` or `stopped`; a finished one's is its ending.
pub(super) const STATUS: &str = "CASE WHEN status NOT IN ('running', 'stopped') THEN status
    WHEN ifnull(awaiting, 0) > 0 THEN 'waiting'
    WHEN owner IS NOT NULL AND lease_expires_at >= ?1
         AND NOT dagloop_owner_gone(lease_host, lease_pid, lease_started) THEN 'running'
    ELSE 'stopped' END";

/// Whether a row's lease is held, in SQL (`?1` is now): unexpired, and not by a process on
/// this host that is gone (see [`crate::store::OwnerProcess::is_gone`]; the next claim takes
/// such a run over at once, so it is listed as driven by nobody).
pub(super) const HELD: &str = "owner IS NOT NULL AND lease_expires_at >= ?1
    AND NOT dagloop_owner_gone(lease_host, lease_pid, lease_started)";

/// The statuses `finished` stands for: every ending.
fn finished_sql() -> &'static str {
    "st NOT IN ('waiting', 'running', 'stopped')"
}

/// Every ending but success.
fn failed_sql() -> &'static str {
    "st NOT IN ('waiting', 'running', 'stopped', 'succeeded')"
}

impl SqliteStore {
    /// One page of runs, waiting first then newest (see [`RunQuery`]).
    pub(crate) fn query_page(&self, q: &RunQuery) -> Result<RunPage, StoreError> {
        let c = self.reader()?;
        let limit = match q.limit {
            0 => DEFAULT_LIMIT,
            n => n.min(MAX_LIMIT),
        };
        let mut args: Vec<Sql> = vec![Sql::Integer(now_ms() as i64)];
        let mut arg = |v: Sql| {
            args.push(v);
            format!("?{}", args.len())
        };
        let mut inner = Vec::new();
        if let Some(by) = &q.submitted_by {
            inner.push(format!("submitted_by = {}", arg(Sql::Text(by.clone()))));
        }
        if let Some(root) = &q.session {
            let p = arg(Sql::Text(root.clone()));
            inner.push(format!("(id = {p} OR session = {p})"));
        }
        if let Some(t) = q.text.as_deref().filter(|t| !t.is_empty()) {
            let p = arg(Sql::Text(t.to_lowercase()));
            inner.push(format!(
                "(instr(lower(id), {p}) > 0 OR instr(lower(title), {p}) > 0)"
            ));
        }
        let mut outer = Vec::new();
        if !q.statuses.is_empty() {
            let mut any = Vec::new();
            for s in &q.statuses {
                if s == "finished" {
                    any.push(finished_sql().to_string());
                } else if s == "failed" {
                    any.push(failed_sql().to_string());
                } else {
                    any.push(format!("st = {}", arg(Sql::Text(s.clone()))));
                }
            }
            outer.push(format!("({})", any.join(" OR ")));
        }
        if let Some(Cursor {
            waiting,
            created_at,
            id,
        }) = &q.after
        {
            let r = arg(Sql::Integer(i64::from(!*waiting)));
            let at = arg(Sql::Integer(*created_at as i64));
            let id = arg(Sql::Text(id.clone()));
            outer.push(format!(
                "(rank > {r} OR (rank = {r} AND (created_at < {at} OR (created_at = {at} AND id < {id}))))"
            ));
        }
        let lim = arg(Sql::Integer(limit as i64 + 1));
        let sql = format!(
            "SELECT id, st, title, ifnull(awaiting, 0), created_at, updated_at, entries, submitted_by, live, wake_at
             FROM (SELECT id, title, awaiting, created_at, updated_at, entries, submitted_by,
                     CASE WHEN status NOT IN ('running', 'stopped') THEN NULL ELSE wake_at END AS wake_at,
                     {STATUS} AS st,
                     CASE WHEN {HELD} THEN owner END AS live,
                     ({STATUS}) <> 'waiting' AS rank
                   FROM runs {})
             {}
             ORDER BY rank, created_at DESC, id DESC LIMIT {lim}",
            where_of(&inner),
            where_of(&outer),
        );
        let mut stmt = c.prepare(&sql).map_err(io)?;
        let mut runs: Vec<RunSummary> = stmt
            .query_map(params_from_iter(args.iter()), |r| {
                Ok(RunSummary {
                    id: r.get(0)?,
                    status: r.get(1)?,
                    title: r.get(2)?,
                    awaiting: r.get::<_, i64>(3)?.max(0) as u64,
                    created_at: r.get::<_, i64>(4)?.max(0) as u64,
                    updated_at: r.get::<_, i64>(5)?.max(0) as u64,
                    entries: r.get::<_, i64>(6)?.max(0) as u64,
                    submitted_by: r.get(7)?,
                    owner: r.get(8)?,
                    wake_at: r.get::<_, Option<i64>>(9)?.map(|w| w.max(0) as u64),
                    input: None,
                })
            })
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)?;
        // The inputs of this page's runs only (one lookup each: the list's index holds no input).
        let mut input = c
            .prepare("SELECT json_extract(record, '$.goal.input') FROM runs WHERE id = ?1")
            .map_err(io)?;
        for run in &mut runs {
            let raw: Option<String> = input
                .query_row([&run.id], |r| {
                    Ok(match r.get_ref(0)? {
                        rusqlite::types::ValueRef::Null => None,
                        rusqlite::types::ValueRef::Text(t) => {
                            Some(String::from_utf8_lossy(t).into_owned())
                        }
                        rusqlite::types::ValueRef::Integer(i) => Some(i.to_string()),
                        rusqlite::types::ValueRef::Real(f) => Some(f.to_string()),
                        rusqlite::types::ValueRef::Blob(_) => None,
                    })
                })
                .map_err(io)?;
            run.input = raw.as_deref().map(crate::store::input_summary);
        }
        let next = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(RunSummary::cursor)
        } else {
            None
        };
        Ok(RunPage { runs, next })
    }

    /// Whether run `id` has ended (its result, or what compaction kept of it, is recorded),
    /// from its row alone; None for no such run. What a server's waiters poll (one indexed row,
    /// no journal).
    pub fn has_ended(&self, id: &str) -> Result<Option<bool>, StoreError> {
        use rusqlite::OptionalExtension as _;
        self.reader()?
            .query_row(
                "SELECT status NOT IN ('running', 'stopped') OR result IS NOT NULL
                 FROM runs WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map_err(io)
    }

    /// Unfinished runs whose row does not say how many calls await a decision (written by an
    /// older dagloop).
    pub(crate) fn underived_ids(&self) -> Result<Vec<String>, StoreError> {
        let c = self.reader()?;
        let mut stmt = c
            .prepare("SELECT id FROM runs WHERE awaiting IS NULL ORDER BY created_at")
            .map_err(io)?;
        stmt.query_map([], |r| r.get(0))
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)
    }

    /// Records what was derived by replay for a run whose row did not say.
    pub(crate) fn record_derived(&self, id: &str, note: RunNote) -> Result<(), StoreError> {
        self.call(Write::Derived(id.to_string(), note)).map(|_| ())
    }

    /// The status of one run as the list derives it (None: no such run).
    #[cfg(test)]
    fn status_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.reader()?
            .query_row(
                &format!("SELECT {STATUS} FROM runs WHERE id = ?2"),
                params![now_ms() as i64, id],
                |r| r.get(0),
            )
            .optional()
            .map_err(io)
    }
}

fn where_of(parts: &[String]) -> String {
    if parts.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", parts.join(" AND "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RunRecord, RunStore, derive_status};
    use serde_json::json;

    #[test]
    fn the_sql_status_is_derive_status_in_every_case() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).expect("open");
        store
            .create(&RunRecord {
                id: "r".into(),
                created_at: 1,
                goal: json!({"goal": "Title\nmore"}),
                base_dir: ".".into(),
                options: json!({}),
            })
            .expect("create");
        let c = rusqlite::Connection::open(&path).expect("sql");
        let far = now_ms() as i64 + 60_000;
        for finished in [None, Some("succeeded"), Some("timeout")] {
            for awaiting in [None, Some(0), Some(3)] {
                for leased in [false, true] {
                    c.execute(
                        "UPDATE runs SET status = ?1, awaiting = ?2, owner = 'o', lease_expires_at = ?3",
                        params![finished.unwrap_or("running"), awaiting, if leased { far } else { 1 }],
                    )
                    .expect("set");
                    let want = derive_status(finished, awaiting.unwrap_or(0) as u64, leased);
                    assert_eq!(
                        store.status_of("r").expect("status").as_deref(),
                        Some(want),
                        "{finished:?} {awaiting:?} {leased}"
                    );
                    let page = store.query_page(&RunQuery::default()).expect("page");
                    assert_eq!(page.runs[0].status, want);
                    assert_eq!(page.runs[0].title, "Title");
                    // `failed` lists every ending but success, and nothing else.
                    let failed = store
                        .query_page(&RunQuery {
                            statuses: vec!["failed".into()],
                            ..RunQuery::default()
                        })
                        .expect("page");
                    let is_failed = !["waiting", "running", "stopped", "succeeded"].contains(&want);
                    assert_eq!(failed.runs.len(), usize::from(is_failed), "{want}");
                }
            }
        }
    }

    /// A lease whose process on this host is gone drives nothing: the list says `stopped`
    /// with no owner (the next claim takes the run over at once), while a live process's
    /// lease still says `running`.
    #[test]
    fn a_lease_whose_process_is_gone_is_listed_as_driven_by_nobody() {
        let Some(me) = crate::store::OwnerProcess::current() else {
            return; // no /proc: only the expiry decides
        };
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).expect("open");
        store
            .create(&RunRecord {
                id: "r".into(),
                created_at: 1,
                goal: json!({"goal": "t"}),
                base_dir: ".".into(),
                options: json!({}),
            })
            .expect("create");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let c = rusqlite::Connection::open(&path).expect("sql");
        let far = now_ms() as i64 + 60_000;
        for (pid, started, want) in [
            (me.pid, me.started, "running"),
            (dead, 1, "stopped"),
            (me.pid, me.started + 1, "running"), // this process's own pid is never judged
        ] {
            c.execute(
                "UPDATE runs SET status = 'running', awaiting = 0, owner = 'o',
                 lease_expires_at = ?1, lease_host = ?2, lease_pid = ?3, lease_started = ?4",
                params![far, me.host, pid, started as i64],
            )
            .expect("set");
            assert_eq!(store.status_of("r").expect("status").as_deref(), Some(want));
            let page = store.query_page(&RunQuery::default()).expect("page");
            assert_eq!(page.runs[0].status, want, "pid {pid}");
            assert_eq!(page.runs[0].owner.is_some(), want == "running");
            let row = &store.list().expect("list")[0];
            assert_eq!(
                (row.status.as_str(), row.owner.is_some()),
                (want, want == "running")
            );
        }
    }
}
