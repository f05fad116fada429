//! What the engine stamps a run's events with, and how many of them it holds for subscribers:
//! the run's clock, new run ids, and the size of the live event ring.
//!
//! The events themselves are numbered by the run's machine and published by its driver through
//! the run's handle (`handle::Shared::publish`, then one send per batch, `handle::Shared::flush`),
//! which catches up subscribers that fall behind.
//!
//! Deliberately not here: filtering, formatting or persisting events (consumers do that).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::protocol::Millis;

/// Where the engine reads the time from.
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// The default ring size, in batches (the driver sends the events of a batch of inputs
/// together, `handle::Shared::flush`). tokio allocates and touches every slot of the ring when the channel
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
