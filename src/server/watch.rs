//! One watcher per run for every client waiting on its end (`POST /runs` with `wait`,
//! `GET /runs/{id}/result?wait=`): the first waiter starts it, later ones share it, and it stops
//! when the last one leaves. It follows the run's end signal while this process drives it and,
//! while nobody here does (parked, or another process's), reads one row of the store every
//! [`POLL`] — never the journal; the run is described (its journal replayed) once, when it
//! has ended, and every waiter is answered from that one description. On the Temporal engine
//! (`serve --engine temporal`) it asks the workflow for the run's description every [`POLL`].
//!
//! `GET /metrics` shows how many runs are watched and how many clients wait on them
//! (`dagloop_run_watchers`, `dagloop_run_waiters`).
//!
//! Deliberately not here: the events a follower streams (a live run's subscription, `sse`) or
//! what a waiter answers when its time runs out (`result`: the run described once, then).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use super::park::POLL;
use super::state::{AppState, lock};
use crate::runs::RunView;

/// How long a watcher follows one handle of a live run before it looks again which handle
/// drives the run (one parked and woken meanwhile has another).
const RELOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// The runs watched, by id (an entry whose last waiter left is gone or about to be).
#[derive(Default)]
pub(super) struct Watches {
    runs: Mutex<BTreeMap<String, Weak<RunWatch>>>,
}

/// A run's one watcher, held by each of its waiters.
pub(super) struct RunWatch {
    id: String,
    ended: watch::Receiver<Option<Arc<RunView>>>,
    task: tokio::task::JoinHandle<()>,
    watches: Weak<AppState>,
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(st) = self.watches.upgrade() {
            let mut runs = lock(&st.watches.runs);
            // A newer watcher may have taken the id since this one's last waiter left.
            if runs.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
                runs.remove(&self.id);
            }
        }
    }
}

impl RunWatch {
    /// The run's description once it has ended (None: the watcher could not tell; the
    /// waiter describes the run itself).
    pub(super) async fn ended(&self) -> Option<Arc<RunView>> {
        let mut rx = self.ended.clone();
        let got = rx.wait_for(Option::is_some).await.ok()?;
        got.clone()
    }
}

impl Watches {
    /// (runs watched, clients waiting on them).
    pub(super) fn counts(&self) -> (usize, usize) {
        let runs = lock(&self.runs);
        let live = runs.values().filter(|w| w.strong_count() > 0);
        live.fold((0, 0), |(n, w), r| (n + 1, w + r.strong_count()))
    }
}

impl AppState {
    /// The watcher of run `id`: the one already there, else a new one.
    pub(super) fn watch_run(self: &Arc<Self>, id: &str) -> Arc<RunWatch> {
        let mut runs = lock(&self.watches.runs);
        if let Some(w) = runs.get(id).and_then(Weak::upgrade) {
            return w;
        }
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(follow(Arc::downgrade(self), id.to_string(), tx));
        let w = Arc::new(RunWatch {
            id: id.to_string(),
            ended: rx,
            task,
            watches: Arc::downgrade(self),
        });
        runs.insert(id.to_string(), Arc::downgrade(&w));
        w
    }
}

/// Follows run `id` until it has ended, then sends its description (once) and stops. Holds
/// the server only weakly, so a watcher never keeps a stopped server alive.
async fn follow(st: Weak<AppState>, id: String, tx: watch::Sender<Option<Arc<RunView>>>) {
    loop {
        let Some(me) = st.upgrade() else { return };
        // On Temporal no run lives here or in the store: the workflow's description says
        // whether it has ended (one query per look).
        #[cfg(feature = "temporal")]
        if me.temporal().is_some() {
            match me.describe_view(&id).await {
                Ok(view) if view.usage.is_some() => {
                    let _ = tx.send(Some(Arc::new(view)));
                    return;
                }
                Ok(_) => {
                    drop(me);
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Err(_) => return,
            }
        }
        let ended = match me.live(&id) {
            // Driven here: its end signal, which holds neither the run nor its handle (the run
            // is parked as if nobody waited; then its driver stops and the row decides).
            Some(live) => {
                let ended = live.handle.ended();
                drop((live, me));
                match tokio::time::timeout(RELOOK, ended).await {
                    Ok(ended) => ended,
                    // Still driven: look again (a run parked and woken has another handle).
                    Err(_) => continue,
                }
            }
            // Nobody drives it here: one row says whether it has ended.
            None => {
                let store = me.store.clone();
                let run = id.clone();
                drop(me);
                match tokio::task::spawn_blocking(move || store.has_ended(&run)).await {
                    Ok(Ok(Some(true))) => true,
                    Ok(Ok(Some(false))) => {
                        tokio::time::sleep(POLL).await;
                        continue;
                    }
                    // No such run, or the store cannot be read: the waiters find out themselves.
                    _ => return,
                }
            }
        };
        if ended {
            let Some(me) = st.upgrade() else { return };
            match me.describe_view(&id).await {
                // A description has usage exactly when the run has its result (a live run's
                // result may not be recorded yet: look again).
                Ok(view) if view.usage.is_some() => {
                    let _ = tx.send(Some(Arc::new(view)));
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
        // Its driver stopped without a result (parked, or the server stops), or the result is
        // not recorded yet: look again.
        tokio::time::sleep(POLL).await;
    }
}
