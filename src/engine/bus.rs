//! The event bus: stamps each [`EventKind`] with the run's next sequence number, the step and
//! the time, hands it to an optional synchronous sink (to persist before anyone sees it), then
//! broadcasts it to every subscriber.
//!
//! Delivery never slows the scheduler: publishing does not wait for subscribers. Subscribers
//! read from a tokio broadcast ring of `capacity` events; one that falls more than `capacity`
//! events behind gets `RecvError::Lagged(n)` on its next receive, losing the `n` oldest events,
//! and continues from the oldest event still held. Anyone that must see every event (the store)
//! uses the sink instead, which runs inside `publish` in sequence order.
//!
//! Deliberately not here: filtering, formatting or persisting events (consumers do that).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::protocol::{CallId, Event, EventKind, Millis};

/// Where the bus reads the time from.
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// Called with every event, in order, before it is broadcast.
pub type Sink = Box<dyn Fn(&Event) + Send + Sync>;

/// The default ring size. tokio allocates and touches every slot of the ring when the channel
/// is made, so this is memory every run pays up front: 65,536 slots cost about 1.7 MiB of RSS
/// per run (`cargo bench --bench server`, live runs). A subscriber that falls further behind is
/// caught up from the run's journal without gap or duplicate, so a small ring costs a slow
/// consumer a replay, never an event.
pub const DEFAULT_CAPACITY: usize = 1_024;

/// Milliseconds since the Unix epoch from the system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Millis)
    })
}

struct Inner {
    seq: u64,
    sink: Option<Sink>,
}

/// Sequence numbers, timestamps and delivery for one run's events.
pub struct EventBus {
    run_id: Arc<str>,
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Event>,
    clock: Clock,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("last_seq", &self.last_seq())
            .field("subscribers", &self.tx.receiver_count())
            .finish()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus::new(DEFAULT_CAPACITY)
    }
}

impl EventBus {
    /// A bus whose subscribers may fall up to `capacity` events behind; system clock, no sink.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        EventBus {
            run_id: Arc::from(""),
            inner: Mutex::new(Inner { seq: 0, sink: None }),
            tx,
            clock: system_clock(),
        }
    }

    /// Stamps every event with this run id (builder style).
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Arc::from(run_id.into());
        self
    }

    /// The run id stamped on events (empty when none was given).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Uses `clock` for timestamps (tests use tokio's paused clock) (builder style).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Calls `sink` with every event before broadcasting it (builder style).
    pub fn with_sink(self, sink: Sink) -> Self {
        if let Ok(mut inner) = self.inner.lock() {
            inner.sink = Some(sink);
        }
        self
    }

    /// Continues numbering after `seq` (a resumed run) (builder style).
    pub fn starting_after(self, seq: u64) -> Self {
        if let Ok(mut inner) = self.inner.lock() {
            inner.seq = seq;
        }
        self
    }

    /// A new subscriber, receiving every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// The current time on the bus's clock.
    pub fn now(&self) -> Millis {
        (self.clock)()
    }

    /// The sequence number of the last published event (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.inner.lock().map_or(0, |i| i.seq)
    }

    /// Stamps and delivers one event; returns its sequence number.
    pub fn publish(&self, step: u32, call: Option<CallId>, kind: EventKind) -> u64 {
        let at = self.now();
        let Ok(mut inner) = self.inner.lock() else {
            return 0;
        };
        inner.seq += 1;
        let event = Event {
            run_id: self.run_id.clone(),
            seq: inner.seq,
            step,
            at,
            call,
            parent: None,
            depth: 0,
            kind,
        };
        if let Some(sink) = &inner.sink {
            sink(&event);
        }
        if self.tx.receiver_count() > 0 {
            // Only fails when every receiver is gone meanwhile; nothing to do then.
            let _ = self.tx.send(event);
        }
        inner.seq
    }
}

/// A new run id: `run-` followed by the time in milliseconds and a per-process counter, in hex.
pub fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "run-{ms:x}-{:x}-{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::broadcast::error::RecvError;

    #[tokio::test]
    async fn numbers_in_order_sinks_first_and_reports_lag() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let bus = EventBus::new(2)
            .with_clock(Arc::new(|| 42))
            .with_sink(Box::new(move |e| s2.lock().expect("lock").push(e.seq)));
        let mut fast = bus.subscribe();
        let mut slow = bus.subscribe();
        for _ in 0..3 {
            bus.publish(1, Some(CallId(9)), EventKind::Unblocked);
            let e = fast.recv().await.expect("event");
            assert_eq!((e.at, e.step, e.call), (42, 1, Some(CallId(9))));
        }
        assert_eq!(*seen.lock().expect("lock"), vec![1, 2, 3]);
        assert_eq!(bus.last_seq(), 3);
        assert!(matches!(slow.recv().await, Err(RecvError::Lagged(1))));
        assert_eq!(slow.recv().await.expect("event").seq, 2);
    }
}
