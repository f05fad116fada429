//! Where a run's journal goes before the run acts on it.
//!
//! Every run keeps its journal in memory (late subscribers are caught up by replaying it); a
//! [`JournalSink`] is an extra, durable home (the store). The engine awaits the sink before it
//! hands the entries to the machine: a failing sink stops the run (status `stopped`, code
//! `store.journal_write`, resumable: nothing is recorded as its end) rather than letting it go
//! on unrecorded, and a panicking one is caught and treated the same. A sink that leases runs
//! (the store) is asked to renew the lease while the run is driven; a lost lease stops the run
//! the same way (`store.lease_lost`).
//!
//! While one batch is being committed ([`Commit`]), the driver goes on reading
//! what happens next into the following batch, and hands the committed batch to the machine as
//! soon as the sink answers: a run with a store waits for one commit at a time, never for one
//! commit per occurrence, and no entry is acted on before it is committed.
//!
//! Deliberately not here: what a durable sink does with the entries (the store's business).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use crate::machine::JournalEntry;

/// A journal sink failed; the run stops, resumable (status `stopped`): a write that fails is
/// not an ending the run decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the journal could not be written: {reason}")]
pub struct JournalError {
    /// A stable code: [`JournalError::WRITE`] or [`JournalError::LEASE_LOST`].
    pub code: &'static str,
    /// What the sink said (or that it panicked).
    pub reason: String,
}

impl JournalError {
    /// The write failed (the store stayed locked, the disk is full, the sink panicked...).
    pub const WRITE: &'static str = "store.journal_write";
    /// This process no longer owns the run: another one drives it now.
    pub const LEASE_LOST: &'static str = "store.lease_lost";

    /// An error with a code and what the sink said.
    pub fn new(code: &'static str, reason: impl Into<String>) -> Self {
        JournalError {
            code,
            reason: reason.into(),
        }
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

/// The future a sink returns.
pub type JournalFuture<'a> = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send + 'a>>;

/// A durable home for a run's journal. `append` resolves once the entries are safe (committed):
/// the engine acts on them only then. Entries arrive in order, each exactly once.
pub trait JournalSink: Send + Sync {
    /// Persists `entries` of run `run_id`.
    fn append<'a>(&'a self, run_id: &'a str, entries: &'a [JournalEntry]) -> JournalFuture<'a>;

    /// How often the driver renews its claim on the run with [`JournalSink::renew_lease`]
    /// while it drives it (None, the default: the sink has no leases).
    fn lease_every(&self) -> Option<Duration> {
        None
    }

    /// Renews this process's claim on run `run_id` (a store's lease). An error with code
    /// [`JournalError::LEASE_LOST`] stops the run at once, without a result; any other error is
    /// tried again at the next renewal (an append checks the lease anyway).
    fn renew_lease<'a>(&'a self, _run_id: &'a str) -> JournalFuture<'a> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Keeps what listing a run needs beside its journal: called (not awaited) after entries
    /// were handled whenever the count of calls awaiting a decision or the earliest timer
    /// changed. A store writes it after the appends already asked for; ignoring it (the
    /// default) loses nothing the journal does not hold.
    fn note(&self, _run_id: &str, _note: RunNote) {}

    /// Holds presentation `presentation` of run `run_id` for the decision `op`, which the
    /// driver is about to journal, against decisions recorded by other processes (a store's
    /// queue: DESIGN.md 3.6). `queued`: `op` was taken from that queue (it holds the
    /// presentation itself). Resolves to the decision that holds it already, when another one
    /// does (the driver refuses `op` then, even when it is the same decision: exactly one is
    /// accepted); None when `op` holds it. The default, for sinks that queue nothing: None.
    fn claim_decision<'a>(
        &'a self,
        _run_id: &'a str,
        _presentation: u64,
        _op: &'a crate::protocol::Op,
        _queued: bool,
    ) -> ClaimFuture<'a> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// The future [`JournalSink::claim_decision`] returns: the decision that holds the
/// presentation already, if another one does.
pub type ClaimFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<crate::protocol::Op>, JournalError>> + Send + 'a>>;

/// What the driver tells its sink about a run as it goes ([`JournalSink::note`]): how many
/// calls await a decision, and its earliest deadline (what wakes the run when it is parked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunNote {
    /// Calls awaiting a decision.
    pub awaiting: u64,
    /// The earliest of its timers (milliseconds since the Unix epoch), if it has any.
    pub wake_at: Option<crate::protocol::Millis>,
}

/// Appends through `sink`, turning a panic inside it into an error.
pub(super) async fn append_caught(
    sink: &dyn JournalSink,
    run_id: &str,
    entries: &[JournalEntry],
) -> Result<(), JournalError> {
    // Commit latency for `/metrics`, timed only when something counts it.
    let timed = crate::telemetry::metrics::enabled().then(std::time::Instant::now);
    let r = append_unwound(sink, run_id, entries).await;
    if let Some(t) = timed {
        crate::telemetry::metrics::journal_commit(t.elapsed().as_secs_f64());
    }
    r
}

async fn append_unwound(
    sink: &dyn JournalSink,
    run_id: &str,
    entries: &[JournalEntry],
) -> Result<(), JournalError> {
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| sink.append(run_id, entries))) {
        Ok(f) => f,
        Err(_) => {
            return Err(JournalError::new(
                JournalError::WRITE,
                "the journal sink panicked",
            ));
        }
    };
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(r) => r,
        Err(_) => Err(JournalError::new(
            JournalError::WRITE,
            "the journal sink panicked",
        )),
    }
}

type Committing =
    Pin<Box<dyn Future<Output = (Vec<JournalEntry>, Result<(), JournalError>)> + Send>>;

/// A batch of entries being committed: handed to the sink at once (a store serialises them on
/// the caller's thread and queues them for its writer), then awaited by the driver.
pub(super) struct Commit(Committing);

impl Commit {
    /// Hands `entries` of run `run_id` to `sink` now.
    pub fn start(
        sink: Arc<dyn JournalSink>,
        run_id: Arc<str>,
        entries: Vec<JournalEntry>,
    ) -> Commit {
        let mut fut: Committing = Box::pin(async move {
            let r = append_caught(sink.as_ref(), &run_id, &entries).await;
            (entries, r)
        });
        // One poll now, so the sink has the batch before the driver turns to other work; the
        // driver polls it again, with its own waker, until it is done.
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            fut = Box::pin(std::future::ready(out));
        }
        Commit(fut)
    }

    /// The entries once the sink answered, with its answer. Cancel-safe; not to be awaited
    /// again once it answered.
    pub async fn done(&mut self) -> (Vec<JournalEntry>, Result<(), JournalError>) {
        self.0.as_mut().await
    }
}
