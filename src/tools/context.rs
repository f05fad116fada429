//! What an activity gets besides its call: an [`ActivityContext`] carrying the call's idempotency
//! key, the parent data a delegate may see, a [`ProgressSink`] to report progress through
//! while the call runs (the engine turns reports into `call_progress` run events), and the
//! run's [`ResultBudget`]: how much of a result the run can still keep, so an activity that
//! reads its result as a stream stops there instead of holding what the run would not keep.
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

/// Characters of an over-bound result kept in its record.
pub const HEAD_CHARS: usize = 1024;

/// What a run can still keep of one call's result: its bound of kept tool-result bytes (the
/// operator's `kept_result_bytes`) and what it had kept when the call started. It also writes the
/// `run.result_bound` record that stands for a result over the bound, whether the engine found
/// the whole result too big or an activity stopped reading it ([`ResultBudget::over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResultBudget {
    /// The most bytes of tool results the run keeps.
    pub limit: u64,
    /// Bytes it had kept.
    pub kept: u64,
}

impl ResultBudget {
    /// The bytes the run can still keep.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.kept)
    }

    /// The message and details of the `run.result_bound` failure standing for a result: `text`
    /// is the result as far as it was read (all of it when `complete`; else the activity stopped
    /// reading after `text.len()` bytes, past what the run could keep), `failed` when it was an
    /// error. The details keep its size (`bytes`: of the whole result, or of what was read), the
    /// SHA-256 and the first [`HEAD_CHARS`] characters of what was read.
    pub fn over(&self, text: &[u8], complete: bool, failed: bool) -> (String, Value) {
        let size = text.len() as u64;
        let digest = ring::digest::digest(&ring::digest::SHA256, text);
        let sha256: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        let head: String = String::from_utf8_lossy(text)
            .chars()
            .take(HEAD_CHARS)
            .collect();
        let message = if complete {
            format!(
                "the call's result ({size} bytes) would take the run over its bound of {} bytes of kept tool results ({} kept so far); it was not kept: its size, SHA-256 and first {HEAD_CHARS} characters are",
                self.limit, self.kept
            )
        } else {
            format!(
                "the call's result was longer than the {} bytes the run could still keep (its bound is {} bytes of kept tool results, {} kept so far): it was read no further than {size} bytes and not kept; the SHA-256 and first {HEAD_CHARS} characters of what was read are",
                self.remaining(),
                self.limit,
                self.kept
            )
        };
        let details = serde_json::json!({
            "bytes": size,
            "complete": complete,
            "sha256": sha256,
            "head": head,
            "failed": failed,
            "bound": self.limit,
            "kept": self.kept,
        });
        (message, details)
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
    /// What the run can still keep of the call's result (None: no bound). An activity that
    /// streams its result may stop reading past [`ResultBudget::remaining`] and fail with
    /// [`ActivityError::ResultBound`](super::ActivityError::ResultBound).
    pub result_budget: Option<ResultBudget>,
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

    /// With what the run can still keep of the result.
    pub fn with_result_budget(mut self, budget: Option<ResultBudget>) -> Self {
        self.result_budget = budget;
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
