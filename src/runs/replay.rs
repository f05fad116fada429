//! Replaying a stored run offline (`dagloop replay`): its journal goes through fresh machines,
//! and the replay says whether it reproduces the run or where it first departs from it.
//!
//! The store keeps the journal (the inputs), not the events, so a divergence is defined on what
//! can be checked (spec/replay.md):
//! - every journaled input must be one the fresh machine was waiting for: an outcome for a call
//!   it launched, a decision for a call it presented (the rule ops are checked by, rule 21), model
//!   output for a turn it asked for, a timer it set;
//! - the result it reaches must be the stored result (status, output, state, steps, calls, usage,
//!   error).
//!
//! Late inputs the engine journals by design are not divergences: an outcome of a call the
//! machine aborted, model output of a turn it stopped reading, a timer that fired while it was
//! being cleared (they raced with the machine's action and the machine ignores them).
//!
//! The replay also digests the events it produces (SHA-256 over their JSON lines), so two
//! replays, by two versions of dagloop or of a goal, can be compared beyond the result.
//!
//! Sans-IO: no model, no tool, no clock; the caller loads the run.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Value, json};

use super::RunsError;
use crate::goal::Goal;
use crate::machine::{Action, FrameKey, JournalEntry, RunInput, RunMachine, RunResult};
use crate::protocol::{CallId, Op};

/// The first place a replay departs from the stored run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// The journal entry where it shows (for a result that differs, the entry the replay
    /// finished at, else the last one).
    pub seq: u64,
    /// A stable code: `replay.unexpected_input` or `replay.result`.
    pub code: &'static str,
    /// What departs, in words.
    pub message: String,
    /// What the fresh machine expected (what it was waiting for, or the stored result's part).
    pub expected: Value,
    /// What the journal holds there (the input, or the replayed result's part).
    pub actual: Value,
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replayed {
    /// Journal entries replayed.
    pub entries: usize,
    /// Events the fresh machines produced.
    pub events: u64,
    /// `sha256:` digest of those events, one JSON line each.
    pub events_digest: String,
    /// The status the replay reached (None: the run had not finished).
    pub status: Option<String>,
    /// The first divergence (None: identical).
    pub divergence: Option<Divergence>,
}

/// What the fresh machine waits for, from the actions it took.
#[derive(Default)]
struct Expect {
    started: bool,
    /// Turns asked and not closed.
    open: BTreeSet<FrameKey>,
    /// Workspace memory searches asked and not answered: (agent, step).
    recalls: BTreeSet<(FrameKey, u32)>,
    /// Turns the machine stopped reading (late output of theirs is ignored).
    dropped: BTreeSet<FrameKey>,
    /// Calls launched whose outcome is awaited.
    running: BTreeSet<CallId>,
    /// Calls aborted (a late outcome is ignored).
    aborted: BTreeSet<CallId>,
}

fn frame_json(f: FrameKey) -> Value {
    match f {
        None => json!("run"),
        Some(c) => json!(format!("delegate call {}", c.0)),
    }
}

impl Expect {
    /// Says whether `input` is one the machine waits for; if not, what it waited for and why.
    // The checks change what is expected (an outcome is taken once): as match guards they
    // would hide side effects.
    #[allow(clippy::collapsible_match)]
    fn admit(&mut self, machine: &RunMachine, input: &RunInput) -> Result<(), (String, Value)> {
        if !self.started && !matches!(input, RunInput::Start) {
            return Err((
                "the journal does not begin with the run's start".into(),
                json!({"input": "start"}),
            ));
        }
        let turns = |open: &BTreeSet<FrameKey>| json!({"model_turns": open.iter().map(|f| frame_json(*f)).collect::<Vec<_>>()});
        match input {
            RunInput::Start => {
                if self.started {
                    return Err(("the run starts twice".into(), json!(null)));
                }
                self.started = true;
            }
            RunInput::Call { frame, .. }
            | RunInput::Unreadable { frame, .. }
            | RunInput::Output { frame, .. }
            | RunInput::Problem { frame, .. }
            | RunInput::Usage { frame, .. }
            | RunInput::Fallback { frame, .. }
            | RunInput::Reask { frame, .. }
            | RunInput::Retry { frame, .. } => {
                if !self.open.contains(frame) && !self.dropped.contains(frame) {
                    return Err((
                        format!(
                            "model output for a turn of the {} the machine never asked for",
                            frame_json(*frame).as_str().unwrap_or("run")
                        ),
                        turns(&self.open),
                    ));
                }
            }
            RunInput::Recalled { frame, step, .. } => {
                if !self.recalls.remove(&(*frame, *step)) {
                    return Err((
                        "workspace memory for a step the machine did not search for".into(),
                        json!({"memory_searches": self.recalls.iter().map(|(f, s)| json!({"agent": frame_json(*f), "step": s})).collect::<Vec<_>>()}),
                    ));
                }
            }
            RunInput::StreamClosed { frame, .. } => {
                if !self.open.remove(frame) && !self.dropped.remove(frame) {
                    return Err((
                        "a model turn closes that the machine never asked for".into(),
                        turns(&self.open),
                    ));
                }
            }
            RunInput::Outcome { call, .. } | RunInput::Interrupted { call } => {
                let late = matches!(input, RunInput::Outcome { .. }) && self.aborted.remove(call);
                if !self.running.remove(call) && !late {
                    return Err((
                        format!(
                            "an outcome for call {}, which the machine did not launch (or which had already ended)",
                            call.0
                        ),
                        json!({"running_calls": self.running.iter().map(|c| c.0).collect::<Vec<_>>()}),
                    ));
                }
            }
            RunInput::Decided {
                call,
                decision,
                by,
                presentation,
            } => {
                let op = Op::Decide {
                    call: *call,
                    decision: decision.clone(),
                    presented: None,
                    presentation: *presentation,
                    by: by.clone(),
                };
                if let Err(e) = machine.check_op(&op) {
                    let awaiting: Vec<u64> =
                        machine.awaiting().into_iter().map(|(id, _)| id.0).collect();
                    return Err((
                        format!("a decision the machine would not take: {e}"),
                        json!({"awaiting_decision": awaiting}),
                    ));
                }
            }
            // The machine keeps its timers: one it set (and has not cleared) or ever set (one
            // that fired while being cleared is ignored).
            RunInput::TimerFired { timer } => {
                if machine.timer_at(*timer).is_none() && !machine.timer_ever_set(*timer) {
                    return Err((
                        "a timer fires that the machine never set".into(),
                        json!({"timers": machine.timers().map(|(t, _)| t).collect::<Vec<_>>()}),
                    ));
                }
            }
            RunInput::Resumed => {
                // The process stopped: nothing it ran will answer; the machine asks again.
                self.running.clear();
                self.aborted.clear();
                self.open.clear();
                self.recalls.clear();
                self.dropped.clear();
            }
            _ => {}
        }
        Ok(())
    }

    /// Takes note of what the machine asked for.
    #[allow(clippy::collapsible_match)]
    fn note(&mut self, action: &Action) {
        match action {
            Action::Request { frame, .. } => {
                self.dropped.remove(frame);
                self.open.insert(*frame);
            }
            Action::Recall { frame, step, .. } => {
                self.recalls.insert((*frame, *step));
            }
            Action::CloseStream { frame } => {
                if self.open.remove(frame) {
                    self.dropped.insert(*frame);
                }
            }
            Action::Launch { id, detached, .. } => {
                self.aborted.remove(id);
                if !*detached {
                    self.running.insert(*id);
                }
            }
            Action::Abort { id } => {
                if self.running.remove(id) {
                    self.aborted.insert(*id);
                }
            }
            _ => {}
        }
    }
}

/// The goal of a stored run and a fresh machine for it, from its record alone
/// ([`super::RunDef::from_record`]; nothing consumed yet): what replay, fork and the crash checks
/// feed its journal through.
pub fn fresh_machine(record: &crate::store::RunRecord) -> Result<(Goal, RunMachine), RunsError> {
    let def = super::RunDef::from_record(record)?;
    let machine = def.machine(&record.id)?;
    Ok((def.goal().clone(), machine))
}

/// Replays the journal of the run `record` describes through a fresh machine and compares what
/// it reaches with `stored` (the run's stored result, if it finished).
pub fn replay_run(
    record: &crate::store::RunRecord,
    journal: &[JournalEntry],
    stored: Option<&RunResult>,
) -> Result<Replayed, RunsError> {
    let (_, mut machine) = fresh_machine(record)?;
    let mut expect = Expect::default();
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut events = 0u64;
    let mut result: Option<(u64, RunResult)> = None;
    let mut divergence = None;
    let mut actions = Vec::new();
    for e in journal {
        if let Err((message, expected)) = expect.admit(&machine, &e.input) {
            divergence = Some(Divergence {
                seq: e.seq,
                code: "replay.unexpected_input",
                message,
                expected,
                actual: serde_json::to_value(&e.input).unwrap_or(Value::Null),
            });
            break;
        }
        machine.handle_into(e.input.clone(), e.at, &mut actions);
        for a in actions.drain(..) {
            expect.note(&a);
            match a {
                Action::Emit(ev) => {
                    events += 1;
                    digest.update(&serde_json::to_vec(&ev).unwrap_or_default());
                    digest.update(b"\n");
                }
                Action::Finished(r) if result.is_none() => result = Some((e.seq, *r)),
                _ => {}
            }
        }
    }
    let last = journal.last().map_or(0, |e| e.seq);
    if divergence.is_none()
        && let Some(s) = stored
    {
        divergence = compare(s, result.as_ref(), last);
    }
    let hex: String = digest
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Replayed {
        entries: journal.len(),
        events,
        events_digest: format!("sha256:{hex}"),
        status: result.map(|(_, r)| r.status.as_str().to_string()),
        divergence,
    })
}

/// The stored result against the replayed one (None when they agree). A result the engine
/// wrote without the machine (the journal failed, the run stalled) is not the machine's to
/// reproduce.
fn compare(
    stored: &RunResult,
    replayed: Option<&(u64, RunResult)>,
    last: u64,
) -> Option<Divergence> {
    let engine_made = stored.status == crate::machine::RunStatus::Stopped
        || stored
            .error
            .as_ref()
            .is_some_and(|e| e.code == "run.stalled");
    let Some((seq, r)) = replayed else {
        if engine_made {
            return None;
        }
        return Some(Divergence {
            seq: last,
            code: "replay.result",
            message: "the stored run finished; the replay did not".into(),
            expected: json!({"status": stored.status.as_str()}),
            actual: json!({"status": null}),
        });
    };
    let parts: [(&str, Value, Value); 7] = [
        ("status", json!(stored.status), json!(r.status)),
        ("output", stored.output.clone(), r.output.clone()),
        ("state", stored.state.clone(), r.state.clone()),
        ("steps", json!(stored.steps), json!(r.steps)),
        ("calls", json!(stored.calls), json!(r.calls)),
        ("usage", json!(stored.usage), json!(r.usage)),
        ("error", json!(stored.error), json!(r.error)),
    ];
    parts
        .into_iter()
        .find(|(_, a, b)| a != b)
        .map(|(part, expected, actual)| Divergence {
            seq: *seq,
            code: "replay.result",
            message: format!("the replayed result's {part} differs from the stored one"),
            expected: json!({ part: expected }),
            actual: json!({ part: actual }),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Timer;

    fn entry(seq: u64, at: u64, input: RunInput) -> JournalEntry {
        JournalEntry { seq, at, input }
    }

    /// A `timer_fired` is checked against the fresh machine's own timers (spec/timers.md TM3):
    /// one it never set departs, with the timers it has set; one it set fires; a second firing
    /// of one no longer set (it raced with the clearing) is admitted.
    #[test]
    fn a_timer_fired_is_checked_against_the_machines_timers() {
        let doc = r#"{"goal": "g", "output_schema": {}, "limits": {"timeout_s": 2}}"#;
        let goal = Goal::from_json(doc, "g.json".as_ref(), ".".into()).expect("goal");
        let record =
            crate::store::RunRecord::new("run-t", &goal, crate::runs::RunOptions::default());
        let deadline = Timer::Deadline { frame: None };
        let never = Timer::Approval {
            call: CallId(1),
        };
        let journal = [
            entry(1, 1000, RunInput::Start),
            entry(2, 1500, RunInput::TimerFired { timer: never }),
        ];
        let r = replay_run(&record, &journal, None).expect("replayed");
        let d = r.divergence.expect("a divergence");
        assert_eq!((d.seq, d.code), (2, "replay.unexpected_input"));
        assert_eq!(d.message, "a timer fires that the machine never set");
        assert_eq!(d.expected, json!({"timers": [{"timer": "deadline"}]}));

        let journal = [
            entry(1, 1000, RunInput::Start),
            entry(2, 3000, RunInput::TimerFired { timer: deadline }),
            entry(3, 3001, RunInput::TimerFired { timer: deadline }),
        ];
        let r = replay_run(&record, &journal, None).expect("replayed");
        assert_eq!(r.divergence, None);
        assert_eq!(r.status.as_deref(), Some("timeout"));
    }
}
