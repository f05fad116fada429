//! A running run, as programs address it: [`RunHandle`] takes ops in and gives events out.
//!
//! Events are broadcast live; a subscriber that starts late, or falls behind the broadcast
//! ring, is caught up from the run's event history, so it sees every event exactly once and in
//! order ([`Subscription`]). The history is made by the first catch-up: the journal so far is
//! replayed through a fresh machine once, and from then on published events are kept as they
//! are published (shared, not copied). The last handle dropped stops the run and
//! every task it owns.
//!
//! Deliberately not here: deciding anything about the run (the machine does) or performing its
//! actions (the driver does).

use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use crate::approval::Policy;
use crate::context::SanitizeLimits;
use crate::machine::{AgentConfig, JournalEntry, RunResult};
use crate::protocol::{Event, Op, OpError};

/// An op on its way to the driver, with where to send the verdict.
pub(super) struct OpRequest {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), OpError>>,
}

/// What the driver shares with handles and subscribers.
pub(super) struct Shared {
    pub run_id: Arc<str>,
    pub root: Arc<AgentConfig>,
    pub policy: Policy,
    pub sanitize: SanitizeLimits,
    pub log: Mutex<Log>,
    pub tx: broadcast::Sender<Arc<Event>>,
    pub ops: mpsc::UnboundedSender<OpRequest>,
    pub done: watch::Sender<Option<Arc<RunResult>>>,
    /// True while the run can only move on when somebody submits an op (nothing streams, runs
    /// or waits on a timer).
    pub idle: watch::Sender<bool>,
    /// Taken by a subscriber catching up; true once [`Log::history`] holds every event of the
    /// run (the replayed ones before the first catch-up included).
    pub catch_up: Mutex<bool>,
}

/// The journal so far, the last event published from it and, once a subscriber has fallen
/// behind the ring, every event since.
#[derive(Default)]
pub(super) struct Log {
    pub journal: Vec<JournalEntry>,
    pub last_seq: u64,
    /// Every journaled event, kept from the first catch-up on (None before): what subscribers
    /// that fall behind the ring are served from. The events before it are made once, by
    /// replaying the journal; later ones are the published events themselves, shared (their
    /// calls are the journal's), so a lagging subscriber costs no second machine.
    pub history: Option<Vec<Arc<Event>>>,
}

impl Shared {
    /// Publishes events under the log lock (so a new subscriber's cut is consistent).
    pub fn publish(&self, log: &mut Log, event: Event) {
        let ephemeral = event.kind.is_ephemeral();
        if !ephemeral {
            log.last_seq = event.seq;
        }
        let listening = self.tx.receiver_count() > 0;
        if !listening && (ephemeral || log.history.is_none()) {
            return;
        }
        let event = Arc::new(event);
        if let (false, Some(h)) = (ephemeral, &mut log.history) {
            h.push(event.clone());
        }
        if listening {
            let _ = self.tx.send(event);
        }
    }

    pub fn subscribe_from(self: &Arc<Self>, after: u64) -> Subscription {
        let (backlog, rx, cut) = self.cut(after);
        Subscription {
            shared: self.clone(),
            backlog: backlog.into_iter(),
            rx,
            cut,
            last: after,
            lags: 0,
            ended: false,
            done: self.done.subscribe(),
        }
    }

    /// Every event after `after` up to the last published one, a live receiver for what comes
    /// next, and the sequence number where the two meet. The first catch-up of the run replays
    /// the journal so far (outside the log lock: the driver goes on meanwhile, its events
    /// recorded); every later one copies from the history.
    fn cut(&self, after: u64) -> (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>, u64) {
        // One catch-up at a time, so the first completes the history before anyone reads it.
        let mut complete = match self.catch_up.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let lock = || match self.log.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let (journal, cut, rx) = {
            let mut log = lock();
            let (cut, rx) = (log.last_seq, self.tx.subscribe());
            if after >= cut {
                return (Vec::new(), rx, cut);
            }
            if *complete {
                let history = log.history.as_deref().unwrap_or_default();
                return (between(history, after, cut), rx, cut);
            }
            log.history = Some(Vec::new());
            (log.journal.clone(), cut, rx)
        };
        let replayed = crate::machine::replay(
            &self.run_id,
            self.root.clone(),
            self.policy.clone(),
            self.sanitize,
            &journal,
        );
        drop(journal);
        let mut history: Vec<Arc<Event>> = replayed.into_iter().map(Arc::new).collect();
        let mut log = lock();
        history.extend(log.history.take().unwrap_or_default());
        let backlog = between(&history, after, cut);
        log.history = Some(history);
        *complete = true;
        (backlog, rx, cut)
    }

    pub async fn submit(&self, op: Op) -> Result<(), OpError> {
        let (reply, verdict) = oneshot::channel();
        let gone = || {
            let finished = self
                .done
                .borrow()
                .as_ref()
                .map(|r| r.status.as_str().to_string());
            match finished {
                Some(status) => OpError::RunFinished { status },
                None => OpError::Unavailable {
                    reason: "the run's driver has stopped".into(),
                },
            }
        };
        if self.ops.send(OpRequest { op, reply }).is_err() {
            return Err(gone());
        }
        verdict.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// The events of `history` (in sequence order) numbered after `after`, up to `cut`.
fn between(history: &[Arc<Event>], after: u64, cut: u64) -> Vec<Arc<Event>> {
    let start = history.partition_point(|e| e.seq <= after);
    history[start..]
        .iter()
        .take_while(|e| e.seq <= cut)
        .cloned()
        .collect()
}

/// Every event of a run after a given sequence number, then live ones, without gap or
/// duplicate. Ends after `run_finished` of the run's own agent (or when the run is dropped).
pub struct Subscription {
    shared: Arc<Shared>,
    backlog: std::vec::IntoIter<Arc<Event>>,
    rx: broadcast::Receiver<Arc<Event>>,
    cut: u64,
    last: u64,
    lags: u64,
    ended: bool,
    done: watch::Receiver<Option<Arc<RunResult>>>,
}

fn is_end(e: &Event) -> bool {
    e.parent.is_none() && matches!(e.kind, crate::protocol::EventKind::RunFinished { .. })
}

impl Subscription {
    /// The next event, or None once the run is over and everything was delivered.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        let e = self.next().await?;
        self.ended |= is_end(&e);
        Some(e)
    }

    async fn next(&mut self) -> Option<Arc<Event>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(e) = self.backlog.next() {
                self.last = e.seq;
                return Some(e);
            }
            let received = tokio::select! {
                biased;
                r = self.rx.recv() => r,
                _ = self.done.wait_for(Option::is_some) => {
                    // The run is over; deliver what is still buffered, then end.
                    match self.rx.try_recv() {
                        Ok(e) => Ok(e),
                        Err(broadcast::error::TryRecvError::Lagged(n)) => {
                            Err(broadcast::error::RecvError::Lagged(n))
                        }
                        Err(_) => return None,
                    }
                }
            };
            match received {
                Ok(e) if e.kind.is_ephemeral() => return Some(e),
                Ok(e) if e.seq <= self.cut.max(self.last) => continue,
                Ok(e) => {
                    self.last = e.seq;
                    return Some(e);
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Fell behind the ring: catch up from the journal.
                    self.lags += n;
                    tracing::debug!(run = %self.shared.run_id, missed = n, "subscriber lagged; replaying");
                    let (backlog, rx, cut) = self.shared.cut(self.last);
                    self.backlog = backlog.into_iter();
                    self.rx = rx;
                    self.cut = cut;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// How many live events this subscriber missed and caught up on from the journal.
    pub fn lagged(&self) -> u64 {
        self.lags
    }
}

/// Stops the run when the last handle goes away.
pub(super) struct Owner {
    pub task: Option<AbortHandle>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// A run in progress: submit ops, subscribe to events, wait for the result. Cloning is cheap;
/// the run (and every task it owns: the model stream, activities, timers, reviewers) stops when
/// the last clone is dropped.
#[derive(Clone)]
pub struct RunHandle {
    pub(super) shared: Arc<Shared>,
    pub(super) _owner: Arc<Owner>,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("run_id", &self.shared.run_id)
            .finish()
    }
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.shared.run_id
    }

    /// Submits an op; `Err` says why it does not apply (nothing changed then). Resolves once
    /// the op is journaled and applied.
    pub async fn submit(&self, op: Op) -> Result<(), OpError> {
        self.shared.submit(op).await
    }

    /// Every event after sequence number `seq` (0: from the start), then live events.
    pub fn subscribe_from(&self, seq: u64) -> Subscription {
        self.shared.subscribe_from(seq)
    }

    /// The journal so far (every input the run consumed, in order).
    pub fn journal(&self) -> Vec<JournalEntry> {
        match self.shared.log.lock() {
            Ok(log) => log.journal.clone(),
            Err(p) => p.into_inner().journal.clone(),
        }
    }

    /// Cancels the run (same as submitting `Op::Cancel`).
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<(), OpError> {
        self.submit(Op::Cancel {
            reason: reason.into(),
        })
        .await
    }

    /// The result, once the run is over (None while it runs).
    pub fn result(&self) -> Option<RunResult> {
        self.shared.done.borrow().as_deref().cloned()
    }

    /// Waits until the run ends (`Some(result)`) or can only move on when somebody decides
    /// (`None`): nothing streams, runs or waits on a timer.
    pub async fn wait_or_idle(&self) -> Option<RunResult> {
        let mut done = self.shared.done.subscribe();
        let mut idle = self.shared.idle.subscribe();
        tokio::select! {
            r = done.wait_for(Option::is_some) => {
                r.ok().and_then(|r| r.as_deref().cloned()).or_else(|| Some(driver_lost()))
            }
            _ = idle.wait_for(|i| *i) => None,
        }
    }

    /// The calls awaiting a decision now, with the fingerprint a decision may quote.
    pub fn awaiting(&self) -> Vec<(crate::protocol::CallId, crate::protocol::Call, String)> {
        let journal = self.journal();
        let mut m = crate::machine::RunMachine::replaying(
            self.shared.run_id.clone(),
            self.shared.root.clone(),
            self.shared.policy.clone(),
            self.shared.sanitize,
        );
        for e in journal {
            m.handle(e.input, e.at);
        }
        m.awaiting()
            .into_iter()
            .map(|(id, c)| {
                let h = crate::protocol::params_hash(&c);
                (id, c, h)
            })
            .collect()
    }

    /// Waits for the run to end and returns its result.
    pub async fn wait(&self) -> RunResult {
        let mut rx = self.shared.done.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(r) => r.as_deref().cloned().unwrap_or_else(driver_lost),
            Err(_) => driver_lost(),
        }
    }
}

fn driver_lost() -> RunResult {
    use crate::machine::{RunError, RunStatus, Usage};
    RunResult {
        status: RunStatus::Cancelled,
        output: serde_json::Value::Null,
        state: serde_json::Value::Null,
        steps: 0,
        usage: Usage::default(),
        calls: Vec::new(),
        error: Some(RunError::new(
            "run.driver_lost",
            "the run's driver stopped without a result (the runtime shut down or it panicked)",
        )),
    }
}
