//! The embedded run store: one SQLite file in WAL mode, one writer thread fed by a channel,
//! readers on their own connections.
//!
//! The writer takes every request waiting in its channel and commits them in one `BEGIN
//! IMMEDIATE` transaction, then answers each: nothing is acknowledged before it is committed.
//! Commits that carry a decision or a run's end are made with `synchronous=FULL`; journal-only
//! commits with `NORMAL` (durable across a process crash; WAL). A busy timeout keeps two
//! processes sharing one file from ever reporting `database is locked`. The WAL is copied into
//! the database file by a checkpoint thread with its own connection (PASSIVE, beside the
//! writer), never inside a commit somebody waits for.
//!
//! The journal is stored a batch to a row (schema version 2): consecutive entries consumed at
//! the same time share one row holding their inputs as JSON lines, serialised once by the caller
//! into one buffer. A row per entry (version 1) cost the writer about three times as much.
//! Older stores are upgraded in place by the migrations below (each version's DDL stays in the
//! code); version 1's journal rows become one-entry batches.
//!
//! Schema version 3 replaces the owner's process id with a lease (`owner`, `lease_expires_at`):
//! `claim` is one conditional `UPDATE` whose changed-row count says who won; every append
//! checks, in its own savepoint of the batch's transaction, that its process still holds the
//! lease (and pushes the expiry on). A commit that finds the file locked past the busy timeout
//! is tried again after a pause, then refused (`store.locked`).
//!
//! Schema version 6 records the lease holder's process beside the lease (`lease_host`: boot id
//! and PID namespace, `lease_pid`, `lease_started`: its start time): a `claim` that finds the
//! lease held by a process of this host that is gone takes it over at once, in the same
//! transaction (see `store::OwnerProcess`). Rows without them (an older dagloop's leases, and
//! processes that cannot tell their host) wait for the expiry as before.
//!
//! Deliberately not here: what the entries mean (the machine replays them).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tokio::sync::oneshot;

mod compact;
mod keys;
mod park;
mod query;
mod reserve;
mod stats;
mod writer;

pub use park::Watch;
pub use stats::StoreStats;
use writer::*;

use super::{RunRecord, RunRow, RunStore, StoreError, StoredRun};
use crate::engine::{JournalError, JournalFuture, JournalSink};
use crate::machine::{JournalEntry, RunInput, RunResult};
use crate::protocol::{Millis, Op};

/// The schema version this build writes; older stores are upgraded in place.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a connection waits for another one's write lock before SQLite reports busy
/// (`DAGLOOP_BUSY_TIMEOUT_MS` overrides it, for tests and operators).
const BUSY: Duration = Duration::from_secs(30);

/// A commit that found the store locked past the busy timeout is tried again after these
/// pauses, then refused with `store.locked`.
const BUSY_RETRIES: [Duration; 2] = [Duration::from_millis(250), Duration::from_millis(1000)];

/// How long a lease lasts unless renewed (`DAGLOOP_LEASE_MS` overrides it); the journal sink
/// asks to renew it every quarter of that.
pub const LEASE: Duration = Duration::from_secs(20);

/// The shortest lease `DAGLOOP_LEASE_MS` may set.
const MIN_LEASE: Duration = Duration::from_millis(100);

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

fn busy_timeout() -> Duration {
    env_ms("DAGLOOP_BUSY_TIMEOUT_MS").unwrap_or(BUSY)
}

/// Migrations, in order: `MIGRATIONS[i]` takes a store from version `i` to `i + 1`. Never edit
/// one that has shipped: stores written by it exist; add the next instead.
const MIGRATIONS: &[&str] = &[
    // 1: runs, a journal row per entry, queued ops.
    "
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        record TEXT NOT NULL,
        result TEXT,
        status TEXT NOT NULL,
        entries INTEGER NOT NULL DEFAULT 0,
        owner_pid INTEGER
    );
    CREATE TABLE journal (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at INTEGER NOT NULL,
        input TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE ops (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        op TEXT NOT NULL
    );
    CREATE INDEX runs_updated ON runs(updated_at);
",
    // 2: a journal row per batch of entries consumed together (`n` entries from `seq`, one
    // input per line); indexes for `dagloop runs` (newest first) and for a run's queued ops,
    // which the process running it polls.
    "
    CREATE TABLE journal2 (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        n INTEGER NOT NULL,
        at INTEGER NOT NULL,
        inputs TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    INSERT INTO journal2 (run_id, seq, n, at, inputs) SELECT run_id, seq, 1, at, input FROM journal;
    DROP TABLE journal;
    ALTER TABLE journal2 RENAME TO journal;
    CREATE INDEX runs_created ON runs(created_at, id);
    CREATE INDEX ops_run ON ops(run_id, id);
",
    // 3: ownership is a lease (owner id, expiry), never a process id; a run that an older
    // dagloop ended `journal_failed` (a write error, not an ending the run decided) is stopped
    // and can be resumed.
    "
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN lease_expires_at INTEGER;
    ALTER TABLE runs DROP COLUMN owner_pid;
    UPDATE runs SET result = NULL, status = 'stopped' WHERE status = 'journal_failed';
",
    // 4: what listing needs, on the run's row (see `query`): the title (the goal's first line,
    // cut), the submitter, the calls awaiting a decision (NULL: not known yet, for an
    // unfinished run an older dagloop wrote; a front-end derives it once by replay), the
    // earliest journaled deadline, and whether its process parked it (`park`: it waits for a
    // decision or a deadline, nobody drives it, a server's watcher wakes it); an index that
    // covers the list, and the indexes the watcher's poll reads.
    "
    ALTER TABLE runs ADD COLUMN title TEXT NOT NULL DEFAULT '';
    ALTER TABLE runs ADD COLUMN submitted_by TEXT;
    ALTER TABLE runs ADD COLUMN awaiting INTEGER;
    ALTER TABLE runs ADD COLUMN wake_at INTEGER;
    ALTER TABLE runs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
    UPDATE runs SET
        title = substr(trim(substr(ifnull(json_extract(record, '$.goal.goal'), ''), 1,
            instr(ifnull(json_extract(record, '$.goal.goal'), '') || char(10), char(10)) - 1)), 1, 200),
        submitted_by = json_extract(record, '$.options.submitted_by'),
        awaiting = CASE WHEN result IS NOT NULL THEN 0 END;
    CREATE INDEX runs_list ON runs(created_at DESC, id DESC, status, awaiting, owner,
        lease_expires_at, updated_at, entries, submitted_by, title);
    CREATE INDEX runs_wake ON runs(wake_at) WHERE wake_at IS NOT NULL;
    CREATE INDEX runs_active ON runs(parked) WHERE status IN ('running', 'stopped');
",
    // 5: compaction (see `compact`): a finished run's journal can be dropped for a snapshot of
    // what `show` and the audit print (`compacted`, JSON) and the journal bytes it dropped.
    "
    ALTER TABLE runs ADD COLUMN compacted TEXT;
    ALTER TABLE runs ADD COLUMN compacted_bytes INTEGER;
",
    // 6: the lease holder's process (host: boot id and PID namespace; pid; start time), so that
    // a process on the same host can tell the holder is gone and take the run over at once.
    // NULL (leases an older dagloop took, and runs nobody holds): only the expiry decides. The
    // index lets a server's watcher find the processes holding leases on this host.
    "
    ALTER TABLE runs ADD COLUMN lease_host TEXT;
    ALTER TABLE runs ADD COLUMN lease_pid INTEGER;
    ALTER TABLE runs ADD COLUMN lease_started INTEGER;
    CREATE INDEX runs_lease_host ON runs(lease_host, lease_pid, lease_started)
        WHERE lease_host IS NOT NULL;
",
    // 7: a queued decision names the presentation it answers (`presentation`, the seq of the
    // call's `approval_requested` event) and is held (`taken_by`, the owner that took it) until
    // its driver journals it; one decision per presentation (DESIGN.md 3.6).
    "
    ALTER TABLE ops ADD COLUMN presentation INTEGER;
    ALTER TABLE ops ADD COLUMN taken_by TEXT;
    CREATE UNIQUE INDEX ops_presentation ON ops(run_id, presentation)
        WHERE presentation IS NOT NULL;
",
    // 8: sessions (`runs::session`): a follow-up run names its session (the id of the session's
    // first run) on its row, so that starting one can check in its insert's transaction that no
    // run of the session is unfinished, and a session's runs are listed by an index.
    "
    ALTER TABLE runs ADD COLUMN session TEXT;
    UPDATE runs SET session = json_extract(record, '$.options.session.root');
    CREATE INDEX runs_session ON runs(session) WHERE session IS NOT NULL;
",
];

/// Journal entries as the writer stores them: a batch to a row (see the module docs).
struct Rows {
    /// `(first seq, how many, at, byte range in text)`.
    rows: Vec<(u64, u64, u64, std::ops::Range<usize>)>,
    /// Every row's inputs, one JSON text per line, rows one after the other.
    text: String,
    /// Some entry is a decision (committed with `synchronous=FULL`).
    decision: bool,
    /// The presentations answered by the entries (decisions journaled or dropped): their
    /// queued ops leave the queue in the same transaction.
    answered: Vec<u64>,
}

impl Rows {
    /// Serialises `entries` once: consecutive entries with the same `at` share a row.
    fn of(entries: &[JournalEntry]) -> Result<Rows, serde_json::Error> {
        let mut buf: Vec<u8> = Vec::with_capacity(entries.len() * 128);
        let mut rows: Vec<(u64, u64, u64, std::ops::Range<usize>)> = Vec::new();
        let mut decision = false;
        let mut answered = Vec::new();
        for e in entries {
            decision |= matches!(e.input, RunInput::Decided { .. });
            if let RunInput::Decided {
                presentation: Some(p),
                ..
            }
            | RunInput::Dropped {
                presentation: Some(p),
                ..
            } = &e.input
            {
                answered.push(*p);
            }
            match rows.last_mut() {
                Some((seq, n, at, range)) if *at == e.at && *seq + *n == e.seq => {
                    buf.push(b'\n');
                    serde_json::to_writer(&mut buf, &e.input)?;
                    *n += 1;
                    range.end = buf.len();
                }
                _ => {
                    let start = buf.len();
                    serde_json::to_writer(&mut buf, &e.input)?;
                    rows.push((e.seq, 1, e.at, start..buf.len()));
                }
            }
        }
        // serde_json writes UTF-8 only.
        let text =
            String::from_utf8(buf).map_err(<serde_json::Error as serde::ser::Error>::custom)?;
        Ok(Rows {
            rows,
            text,
            decision,
            answered,
        })
    }

    fn len(&self) -> u64 {
        self.rows.iter().map(|r| r.1).sum()
    }
}

/// Who the writer writes as: the store handle's owner id and lease length, and its process
/// (recorded with every lease it takes).
struct Me {
    owner: std::sync::Arc<str>,
    lease_ms: i64,
    process: Option<&'static super::OwnerProcess>,
}

enum Write {
    Create(RunRecord),
    Claim(String),
    /// Pushes the lease's expiry on (this owner only).
    Renew(String),
    Release(String),
    /// Entries already serialised by the caller.
    Append(String, Rows),
    /// The run, its status and its result, serialised by the caller.
    Finish(String, &'static str, String),
    Prune(Millis),
    /// An op (JSON) for run, the presentation it decides, the journal's last entry its check
    /// saw.
    PushOp(String, String, Option<u64>, u64),
    /// A driver holds a presentation for a decision (JSON) it is about to journal; whether
    /// the decision was taken from the queue (then it may hold it already).
    ClaimOp(String, String, u64, bool),
    TakeOps(String),
    /// The run's options (JSON), recorded anew (a definition accepted on resume).
    SetOptions(String, String),
    /// What the driver noted (this owner's runs only).
    Note(String, crate::engine::RunNote),
    /// Gives the lease up on a run that waits only for decisions and deadlines.
    Park(String),
    /// What a front-end derived by replay for a run whose row does not say (rows of an older
    /// dagloop only).
    Derived(String, crate::engine::RunNote),
    /// Drops a finished run's journal for a snapshot (JSON) made from `entries` entries.
    Compact(String, String, u64),
}

enum Done {
    Unit,
    Count(usize),
    Bytes(u64),
    Ops(Vec<String>),
    Queued(super::Queued),
}

/// Where the writer sends one request's outcome (a tokio oneshot for the async journal path, a
/// std channel for the synchronous calls, which may come from inside a runtime).
type Reply = Box<dyn FnOnce(Result<Done, StoreError>) + Send>;

/// A run store in one SQLite file. See the module docs.
pub struct SqliteStore {
    path: PathBuf,
    /// The owner id this handle writes as (see `RunStore::owner`).
    owner: std::sync::Arc<str>,
    lease: Duration,
    /// The writer's queue (None once closed).
    tx: Mutex<Option<mpsc::Sender<(Write, Reply)>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("owner", &self.owner)
            .finish()
    }
}

fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    let p = path.display().to_string();
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::Foreign {
            path: p,
            reason: "not an SQLite database".into(),
        },
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: p,
            reason: e.to_string(),
        },
        _ => StoreError::Io {
            reason: e.to_string(),
        },
    }
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        reason: e.to_string(),
    }
}

fn connect(path: &Path, flags: OpenFlags) -> Result<Connection, StoreError> {
    let c = Connection::open_with_flags(path, flags).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    c.busy_timeout(busy_timeout()).map_err(io)?;
    register_functions(&c)?;
    Ok(c)
}

/// The functions the store's SQL calls: `dagloop_owner_gone(lease_host, lease_pid,
/// lease_started)` is 1 when the lease's process ran on this host and is gone (a NULL column,
/// another host or anything uncertain is 0: only the lease's expiry decides then).
fn register_functions(c: &Connection) -> Result<(), StoreError> {
    use rusqlite::functions::FunctionFlags;
    c.create_scalar_function("dagloop_owner_gone", 3, FunctionFlags::SQLITE_UTF8, |ctx| {
        let process = owner_process(ctx.get(0)?, ctx.get(1)?, ctx.get(2)?);
        Ok(process.is_some_and(|p| p.is_gone()))
    })
    .map_err(io)
}

/// Checks the file is ours (or empty), at a version we know; upgrades an older one. Runs in
/// one `BEGIN IMMEDIATE` transaction, so processes opening a new store at once migrate it once.
/// The outer error is SQLite's own (see [`first_open`], which retries a busy one); the inner
/// one is the file's verdict.
fn migrate(c: &mut Connection, path: &Path) -> rusqlite::Result<Result<(), StoreError>> {
    let check: String = c.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        return Ok(Err(StoreError::Corrupt {
            path: path.display().to_string(),
            reason: check,
        }));
    }
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let tables: i64 = tx.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
        [],
        |r| r.get(0),
    )?;
    if version == 0 && tables > 0 {
        return Ok(Err(StoreError::Foreign {
            path: path.display().to_string(),
            reason: format!("an SQLite database with {tables} tables of another program"),
        }));
    }
    if version > SCHEMA_VERSION {
        return Ok(Err(StoreError::TooNew {
            path: path.display().to_string(),
            found: version,
            supported: SCHEMA_VERSION,
        }));
    }
    let from = usize::try_from(version).unwrap_or(0);
    for (v, sql) in MIGRATIONS.iter().enumerate().skip(from) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (v + 1) as i64)?;
    }
    tx.commit().map(Ok)
}

/// The first statements on a store's file: [`migrate`], then the switch to WAL. Several
/// processes creating one new store at once meet exactly here, and SQLite's busy handler does
/// not cover every path of these (the journal-mode change, which needs the file to itself, and
/// a schema read racing another connection's migration report busy at once). So a busy or
/// locked file is tried again, after pauses growing to 100 ms, until the busy timeout has
/// passed; what the file then still says is the answer. Each try is whole: a failed migration's
/// transaction rolled back.
fn first_open(c: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + busy_timeout();
    let mut pause = Duration::from_millis(2);
    loop {
        let tried = migrate(c, path).and_then(|verdict| {
            if verdict.is_ok() {
                c.pragma_update(None, "journal_mode", "WAL")?;
            }
            Ok(verdict)
        });
        match tried {
            Ok(verdict) => return verdict,
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(classify(path, e)),
        }
    }
}

impl SqliteStore {
    /// Opens (creating it and its folder if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, CHECKPOINT_PAGES)
    }

    /// Opens the store at `path`, which must exist: for commands that only read or continue
    /// runs, so that a mistyped path is `store.not_found` rather than a new, empty store.
    pub fn open_existing(path: &Path) -> Result<SqliteStore, StoreError> {
        super::must_exist(path)?;
        SqliteStore::open(path)
    }

    fn open_with(path: &Path, checkpoint_at: i32) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        let mut c = connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )?;
        first_open(&mut c, path)?;
        c.pragma_update(None, "synchronous", "NORMAL").map_err(io)?;
        // Checkpoints run on a connection and a thread of their own, beside the writer: a
        // PASSIVE checkpoint lets the writer go on committing meanwhile.
        let cc = connect(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        // A checkpoint that resets the WAL leaves the file at most this long (SQLite truncates
        // it after the reset).
        c.pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)
            .map_err(io)?;
        let (ctx, crx) = mpsc::sync_channel::<Checkpoint>(1);
        let checkpointer = std::thread::Builder::new()
            .name("dagloop-store-checkpoint".into())
            .spawn(move || {
                while let Ok(mode) = crx.recv() {
                    let sql = match mode {
                        Checkpoint::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
                        Checkpoint::Truncate => "PRAGMA wal_checkpoint(TRUNCATE)",
                    };
                    let _ = cc.query_row(sql, [], |_| Ok(()));
                    if matches!(mode, Checkpoint::Truncate) {
                        crate::idle::release(); // the store went idle
                    }
                }
            })
            .map_err(io)?;
        let (tx, rx) = mpsc::channel::<(Write, Reply)>();
        let p = path.to_path_buf();
        let owner: std::sync::Arc<str> = super::new_owner_id().into();
        let lease = env_ms("DAGLOOP_LEASE_MS").map_or(LEASE, |l| l.max(MIN_LEASE));
        let me = Me {
            owner: owner.clone(),
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            process: super::OwnerProcess::current(),
        };
        let writer = std::thread::Builder::new()
            .name("dagloop-store".into())
            .spawn(move || {
                writer(c, rx, &p, &me, checkpoint_at, ctx);
                let _ = checkpointer.join();
            })
            .map_err(io)?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            owner,
            lease,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Creates a store at `path` at schema `version` (the first `version` migrations only), as a
    /// dagloop of that version would have left it, for tests of upgrades. Stores are otherwise
    /// only ever opened with [`SqliteStore::open`], which upgrades them.
    #[doc(hidden)]
    pub fn create_at_version(path: &Path, version: i64) -> Result<(), StoreError> {
        let known = usize::try_from(version)
            .ok()
            .filter(|v| (1..=MIGRATIONS.len()).contains(v))
            .ok_or_else(|| io(format!("no schema version {version}")))?;
        let mut c = connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )?;
        let tx = c.transaction().map_err(io)?;
        for sql in &MIGRATIONS[..known] {
            tx.execute_batch(sql).map_err(io)?;
        }
        tx.pragma_update(None, "user_version", version)
            .map_err(io)?;
        tx.commit().map_err(io)?;
        c.pragma_update(None, "journal_mode", "WAL").map_err(io)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long this handle's leases last unless renewed.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Stops the writer once it has answered everything queued, and waits for it and for any
    /// checkpoint under way. Later requests fail with `store.io`.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    fn send(&self, w: Write, reply: Reply) {
        let sent = match self.tx.lock() {
            Ok(tx) => match tx.as_ref() {
                Some(tx) => tx.send((w, reply)).map_err(|e| e.0.1),
                None => Err(reply),
            },
            Err(_) => Err(reply),
        };
        if let Err(reply) = sent {
            reply(Err(io("the store is closed")));
        }
    }

    fn call(&self, w: Write) -> Result<Done, StoreError> {
        let (tx, rx) = mpsc::channel();
        self.send(
            w,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(io("the store's writer stopped")))
    }

    fn reader(&self) -> Result<Connection, StoreError> {
        connect(&self.path, OpenFlags::SQLITE_OPEN_READ_ONLY)
    }
}

/// A store's failure as the journal's: a lost lease says so (the run stops and another owner
/// drives it); anything else is a write that failed.
fn journal_error(e: StoreError) -> JournalError {
    let code = match e {
        StoreError::LeaseLost { .. } => JournalError::LEASE_LOST,
        _ => JournalError::WRITE,
    };
    JournalError::new(code, e.to_string())
}

impl SqliteStore {
    /// Sends `w` to the writer; the future resolves with its answer.
    fn ask(&self, w: Write) -> JournalFuture<'static> {
        let (tx, rx) = oneshot::channel();
        self.send(
            w,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        Box::pin(async move {
            match rx.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(journal_error(e)),
                Err(_) => Err(JournalError::new(
                    JournalError::WRITE,
                    "the store's writer stopped",
                )),
            }
        })
    }
}

impl JournalSink for SqliteStore {
    fn append<'a>(&'a self, run_id: &'a str, entries: &'a [JournalEntry]) -> JournalFuture<'a> {
        // Serialised here, on the caller's thread, into one buffer: no deep copy of the entries,
        // and the writer thread only writes.
        match Rows::of(entries) {
            Ok(rows) => self.ask(Write::Append(run_id.to_string(), rows)),
            Err(e) => {
                let e = JournalError::new(JournalError::WRITE, e.to_string());
                Box::pin(async move { Err(e) })
            }
        }
    }

    fn lease_every(&self) -> Option<Duration> {
        Some(self.lease / 4)
    }

    fn renew_lease<'a>(&'a self, run_id: &'a str) -> JournalFuture<'a> {
        self.ask(Write::Renew(run_id.to_string()))
    }

    fn note(&self, run_id: &str, note: crate::engine::RunNote) {
        self.send(Write::Note(run_id.to_string(), note), Box::new(|_| {}));
    }

    fn claim_decision<'a>(
        &'a self,
        run_id: &'a str,
        presentation: u64,
        op: &'a Op,
        queued: bool,
    ) -> crate::engine::ClaimFuture<'a> {
        let text = match serde_json::to_string(op) {
            Ok(t) => t,
            Err(e) => {
                let e = JournalError::new(JournalError::WRITE, e.to_string());
                return Box::pin(async move { Err(e) });
            }
        };
        let (tx, rx) = oneshot::channel();
        self.send(
            Write::ClaimOp(run_id.to_string(), text, presentation, queued),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        Box::pin(async move {
            match rx.await {
                Ok(Ok(Done::Queued(super::Queued::Decided { winner }))) => Ok(Some(winner)),
                Ok(Ok(_)) => Ok(None),
                Ok(Err(e)) => Err(journal_error(e)),
                Err(_) => Err(JournalError::new(
                    JournalError::WRITE,
                    "the store's writer stopped",
                )),
            }
        })
    }
}

/// The lease a `runs` row holds, when it has not expired at `now`.
fn live_lease(owner: Option<String>, expires: Option<i64>, now: Millis) -> Option<super::Lease> {
    let expires_at = u64::try_from(expires?).ok()?;
    (expires_at >= now).then_some(super::Lease {
        owner: owner?,
        expires_at,
        process: None,
    })
}

/// The process a row's lease columns name (`lease_host`, `lease_pid`, `lease_started`), when
/// they name one.
fn owner_process(
    host: Option<String>,
    pid: Option<i64>,
    started: Option<i64>,
) -> Option<super::OwnerProcess> {
    Some(super::OwnerProcess {
        host: host?,
        pid: u32::try_from(pid?).ok()?,
        started: u64::try_from(started?).ok()?,
    })
}

impl RunStore for SqliteStore {
    fn stats(&self) -> Result<serde_json::Value, StoreError> {
        SqliteStore::stats(self).and_then(|s| serde_json::to_value(s).map_err(io))
    }

    fn park(&self, id: &str) -> Result<(), StoreError> {
        self.call(Write::Park(id.to_string())).map(|_| ())
    }

    fn query(&self, q: &super::RunQuery) -> Result<super::RunPage, StoreError> {
        self.query_page(q)
    }

    fn underived(&self) -> Result<Vec<String>, StoreError> {
        self.underived_ids()
    }

    fn set_derived(&self, id: &str, note: crate::engine::RunNote) -> Result<(), StoreError> {
        self.record_derived(id, note)
    }

    fn set_options(&self, id: &str, options: &serde_json::Value) -> Result<(), StoreError> {
        self.call(Write::SetOptions(id.into(), options.to_string()))
            .map(|_| ())
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    fn create(&self, record: &RunRecord) -> Result<(), StoreError> {
        self.call(Write::Create(record.clone())).map(|_| ())
    }

    fn claim(&self, id: &str) -> Result<(), StoreError> {
        self.call(Write::Claim(id.into())).map(|_| ())
    }

    fn release(&self, id: &str) -> Result<(), StoreError> {
        self.call(Write::Release(id.into())).map(|_| ())
    }

    fn finish(&self, id: &str, result: &RunResult) -> Result<(), StoreError> {
        // Serialised here: no deep copy of the result for the writer.
        let text = serde_json::to_string(result).map_err(io)?;
        self.call(Write::Finish(id.into(), result.status.as_str(), text))
            .map(|_| ())
    }

    fn list(&self) -> Result<Vec<RunRow>, StoreError> {
        let c = self.reader()?;
        let now = now_ms();
        let mut stmt = c
            .prepare(
                "SELECT id, status, entries, created_at, updated_at, owner, lease_expires_at, result IS NOT NULL,
                        lease_host, lease_pid, lease_started
                 FROM runs ORDER BY created_at DESC, id DESC",
            )
            .map_err(io)?;
        let rows = stmt
            .query_map([], |r| {
                let finished: bool = r.get(7)?;
                let mut status: String = r.get(1)?;
                let gone =
                    owner_process(r.get(8)?, r.get(9)?, r.get(10)?).is_some_and(|p| p.is_gone());
                let owner = live_lease(r.get(5)?, r.get(6)?, now)
                    .filter(|_| !gone)
                    .map(|l| l.owner);
                if !finished {
                    status = if owner.is_some() {
                        "running"
                    } else {
                        "stopped"
                    }
                    .into();
                }
                Ok(RunRow {
                    id: r.get(0)?,
                    status,
                    entries: r.get::<_, i64>(2)? as u64,
                    created_at: r.get::<_, i64>(3)? as u64,
                    updated_at: r.get::<_, i64>(4)? as u64,
                    owner,
                })
            })
            .map_err(io)?;
        rows.collect::<Result<_, _>>().map_err(io)
    }

    fn load(&self, id: &str) -> Result<StoredRun, StoreError> {
        let c = self.reader()?;
        type Row = (
            String,
            Option<String>,
            Option<String>,
            Option<i64>,
            bool,
            i64,
            Option<super::OwnerProcess>,
        );
        let row: Option<Row> = c
            .query_row(
                "SELECT record, result, owner, lease_expires_at, compacted IS NOT NULL, entries,
                 lease_host, lease_pid, lease_started
                 FROM runs WHERE id = ?1",
                params![id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        owner_process(r.get(6)?, r.get(7)?, r.get(8)?),
                    ))
                },
            )
            .optional()
            .map_err(io)?;
        let Some((record, result, owner, expires, compacted, entries, process)) = row else {
            return Err(StoreError::UnknownRun { id: id.into() });
        };
        if compacted {
            return Err(StoreError::Compacted {
                id: id.into(),
                entries: entries.max(0) as u64,
            });
        }
        let record: RunRecord = serde_json::from_str(&record).map_err(io)?;
        let result: Option<RunResult> = result
            .map(|r| serde_json::from_str(&r))
            .transpose()
            .map_err(io)?;
        let mut stmt = c
            .prepare("SELECT seq, n, at, inputs FROM journal WHERE run_id = ?1 ORDER BY seq")
            .map_err(io)?;
        let mut rows = stmt.query(params![id]).map_err(io)?;
        let mut journal = Vec::new();
        while let Some(r) = rows.next().map_err(io)? {
            let seq = r.get::<_, i64>(0).map_err(io)?;
            let n = r.get::<_, i64>(1).map_err(io)?;
            let at = r.get::<_, i64>(2).map_err(io)?;
            let text = r.get_ref(3).map_err(io)?.as_str().map_err(io)?;
            let before = journal.len();
            for (i, line) in text.split('\n').enumerate() {
                let input: RunInput = serde_json::from_str(line).map_err(io)?;
                journal.push(JournalEntry {
                    seq: (seq + i as i64) as u64,
                    at: at as u64,
                    input,
                });
            }
            if (journal.len() - before) as i64 != n {
                return Err(StoreError::Corrupt {
                    path: self.path.display().to_string(),
                    reason: format!(
                        "the journal row of {id} at {seq} holds a wrong number of entries"
                    ),
                });
            }
        }
        drop(rows);
        Ok(StoredRun {
            record,
            journal,
            result,
            // A lease whose process on this host is gone drives nothing (the next claim takes
            // it over at once).
            lease: live_lease(owner, expires, now_ms())
                .map(|l| super::Lease { process, ..l })
                .filter(|l| !l.process.as_ref().is_some_and(super::OwnerProcess::is_gone)),
        })
    }

    fn prune(&self, before: Millis) -> Result<usize, StoreError> {
        match self.call(Write::Prune(before))? {
            Done::Count(n) => Ok(n),
            _ => Ok(0),
        }
    }

    fn finished_before(&self, before: Millis) -> Result<Vec<String>, StoreError> {
        self.finished_ids(before)
    }

    fn compact(
        &self,
        id: &str,
        snapshot: &serde_json::Value,
        entries: u64,
    ) -> Result<u64, StoreError> {
        let text = serde_json::to_string(snapshot).map_err(io)?;
        match self.call(Write::Compact(id.into(), text, entries))? {
            Done::Bytes(n) => Ok(n),
            _ => Ok(0),
        }
    }

    fn compacted(&self, id: &str) -> Result<Option<super::Compacted>, StoreError> {
        self.compacted_run(id)
    }

    fn push_op(&self, id: &str, op: &Op, seen: u64) -> Result<super::Queued, StoreError> {
        let text = serde_json::to_string(op).map_err(io)?;
        let presentation = match op {
            Op::Decide { presentation, .. } => *presentation,
            _ => None,
        };
        match self.call(Write::PushOp(id.into(), text, presentation, seen))? {
            Done::Queued(q) => Ok(q),
            _ => Ok(super::Queued::Queued),
        }
    }

    fn queued_ops(&self, id: &str) -> Result<Vec<Op>, StoreError> {
        let c = self.reader()?;
        let mut stmt = c
            .prepare("SELECT op FROM ops WHERE run_id = ?1 ORDER BY id")
            .map_err(io)?;
        let ops: Vec<String> = stmt
            .query_map(rusqlite::params![id], |r| r.get(0))
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)?;
        ops.iter()
            .map(|o| serde_json::from_str(o).map_err(io))
            .collect()
    }

    fn take_ops(&self, id: &str) -> Result<Vec<Op>, StoreError> {
        match self.call(Write::TakeOps(id.into()))? {
            Done::Ops(ops) => ops
                .iter()
                .map(|o| serde_json::from_str(o).map_err(io))
                .collect(),
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests;
