//! Reading stored runs from Python without running them: `replay` puts a stored run's journal
//! through fresh machines (`runs::replay_run`, as `dagloop replay` does).
//!
//! Deliberately not here: continuing or forking a run (`start`), or any rule of the replay.

use std::path::PathBuf;

use dagloop::store::{RunStore, SqliteStore};
use pyo3::prelude::*;

use super::start::to_json;
use super::{Failure, complete};

/// `done(replayed_json)`: the replay of stored run `run_id` (`entries`, `events`,
/// `events_digest`, `status`, `divergence`: None when identical).
#[pyfunction]
pub(crate) fn replay(store: PathBuf, run_id: String, done: Py<PyAny>) -> PyResult<()> {
    complete(done, async move {
        let fail = |code: &str, e: String| -> Failure { (code.to_string(), e) };
        let s = SqliteStore::open_existing(&store).map_err(|e| fail(e.code(), e.to_string()))?;
        let stored = s.load(&run_id).map_err(|e| fail(e.code(), e.to_string()))?;
        let r = dagloop::runs::replay_run(&stored.record, &stored.journal, stored.result.as_ref())
            .map_err(|e| fail(e.code(), e.to_string()))?;
        Ok::<_, Failure>(to_json(&r))
    })
}
