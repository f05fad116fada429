//! The run store a command opens: the default file, `--store`, `--no-store`, and refusing a
//! file that does not exist for commands that only read or continue runs.
//!
//! Deliberately not here: what a store holds or how (`crate::store`).

use super::*;

/// The run store a command uses, and where it lives (for messages).
#[derive(Clone)]
pub(super) struct Store {
    runs: Arc<dyn crate::store::RunStore>,
    path: std::path::PathBuf,
}

impl Store {
    /// The store's file.
    pub(super) fn path(&self) -> &FsPath {
        &self.path
    }

    /// The store, shared (a run's host, its journal's sink).
    pub(super) fn shared(&self) -> Arc<dyn crate::store::RunStore> {
        self.runs.clone()
    }
}

impl std::ops::Deref for Store {
    type Target = dyn crate::store::RunStore;
    fn deref(&self) -> &Self::Target {
        &*self.runs
    }
}

/// Opens the SQLite store at `path`.
#[cfg(feature = "sqlite")]
pub(super) fn open_at(path: &FsPath) -> Result<Store, CliError> {
    crate::store::SqliteStore::open(path)
        .map(|s| Store {
            runs: Arc::new(s),
            path: path.to_path_buf(),
        })
        .map_err(|e| CliError::new(e.code(), e))
}

/// Without the `sqlite` feature there is no store to open: a command given one says so.
#[cfg(not(feature = "sqlite"))]
pub(super) fn open_at(path: &FsPath) -> Result<Store, CliError> {
    Err(CliError::new(
        "cli.no_store",
        format!(
            "this dagloop was built without the `sqlite` feature, so it cannot open the run store {} (run with --no-store)",
            path.display()
        ),
    ))
}

/// The store the command uses: `--store`, else `DAGLOOP_STORE`, else the default file; none
/// with `--no-store`. With `existing`, a file that does not exist is `store.not_found`.
pub(super) fn open_store(
    path: Option<&FsPath>,
    none: bool,
    existing: bool,
) -> Result<Option<Store>, CliError> {
    if none {
        return Ok(None);
    }
    let Some(path) = path
        .map(FsPath::to_path_buf)
        .or_else(crate::store::default_path)
    else {
        return Ok(None);
    };
    if existing {
        crate::store::must_exist(&path).map_err(|e| CliError::new(e.code(), e))?;
    }
    open_at(&path).map(Some)
}

pub(super) fn required(s: Result<Option<Store>, CliError>) -> Result<Store, CliError> {
    s?.ok_or_else(|| {
        CliError::new(
            "cli.no_store",
            "this command needs the run store (drop --no-store, or give --store PATH)",
        )
    })
}

/// The full id of the run `given` names: itself when a run has that id, else the one run whose
/// id starts with it. Several runs starting with it are `cli.ambiguous_run` (with their ids);
/// none is left to the command, which says `store.unknown_run`.
pub(super) fn resolve_run(store: &Store, given: &str) -> Result<String, CliError> {
    if given.is_empty() {
        return Ok(String::new());
    }
    let page = store
        .query(&crate::store::RunQuery {
            text: Some(given.to_string()),
            limit: crate::store::MAX_LIMIT,
            ..Default::default()
        })
        .map_err(|e| CliError::new(e.code(), e))?;
    if page.runs.iter().any(|r| r.id == given) {
        return Ok(given.to_string());
    }
    let found: Vec<&str> = page
        .runs
        .iter()
        .map(|r| r.id.as_str())
        .filter(|id| id.starts_with(given))
        .collect();
    match found.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Ok(given.to_string()),
        many => Err(CliError::new(
            "cli.ambiguous_run",
            format!(
                "`{given}` is the start of {} run ids ({}); give more of the id",
                many.len(),
                many.join(", ")
            ),
        )),
    }
}
