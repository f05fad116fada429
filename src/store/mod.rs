//! Where runs outlive their process: each run's goal and options, its journal, the decisions
//! submitted while no process ran it, and its result (DESIGN.md 3.2).
//!
//! [`RunStore`] is the small trait the engine and front-ends use; [`SqliteStore`] (feature
//! `sqlite`) is the embedded default. A run is rebuilt by replaying its journal (see
//! `engine::resume`), so the journal is all the store must keep exactly; everything else is for
//! listing and showing runs.
//!
//! Deliberately not here: deciding what a stored run means (the machine does, by replay) or
//! running it (the engine does).

#[cfg(feature = "sqlite")]
mod sqlite;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "sqlite")]
pub use sqlite::{SCHEMA_VERSION, SqliteStore};

use crate::engine::JournalSink;
use crate::machine::{JournalEntry, RunResult};
use crate::protocol::{Millis, Op};

/// What a stored run needs to be rebuilt: its goal as loaded, where relative paths resolve, and
/// the options the run was started with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run id.
    pub id: String,
    /// When it was created (milliseconds since the Unix epoch).
    pub created_at: Millis,
    /// The goal document.
    pub goal: Value,
    /// The goal file's folder (relative paths in the goal resolve against it).
    pub base_dir: String,
    /// The options it was started with (model, policy, shell), as the front-end wrote them.
    pub options: Value,
}

/// One line of `dagloop runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// The run id.
    pub id: String,
    /// `running`, `stopped` (no process runs it; resume it) or the terminal status.
    pub status: String,
    /// Journal entries recorded.
    pub entries: u64,
    /// When it was created.
    pub created_at: Millis,
    /// When its journal last grew (or it finished).
    pub updated_at: Millis,
    /// The process that runs it, while one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_pid: Option<u32>,
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
    /// The process that runs it, while one does.
    pub owner_pid: Option<u32>,
}

/// The store failed or holds something it cannot use. Nothing is overwritten on error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
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

impl StoreError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Open { .. } => "store.open",
            StoreError::Foreign { .. } => "store.foreign",
            StoreError::Corrupt { .. } => "store.corrupt",
            StoreError::TooNew { .. } => "store.too_new",
            StoreError::UnknownRun { .. } => "store.unknown_run",
            StoreError::Exists { .. } => "store.exists",
            StoreError::Io { .. } => "store.io",
        }
    }
}

/// A durable home for runs. Appending the journal goes through [`JournalSink`] (awaited before
/// the run acts on the entries); the rest is synchronous and cheap.
pub trait RunStore: JournalSink {
    /// Records a new run (before its first journal entry).
    fn create(&self, record: &RunRecord, owner_pid: u32) -> Result<(), StoreError>;
    /// Marks a stored run as run by this process again (resume).
    fn claim(&self, id: &str, owner_pid: u32) -> Result<(), StoreError>;
    /// Records the result; the run is finished.
    fn finish(&self, id: &str, result: &RunResult) -> Result<(), StoreError>;
    /// Every run, newest first.
    fn list(&self) -> Result<Vec<RunRow>, StoreError>;
    /// One run, journal included.
    fn load(&self, id: &str) -> Result<StoredRun, StoreError>;
    /// Forgets finished runs last updated before `before`; returns how many.
    fn prune(&self, before: Millis) -> Result<usize, StoreError>;
    /// Queues an op for the run (a decision taken while no process runs it, or for the process
    /// that does to pick up).
    fn push_op(&self, id: &str, op: &Op) -> Result<(), StoreError>;
    /// Takes the queued ops of a run, oldest first.
    fn take_ops(&self, id: &str) -> Result<Vec<Op>, StoreError>;
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
