//! The per-run bound on kept tool-result bytes: every call's result (or error object) is
//! journaled, so a run that gets three 50 MiB results keeps 150 MiB in the store and in memory.
//! The driver passes each activity's outcome through [`ResultBound::admit`] *before* the
//! machine (and so the journal) sees it: a result that would take the run over its bound is
//! replaced by a failure, `run.result_bound`, that keeps the result's size, its SHA-256 and its
//! first [`HEAD_CHARS`] characters. The journal holds what was kept, so a replay, a resume and a
//! view agree with the live run without deciding anything again.
//!
//! The bound counts the serialised size of every outcome value the run journaled; a resumed
//! run counts its journal's first ([`ResultBound::resumed`]). Each launched call is handed what
//! the run can still keep ([`ResultBound::budget`]), so an activity that streams its result
//! (`http`) stops reading there and returns the same record for what it read; such a record is
//! kept as it is.
//!
//! Deliberately not here: what the model is shown of a result (`context::sanitize`) or a
//! single response's size cap (each activity's own, e.g. `_http.max_bytes`).

use serde_json::{Value, json};

use crate::machine::{JournalEntry, RunInput};
use crate::scheduler::Outcome;

/// The bound when the operator sets none: 64 MiB of tool results per run.
pub const DEFAULT_KEPT_RESULT_BYTES: u64 = 64 * 1024 * 1024;

pub use crate::tools::HEAD_CHARS;
use crate::tools::ResultBudget;

/// The largest `run.result_bound` record an activity may hand back and have kept as it is (its
/// head is [`HEAD_CHARS`] characters of up to 4 bytes, escaped): anything bigger is bounded as
/// any other result.
const RECORD_BYTES: u64 = 16 * HEAD_CHARS as u64 + 1024;

/// The run's bound and what it has kept so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResultBound {
    /// The most bytes of tool results the run keeps.
    pub limit: u64,
    /// Bytes kept so far.
    pub kept: u64,
}

impl Default for ResultBound {
    fn default() -> ResultBound {
        ResultBound::new(DEFAULT_KEPT_RESULT_BYTES)
    }
}

impl ResultBound {
    /// A run that has kept nothing yet.
    pub fn new(limit: u64) -> ResultBound {
        ResultBound { limit, kept: 0 }
    }

    /// The run's bound as a call found it when it was launched (`budget`): a worker that runs
    /// the call away from the run (Temporal) bounds its result with the same rule before it
    /// hands it back, and the run admits it again as it arrives.
    #[cfg(feature = "temporal")]
    pub fn within(budget: ResultBudget) -> ResultBound {
        ResultBound {
            limit: budget.limit,
            kept: budget.kept,
        }
    }

    /// A run resumed from `journal`: what its journaled outcomes hold counts.
    pub fn resumed(limit: u64, journal: &[JournalEntry]) -> ResultBound {
        let kept = journal
            .iter()
            .map(|e| match &e.input {
                RunInput::Outcome { outcome, .. } => size_of(outcome_value(outcome)),
                _ => 0,
            })
            .sum();
        ResultBound { limit, kept }
    }

    /// The outcome as the run keeps it: itself while the run stays within its bound, else the
    /// `run.result_bound` failure that stands for it.
    pub fn admit(&mut self, outcome: Outcome) -> Outcome {
        let value = outcome_value(&outcome);
        let size = size_of(value);
        let recorded = outcome.result.is_err()
            && value.get("code") == Some(&json!("run.result_bound"))
            && size <= RECORD_BYTES;
        if recorded || self.kept.saturating_add(size) <= self.limit {
            self.kept += size;
            return outcome;
        }
        let text = serde_json::to_string(value).unwrap_or_default();
        let (message, details) = self
            .budget()
            .over(text.as_bytes(), true, outcome.result.is_err());
        let failure = Outcome::error(crate::protocol::error_object(
            "run.result_bound",
            message,
            Some(details),
        ));
        self.kept += size_of(outcome_value(&failure));
        failure
    }

    /// What the run can still keep, handed to each call it launches.
    pub fn budget(&self) -> ResultBudget {
        ResultBudget {
            limit: self.limit,
            kept: self.kept,
        }
    }
}

fn outcome_value(o: &Outcome) -> &Value {
    match &o.result {
        Ok(v) | Err(v) => v,
    }
}

/// Serialised size of `v` in bytes, without building the text.
fn size_of(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// What a result shares with the outcome (for tests: the kept value is the same allocation).
#[cfg(test)]
fn same(a: &Outcome, b: &Outcome) -> bool {
    match (&a.result, &b.result) {
        (Ok(x), Ok(y)) | (Err(x), Err(y)) => std::sync::Arc::ptr_eq(x, y),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_kept_until_the_bound_then_recorded_by_size_and_hash() {
        let mut b = ResultBound::new(100);
        let small = Outcome::ok(json!({"v": "x".repeat(40)}));
        let kept = b.admit(small.clone());
        assert!(same(&kept, &small), "kept as it is");
        assert_eq!(b.kept, 48);
        let big = Outcome::ok(json!("y".repeat(2000)));
        let over = b.admit(big);
        let Err(e) = &over.result else {
            panic!("a failure: {over:?}")
        };
        assert_eq!(e["code"], "run.result_bound");
        assert_eq!(e["details"]["bytes"], 2002);
        assert_eq!(e["details"]["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(
            e["details"]["head"].as_str().map(|h| h.chars().count()),
            Some(HEAD_CHARS)
        );
        // The same result again is refused the same way: nothing depends on order but the sum.
        let again = b.admit(Outcome::ok(json!("y".repeat(2000))));
        assert_eq!(
            again.result.as_ref().err().map(|e| &e["details"]["sha256"]),
            Some(&e["details"]["sha256"])
        );
    }

    /// An activity that stopped reading hands back the record for what it read: it is kept as
    /// it is, even past the bound, and counted; a big error object that merely says so is not.
    #[test]
    fn an_activitys_own_record_is_kept_as_it_is() {
        let mut b = ResultBound::new(10);
        let (message, details) = b.budget().over(b"\"yyyyyyyyyyy", false, false);
        let record = Outcome::error(crate::protocol::error_object(
            "run.result_bound",
            message,
            Some(details),
        ));
        let kept = b.admit(record.clone());
        assert!(same(&kept, &record), "kept as it is");
        assert_eq!(b.kept, size_of(outcome_value(&record)));
        let forged = Outcome::error(json!({"code": "run.result_bound", "pad": "z".repeat(40_000)}));
        let bounded = b.admit(forged);
        let Err(e) = &bounded.result else {
            panic!("a failure: {bounded:?}")
        };
        assert_eq!(e["details"]["bytes"], 40_036, "{e}");
        assert_eq!(e["details"]["complete"], true, "{e}");
    }

    #[test]
    fn a_resumed_run_counts_what_its_journal_kept() {
        let journal = vec![JournalEntry {
            input: RunInput::Outcome {
                call: crate::protocol::CallId(1),
                outcome: Outcome::ok(json!("z".repeat(98))),
            },
            seq: 1,
            at: 0,
        }];
        let b = ResultBound::resumed(150, &journal);
        assert_eq!(b.kept, 100);
        let mut b2 = b;
        assert!(b2.admit(Outcome::ok(json!("q".repeat(60)))).result.is_err());
    }
}
