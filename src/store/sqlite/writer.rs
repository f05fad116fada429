//! The store's writer thread: it takes every request waiting in its channel, commits them in
//! one `BEGIN IMMEDIATE` transaction (each request in its own savepoint, a lease checked per
//! append) and answers each; and the checkpoint thread's thresholds that keep the WAL small.
//!
//! Deliberately not here: opening the store and reading it (`sqlite.rs` and its readers).

use super::*;

/// The WAL holds this many pages or more after a commit: the checkpoint thread is asked to copy
/// it into the database file (SQLite's own threshold, which it would otherwise apply inside
/// whichever commit crossed it, on the writer's thread).
pub(super) const CHECKPOINT_PAGES: i32 = 1000;

/// The WAL is kept under about this size: past it the checkpoint resets it, and a reset WAL
/// file is cut back to it.
pub(super) const WAL_LIMIT_BYTES: i64 = 64 << 20;

/// [`WAL_LIMIT_BYTES`] in pages of the default size (4 KiB), less a margin for the frames
/// written while a checkpoint runs.
pub(super) const WAL_LIMIT_PAGES: i32 = 12_000;

/// After this long without a write, the WAL is copied into the database and truncated.
pub(super) const IDLE_TRUNCATE: Duration = Duration::from_secs(2);

/// What the checkpoint thread is asked to do.
pub(super) enum Checkpoint {
    /// Copy what it can beside the writer.
    Passive,
    /// Copy everything and truncate the WAL file (waits for readers to move on).
    Truncate,
}

thread_local! {
    /// Pages in the WAL after the last commit of this thread's connection (the writer's).
    static WAL_PAGES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

pub(super) fn note_wal_pages(
    _: &rusqlite::hooks::Wal,
    pages: std::ffi::c_int,
) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

pub(super) fn writer(
    mut c: Connection,
    rx: mpsc::Receiver<(Write, Reply)>,
    path: &Path,
    me: &Me,
    checkpoint_at: i32,
    checkpoint: mpsc::SyncSender<Checkpoint>,
) {
    // Checkpoints happen beside the writer, not inside its commits (this hook replaces SQLite's
    // automatic checkpoint): a run waiting for its journal never waits for one.
    c.wal_hook(Some(note_wal_pages));
    // The WAL's size when a checkpoint was last asked for.
    let mut asked_at = 0;
    // Something was committed since the WAL was last truncated.
    let mut dirty = false;
    // Room for giving leases back on a full disk: kept once this process has committed.
    let mut reserve = reserve::Reserve::new(path);
    let mut committed = false;
    loop {
        let first = match rx.recv_timeout(IDLE_TRUNCATE) {
            Ok(first) => first,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Idle: the WAL is copied into the database and truncated to nothing.
                if dirty {
                    dirty = false;
                    let _ = checkpoint.try_send(Checkpoint::Truncate);
                    reserve.keep();
                }
                crate::idle::release();
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        dirty = true;
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
            if batch.len() >= 512 {
                break;
            }
        }
        let mut results = match commit_batch(&mut c, &batch, path, me) {
            Ok(done) => done.into_iter().collect::<Vec<_>>(),
            Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
        };
        // A write that gives a lease up and failed (the disk is full) is tried once more, on
        // its own, in the room the reserve frees: a run that stopped because its journal could
        // not be written does not keep its lease.
        for (i, (w, _)) in batch.iter().enumerate() {
            if gives_lease_up(w) && matches!(results[i], Err(StoreError::Io { .. })) {
                // (Gone already: another process, or this one, spent it; the write is tried
                // again all the same.)
                reserve.spend();
                let one = std::slice::from_ref(&batch[i]);
                results[i] = match commit_batch(&mut c, one, path, me) {
                    Ok(mut done) => done.pop().unwrap_or_else(|| Err(io("no answer"))),
                    Err(e) => Err(e),
                };
            }
        }
        // The reserve is written after this process's first commit, and again (once spent)
        // when the store is next idle.
        if !committed && results.iter().any(Result::is_ok) {
            committed = true;
            reserve.keep();
        }
        for ((_, reply), r) in batch.into_iter().zip(results) {
            reply(r);
        }
        // Once per `checkpoint_at` pages the WAL grew by, not after every commit: a WAL that
        // cannot start over yet (frames were added while the last checkpoint ran) stays above
        // the threshold, and checkpointing after each commit would only add fsyncs.
        let pages = WAL_PAGES.with(|p| p.get());
        if pages < asked_at {
            asked_at = 0; // the WAL started over
        }
        if pages - asked_at >= checkpoint_at {
            asked_at = pages;
            // At most one request waits; the checkpoint thread takes it when it is free.
            // Past the bound, the checkpoint resets the WAL (it waits for readers to move on).
            let mode = if pages >= WAL_LIMIT_PAGES {
                Checkpoint::Truncate
            } else {
                Checkpoint::Passive
            };
            let _ = checkpoint.try_send(mode);
        }
    }
}

pub(super) fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `w` gives a run's lease up (what the reserve's room is kept for).
fn gives_lease_up(w: &Write) -> bool {
    matches!(w, Write::Release(_) | Write::Park(_) | Write::Finish(..))
}

/// Commits `batch` ([`commit_retrying`]), with `synchronous = FULL` when it holds a decision or
/// a run's end.
fn commit_batch(
    c: &mut Connection,
    batch: &[(Write, Reply)],
    path: &Path,
    me: &Me,
) -> Result<Vec<Result<Done, StoreError>>, StoreError> {
    let full = batch.iter().any(|(w, _)| match w {
        Write::Finish(..) | Write::PushOp(..) | Write::ClaimOp(..) => true,
        Write::Append(_, rows) => rows.decision,
        _ => false,
    });
    if !full {
        return commit_retrying(c, batch, path, me);
    }
    // Never commit a decision or a run's end with less than FULL.
    c.pragma_update(None, "synchronous", "FULL").map_err(io)?;
    let r = commit_retrying(c, batch, path, me);
    let _ = c.pragma_update(None, "synchronous", "NORMAL");
    r
}

/// [`commit`], tried again after a pause while another connection keeps the store locked past
/// the busy timeout ([`BUSY_RETRIES`]), then refused with `store.locked`.
pub(super) fn commit_retrying(
    c: &mut Connection,
    batch: &[(Write, Reply)],
    path: &Path,
    me: &Me,
) -> Result<Vec<Result<Done, StoreError>>, StoreError> {
    let mut pauses = BUSY_RETRIES.iter();
    loop {
        match commit(c, batch, path, me) {
            Err(StoreError::Locked { reason }) => match pauses.next() {
                Some(p) => {
                    tracing::warn!(
                        "the run store is locked by another process ({reason}); trying again"
                    );
                    std::thread::sleep(*p);
                }
                None => return Err(StoreError::Locked { reason }),
            },
            other => return other,
        }
    }
}

pub(super) fn locked_or(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Locked {
                reason: e.to_string(),
            }
        }
        _ => classify(path, e),
    }
}

/// One transaction for the whole batch; each request in a savepoint of its own, so that a
/// request that fails (a duplicate id, a lost lease) is answered alone and leaves nothing
/// behind, without undoing the others.
pub(super) fn commit(
    c: &mut Connection,
    batch: &[(Write, Reply)],
    path: &Path,
    me: &Me,
) -> Result<Vec<Result<Done, StoreError>>, StoreError> {
    let mut tx = c
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| locked_or(path, e))?;
    if let [(w, _)] = batch {
        // One request: the transaction is its savepoint (dropped without a commit, it rolls
        // back).
        let r = apply(&tx, me, w);
        if r.is_ok() {
            tx.commit().map_err(|e| locked_or(path, e))?;
        }
        return Ok(vec![r]);
    }
    let mut out = Vec::with_capacity(batch.len());
    for (w, _) in batch {
        let sp = tx.savepoint().map_err(|e| locked_or(path, e))?;
        let r = apply(&sp, me, w);
        if r.is_ok() {
            sp.commit().map_err(|e| locked_or(path, e))?;
        }
        // Dropped without a commit, a savepoint rolls back.
        out.push(r);
    }
    tx.commit().map_err(|e| locked_or(path, e))?;
    Ok(out)
}

/// The lease of run `id` as it stands: `UnknownRun`, or who holds it until when.
pub(super) fn holder(
    c: &Connection,
    id: &str,
) -> Result<(Option<String>, Option<i64>), StoreError> {
    c.query_row(
        "SELECT owner, lease_expires_at FROM runs WHERE id = ?1",
        params![id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .map_err(io)?
    .ok_or_else(|| StoreError::UnknownRun { id: id.into() })
}

/// A run's lease holder: who, until when, and the process the lease names.
type Holder = (
    Option<String>,
    Option<i64>,
    Option<crate::store::OwnerProcess>,
);

/// [`holder`], with the process its lease names (when it names one).
fn holder_process(c: &Connection, id: &str) -> Result<Holder, StoreError> {
    type Row = (
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let row: Option<Row> = c
        .query_row(
            "SELECT owner, lease_expires_at, lease_host, lease_pid, lease_started FROM runs WHERE id = ?1",
            params![id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()
        .map_err(io)?;
    let (owner, expires, host, pid, started) =
        row.ok_or_else(|| StoreError::UnknownRun { id: id.into() })?;
    Ok((owner, expires, owner_process(host, pid, started)))
}

/// The seq of the run's last journal entry (0: none).
fn last_entry(c: &Connection, id: &str) -> Result<u64, StoreError> {
    c.prepare_cached("SELECT seq + n - 1 FROM journal WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1")
        .and_then(|mut s| s.query_row(params![id], |r| r.get::<_, i64>(0)).optional())
        .map(|last| last.map_or(0, |l| l.max(0) as u64))
        .map_err(io)
}

/// The queued decision holding presentation `p` of run `id`, if one does: its row and op.
fn holding(c: &Connection, id: &str, p: u64) -> Result<Option<(i64, String)>, StoreError> {
    c.prepare_cached("SELECT id, op FROM ops WHERE run_id = ?1 AND presentation = ?2")
        .and_then(|mut s| {
            s.query_row(params![id, p as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(io)
}

pub(super) fn apply(c: &Connection, me: &Me, w: &Write) -> Result<Done, StoreError> {
    let now = now_ms() as i64;
    let until = now.saturating_add(me.lease_ms);
    let owner: &str = &me.owner;
    let (host, pid, started) = match me.process {
        Some(p) => (
            Some(p.host.as_str()),
            Some(i64::from(p.pid)),
            i64::try_from(p.started).ok(),
        ),
        None => (None, None, None),
    };
    match w {
        Write::Create(rec) => {
            let record = serde_json::to_string(rec).map_err(io)?;
            let title = crate::store::title_of(rec.goal["goal"].as_str().unwrap_or(""));
            let by = rec.options["submitted_by"].as_str();
            let session = rec.options["session"]["root"].as_str();
            // Runs of one session are serialised: checked in this transaction, so two
            // follow-ups started at once cannot both see the session idle.
            if let Some(root) = session
                && let Some(running) = c
                    .query_row(
                        "SELECT id FROM runs WHERE (id = ?1 OR session = ?1) AND result IS NULL
                         ORDER BY created_at LIMIT 1",
                        params![root],
                        |r| r.get::<_, String>(0),
                    )
                    .optional()
                    .map_err(io)?
            {
                return Err(StoreError::SessionBusy {
                    session: root.to_string(),
                    running,
                });
            }
            let n = c
                .execute(
                    "INSERT OR IGNORE INTO runs (id, created_at, updated_at, record, status, owner, lease_expires_at, title, submitted_by, awaiting,
                     lease_host, lease_pid, lease_started, session)
                     VALUES (?1, ?2, ?2, ?3, 'running', ?4, ?5, ?6, ?7, 0, ?8, ?9, ?10, ?11)",
                    params![rec.id, rec.created_at as i64, record, owner, until, title, by, host, pid, started, session],
                )
                .map_err(io)?;
            if n == 0 {
                return Err(StoreError::Exists { id: rec.id.clone() });
            }
            Ok(Done::Unit)
        }
        Write::SetOptions(id, options) => {
            let n = c
                .execute(
                    "UPDATE runs SET record = json_set(record, '$.options', json(?2)) WHERE id = ?1",
                    params![id, options],
                )
                .map_err(io)?;
            if n == 0 {
                return Err(StoreError::UnknownRun { id: id.clone() });
            }
            Ok(Done::Unit)
        }
        Write::Claim(id) => {
            // One atomic update decides who drives the run: nobody else can take a lease
            // between a check and a write.
            let n = c
                .execute(
                    "UPDATE runs SET owner = ?2, lease_expires_at = ?3, parked = 0,
                     lease_host = ?5, lease_pid = ?6, lease_started = ?7 WHERE id = ?1
                     AND (owner IS NULL OR owner = ?2 OR lease_expires_at IS NULL OR lease_expires_at < ?4)",
                    params![id, owner, until, now, host, pid, started],
                )
                .map_err(io)?;
            if n == 0 {
                let (holder, expires, process) = holder_process(c, id)?;
                // A holder on this host that is gone (crashed, killed) is taken over at once,
                // in this same transaction: still nobody can come between.
                if let (Some(gone), Some(p)) = (&holder, &process)
                    && p.is_gone()
                {
                    c.execute(
                        "UPDATE runs SET owner = ?2, lease_expires_at = ?3, parked = 0,
                         lease_host = ?5, lease_pid = ?6, lease_started = ?7 WHERE id = ?1 AND owner = ?4",
                        params![id, owner, until, gone, host, pid, started],
                    )
                    .map_err(io)?;
                    tracing::info!(run = %id, "took the run over from {gone}: that process is gone");
                    return Ok(Done::Unit);
                }
                let expires_at = expires.map_or(0, |e| e.max(0) as u64);
                return Err(StoreError::Busy {
                    id: id.clone(),
                    owner: holder.unwrap_or_default(),
                    expires_at,
                    remaining_s: expires_at.saturating_sub(now as u64).div_ceil(1000),
                });
            }
            Ok(Done::Unit)
        }
        Write::Renew(id) => {
            let n = c
                .execute(
                    "UPDATE runs SET lease_expires_at = ?3 WHERE id = ?1 AND owner = ?2",
                    params![id, owner, until],
                )
                .map_err(io)?;
            if n == 0 {
                holder(c, id)?;
                return Err(StoreError::LeaseLost { id: id.clone() });
            }
            Ok(Done::Unit)
        }
        Write::Release(id) => {
            c.execute(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL,
                 lease_host = NULL, lease_pid = NULL, lease_started = NULL WHERE id = ?1 AND owner = ?2",
                params![id, owner],
            )
            .map_err(io)?;
            Ok(Done::Unit)
        }
        Write::Append(id, rows) => {
            // Ownership first, in the append's own transaction: an owner that lost the lease
            // never appends. The append renews the lease too.
            let n = c
                .prepare_cached(
                    "UPDATE runs SET entries = entries + ?2, updated_at = ?3, lease_expires_at = ?5
                     WHERE id = ?1 AND owner = ?4",
                )
                .and_then(|mut s| s.execute(params![id, rows.len() as i64, now, owner, until]))
                .map_err(io)?;
            if n == 0 {
                holder(c, id)?;
                return Err(StoreError::LeaseLost { id: id.clone() });
            }
            let mut stmt = c
                .prepare_cached(
                    "INSERT INTO journal (run_id, seq, n, at, inputs) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(io)?;
            for (seq, n, at, range) in &rows.rows {
                let text = rows.text.get(range.clone()).unwrap_or_default();
                stmt.execute(params![id, *seq as i64, *n as i64, *at as i64, text])
                    .map_err(io)?;
            }
            // A decision journaled (applied or dropped) leaves the queue with it: from now on
            // the journal itself refuses another one (DESIGN.md 3.6).
            for p in &rows.answered {
                c.prepare_cached("DELETE FROM ops WHERE run_id = ?1 AND presentation = ?2")
                    .and_then(|mut s| s.execute(params![id, *p as i64]))
                    .map_err(io)?;
            }
            Ok(Done::Unit)
        }
        Write::Finish(id, status, text) => {
            let n = c
                .execute(
                    "UPDATE runs SET result = ?2, status = ?3, updated_at = ?4, owner = NULL, lease_expires_at = NULL,
                     lease_host = NULL, lease_pid = NULL, lease_started = NULL, awaiting = 0, wake_at = NULL
                     WHERE id = ?1 AND (owner IS NULL OR owner = ?5)",
                    params![id, text, status, now, owner],
                )
                .map_err(io)?;
            if n == 0 {
                holder(c, id)?;
                return Err(StoreError::LeaseLost { id: id.clone() });
            }
            Ok(Done::Unit)
        }
        Write::Prune(before) => {
            let n = c
                .execute(
                    "DELETE FROM journal WHERE run_id IN (SELECT id FROM runs WHERE result IS NOT NULL AND updated_at < ?1)",
                    params![*before as i64],
                )
                .map_err(io)?;
            let _ = n;
            c.execute(
                "DELETE FROM ops WHERE run_id IN (SELECT id FROM runs WHERE result IS NOT NULL AND updated_at < ?1)",
                params![*before as i64],
            )
            .map_err(io)?;
            let runs = c
                .execute(
                    "DELETE FROM runs WHERE result IS NOT NULL AND updated_at < ?1",
                    params![*before as i64],
                )
                .map_err(io)?;
            Ok(Done::Count(runs))
        }
        Write::Note(id, note) => {
            c.prepare_cached(
                "UPDATE runs SET awaiting = ?3, wake_at = ?4 WHERE id = ?1 AND owner = ?2 AND result IS NULL",
            )
            .and_then(|mut s| s.execute(params![id, owner, note.awaiting as i64, note.wake_at.map(|w| w as i64)]))
            .map_err(io)?;
            Ok(Done::Unit)
        }
        Write::Park(id) => park::park(c, owner, id),
        Write::Compact(id, snapshot, entries) => compact::compact(c, id, snapshot, *entries),
        Write::Derived(id, note) => {
            c.execute(
                "UPDATE runs SET awaiting = ?2, wake_at = ?3 WHERE id = ?1 AND awaiting IS NULL",
                params![id, note.awaiting as i64, note.wake_at.map(|w| w as i64)],
            )
            .map_err(io)?;
            Ok(Done::Unit)
        }
        Write::PushOp(id, op, presentation, seen) => {
            let exists: Option<i64> = c
                .query_row("SELECT 1 FROM runs WHERE id = ?1", params![id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(io)?;
            if exists.is_none() {
                return Err(StoreError::UnknownRun { id: id.clone() });
            }
            // Checked and queued in one transaction: against the journal the check saw, and
            // against any decision already holding the presentation.
            let last = last_entry(c, id)?;
            if last != *seen {
                return Ok(Done::Queued(crate::store::Queued::Moved { now: last }));
            }
            if let Some(p) = presentation
                && let Some((_, winner)) = holding(c, id, *p)?
            {
                let winner = serde_json::from_str(&winner).map_err(io)?;
                return Ok(Done::Queued(crate::store::Queued::Decided { winner }));
            }
            c.execute(
                "INSERT INTO ops (run_id, op, presentation) VALUES (?1, ?2, ?3)",
                params![id, op, presentation.map(|p| p as i64)],
            )
            .map_err(io)?;
            Ok(Done::Queued(crate::store::Queued::Queued))
        }
        Write::ClaimOp(id, op, p, queued) => {
            match holding(c, id, *p)? {
                None => {
                    c.execute(
                        "INSERT INTO ops (run_id, op, presentation, taken_by) VALUES (?1, ?2, ?3, ?4)",
                        params![id, op, *p as i64, owner],
                    )
                    .map_err(io)?;
                }
                Some((row, held)) => {
                    // Only a queued decision holds its own presentation already: any other,
                    // the same decision included, came second.
                    let itself = *queued
                        && serde_json::from_str::<serde_json::Value>(&held).ok()
                            == serde_json::from_str::<serde_json::Value>(op).ok();
                    if !itself {
                        let winner = serde_json::from_str(&held).map_err(io)?;
                        return Ok(Done::Queued(crate::store::Queued::Decided { winner }));
                    }
                    c.execute(
                        "UPDATE ops SET taken_by = ?2 WHERE id = ?1",
                        params![row, owner],
                    )
                    .map_err(io)?;
                }
            }
            Ok(Done::Queued(crate::store::Queued::Queued))
        }
        Write::TakeOps(id) => {
            // Ops nobody took, and decisions an earlier owner took and never journaled (it
            // stopped first).
            let mut stmt = c
                .prepare_cached(
                    "SELECT op FROM ops WHERE run_id = ?1 AND (taken_by IS NULL OR taken_by != ?2)
                     ORDER BY id",
                )
                .map_err(io)?;
            let ops: Vec<String> = stmt
                .query_map(params![id, owner], |r| r.get(0))
                .map_err(io)?
                .collect::<Result<_, _>>()
                .map_err(io)?;
            if ops.is_empty() {
                return Ok(Done::Ops(ops));
            }
            // Only the lease holder takes a run's decisions: a process that lost the run must
            // not take (and lose) those meant for the one that drives it now.
            if holder(c, id)?.0.as_deref() != Some(owner) {
                return Err(StoreError::LeaseLost { id: id.clone() });
            }
            // A decision stays, held by this owner, until it is journaled (see `Append`);
            // other ops leave now.
            c.execute(
                "DELETE FROM ops WHERE run_id = ?1 AND presentation IS NULL",
                params![id],
            )
            .map_err(io)?;
            c.execute(
                "UPDATE ops SET taken_by = ?2 WHERE run_id = ?1",
                params![id, owner],
            )
            .map_err(io)?;
            Ok(Done::Ops(ops))
        }
    }
}
