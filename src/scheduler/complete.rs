//! How calls end: completion and failure (rules 3, 10-12), unresolved references (rule 8),
//! stream close and cancellation.

use std::sync::Arc;

use serde_json::Value;

use super::core::{emit, path_texts, read_ids, write_ids};
use super::resolve::RefAt;
use super::{Phase, Scheduler};
use crate::protocol::{Call, CallId, EventKind, FailKind, Millis, OutputMethod};
use crate::scheduler::{Action, CallStatus, Outcome, OutcomeKind, SchedulerError};
use crate::state::output_choice;

impl Scheduler {
    /// Rule 8: the references at `missing` point at nothing and never will.
    pub(super) fn unresolve(&mut self, ix: usize, missing: &[RefAt], out: &mut Vec<Action>) {
        let e = &mut self.entries[ix];
        let missing = path_texts(e, &mut self.state, missing);
        let named = missing.iter().map(|t| t.to_string()).collect();
        emit(out, e.id, EventKind::Unresolved { missing });
        e.value = Some(Arc::new(
            SchedulerError::Unresolved { missing: named }.to_value(),
        ));
        e.waiting_on = Vec::new();
        self.set_phase(ix, Phase::Done(CallStatus::Unresolved));
        self.release(ix);
    }

    pub(super) fn finished(
        &mut self,
        id: CallId,
        outcome: Outcome,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let Some(ix) = self.ix(id) else { return };
        if self.entries[ix].phase != Phase::Running {
            return;
        }
        let Outcome {
            result,
            branch,
            kind,
        } = outcome;
        match (kind, result) {
            (OutcomeKind::Ok, Ok(v)) => self.succeed(ix, v, branch, now, out),
            (OutcomeKind::Cancelled, r) => {
                let e = &mut self.entries[ix];
                e.value = Some(r.unwrap_or_else(|e| e));
                emit(out, id, EventKind::Cancelled);
                self.set_phase(ix, Phase::Done(CallStatus::Cancelled));
                self.release(ix);
            }
            (k, r) => {
                let fk = match k {
                    OutcomeKind::Timeout => FailKind::Timeout,
                    OutcomeKind::Panic => FailKind::Panic,
                    _ => FailKind::Error,
                };
                self.fail(ix, r.unwrap_or_else(|e| e), fk, branch, now, out);
            }
        }
    }

    pub(super) fn method(&self, ix: usize) -> OutputMethod {
        self.entries[ix]
            .current()
            .map(Call::method_or_default)
            .unwrap_or_default()
    }

    /// Writes `value` to the output target's paths at the positions `chosen`
    /// ([`output_choice`]), by the ids interned when the call was accepted. The call is ending:
    /// its target is taken, so each chosen path moves into the state's log (no copy), and its
    /// `written` event names it with the text the run's table keeps.
    pub(super) fn write_all(
        &mut self,
        ix: usize,
        chosen: std::ops::Range<usize>,
        value: &Arc<Value>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        let method = self.method(ix);
        let Some(target) = self.entries[ix].target.take() else {
            return;
        };
        let (start, n) = (chosen.start, chosen.len());
        for (k, r) in target.refs.into_iter().enumerate().skip(start).take(n) {
            let Some(&pid) = write_ids(&self.entries[ix]).get(k) else {
                continue;
            };
            let path = self.state.text(pid, &r.path);
            let write_seq = self
                .state
                .write_id(pid, r.path, value.clone(), method, Some(id), now);
            emit(
                out,
                id,
                EventKind::Written {
                    path,
                    method,
                    write_seq,
                },
            );
        }
    }

    pub(super) fn succeed(
        &mut self,
        ix: usize,
        value: Arc<Value>,
        branch: Option<usize>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let paths = self.entries[ix]
            .target
            .as_ref()
            .map_or(0..0, |t| output_choice(t, true, branch));
        let id = self.entries[ix].id;
        emit(
            out,
            id,
            EventKind::Finished {
                result: value.clone(),
            },
        );
        self.write_all(ix, paths, &value, now, out);
        self.entries[ix].value = Some(value);
        self.set_phase(ix, Phase::Done(CallStatus::Done));
        self.release(ix);
    }

    /// Rule 12: a failure is an error observation, written to the failure branch where one exists.
    pub(super) fn fail(
        &mut self,
        ix: usize,
        error: Arc<Value>,
        kind: FailKind,
        branch: Option<usize>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let paths = self.entries[ix]
            .target
            .as_ref()
            .map_or(0..0, |t| output_choice(t, false, branch));
        let id = self.entries[ix].id;
        emit(
            out,
            id,
            EventKind::Failed {
                error: error.clone(),
                kind,
            },
        );
        self.write_all(ix, paths, &error, now, out);
        self.entries[ix].value = Some(error);
        let status = if kind == FailKind::Rejected {
            CallStatus::Rejected
        } else {
            CallStatus::Failed
        };
        self.set_phase(ix, Phase::Done(status));
        self.release(ix);
    }

    pub(super) fn close(&mut self) {
        if !self.stream_open {
            return;
        }
        self.stream_open = false;
        for e in &self.entries {
            if e.phase == Phase::Waiting {
                self.recheck.insert(e.id);
            }
        }
    }

    pub(super) fn cancel(&mut self, out: &mut Vec<Action>) {
        self.cancelled = true;
        self.recheck.clear();
        for ix in 0..self.entries.len() {
            let phase = self.entries[ix].phase;
            if matches!(phase, Phase::Done(_)) {
                continue;
            }
            let id = self.entries[ix].id;
            if phase == Phase::Running {
                out.push(Action::Abort { id });
            }
            emit(out, id, EventKind::Cancelled);
            self.entries[ix].value = Outcome::cancelled().result.err();
            self.entries[ix].waiting_on = Vec::new();
            self.set_phase(ix, Phase::Done(CallStatus::Cancelled));
            let e = &self.entries[ix];
            self.graph
                .remove_ids(self.state.paths(), id, read_ids(e), write_ids(e));
        }
    }
}
