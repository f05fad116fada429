//! Python functions as the activity of a goal's `"_activity": "rust"` tools: a call becomes a
//! work item queued for the Python side, which takes every queued item at once
//! (`Run.take_work`), runs them (on its event loop, or a thread for a sync function) and answers
//! them in batches (`answer`: each call through its [`Reply`], all of a batch handed to their
//! calls by one task on the runtime, so a batch wakes the run's threads once).
//!
//! The run's threads never take the GIL to hand a call over: a queue that was empty wakes the
//! Python event loop by writing one byte to a socket it watches (`loop.add_reader`), so a
//! fan-out of a thousand calls costs a few wake-ups, not a thousand GIL hand-overs (each of which
//! waits for the interpreter's switch interval while Python runs tools).
//!
//! The socket is a Unix socket pair on Unix; elsewhere (Windows, where asyncio watches sockets
//! only, and a proactor loop cannot watch them at all: the Python side then awaits
//! `loop.sock_recv` instead) a connected pair of loopback TCP sockets made with `std::net`.
//!
//! Deliberately not here: calling Python (the Python side does, so that an async tool runs on
//! the caller's event loop and many run at once), or any timeout or approval rule (the core's).

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use dagloop::protocol::{Call, Tool};
use dagloop::tools::{Activity, ActivityError, ActivityFuture, ActivityOutput};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use serde_json::{Value, json};
use tokio::sync::oneshot;

type Answer = Result<ActivityOutput, ActivityError>;

/// One call for Python to run.
pub(crate) struct Work {
    pub tool: String,
    pub params: String,
    pub reply: Reply,
}

/// The calls waiting for Python, and how Python is woken to take them.
pub(crate) struct WorkQueue {
    items: Mutex<Vec<Work>>,
    /// A byte was written since Python last took the queue: no need to write another.
    notified: AtomicBool,
    /// Python is gone (the run was dropped): calls fail at once.
    closed: AtomicBool,
    /// The end written to; Python watches the other.
    wake: WakeStream,
}

/// The wake-up socket: a Unix socket pair where there is one.
#[cfg(unix)]
pub(crate) type WakeStream = std::os::unix::net::UnixStream;
/// The wake-up socket: loopback TCP where there is no Unix socket pair (Windows).
#[cfg(not(unix))]
pub(crate) type WakeStream = std::net::TcpStream;

#[cfg(unix)]
fn wake_pair() -> std::io::Result<(WakeStream, WakeStream)> {
    WakeStream::pair()
}

/// A connected pair of loopback TCP sockets: a listener on an ephemeral port of 127.0.0.1
/// accepts one connection, which must come from the end made here (another process racing to
/// the port is refused), then stops listening.
#[cfg(not(unix))]
fn wake_pair() -> std::io::Result<(WakeStream, WakeStream)> {
    use std::net::{Ipv4Addr, TcpListener};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let wake = WakeStream::connect(listener.local_addr()?)?;
    loop {
        let (watched, peer) = listener.accept()?;
        if peer == wake.local_addr()? {
            wake.set_nodelay(true)?;
            return Ok((wake, watched));
        }
    }
}

impl WorkQueue {
    /// A queue, and the socket end Python watches (non-blocking, like this one).
    pub(crate) fn new() -> std::io::Result<(WorkQueue, WakeStream)> {
        let (wake, watched) = wake_pair()?;
        wake.set_nonblocking(true)?;
        watched.set_nonblocking(true)?;
        let queue = WorkQueue {
            items: Mutex::new(Vec::new()),
            notified: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            wake,
        };
        Ok((queue, watched))
    }

    /// Queues `work`, waking Python unless it was woken already; gives it back when Python is
    /// gone.
    fn push(&self, work: Work) -> Result<(), Work> {
        if self.closed.load(Ordering::Acquire) {
            return Err(work);
        }
        match self.items.lock() {
            Ok(mut items) => items.push(work),
            Err(_) => return Err(work),
        }
        if !self.notified.swap(true, Ordering::AcqRel) {
            // A full socket already holds a wake-up: nothing is lost when this write is not made.
            let _ = (&self.wake).write(&[1]);
        }
        Ok(())
    }

    /// Every queued call, in order; the next call queued wakes Python again.
    pub(crate) fn take(&self) -> Vec<Work> {
        self.notified.store(false, Ordering::Release);
        match self.items.lock() {
            Ok(mut items) => std::mem::take(&mut *items),
            Err(_) => Vec::new(),
        }
    }

    /// Python is gone: the queued calls fail (their replies dropped), and so does every later one.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        drop(self.take());
    }
}

/// The activity of every Python tool of a run: it queues the call and waits for its answer.
pub(crate) struct PyTools {
    pub queue: std::sync::Arc<WorkQueue>,
}

impl Activity for PyTools {
    fn run(&self, tool: &Tool, call: std::sync::Arc<Call>) -> ActivityFuture {
        let (tx, rx) = oneshot::channel();
        let work = Work {
            tool: tool.name.clone(),
            params: call.params.as_value().to_string(),
            reply: Reply {
                tx: Mutex::new(Some(tx)),
            },
        };
        let sent = self.queue.push(work);
        Box::pin(async move {
            if sent.is_err() {
                return Err(gone());
            }
            rx.await.unwrap_or_else(|_| Err(gone()))
        })
    }
}

fn gone() -> ActivityError {
    ActivityError::Failed {
        message: "the Python side of the run is gone (its event loop stopped)".into(),
        details: Value::Null,
    }
}

/// How Python answers one call (once; a second answer is ignored).
#[pyclass(frozen, module = "dagloop._dagloop")]
pub(crate) struct Reply {
    tx: Mutex<Option<oneshot::Sender<Answer>>>,
}

impl Reply {
    /// The channel to the call, the first time (a call is answered once).
    fn take(&self) -> Option<oneshot::Sender<Answer>> {
        self.tx.lock().ok().and_then(|mut t| t.take())
    }

    fn send(&self, answer: Answer) {
        if let Some(tx) = self.take() {
            let _ = tx.send(answer);
        }
    }
}

/// The call's failure: the function raised `exception` (its class name) with `message`.
fn failed(exception: &str, message: &str) -> Answer {
    Err(ActivityError::Failed {
        message: format!("{exception}: {message}"),
        details: json!({"exception": exception}),
    })
}

/// What a tool's result (JSON, as `bytes` or `str`) answers: its value, or the call's failure
/// when it is not JSON.
fn parse_result(result: &Bound<'_, PyAny>) -> Answer {
    let parsed = if let Ok(b) = result.cast::<PyBytes>() {
        serde_json::from_slice::<Value>(b.as_bytes()).map_err(|e| e.to_string())
    } else if let Ok(s) = result.cast::<PyString>() {
        s.to_str()
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<Value>(s).map_err(|e| e.to_string()))
    } else {
        Err("neither bytes nor str".to_string())
    };
    match parsed {
        Ok(v) => Ok(v.into()),
        Err(e) => Err(ActivityError::Failed {
            message: format!("the tool's result is not JSON: {e}"),
            details: Value::Null,
        }),
    }
}

/// Answers many calls at once: `answers` is a list of `(reply, result_json)` (as [`Reply::ok`])
/// and `(reply, exception, message)` (as [`Reply::fail`]) items, handed to their calls together
/// ([`deliver`]).
#[pyfunction]
pub(crate) fn answer(answers: &Bound<'_, PyList>) -> PyResult<()> {
    let mut batch = Vec::with_capacity(answers.len());
    for item in answers.iter() {
        let item = item.cast_into::<PyTuple>()?;
        let answer = match item.len() {
            2 => parse_result(&item.get_item(1)?),
            3 => failed(
                &item.get_item(1)?.extract::<String>()?,
                &item.get_item(2)?.extract::<String>()?,
            ),
            n => {
                return Err(PyTypeError::new_err(format!(
                    "an answer is (reply, result) or (reply, exception, message), not {n} items"
                )));
            }
        };
        let reply = item.get_item(0)?.cast_into::<Reply>()?;
        if let Some(tx) = reply.get().take() {
            batch.push((tx, answer));
        }
    }
    deliver(batch);
    Ok(())
}

/// Hands the answers of a batch to their calls with one wake-up of the run's threads: a task
/// spawned on the runtime sends them all, so each call's task is woken from a runtime thread
/// (onto its own queue). Sent from this (Python's) thread instead, each send woke its call's
/// task from outside the runtime: the runtime's shared queue, and a `write` to wake a parked
/// thread, for nearly every answer. An answer whose call is gone (the run ended, the call was
/// aborted) is dropped with its channel; if the runtime is gone, so are the calls (the task is
/// never run and the answers are dropped: each call fails as `gone`).
fn deliver(batch: Vec<(oneshot::Sender<Answer>, Answer)>) {
    let send_all = move |batch: Vec<(oneshot::Sender<Answer>, Answer)>| {
        for (tx, answer) in batch {
            let _ = tx.send(answer);
        }
    };
    if batch.len() < 2 {
        return send_all(batch); // one wake-up either way
    }
    if let Ok(rt) = super::runtime() {
        rt.spawn(async move { send_all(batch) });
    }
}

#[pymethods]
impl Reply {
    /// The call's result, as JSON (`bytes` or `str`; what is not JSON fails the call). Read with the
    /// GIL held: letting it go for the microsecond this takes cost 60-80 µs per call in the
    /// 1,000-call benchmark (taking it back waits for whichever thread took it meanwhile).
    fn ok(&self, result: &Bound<'_, PyAny>) {
        self.send(parse_result(result));
    }

    /// The call failed: the function raised `exception` (its class name) with `message`
    /// (`activity.failed`).
    fn fail(&self, exception: &str, message: &str) {
        self.send(failed(exception, message));
    }

    /// The call ran longer than the tool's `timeout` (`activity.timeout`).
    fn timeout(&self, seconds: f64) {
        self.send(Err(ActivityError::Timeout { seconds }));
    }

    /// The params do not fit the function's signature (`activity.bad_params`).
    fn bad_params(&self, tool: &str, reason: &str) {
        self.send(Err(ActivityError::BadParams {
            tool: tool.to_string(),
            reason: reason.to_string(),
        }));
    }
}
