//! Runs' span builders on a thread of their own, so that tracing costs the run's driver a
//! push onto a queue per batch of events instead of building spans and metrics on its own
//! thread (callgrind, chain0 with OTLP export: 19,000 instructions per call moved off the
//! driver's thread).
//!
//! One worker thread serves every run of the process. A run's [`SpanFeed`] hands it each
//! published event (shared, not copied) with the journal entries the spans read that were
//! added since the last one ([`RunSpans::reads`]); the worker owns the run's [`RunSpans`] and
//! calls [`RunSpans::observe_new`], in the order the run published.
//!
//! Waking a thread costs the waker a system call, and a wake-up per batch of events was most of
//! what tracing cost a chain of calls (strace: 0.7 more `futex` calls per hop). So events are
//! handed over in batches ([`SpanFeed::flush`], called by the driver after each batch of inputs
//! it handled) onto a queue the worker looks at every 10 ms while runs are busy, without being
//! woken. After 50 ms with nothing to do (`IDLE`) it sleeps until woken, so a process whose runs
//! wait for a reviewer spends next to nothing on it: every 2 s asleep (`ASLEEP`) it hands what
//! it freed back to the allocator ([`crate::idle`]). A run that ends waits for its feed to be drained
//! ([`SpanFeed::drained`], which wakes the worker) before it says so, and [`drain_all`] (called
//! by `telemetry::flush`) waits for every feed before the exporters flush: a span is never lost
//! to the hand-over.
//!
//! Deliberately not here: what the spans say (`spans`) or where they go (`export`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};
use std::time::{Duration, Instant};

use super::RunSpans;
use crate::machine::JournalEntry;
use crate::protocol::Event;

enum Msg {
    Open(u64, Box<RunSpans>),
    Events(u64, Vec<Item>),
    /// Everything sent before it was handled.
    Drained(Reply),
    Close(u64),
}

/// One published event with the journal entries added before it.
struct Item {
    new: Vec<JournalEntry>,
    last_seq: Option<u64>,
    event: Arc<Event>,
}

/// Events held before a batch is handed over even if the driver has not flushed.
const BATCH: usize = 256;

enum Reply {
    Async(tokio::sync::oneshot::Sender<()>),
    Sync(mpsc::SyncSender<()>),
}

/// How often the worker looks at its queue while runs are busy. Each look wakes a thread that
/// preempts one of the run's: looking every millisecond added 7 to 10 points to a traced
/// chain's time, while a fan-out, whose cores are both busy, did about 6 points better with
/// it (`docs/observability.md`, "Fifth round"). A span reaches its exporter up to this much
/// later, which is nothing beside an OTLP batch's wait.
const POLL: Duration = Duration::from_millis(10);
/// How long the worker keeps looking with nothing to do before it sleeps until woken.
const IDLE: Duration = Duration::from_millis(50);
/// How long the sleeping worker waits before it hands what it freed back ([`crate::idle`]),
/// and again after each such wait while nothing comes.
const ASLEEP: Duration = Duration::from_secs(2);

/// What runs hand the worker.
struct Queue {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    msgs: Vec<Msg>,
    /// The worker sleeps until woken (it no longer looks every `POLL`).
    asleep: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }

    /// Queues `msg`; wakes the worker when it sleeps, or when `urgent` (somebody waits).
    fn push(&self, msg: Msg, urgent: bool) {
        let mut s = self.lock();
        s.msgs.push(msg);
        let wake = urgent || s.asleep;
        drop(s);
        if wake {
            self.wake.notify_one();
        }
    }

    /// The next messages, waiting for them as the module says.
    fn next(&self, out: &mut Vec<Msg>) {
        let mut s = self.lock();
        let mut idle_since = Instant::now();
        while s.msgs.is_empty() {
            if idle_since.elapsed() >= IDLE {
                s.asleep = true;
                let timed_out;
                (s, timed_out) = match self.wake.wait_timeout(s, ASLEEP) {
                    Ok((s, t)) => (s, t.timed_out()),
                    Err(p) => (p.into_inner().0, false),
                };
                if timed_out && s.msgs.is_empty() {
                    // Asleep a while: what the worker freed goes back to the allocator (not
                    // under the lock; a message queued meanwhile is seen below).
                    drop(s);
                    crate::idle::release();
                    s = self.lock();
                    continue;
                }
                s.asleep = false;
                idle_since = Instant::now();
            } else {
                s = match self.wake.wait_timeout(s, POLL) {
                    Ok((s, _)) => s,
                    Err(p) => p.into_inner().0,
                };
            }
        }
        std::mem::swap(&mut s.msgs, out);
    }
}

static WORKER: OnceLock<Option<Arc<Queue>>> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(1);

fn worker() -> Option<&'static Queue> {
    WORKER
        .get_or_init(|| {
            let q = Arc::new(Queue {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            });
            let mine = q.clone();
            let spawned = std::thread::Builder::new()
                .name("dagloop-spans".into())
                .spawn(move || serve(&mine));
            match spawned {
                Ok(_) => Some(q),
                Err(e) => {
                    tracing::warn!("no thread for runs' spans, so none are made: {e}");
                    None
                }
            }
        })
        .as_deref()
}

fn serve(q: &Queue) {
    let mut runs: BTreeMap<u64, Box<RunSpans>> = BTreeMap::new();
    let mut msgs = Vec::new();
    loop {
        q.next(&mut msgs);
        for msg in msgs.drain(..) {
            match msg {
                Msg::Open(feed, spans) => {
                    runs.insert(feed, spans);
                }
                Msg::Events(feed, items) => {
                    if let Some(spans) = runs.get_mut(&feed) {
                        for i in items {
                            spans.observe_new(&i.new, i.last_seq, &i.event);
                        }
                    }
                }
                Msg::Drained(Reply::Async(tx)) => {
                    let _ = tx.send(());
                }
                Msg::Drained(Reply::Sync(tx)) => {
                    let _ = tx.send(());
                }
                Msg::Close(feed) => {
                    runs.remove(&feed);
                }
            }
        }
    }
}

/// One run's hand-over to the span worker.
pub struct SpanFeed {
    id: u64,
    tx: &'static Queue,
    /// How much of the journal was looked at.
    scanned: usize,
    /// Events not handed over yet.
    pending: Vec<Item>,
}

impl std::fmt::Debug for SpanFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanFeed").field("id", &self.id).finish()
    }
}

impl SpanFeed {
    /// Hands `spans` to the worker (None when it could not start: the run makes no spans).
    pub fn start(spans: Box<RunSpans>) -> Option<Self> {
        let tx = worker()?;
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        tx.push(Msg::Open(id, spans), false);
        Some(SpanFeed {
            id,
            tx,
            scanned: 0,
            pending: Vec::new(),
        })
    }

    /// The run published `event`; `journal` is its journal as handled so far. Events the spans
    /// do not use ([`RunSpans::uses`]) are not kept; the journal entries before them go with
    /// the next event. Held until [`SpanFeed::flush`] (or until a batch is full).
    pub fn event(&mut self, journal: &[JournalEntry], event: &Arc<Event>) {
        if !RunSpans::uses(event) {
            return;
        }
        let new = journal
            .get(self.scanned..)
            .unwrap_or_default()
            .iter()
            .filter(|e| RunSpans::reads(&e.input))
            .cloned()
            .collect();
        self.scanned = journal.len();
        self.pending.push(Item {
            new,
            last_seq: journal.last().map(|e| e.seq),
            event: event.clone(),
        });
        if self.pending.len() >= BATCH {
            self.flush();
        }
    }

    /// Hands the events held so far to the worker.
    pub fn flush(&mut self) {
        if !self.pending.is_empty() {
            // The next batch is likely the same size: room for it, so it never regrows.
            let room = self.pending.len();
            let items = std::mem::replace(&mut self.pending, Vec::with_capacity(room));
            self.tx.push(Msg::Events(self.id, items), false);
        }
    }

    /// Resolves once every event published so far has made its spans.
    pub fn drained(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        self.flush();
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.push(Msg::Drained(Reply::Async(tx)), true);
        rx
    }
}

impl Drop for SpanFeed {
    fn drop(&mut self) {
        self.flush();
        self.tx.push(Msg::Close(self.id), false);
    }
}

/// Waits (at most `limit`) until every event handed to the worker so far has made its spans.
pub fn drain_all(limit: Duration) {
    let Some(Some(q)) = WORKER.get() else {
        return;
    };
    let (done, wait) = mpsc::sync_channel(1);
    q.push(Msg::Drained(Reply::Sync(done)), true);
    let _ = wait.recv_timeout(limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the worker sleeps until woken.
    fn worker_asleep() -> bool {
        matches!(WORKER.get(), Some(Some(q)) if q.lock().asleep)
    }

    /// The worker stops looking at its queue once runs go quiet, and a run's drain still wakes
    /// it: a run waiting for a reviewer costs no wake-ups.
    #[test]
    fn the_worker_sleeps_when_runs_are_quiet_and_a_drain_wakes_it() {
        let goal = crate::goal::Goal::from_json(
            r#"{"goal": "g", "output_schema": {}}"#,
            "t".as_ref(),
            ".".into(),
        )
        .expect("goal");
        let config = goal.agent_config(BTreeMap::new()).expect("config");
        let spans = RunSpans::new("run-quiet", &config, &[], None, false, false);
        let mut feed = SpanFeed::start(Box::new(spans)).expect("a worker");
        let until = Instant::now() + Duration::from_secs(10);
        while !worker_asleep() {
            assert!(Instant::now() < until, "the worker never went to sleep");
            std::thread::sleep(IDLE / 5);
        }
        let mut drained = feed.drained();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match drained.try_recv() {
                Ok(()) => break,
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                    assert!(Instant::now() < until, "a drain did not wake the worker");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("the worker dropped the drain: {e}"),
            }
        }
    }
}
