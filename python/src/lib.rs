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
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

mod run;
mod start;
mod store;
mod tool;

/// mimalloc rather than glibc's malloc for this module's Rust allocations (Python's own objects
/// keep Python's allocator; no memory crosses between the two: what Python gets is copied into
/// its objects). A run's threads allocate many small short-lived objects (calls, events, JSON
/// values): with glibc's allocator, `malloc`/`free` took about a quarter of the runtime threads'
/// CPU in the 1,000-call benchmark (`perf record`), as in the CLI (src/main.rs).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The runtime every run of the process runs on (its worker threads never hold the GIL
/// except to hand a value back): started by the first call, shut down when the interpreter
/// exits (`_exiting`), never started again.
static RT: Mutex<Runtime> = Mutex::new(Runtime::NotStarted);

enum Runtime {
    NotStarted,
    Running(tokio::runtime::Runtime),
    /// The interpreter exited, or the runtime could not start (why).
    Gone(String),
}

fn runtime() -> PyResult<tokio::runtime::Handle> {
    let gone = |why: &str| PyRuntimeError::new_err(format!("no tokio runtime: {why}"));
    let mut rt = RT
        .lock()
        .map_err(|_| gone("a thread panicked holding it"))?;
    if let Runtime::NotStarted = *rt {
        *rt = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("dagloop")
            .build()
        {
            Ok(r) => Runtime::Running(r),
            Err(e) => Runtime::Gone(format!("cannot start it: {e}")),
        };
    }
    match &*rt {
        Runtime::Running(r) => Ok(r.handle().clone()),
        Runtime::Gone(why) => Err(gone(why)),
        Runtime::NotStarted => Err(gone("not started")),
    }
}

/// Set when the interpreter exits (`atexit`): from then on nothing is handed back to Python (a
/// thread taking the GIL while the interpreter finalizes aborts the process).
static EXITING: AtomicBool = AtomicBool::new(false);

/// Runtime threads that passed the `EXITING` check and may hold, or wait for, the GIL: the
/// exit hook waits for none to be left before the interpreter goes on finalizing.
static HANDING_BACK: AtomicUsize = AtomicUsize::new(0);

/// How long the exit hook waits for values being handed back, and then for the runtime's
/// threads to stop (each; a thread stuck in a blocking call is left behind after that).
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Called by the package's `atexit` hook (registered by the module's init), before the
/// interpreter finalizes: no value is handed back from now on; the GIL is released until the
/// threads handing one back are done (a thread that still held or awaited the GIL once
/// finalization began would be killed inside `PyGILState_Ensure`/`Release` and abort the
/// process), then the runtime is shut down (its tasks dropped, its threads joined).
#[pyfunction]
fn _exiting(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    let rt = RT.lock().ok().map(|mut rt| {
        std::mem::replace(&mut *rt, Runtime::Gone("the interpreter is exiting".into()))
    });
    py.detach(move || {
        let deadline = Instant::now() + EXIT_WAIT;
        while HANDING_BACK.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(Runtime::Running(rt)) = rt {
            rt.shutdown_timeout(EXIT_WAIT);
        }
    });
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
        // Counted before the check (both SeqCst): either the exit hook sees this thread in
        // `HANDING_BACK` and waits for it, or this thread sees `EXITING` and stays away.
        HANDING_BACK.fetch_add(1, Ordering::SeqCst);
        let _left = Left;
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

/// Takes a thread off `HANDING_BACK` when it is done (however it leaves).
struct Left;

impl Drop for Left {
    fn drop(&mut self) {
        HANDING_BACK.fetch_sub(1, Ordering::SeqCst);
    }
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
    // Before the interpreter finalizes, nothing of this module's threads is left touching it.
    let exiting = m.getattr("_exiting")?;
    m.py()
        .import("atexit")?
        .call_method1("register", (exiting,))?;
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
