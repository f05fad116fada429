//! Judging a run killed after a journal entry and resumed (`dagloop test --crash-each-point`)
//! against the same case run without interruption.
//!
//! The run's final journal says what each process did: the entries before the `resumed` one
//! are those the killed process committed; feeding the whole journal through a fresh machine
//! gives every call the machine launched, and from which entry. Three rules:
//! - a call whose outcome was committed before the kill is never launched again;
//! - a call that was running when the process was killed (launched, no outcome committed) is
//!   treated as its tool says: an `_idempotent` tool's call is run again without asking, any
//!   other is presented to a reviewer first (a `decided` entry before it runs again, if ever);
//! - the resumed run reaches the uninterrupted run's status, output and state. When it does
//!   not and a call ran again after the kill, that call is named: it ran twice, and its second
//!   run changed what the run reached (a tool marked `_idempotent` that is not).
//!
//! Sans-IO: the caller loads the journal and the results.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::machine::{Action, JournalEntry, RunInput};
use crate::protocol::CallId;
use crate::store::RunRecord;

/// What the judge found about one killed-and-resumed run.
#[derive(Debug, Clone, Default)]
pub struct Judged {
    /// Entries the killed process had committed (None: no `resumed` entry, the resumed
    /// process found the run finished).
    pub killed_after: Option<u64>,
    /// Calls that were running at the kill.
    pub interrupted: Vec<u64>,
    /// What breaks a rule, in words.
    pub failures: Vec<String>,
}

struct Launched {
    tool: String,
    idempotent: bool,
    /// Entry seqs whose handling launched it.
    at: Vec<u64>,
}

/// Judges the journal of a run killed once and resumed, and its result, against `baseline`
/// (the uninterrupted run's result JSON).
pub fn judge(
    record: &RunRecord,
    journal: &[JournalEntry],
    resumed: &Value,
    baseline: &Value,
) -> Result<Judged, crate::runs::RunsError> {
    let kill = journal
        .iter()
        .find(|e| matches!(e.input, RunInput::Resumed))
        .map(|e| e.seq);
    let mut judged = Judged {
        killed_after: kill.map(|s| s.saturating_sub(1)),
        ..Judged::default()
    };
    let (_, mut machine) = crate::runs::fresh_machine(record)?;
    let mut launched: BTreeMap<CallId, Launched> = BTreeMap::new();
    let mut outcome_at: BTreeMap<CallId, u64> = BTreeMap::new();
    let mut decided_at: BTreeMap<CallId, Vec<u64>> = BTreeMap::new();
    let mut actions = Vec::new();
    for e in journal {
        match &e.input {
            RunInput::Outcome { call, .. } => {
                outcome_at.entry(*call).or_insert(e.seq);
            }
            RunInput::Decided { call, .. } => decided_at.entry(*call).or_default().push(e.seq),
            _ => {}
        }
        machine.handle_into(e.input.clone(), e.at, &mut actions);
        for a in actions.drain(..) {
            if let Action::Launch {
                id,
                tool,
                detached: false,
                ..
            } = a
            {
                if matches!(e.input, RunInput::TimerFired { .. }) {
                    // A retry after its backoff, not the resume's doing.
                    continue;
                }
                launched
                    .entry(id)
                    .or_insert_with(|| Launched {
                        tool: tool.name.clone(),
                        idempotent: crate::scheduler::is_idempotent(&tool),
                        at: Vec::new(),
                    })
                    .at
                    .push(e.seq);
            }
        }
    }
    let mut ran_again = Vec::new();
    if let Some(kill) = kill {
        for (id, l) in &launched {
            let before = l.at.iter().any(|s| *s < kill);
            let again: Vec<u64> = l.at.iter().copied().filter(|s| *s >= kill).collect();
            let done_before = outcome_at.get(id).is_some_and(|s| *s < kill);
            if !before {
                continue;
            }
            if again.is_empty() {
                if !done_before {
                    judged.interrupted.push(id.0);
                }
                continue;
            }
            if done_before {
                judged.failures.push(format!(
                    "call {} ({}) completed before the kill (its outcome is entry {}) and was started again after the resume (entry {})",
                    id.0, l.tool, outcome_at[id], again[0]
                ));
                continue;
            }
            judged.interrupted.push(id.0);
            ran_again.push((id.0, l.tool.clone(), l.idempotent));
            let asked = decided_at
                .get(id)
                .is_some_and(|d| d.iter().any(|s| *s >= kill && *s <= again[0]));
            if !l.idempotent && !asked {
                judged.failures.push(format!(
                    "call {} ({}) was running at the kill; its tool is not `_idempotent`, yet it ran again without a reviewer's decision",
                    id.0, l.tool
                ));
            }
        }
    }
    let differs: Vec<String> = ["status", "output", "state"]
        .into_iter()
        .filter(|k| resumed[*k] != baseline[*k])
        .map(|k| format!("{k}: expected {}, got {}", baseline[k], resumed[k]))
        .collect();
    if !differs.is_empty() {
        let twice: BTreeSet<String> = ran_again
            .iter()
            .map(|(id, tool, idem)| {
                format!(
                    "call {id} ({tool}) ran twice: it was running at the kill and ran again on resume{}",
                    if *idem {
                        " because its tool is marked `_idempotent`"
                    } else {
                        ", approved by the reviewer"
                    }
                )
            })
            .collect();
        let mut msg = format!(
            "the resumed run differs from the uninterrupted one: {}",
            differs.join("; ")
        );
        if !twice.is_empty() {
            msg = format!(
                "double execution: {}; {msg}",
                twice.into_iter().collect::<Vec<_>>().join("; ")
            );
        }
        judged.failures.push(msg);
    }
    Ok(judged)
}
