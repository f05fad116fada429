//! Where runs outlive their process: each run's goal and options, its journal, the decisions
//! submitted while no process ran it, and its result (DESIGN.md 3.2).
//!
//! [`RunStore`] is the small trait the engine and front-ends use; [`SqliteStore`] (feature
//! `sqlite`) is the embedded default. A run is rebuilt by replaying its journal (see
//! `engine::resume`), so the journal is all the store must keep exactly; everything else is for
//! listing and showing runs.
//!
//! Who drives a stored run is a lease on its row (owner id and expiry; see [`RunStore`]): taken
//! in one atomic update, renewed while the run is driven, checked inside every append's
//! transaction, taken over by whoever comes next once it expired. The lease also records the
//! owner's process ([`OwnerProcess`]: host, pid, start time), so that a process on the same
//! host takes over at once from an owner that is gone; a process id alone decides nothing.
//!
//! Deliberately not here: deciding what a stored run means (the machine does, by replay) or
//! running it (the engine does).

mod owner;
mod query;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use owner::OwnerProcess;

pub use query::{
    Cursor, DEFAULT_LIMIT, INPUT_SUMMARY_CHARS, MAX_LIMIT, QueryError, RunPage, RunQuery,
    RunSummary, STATUSES, TITLE_CHARS, derive_status, input_summary, status_matches, title_of,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "sqlite")]
pub use sqlite::{SCHEMA_VERSION, SqliteStore, StoreStats, Watch};

use crate::engine::JournalSink;
use crate::machine::{JournalEntry, RunResult};
use crate::protocol::{Millis, Op};

/// A run's record, the one record of what a run is: its goal as loaded (placeholders by name,
/// delegate goals and MCP tools by content in `options.record`, versioned by
/// `options.record.version`), where relative paths resolve, and the options it was started
/// with. The store's run row holds it, and a Temporal workflow's input is it
/// (`temporal::RunSpec` carries this type, flattened); `runs::RunDef::from_record` reads it back. A record
/// written before `options.record` existed (dagloop 802893f) still loads: its delegate goals
/// are read from their files until a process that drives the run records them. Temporal inputs
/// written before the merge named the id `run_id` and had no `created_at`; they load too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run id (the workflow's id on Temporal).
    #[serde(alias = "run_id")]
    pub id: String,
    /// When it was created (milliseconds since the Unix epoch; 0 in a Temporal input written
    /// before the merge).
    #[serde(default)]
    pub created_at: Millis,
    /// The goal document.
    pub goal: Value,
    /// The goal file's folder (relative paths in the goal resolve against it).
    pub base_dir: String,
    /// The options it was started with (model, policy, shell), as the front-end wrote them.
    pub options: Value,
}

/// One line of `dagloop runs`.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// The run id.
    pub id: String,
    /// `running`, `stopped` (no process runs it; resume it) or the terminal status.
    pub status: String,
    /// Journal entries recorded.
    pub entries: u64,
    /// When it was created.
    #[cfg_attr(feature = "server", schema(value_type = u64))]
    pub created_at: Millis,
    /// When its journal last grew (or it finished).
    #[cfg_attr(feature = "server", schema(value_type = u64))]
    pub updated_at: Millis,
    /// Who drives it, while somebody holds an unexpired lease on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// What became of an op offered to a run's queue ([`RunStore::push_op`]) or of a driver's claim
/// on a presentation ([`crate::engine::JournalSink::claim_decision`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Queued {
    /// Queued (claimed).
    Queued,
    /// The run's journal no longer ends where the op was checked: it ends at entry `now`.
    Moved {
        /// The journal's last entry now.
        now: u64,
    },
    /// Another decision about the same presentation was recorded first.
    Decided {
        /// That decision's op.
        winner: Op,
    },
}

/// A claim on a run: the owner (one id per opened store, so per process) that drives it, until
/// `expires_at` unless renewed. See [`RunStore::claim`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The owner id: random hex, then the process id and host for people.
    pub owner: String,
    /// When the lease runs out (milliseconds since the Unix epoch) unless renewed.
    pub expires_at: Millis,
    /// The owner's process, when it recorded one (leases taken by an older dagloop did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<OwnerProcess>,
}

/// Everything stored about one run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    /// How it was started.
    pub record: RunRecord,
    /// Its journal, in order.
    pub journal: Vec<JournalEntry>,
    /// Its result, once finished.
    pub result: Option<RunResult>,
    /// The lease of whoever drives it now (None when nobody holds an unexpired one, or its
    /// holder ran on this host and is gone).
    pub lease: Option<Lease>,
}

/// A retention policy (the config's `[store]`, `runs prune --retain`): how long finished runs
/// are kept whole, and kept at all (milliseconds since their last
/// update); `None`: never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Finished runs not updated for this long are deleted.
    pub retain_ms: Option<u64>,
    /// Finished runs not updated for this long are compacted.
    pub compact_after_ms: Option<u64>,
}

impl Retention {
    /// Neither deletes nor compacts anything.
    pub fn is_empty(&self) -> bool {
        self.retain_ms.is_none() && self.compact_after_ms.is_none()
    }
}

/// What a compacted run keeps in place of its journal (see [`RunStore::compact`]): its record,
/// its result, and the snapshot the front-end wrote when it compacted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    /// How it was started.
    pub record: RunRecord,
    /// Its result (only finished runs are compacted).
    pub result: RunResult,
    /// The journal entries it had.
    pub entries: u64,
    /// What the front-end kept (`runs::compact`: the run's description, its audit and grants).
    pub snapshot: Value,
    /// Bytes of journal text dropped.
    pub journal_bytes: u64,
}

/// The store failed or holds something it cannot use. Nothing is overwritten on error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A command that only reads or continues runs was given a store file that does not exist
    /// (nothing is created at a mistyped path).
    #[error("no run store at {path}: the file does not exist (check --store / DAGLOOP_STORE)")]
    NotFound {
        /// The file.
        path: String,
    },
    /// The file cannot be opened or created.
    #[error("cannot open the run store {path}: {reason}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not a dagloop store (another program's database, or not SQLite at all).
    #[error("{path} is not a dagloop run store ({reason}); it was left untouched")]
    Foreign {
        /// The file.
        path: String,
        /// What was found.
        reason: String,
    },
    /// The file is damaged (truncated, corrupt).
    #[error("the run store {path} is damaged: {reason}; it was left untouched")]
    Corrupt {
        /// The file.
        path: String,
        /// What SQLite said.
        reason: String,
    },
    /// The store was written by a newer dagloop.
    #[error(
        "the run store {path} has schema version {found}, newer than this dagloop's {supported}; upgrade dagloop"
    )]
    TooNew {
        /// The file.
        path: String,
        /// Its version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// No run has this id.
    #[error("no run `{id}` in the store")]
    UnknownRun {
        /// The id given.
        id: String,
    },
    /// Another owner holds an unexpired lease on the run: it drives it.
    #[error(
        "run {id} is being run by {owner}, whose lease runs for another {remaining_s} s unless it is renewed; decide with `dagloop decide`, or resume it once that process has stopped (`dagloop resume` without --no-wait waits for it)"
    )]
    Busy {
        /// The run.
        id: String,
        /// Who holds the lease.
        owner: String,
        /// Until when (milliseconds since the Unix epoch), unless renewed.
        expires_at: Millis,
        /// How long that is from the refusal, in whole seconds (rounded up).
        remaining_s: u64,
    },
    /// This process no longer holds the run's lease (it expired and another owner took it, or
    /// it was released): it must not write to the run.
    #[error("the lease on run {id} was lost: another process drives it now, or nobody does")]
    LeaseLost {
        /// The run.
        id: String,
    },
    /// The store stayed locked by another connection past the busy timeout and the retries.
    #[error("the run store stayed locked by another process: {reason}")]
    Locked {
        /// What SQLite said.
        reason: String,
    },
    /// The run was compacted: its journal was dropped and only its result, decisions and a
    /// final snapshot kept; what needs the journal (replay, fork, a cassette, its events) is
    /// refused.
    #[error(
        "run {id} was compacted: its journal ({entries} entries: model turns, tool calls and results, events) was dropped, and only its result, decisions and final snapshot were kept; `show` and `show --audit` still work, but replay, fork, cassettes and event streams need the journal"
    )]
    Compacted {
        /// The run.
        id: String,
        /// The journal entries it had.
        entries: u64,
    },
    /// Only a finished run can be compacted.
    #[error("run {id} is not finished: only finished runs are compacted or pruned")]
    NotFinished {
        /// The run.
        id: String,
    },
    /// A run of the session is not finished: a follow-up starts only when the session's runs
    /// have all ended (runs of one session are serialised).
    #[error(
        "session {session} is busy: its run {running} has not finished (wait for it, or leave out --no-wait to wait)"
    )]
    SessionBusy {
        /// The session (the id of its first run).
        session: String,
        /// The unfinished run.
        running: String,
    },
    /// A run with this id exists already.
    #[error("a run `{id}` exists already")]
    Exists {
        /// The id.
        id: String,
    },
    /// Reading or writing failed.
    #[error("the run store failed: {reason}")]
    Io {
        /// What SQLite (or the writer) said.
        reason: String,
    },
}

crate::codes::has_code!(StoreError);

impl StoreError {
    /// A read or write that failed because the store's file system is full (SQLite's
    /// `SQLITE_FULL`, "database or disk is full"; the OS's `ENOSPC`).
    pub fn disk_full(&self) -> bool {
        matches!(self, StoreError::Io { reason }
            if reason.contains("disk is full") || reason.contains("No space left on device"))
    }

    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::NotFound { .. } => "store.not_found",
            StoreError::Open { .. } => "store.open",
            StoreError::Foreign { .. } => "store.foreign",
            StoreError::Corrupt { .. } => "store.corrupt",
            StoreError::TooNew { .. } => "store.too_new",
            StoreError::UnknownRun { .. } => "store.unknown_run",
            StoreError::Exists { .. } => "store.exists",
            StoreError::Busy { .. } => "store.busy",
            StoreError::LeaseLost { .. } => "store.lease_lost",
            StoreError::Locked { .. } => "store.locked",
            StoreError::Io { .. } => "store.io",
            StoreError::Compacted { .. } => "store.compacted",
            StoreError::NotFinished { .. } => "store.not_finished",
            StoreError::SessionBusy { .. } => "session.busy",
        }
    }
}

/// A durable home for runs. Appending the journal goes through [`JournalSink`] (awaited before
/// the run acts on the entries); the rest is synchronous and cheap.
///
/// Ownership is a lease held by the store handle's owner id ([`RunStore::owner`]): `create`
/// and `claim` take it, the journal sink renews it while the run is driven and checks it in the
/// transaction of every append, `finish` and `release` give it up. A lease that was not renewed
/// in time is taken by whoever claims the run next.
pub trait RunStore: JournalSink {
    /// The id this store handle writes as (one per opened store).
    fn owner(&self) -> &str;
    /// Records a new run (before its first journal entry), leased to this owner.
    fn create(&self, record: &RunRecord) -> Result<(), StoreError>;
    /// Takes the run's lease for this owner, in one atomic update: it succeeds when nobody
    /// holds it, it expired, this owner holds it already, or its owner ran on this host and is
    /// gone (see [`OwnerProcess`]); otherwise `store.busy`.
    fn claim(&self, id: &str) -> Result<(), StoreError>;
    /// Gives the lease up (when this owner holds it): the run stays as it is, for the next
    /// process to continue.
    fn release(&self, id: &str) -> Result<(), StoreError>;
    /// Gives the lease up on a run that waits only for decisions and deadlines and marks it
    /// parked: nobody need drive it until a decision is recorded or its earliest deadline
    /// (what the driver noted) passes; a server's watcher wakes it then.
    fn park(&self, id: &str) -> Result<(), StoreError>;
    /// Records the result and gives the lease up; the run is finished. Refused with
    /// `store.lease_lost` when another owner holds the lease.
    fn finish(&self, id: &str, result: &RunResult) -> Result<(), StoreError>;
    /// Every run, newest first.
    fn list(&self) -> Result<Vec<RunRow>, StoreError>;
    /// One run, journal included (`store.compacted` for a compacted run).
    fn load(&self, id: &str) -> Result<StoredRun, StoreError>;
    /// Forgets finished runs last updated before `before`; returns how many. Runs that are not
    /// finished (running, waiting, stopped) are never touched.
    fn prune(&self, before: Millis) -> Result<usize, StoreError>;
    /// Finished runs last updated before `before` that are not compacted yet, oldest first.
    fn finished_before(&self, before: Millis) -> Result<Vec<String>, StoreError>;
    /// Compacts a finished run: drops its journal and queued ops and keeps `snapshot` (what the
    /// front-end derived from it) beside its record and result, in one transaction. `entries`
    /// is the journal length the snapshot was made from (a run whose journal changed since is
    /// refused). Returns the bytes of journal text dropped (0 if it was compacted already).
    /// From then on [`RunStore::load`] answers `store.compacted`; [`RunStore::compacted`] reads
    /// what was kept.
    fn compact(&self, id: &str, snapshot: &Value, entries: u64) -> Result<u64, StoreError>;
    /// What a compacted run kept (None: the run is not compacted).
    fn compacted(&self, id: &str) -> Result<Option<Compacted>, StoreError>;
    /// Queues an op for the run (a decision taken while no process runs it, or for the process
    /// that does to pick up), in one transaction with two checks: the run's journal still ends
    /// at entry `seen` (the one the op was checked against; otherwise [`Queued::Moved`]), and no
    /// other decision holds the presentation a decision names ([`Queued::Decided`]): of
    /// concurrent decisions about one presentation, whichever process records them, one is
    /// queued. The presentation is held until the decision is journaled (or dropped).
    fn push_op(&self, id: &str, op: &Op, seen: u64) -> Result<Queued, StoreError>;
    /// Records a run's options anew (`resume --accept-changes` records the new definition).
    fn set_options(&self, id: &str, options: &serde_json::Value) -> Result<(), StoreError>;
    /// Takes the queued ops of a run, oldest first: only the owner that holds its lease
    /// (`store.lease_lost` for another, so that a process that lost the run never takes the
    /// decisions meant for the one that drives it). A decision stays queued, held by this
    /// owner, until the driver journals it (applied or dropped); one that an owner took and
    /// never journaled (it died) is taken again by the next.
    fn take_ops(&self, id: &str) -> Result<Vec<Op>, StoreError>;
    /// The ops queued for a run, oldest first, without taking them (what a resume will apply
    /// first). A store that cannot say lists none.
    fn queued_ops(&self, _id: &str) -> Result<Vec<Op>, StoreError> {
        Ok(Vec::new())
    }
    /// The store's size and contents (`dagloop runs --stats`), as JSON.
    fn stats(&self) -> Result<serde_json::Value, StoreError>;
    /// One page of runs from their rows (no journal is read): waiting first, then newest.
    fn query(&self, q: &RunQuery) -> Result<RunPage, StoreError>;
    /// Unfinished runs whose row does not say how many calls await a decision (rows an older
    /// dagloop wrote): a front-end derives it once by replay and records it with
    /// [`RunStore::set_derived`].
    fn underived(&self) -> Result<Vec<String>, StoreError>;
    /// Records what was derived for such a run (a row that says already is left alone).
    fn set_derived(&self, id: &str, note: crate::engine::RunNote) -> Result<(), StoreError>;
}

/// A fresh owner id: 128 random bits as hex (what makes it unique), then the process id and
/// host, for people reading `dagloop runs`. Nothing is decided from the process id.
pub fn new_owner_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hex = String::with_capacity(32);
    for i in 0..2u8 {
        // Each RandomState is seeded from the operating system's randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hex.push_str(&format!("{:016x}", h.finish()));
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".into());
    format!("{hex} (pid {} on {host})", std::process::id())
}

/// `store.not_found` when no file is at `path`: commands that only read or continue runs check
/// this first, so that a mistyped path never becomes a new, empty store.
pub fn must_exist(path: &std::path::Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::NotFound {
            path: path.display().to_string(),
        }),
        _ => Ok(()),
    }
}

/// The default store file: `dagloop/runs.db` under the user's data directory (or `DAGLOOP_STORE`).
pub fn default_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("DAGLOOP_STORE") {
        return Some(p.into());
    }
    #[cfg(feature = "sqlite")]
    {
        dirs::data_dir().map(|d| d.join("dagloop").join("runs.db"))
    }
    #[cfg(not(feature = "sqlite"))]
    {
        None
    }
}
