//! `dagloop._dagloop`: the native half of the Python package. It drives runs through the same
//! library front-end as the command line (`runs::define`, `launch::prepare`, the store, the
//! cassette executor) and hands Python what it needs as plain values: tool calls to run
//! (`tool.rs`), events and results as their JSON (the HTTP API's shapes), decisions in.
//!
//! Deliberately not here: anything Python-shaped (schemas from type hints, Pydantic outputs,
//! typed events, the reviewer callback — `python/dagloop/`), and any rule of a run: those are
//! the library's. Every async method takes a `done(value, error)` callback, called once from
//! the run's tokio runtime with the GIL held; the Python side turns it into an awaitable.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

mod run;
mod start;
mod store;
mod tool;

/// The runtime every run of the process runs on (its worker threads never hold the GIL
/// except to hand a value back).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("dagloop")
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| PyRuntimeError::new_err(format!("cannot start the tokio runtime: {e}")))
}

/// Set when the interpreter exits (`atexit`): from then on nothing is handed back to Python (a
/// thread taking the GIL while the interpreter finalizes aborts the process).
static EXITING: AtomicBool = AtomicBool::new(false);

/// Called by the package's `atexit` hook.
#[pyfunction]
fn _exiting() {
    EXITING.store(true, Ordering::SeqCst);
}

/// A failure handed to Python: a stable code and the message.
type Failure = (String, String);

/// Runs `fut` on the runtime and calls `done(value, None)` or `done(None, (code, message))`
/// with its outcome.
fn complete<T, F>(done: Py<PyAny>, fut: F) -> PyResult<()>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: for<'py> IntoPyObject<'py> + Send + 'static,
{
    runtime()?.spawn(async move {
        let out = fut.await;
        if EXITING.load(Ordering::SeqCst) {
            return;
        }
        Python::attach(|py| {
            let called = match out {
                Ok(v) => done.call1(py, (v, py.None())),
                Err(e) => done.call1(py, (py.None(), e)),
            };
            if let Err(e) = called {
                e.print(py);
            }
        });
    });
    Ok(())
}

/// The module.
#[pymodule]
fn _dagloop(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(start::start, m)?)?;
    m.add_function(wrap_pyfunction!(_exiting, m)?)?;
    m.add_function(wrap_pyfunction!(tool::answer, m)?)?;
    m.add_function(wrap_pyfunction!(store::replay, m)?)?;
    m.add_class::<run::Run>()?;
    m.add_class::<tool::Reply>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Which Cargo profile built the module: benchmarks say so beside their figures.
    m.add(
        "profile",
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
    )?;
    Ok(())
}
