//! A started run as Python sees it: tool calls out (`take_work`, when the socket of
//! `wake_fd` is readable), events out as the HTTP API's
//! JSON (`next_event`), decisions and cancellation in, the result at the end.
//!
//! Deliberately not here: what a decision means or whether it applies (the run's machine
//! decides and refuses with an `OpError` code), or how events are typed for Python.

use std::collections::BTreeMap;
use std::sync::Arc;

use dagloop::protocol::{CallId, Decision, Op, Tool};
use dagloop::runs::{Launched, Servers};
use dagloop::store::RunStore;
use dagloop::{RunHandle, Subscription};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::Mutex;

use super::start::to_json;
use super::tool::{Reply, WakeStream, WorkQueue};
use super::{Failure, complete};

/// A run going on in this process.
#[pyclass(frozen, module = "dagloop._dagloop")]
pub(crate) struct Run {
    handle: RunHandle,
    work: Arc<WorkQueue>,
    /// The socket end Python watches for work, until Python takes it (`wake_fd`).
    watched: std::sync::Mutex<Option<WakeStream>>,
    events: Arc<Mutex<Option<Subscription>>>,
    store: Option<Arc<dyn RunStore>>,
    /// The run's tools by name (what a call awaiting a decision would do is described from them).
    tools: BTreeMap<String, Tool>,
    /// The goal's MCP servers, stopped when the run is dropped.
    _servers: std::sync::Mutex<Option<Servers>>,
}

impl Run {
    pub(crate) fn new(
        launched: Launched,
        work: Arc<WorkQueue>,
        watched: WakeStream,
        store: Option<Arc<dyn RunStore>>,
        tools: &[Tool],
    ) -> Run {
        Run {
            handle: launched.handle,
            work,
            watched: std::sync::Mutex::new(Some(watched)),
            events: Arc::new(Mutex::new(None)),
            store,
            tools: tools.iter().map(|t| (t.name.clone(), t.clone())).collect(),
            _servers: std::sync::Mutex::new(launched.servers),
        }
    }
}

#[cfg(unix)]
fn into_handle(w: WakeStream) -> Option<u64> {
    use std::os::fd::IntoRawFd;
    u64::try_from(w.into_raw_fd()).ok()
}

#[cfg(windows)]
fn into_handle(w: WakeStream) -> Option<u64> {
    use std::os::windows::io::IntoRawSocket;
    Some(w.into_raw_socket())
}

/// Neither Unix nor Windows: no socket to hand over (Python then finds no call to run).
#[cfg(not(any(unix, windows)))]
fn into_handle(_: WakeStream) -> Option<u64> {
    None
}

impl Drop for Run {
    /// Nobody in Python will run a call any more: the queued ones fail, and so do later ones.
    fn drop(&mut self) {
        self.work.close();
    }
}

#[pymethods]
impl Run {
    /// The run's id.
    #[getter]
    fn run_id(&self) -> String {
        self.handle.run_id().to_string()
    }

    /// The socket that becomes readable when calls wait in `take_work` (non-blocking; Python
    /// owns it from then on: `socket.socket(fileno=...)`, read and closed there): its file
    /// descriptor on Unix, its `SOCKET` handle on Windows. Given once: None after.
    fn wake_fd(&self) -> Option<u64> {
        let watched = self.watched.lock().ok().and_then(|mut w| w.take());
        watched.and_then(into_handle)
    }

    /// The calls of Python tools waiting to run, as `(tool, params_json, reply)`, every one
    /// queued by now (none when the socket woke Python for calls already taken).
    fn take_work(&self) -> Vec<(String, String, Reply)> {
        self.work
            .take()
            .into_iter()
            .map(|w| (w.tool, w.params, w.reply))
            .collect()
    }

    /// `done(event_json | None)`: the next event after `after` the first time (then the next
    /// one), None once the run is over and every event was delivered.
    #[pyo3(signature = (done, after = 0))]
    fn next_event(&self, done: Py<PyAny>, after: u64) -> PyResult<()> {
        let events = self.events.clone();
        let handle = self.handle.clone();
        complete(done, async move {
            let mut sub = events.lock().await;
            let sub = sub.get_or_insert_with(|| handle.subscribe_from(after));
            Ok::<_, Failure>(sub.recv().await.map(|e| to_json(&*e)))
        })
    }

    /// What a call of `tool` with `params` (JSON) would do, described without doing it
    /// (`tools::describe_action`, the `action` the server shows a reviewer), as JSON; None for a
    /// tool the run's goal does not define.
    fn action(&self, tool: &str, params: &str) -> PyResult<Option<String>> {
        let params: serde_json::Map<String, serde_json::Value> = serde_json::from_str(params)
            .map_err(|e| PyValueError::new_err(format!("bad params: {e}")))?;
        Ok(self
            .tools
            .get(tool)
            .map(|t| to_json(&dagloop::tools::describe_action(t, &params))))
    }

    /// Submits a decision (`{"decision": "approve" | "edit" | "reject", ...}` as JSON) on
    /// `call_id`; `presented` and `presentation` quote the `approval_requested` event it
    /// answers. `done(None, (code, message))` when the run refuses it.
    #[pyo3(signature = (done, call_id, decision, presented = None, presentation = None))]
    fn decide(
        &self,
        done: Py<PyAny>,
        call_id: u64,
        decision: &str,
        presented: Option<String>,
        presentation: Option<u64>,
    ) -> PyResult<()> {
        let decision: Decision = serde_json::from_str(decision)
            .map_err(|e| PyValueError::new_err(format!("bad decision: {e}")))?;
        let op = Op::Decide {
            call: CallId(call_id),
            decision,
            presented,
            presentation,
            by: Some(dagloop::protocol::Actor::new("python", "python")),
        };
        let handle = self.handle.clone();
        complete(done, async move {
            handle
                .submit(op)
                .await
                .map_err(|e| (e.code().to_string(), e.to_string()))
        })
    }

    /// Cancels the run (its result says `cancelled`).
    fn cancel(&self, done: Py<PyAny>, reason: String) -> PyResult<()> {
        let handle = self.handle.clone();
        complete(done, async move {
            handle
                .cancel(reason)
                .await
                .map_err(|e| (e.code().to_string(), e.to_string()))
        })
    }

    /// `done(result_json)` once the run is over; a final result is recorded in the store (else
    /// its lease is let go).
    fn wait(&self, done: Py<PyAny>) -> PyResult<()> {
        let handle = self.handle.clone();
        let store = self.store.clone();
        complete(done, async move {
            let result = handle.wait().await;
            // As `dagloop run`: only an ending the run decided is recorded (a follow-up reads
            // it); a run that stopped is left as its journal has it, to be resumed.
            if let Some(s) = store {
                let _ = if result.status.is_final() {
                    s.finish(handle.run_id(), &result)
                } else {
                    s.release(handle.run_id())
                };
            }
            Ok::<_, Failure>(to_json(&result))
        })
    }
}
