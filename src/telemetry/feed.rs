//! Runs' span builders on a thread of their own, so that tracing costs the run's driver a
//! channel send per event instead of building spans and metrics on its own thread (callgrind,
//! chain0 with OTLP export: 19,000 instructions per call moved off the driver's thread).
//!
//! One worker thread serves every run of the process. A run's [`SpanFeed`] hands it each
//! published event (shared, not copied) with the journal entries the spans read that were
//! added since the last one ([`RunSpans::reads`]); the worker owns the run's [`RunSpans`] and
//! calls [`RunSpans::observe_new`], in the order the run published. A run that ends waits for
//! its feed to be drained ([`SpanFeed::drained`]) before it says so, and [`drain_all`] (called
//! by `telemetry::flush`) waits for every feed before the exporters flush: a span is never
//! lost to the hand-over.
//!
//! Deliberately not here: what the spans say (`spans`) or where they go (`export`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use super::RunSpans;
use crate::machine::JournalEntry;
use crate::protocol::Event;

enum Msg {
    Open(u64, Box<RunSpans>),
    Event {
        feed: u64,
        new: Vec<JournalEntry>,
        last_seq: Option<u64>,
        event: Arc<Event>,
    },
    /// Everything sent before it was handled.
    Drained(Reply),
    Close(u64),
}

enum Reply {
    Async(tokio::sync::oneshot::Sender<()>),
    Sync(mpsc::SyncSender<()>),
}

static WORKER: OnceLock<Option<mpsc::Sender<Msg>>> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(1);

fn worker() -> Option<&'static mpsc::Sender<Msg>> {
    WORKER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Msg>();
            let spawned = std::thread::Builder::new()
                .name("dagloop-spans".into())
                .spawn(move || serve(rx));
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!("no thread for runs' spans, so none are made: {e}");
                    None
                }
            }
        })
        .as_ref()
}

fn serve(rx: mpsc::Receiver<Msg>) {
    let mut runs: BTreeMap<u64, Box<RunSpans>> = BTreeMap::new();
    for msg in rx {
        match msg {
            Msg::Open(feed, spans) => {
                runs.insert(feed, spans);
            }
            Msg::Event {
                feed,
                new,
                last_seq,
                event,
            } => {
                if let Some(spans) = runs.get_mut(&feed) {
                    spans.observe_new(&new, last_seq, &event);
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

/// One run's hand-over to the span worker.
pub struct SpanFeed {
    id: u64,
    tx: &'static mpsc::Sender<Msg>,
    /// How much of the journal was looked at.
    scanned: usize,
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
        tx.send(Msg::Open(id, spans)).ok()?;
        Some(SpanFeed { id, tx, scanned: 0 })
    }

    /// The run published `event`; `journal` is its journal as handled so far. Ephemeral events
    /// make no spans and are not sent.
    pub fn event(&mut self, journal: &[JournalEntry], event: &Arc<Event>) {
        if event.kind.is_ephemeral() {
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
        let _ = self.tx.send(Msg::Event {
            feed: self.id,
            new,
            last_seq: journal.last().map(|e| e.seq),
            event: event.clone(),
        });
    }

    /// Resolves once every event handed over so far has made its spans.
    pub fn drained(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Msg::Drained(Reply::Async(tx)));
        rx
    }
}

impl Drop for SpanFeed {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Close(self.id));
    }
}

/// Waits (at most `limit`) until every event handed to the worker so far has made its spans.
pub fn drain_all(limit: Duration) {
    let Some(Some(tx)) = WORKER.get() else {
        return;
    };
    let (done, wait) = mpsc::sync_channel(1);
    if tx.send(Msg::Drained(Reply::Sync(done))).is_ok() {
        let _ = wait.recv_timeout(limit);
    }
}
