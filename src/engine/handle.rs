//! A running run, as programs address it: [`RunHandle`] takes ops in and gives events out.
//!
//! Events are broadcast live, a batch at a time: the driver publishes a batch's events into
//! the log one by one and sends them together ([`Shared::flush`]: one look at the receivers,
//! one send, one wake-up per subscriber), and a subscriber reads them one by one again. A
//! subscriber that starts late, or falls behind the broadcast ring, is caught up from the run's
//! event history, so it sees every event exactly once and in
//! order ([`Subscription`]). The history starts when the ring is about to drop an event some
//! subscriber has not read: the events still in the ring (a shadow of it is kept while anyone
//! listens) and every later one are kept as published (shared, not copied). Until anyone
//! listens, a run keeps its first events (a ring's worth), so that a subscriber that joins just
//! after the start is served from them. A subscriber that asks for events from before all that
//! (it joined late) is served from one replay of the journal through a fresh machine, made
//! once. The last handle dropped stops the run and every task it owns.
//!
//! Deliberately not here: deciding anything about the run (the machine does) or performing its
//! actions (the driver does).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use crate::machine::{JournalEntry, RunResult};
use crate::protocol::{Event, Op, OpError};

/// An op on its way to the driver, with where to send the verdict.
pub(super) struct OpRequest {
    pub op: Op,
    /// Taken from the store's queue: recorded (and answered) already, so a decision that no
    /// longer applies is journaled as dropped rather than only refused.
    pub queued: bool,
    pub reply: oneshot::Sender<Result<(), OpError>>,
}

/// What the driver shares with handles and subscribers.
pub(super) struct Shared {
    pub run_id: Arc<str>,
    /// What the run's machines are built from (its catch-up replays, `awaiting`).
    pub def: super::MachineDef,
    pub log: Mutex<Log>,
    pub tx: broadcast::Sender<Batch>,
    /// The ring's size (batches a subscriber may fall behind before it lags).
    pub capacity: usize,
    pub ops: mpsc::UnboundedSender<OpRequest>,
    pub done: watch::Sender<Option<Arc<RunResult>>>,
    /// True while the run can only move on when somebody submits an op or one of its timers
    /// fires (nothing streams, runs or is being committed).
    pub idle: watch::Sender<bool>,
    /// Taken by a subscriber catching up; true once [`Log::history`] holds every event of the
    /// run from the first on (the replayed ones before the history started included).
    pub catch_up: Mutex<bool>,
    /// How many times the journal was replayed to make events for a subscriber.
    pub replays: AtomicU32,
}

/// Events published together: what the ring carries, one send for all of them.
pub(super) type Batch = Arc<[Arc<Event>]>;

/// The journal so far, the last event published from it and, once a subscriber could fall
/// behind the ring, every event since.
#[derive(Default)]
pub(super) struct Log {
    pub journal: Vec<JournalEntry>,
    pub last_seq: u64,
    /// Journaled events in sequence order without gaps, kept from the moment the ring was about
    /// to drop one that a subscriber had not read, or from the first catch-up (None before):
    /// what subscribers that fall behind are served from. Kept events are the published ones,
    /// shared (their calls are the journal's), so a lagging subscriber costs no second machine.
    /// Events from before the history started are made once, by replaying the journal, for a
    /// subscriber that asks for them.
    pub history: Option<Vec<Arc<Event>>>,
    /// While nothing is kept: the batches the ring may still hold (the last `capacity`), so
    /// that the history can start with their journaled events, or, before anybody listened,
    /// the run's first ones ([`Log::early`]). Always the last journaled events, without gaps
    /// (live-only events in them are skipped where they are read).
    pub recent: VecDeque<Batch>,
    /// How many events `recent` holds.
    pub recent_events: usize,
    /// Events published since the last send ([`Shared::flush`]), in order.
    pub pending: Vec<Arc<Event>>,
    /// Sends left before the ring may be full of batches its slowest subscriber has not read
    /// (0: ask the ring).
    pub room: usize,
    /// True while `recent` holds every journaled event since the run's first, kept while
    /// nobody listened; false once that would have taken more than the ring's size.
    pub early: bool,
    /// The run's spans and metrics, when telemetry is on (None: one branch per event).
    pub spans: Option<crate::telemetry::SpanFeed>,
}

impl Shared {
    /// Publishes an event under the log lock (so a new subscriber's cut is consistent): it
    /// joins the batch that [`Shared::flush`] sends. Every publisher flushes before it lets go
    /// of the lock for long (the driver at the end of a batch of inputs; a progress report or
    /// the model's text at once); a new subscriber's cut flushes first.
    pub fn publish(&self, log: &mut Log, event: Event) {
        if !event.kind.is_ephemeral() {
            log.last_seq = event.seq;
        }
        // Nobody reads this event, and the run keeps none: what the ring held is no run of
        // events without gaps any more (past the run's first events, kept for a subscriber
        // that joins just after the start).
        let unheard = log.history.is_none() && !log.early && self.tx.receiver_count() == 0;
        if unheard {
            log.room = 0;
            log.recent.clear();
            log.recent_events = 0;
            log.pending.clear();
            if log.spans.is_none() {
                return;
            }
        }
        let event = Arc::new(event);
        // With telemetry on, the event is shared with the span worker as soon as it exists.
        if let Some(spans) = &mut log.spans {
            spans.event(&log.journal, &event);
        }
        if !unheard {
            log.pending.push(event);
        }
    }

    /// Sends the events published since the last send as one batch (none: nothing happens),
    /// and keeps the journaled ones where late and lagging subscribers are served from.
    pub fn flush(&self, log: &mut Log) {
        if log.pending.is_empty() {
            return;
        }
        let listening = self.tx.receiver_count() > 0;
        if !listening {
            log.room = 0;
            // Live-only events go to whoever listens now: nobody.
            log.pending.retain(|e| !e.kind.is_ephemeral());
            if log.history.is_none()
                && (!log.early || log.recent_events + log.pending.len() > self.capacity)
            {
                // Until the ring's worth of them, the run's first events are kept all the
                // same: a subscriber that joins just after the start (the usual race with the
                // driver's first steps) is served from them, not from a replay.
                log.recent.clear();
                log.recent_events = 0;
                log.early = false;
                log.pending.clear();
                return;
            }
            if log.pending.is_empty() {
                return;
            }
        } else if log.history.is_none() {
            self.make_room(log);
        }
        let batch: Batch = log.pending.drain(..).collect();
        match &mut log.history {
            Some(h) => h.extend(journaled(&batch).cloned()),
            None => {
                if log.recent.len() >= self.capacity
                    && let Some(old) = log.recent.pop_front()
                {
                    log.recent_events -= old.len();
                }
                log.recent_events += batch.len();
                log.recent.push_back(batch.clone());
            }
        }
        if listening {
            let _ = self.tx.send(batch);
        }
    }

    /// Before a send while nothing is kept: when the ring is full of batches its slowest
    /// subscriber has not read, the send would drop one, so the history starts with the events
    /// the ring holds. The ring is asked only once the sends since it was last asked could
    /// have filled it (asking walks the ring).
    fn make_room(&self, log: &mut Log) {
        // tokio rounds the ring up to a power of two: counting against the size asked for
        // starts the history early, never late.
        if log.room == 0 {
            log.room = self.capacity.saturating_sub(self.tx.len());
        }
        if log.room == 0 {
            let recent = std::mem::take(&mut log.recent);
            log.recent_events = 0;
            log.history = Some(recent.iter().flat_map(|b| journaled(b)).cloned().collect());
        } else {
            log.room -= 1;
        }
    }

    pub fn subscribe_from(self: &Arc<Self>, after: u64) -> Subscription {
        let (backlog, rx, cut) = self.cut(after);
        Subscription {
            shared: self.clone(),
            backlog: backlog.into_iter(),
            live: None,
            rx,
            cut,
            last: after,
            lags: 0,
            batches: 0,
            ended: false,
            done: self.done.subscribe(),
        }
    }

    /// Every event after `after` up to the last published one, a live receiver for what comes
    /// next, and the sequence number where the two meet. The first catch-up of the run replays
    /// the journal so far (outside the log lock: the driver goes on meanwhile, its events
    /// recorded); every later one copies from the history.
    fn cut(&self, after: u64) -> (Vec<Arc<Event>>, broadcast::Receiver<Batch>, u64) {
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
            // What was published goes out first: the cut covers it.
            self.flush(&mut log);
            let (cut, rx) = (log.last_seq, self.tx.subscribe());
            if after >= cut {
                return (Vec::new(), rx, cut);
            }
            if let Some(h) = &log.history
                && (*complete || h.first().is_some_and(|e| e.seq <= after + 1))
            {
                return (between(h, after, cut), rx, cut);
            }
            // The ring's shadow (or the run's first events) reaches back far enough.
            let reaches = log
                .recent
                .iter()
                .flat_map(|b| journaled(b))
                .next()
                .is_some_and(|e| e.seq <= after + 1);
            if log.history.is_none() && reaches {
                let backlog = log
                    .recent
                    .iter()
                    .flat_map(|b| journaled(b))
                    .filter(|e| e.seq > after && e.seq <= cut)
                    .cloned()
                    .collect();
                return (backlog, rx, cut);
            }
            if log.history.is_none() {
                log.history = Some(Vec::new());
                log.recent = VecDeque::new();
                log.recent_events = 0;
            }
            (log.journal.clone(), cut, rx)
        };
        self.replays.fetch_add(1, Ordering::Relaxed);
        let (_, replayed) = self.def.replay(&self.run_id, &journal);
        drop(journal);
        let mut log = lock();
        let kept = log.history.take().unwrap_or_default();
        // The replay ends where the kept events begin (or overlaps them): kept ones are the
        // published events themselves, so they win.
        let first_kept = kept.first().map_or(u64::MAX, |e| e.seq);
        let mut history: Vec<Arc<Event>> = replayed
            .into_iter()
            .filter(|e| e.seq < first_kept)
            .map(Arc::new)
            .collect();
        history.extend(kept);
        let backlog = between(&history, after, cut);
        log.history = Some(history);
        *complete = true;
        (backlog, rx, cut)
    }

    pub async fn submit(&self, op: Op, queued: bool) -> Result<(), OpError> {
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
        if self.ops.send(OpRequest { op, queued, reply }).is_err() {
            return Err(gone());
        }
        verdict.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// The journaled events of a batch (live-only ones left out), in order.
fn journaled(batch: &[Arc<Event>]) -> impl Iterator<Item = &Arc<Event>> {
    batch.iter().filter(|e| !e.kind.is_ephemeral())
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
    /// The live batch being read, and the position in it.
    live: Option<(Batch, usize)>,
    rx: broadcast::Receiver<Batch>,
    cut: u64,
    last: u64,
    lags: u64,
    batches: u64,
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
            if let Some((batch, at)) = &mut self.live {
                if let Some(e) = batch.get(*at) {
                    *at += 1;
                    if e.kind.is_ephemeral() {
                        return Some(e.clone());
                    }
                    if e.seq <= self.cut.max(self.last) {
                        continue;
                    }
                    self.last = e.seq;
                    return Some(e.clone());
                }
                self.live = None;
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
                Ok(batch) => {
                    self.batches += 1;
                    self.live = Some((batch, 0));
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Fell behind the ring: catch up from the kept events.
                    tracing::debug!(run = %self.shared.run_id, missed = n, "subscriber lagged; catching up");
                    let (backlog, rx, cut) = self.shared.cut(self.last);
                    self.lags += backlog.len() as u64;
                    self.backlog = backlog.into_iter();
                    self.rx = rx;
                    self.cut = cut;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// How many events this subscriber, having fallen behind the ring, was caught up on from
    /// the run's kept events (or, for events from before the run kept any, a replay of its
    /// journal) instead of reading them live.
    pub fn lagged(&self) -> u64 {
        self.lags
    }

    /// How many batches this subscriber read live: the driver sends the events of a batch of
    /// inputs together (one send, one wake-up), so this is at most the number of live events
    /// and usually well under it.
    pub fn live_batches(&self) -> u64 {
        self.batches
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
        self.shared.submit(op, false).await
    }

    /// Submits an op taken from the store's queue (recorded, and answered, by another process
    /// or earlier): like [`RunHandle::submit`], except that a decision that no longer applies
    /// (its presentation was decided otherwise, or presented again) is journaled as dropped
    /// (a `decision_dropped` event, in the audit) as well as refused.
    pub async fn submit_queued(&self, op: Op) -> Result<(), OpError> {
        self.shared.submit(op, true).await
    }

    /// Every event after sequence number `seq` (0: from the start), then live events.
    pub fn subscribe_from(&self, seq: u64) -> Subscription {
        self.shared.subscribe_from(seq)
    }

    /// How many times the run's journal was replayed to make events for a subscriber: at most
    /// once per run, and only for a subscriber that asked for events from before the run began
    /// keeping them (one that joined late). A subscriber that falls behind the ring is served
    /// from the kept events instead.
    pub fn event_replays(&self) -> u32 {
        self.shared.replays.load(Ordering::Relaxed)
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
            by: None,
        })
        .await
    }

    /// The result, once the run is over (None while it runs).
    pub fn result(&self) -> Option<RunResult> {
        self.shared.done.borrow().as_deref().cloned()
    }

    /// Waits until the run ends (`Some(result)`) or can only move on when somebody decides or
    /// one of its timers fires (`None`): nothing streams or runs. Such a run can be parked
    /// (dropped, and resumed from its journal later): its timers are rebuilt with it and fire
    /// at the time they were set for.
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

    /// True while the run can only move on when somebody submits an op or one of its timers
    /// fires (see [`RunHandle::wait_or_idle`]).
    pub fn is_idle(&self) -> bool {
        *self.shared.idle.borrow()
    }

    /// How many subscribers follow the run's events now.
    pub fn watchers(&self) -> usize {
        self.shared.tx.receiver_count()
    }

    /// The calls awaiting a decision now, with the fingerprint a decision may quote.
    pub fn awaiting(&self) -> Vec<(crate::protocol::CallId, crate::protocol::Call, String)> {
        let (m, _) = self.shared.def.replay(&self.shared.run_id, &self.journal());
        m.awaiting()
            .into_iter()
            .map(|(id, c)| {
                let h = crate::protocol::params_hash(&c);
                (id, c, h)
            })
            .collect()
    }

    /// The run's end signal, without a handle: it does not keep the run going (the run stops
    /// when its last handle is dropped, as ever). Resolves `true` once the run has its result,
    /// `false` when its driver stopped without one (dropped, parked).
    pub fn ended(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let mut rx = self.shared.done.subscribe();
        async move { rx.wait_for(Option::is_some).await.is_ok() }
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
    RunResult::stopped(crate::machine::RunError::new(
        "run.driver_lost",
        "the run's driver stopped without a result (the runtime shut down or it panicked); the run can be resumed",
    ))
}
