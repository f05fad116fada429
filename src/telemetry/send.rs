//! Sending dagloop's spans over OTLP: spans are encoded into a batch as they end
//! ([`otlp::Batch`]); a full batch (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512) goes to a thread of
//! its own that sends it (HTTP/protobuf or gRPC), and that thread also sends what is pending
//! every `OTEL_BSP_SCHEDULE_DELAY` (5 s) and on flush.
//!
//! Spans wait in at most `OTEL_BSP_MAX_QUEUE_SIZE` (16,384) before the sending thread takes
//! them; past that a batch is dropped, counted ([`dropped`]) and warned about, as the SDKs do,
//! so an unreachable collector never holds up a run or grows its memory without bound. A failed
//! request is not sent again: it is counted as dropped and logged, once per streak of failures.
//!
//! Deliberately not here: what a span says (`spans`), its bytes (`otlp`), or reading the
//! `OTEL_*` variables (`export`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::otlp::{Batch, Envelope};
use super::record::SpanRecord;
use super::spans::SpanExport;

/// Sends one `ExportTraceServiceRequest`.
pub(super) type Sender = Box<dyn FnMut(Vec<u8>) -> Result<(), String> + Send>;

/// How spans are batched and queued.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// Spans per request.
    pub batch: usize,
    /// Spans that may wait to be sent.
    pub queue: usize,
    /// How long a span may wait in a batch that is not full.
    pub delay: Duration,
    /// Links a span keeps (`OTEL_SPAN_LINK_COUNT_LIMIT`).
    pub links: usize,
    /// Characters a string attribute keeps (None: all).
    pub values: Option<usize>,
}

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans this process's OTLP export dropped: the queue was full or the collector refused them.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

enum Msg {
    Batch(Batch),
    Flush(mpsc::SyncSender<()>),
}

struct Shared {
    pending: Mutex<Batch>,
    /// A drop was warned about and nothing was sent since.
    warned: AtomicBool,
}

impl Shared {
    fn take(&self) -> Batch {
        match self.pending.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    fn dropped(&self, n: usize, why: &str) {
        DROPPED.fetch_add(n as u64, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("OpenTelemetry spans dropped ({n}): {why}");
        }
    }
}

/// The span exporter `OTEL_EXPORTER_OTLP_*` sets up.
pub(super) struct Otlp {
    shared: Arc<Shared>,
    tx: mpsc::SyncSender<Msg>,
    batch: usize,
    links: usize,
    values: Option<usize>,
}

impl Otlp {
    /// Starts the sending thread.
    pub fn start(
        settings: Settings,
        envelope: Envelope,
        send: Sender,
    ) -> Result<Self, std::io::Error> {
        let batch = settings.batch.max(1);
        let (tx, rx) = mpsc::sync_channel((settings.queue / batch).max(1));
        let shared = Arc::new(Shared {
            pending: Mutex::new(Batch::default()),
            warned: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("dagloop-otlp".into())
            .spawn(move || serve(&s, &rx, settings.delay, &envelope, send))?;
        Ok(Otlp {
            shared,
            tx,
            batch,
            links: settings.links,
            values: settings.values,
        })
    }

    /// Sends everything ended so far and waits (at most `limit` in all, even when the
    /// collector does not answer and the queue is full) until it was sent.
    pub fn flush(&self, limit: Duration) {
        let until = std::time::Instant::now() + limit;
        let (done, wait) = mpsc::sync_channel(1);
        let mut msg = Msg::Flush(done);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(mpsc::TrySendError::Full(m)) if std::time::Instant::now() < until => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        let _ = wait.recv_timeout(left);
    }
}

impl SpanExport for Otlp {
    fn link_limit(&self) -> usize {
        self.links
    }

    fn value_limit(&self) -> Option<usize> {
        self.values
    }

    fn export(&self, span: &SpanRecord) {
        let full = {
            let mut pending = match self.shared.pending.lock() {
                Ok(p) => p,
                Err(poisoned) => poisoned.into_inner(),
            };
            pending.push(span);
            (pending.len() >= self.batch).then(|| pending.take())
        };
        if let Some(b) = full {
            let n = b.len();
            match self.tx.try_send(Msg::Batch(b)) {
                Ok(()) => {}
                Err(mpsc::TrySendError::Full(_)) => self
                    .shared
                    .dropped(n, "more spans ended than the collector took in time"),
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    self.shared.dropped(n, "the sending thread is gone")
                }
            }
        }
    }
}

fn serve(
    shared: &Shared,
    rx: &mpsc::Receiver<Msg>,
    delay: Duration,
    envelope: &Envelope,
    mut send: Sender,
) {
    let mut send_batch = |b: Batch| {
        if b.is_empty() {
            return;
        }
        let n = b.len();
        match send(envelope.request(&b)) {
            Ok(()) => shared.warned.store(false, Ordering::Relaxed),
            Err(e) => shared.dropped(n, &format!("the collector did not take them: {e}")),
        }
    };
    loop {
        match rx.recv_timeout(delay) {
            Ok(Msg::Batch(b)) => send_batch(b),
            Ok(Msg::Flush(done)) => {
                send_batch(shared.take());
                let _ = done.send(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => send_batch(shared.take()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                send_batch(shared.take());
                return;
            }
        }
    }
}
