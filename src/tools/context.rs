//! What an activity gets besides its call: an [`ActivityContext`] carrying the call's idempotency
//! key, the parent data a delegate may see, and a [`ProgressSink`] to report progress through
//! while the call runs (the engine turns reports into `call_progress` run events).
//!
//! Deliberately not here: publishing events or reading clocks (the engine's sink does both), and
//! any rate limiting of reports (an activity reports what its source reports).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};

/// One progress report of a running call.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Progress so far (units are the activity's; often a count or a fraction).
    pub progress: f64,
    /// The total, when the activity knows it.
    pub total: Option<f64>,
    /// A human-readable message.
    pub message: Option<String>,
}

impl Progress {
    /// A report of `progress` out of `total`.
    pub fn new(progress: f64, total: Option<f64>) -> Self {
        Progress {
            progress,
            total,
            message: None,
        }
    }

    /// The same report with a message.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

struct Listener {
    f: Box<dyn Fn(Progress) + Send + Sync>,
    open: AtomicBool,
}

/// Where a running activity reports progress. Cheap to clone; reports go nowhere when nobody
/// listens (the default) or once the sink is closed (the engine closes a call's sink when its
/// activity ends, so a report from a task the activity left behind never follows the call's end).
#[derive(Clone, Default)]
pub struct ProgressSink(Option<Arc<Listener>>);

impl ProgressSink {
    /// A sink that hands every report to `f` (called on the activity's task: keep it quick).
    pub fn new(f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        ProgressSink(Some(Arc::new(Listener {
            f: Box::new(f),
            open: AtomicBool::new(true),
        })))
    }

    /// A sink that drops every report.
    pub fn none() -> Self {
        ProgressSink(None)
    }

    /// Reports progress (dropped when nobody listens).
    pub fn report(&self, progress: Progress) {
        if let Some(l) = &self.0
            && l.open.load(Ordering::Acquire)
        {
            (l.f)(progress);
        }
    }

    /// Closes this sink and every clone of it: later reports are dropped.
    pub fn close(&self) {
        if let Some(l) = &self.0 {
            l.open.store(false, Ordering::Release);
        }
    }

    /// True when reports go somewhere (an activity may skip asking its source for progress
    /// otherwise).
    pub fn is_listening(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|l| l.open.load(Ordering::Acquire))
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_listening() {
            "ProgressSink(listening)"
        } else {
            "ProgressSink(none)"
        })
    }
}

/// What the registry hands an activity with each call.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ActivityContext {
    /// The same for every attempt at one call of a tool declared `"_idempotent": true` (the
    /// engine uses `RUN:CALL`); the `http` activity sends it as the `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// For delegates: the parent context the call's `_scopes` allow (kind name → value).
    pub scoped: Map<String, Value>,
    /// Where the call reports progress.
    pub progress: ProgressSink,
}

impl ActivityContext {
    /// No key, no scoped data, progress dropped.
    pub fn new() -> Self {
        ActivityContext::default()
    }

    /// With an idempotency key.
    pub fn with_key(mut self, key: Option<String>) -> Self {
        self.idempotency_key = key;
        self
    }

    /// With the parent data a delegate may see.
    pub fn with_scoped(mut self, scoped: Map<String, Value>) -> Self {
        self.scoped = scoped;
        self
    }

    /// With a progress sink.
    pub fn with_progress(mut self, progress: ProgressSink) -> Self {
        self.progress = progress;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_sink_hands_reports_on_until_closed_and_the_default_drops_them() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let sink = ProgressSink::new(move |p| s.lock().unwrap().push(p));
        assert!(sink.is_listening());
        sink.clone()
            .report(Progress::new(1.0, Some(4.0)).message("a quarter"));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Progress {
                progress: 1.0,
                total: Some(4.0),
                message: Some("a quarter".into())
            }]
        );
        let kept = sink.clone();
        sink.close();
        assert!(!kept.is_listening());
        kept.report(Progress::new(3.0, None));
        assert_eq!(seen.lock().unwrap().len(), 1, "a closed sink drops reports");
        let none = ActivityContext::new().progress;
        assert!(!none.is_listening());
        none.report(Progress::new(2.0, None));
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
}
