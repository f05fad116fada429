//! The scheduler's core transitions: arrival (validation, graph insertion, refusal), readiness
//! (incremental re-checks, blocking) and settling (draining the recheck queue, ending the step).
//! The gate lives in `gate.rs`, how calls end in `complete.rs`. Every transition keeps the graph,
//! the phase counters and the recheck queue consistent.

use std::sync::Arc;

use super::{Entry, Phase, Scheduler, ToolEntry};
use crate::graph::{GraphError, PathId};
use crate::protocol::{Call, CallId, EventKind, FailKind, Millis, Path, PathText};
use crate::scheduler::resolve::{self, Check, RefAt};
use crate::scheduler::{Action, CallStatus, Parsed, SchedulerError, UnreadableCall};
use crate::state::State;

pub(super) fn emit(out: &mut Vec<Action>, id: CallId, kind: EventKind) {
    out.push(Action::Event {
        call: Some(id),
        kind,
    });
}

/// The ids of every path the entry's references may read (all alternatives).
pub(super) fn read_ids(e: &Entry) -> &[PathId] {
    e.paths.get(..e.reads).unwrap_or_default()
}

/// The ids of every path the entry's output target may write (all alternatives).
pub(super) fn write_ids(e: &Entry) -> &[PathId] {
    e.paths.get(e.reads..).unwrap_or_default()
}

/// The id of the read path at `at` (see `Entry::paths`).
pub(super) fn read_id(e: &Entry, at: RefAt) -> Option<PathId> {
    let before: usize = e
        .refs
        .get(..at.0 as usize)?
        .iter()
        .map(|(_, x)| x.refs.len())
        .sum();
    read_ids(e).get(before + at.1 as usize).copied()
}

/// The texts of the entry's read paths at `at`, sorted, once each: taken from the run's path
/// table (rendered once per run, shared by every event that names the path).
pub(super) fn path_texts(e: &Entry, state: &mut State, at: &[RefAt]) -> Vec<PathText> {
    let mut v: Vec<PathText> = at
        .iter()
        .filter_map(|&a| Some(state.text(read_id(e, a)?, resolve::path_at(&e.refs, a)?)))
        .collect();
    v.sort();
    v.dedup();
    v
}

impl Entry {
    pub(super) fn new(id: CallId, written: Option<Arc<Call>>) -> Self {
        Entry {
            id,
            written,
            revised: None,
            tool: None,
            target: None,
            phase: Phase::Done(CallStatus::Refused),
            approved: false,
            decided: false,
            announced: false,
            waiting_on: Vec::new(),
            watch: 0,
            presented: None,
            interrupted: false,
            refs: Vec::new(),
            paths: Vec::new(),
            reads: 0,
            value: None,
            read_from: Vec::new(),
        }
    }
}

impl Scheduler {
    pub(super) fn ix(&self, id: CallId) -> Option<usize> {
        self.index.get(&id).copied()
    }

    pub(super) fn set_phase(&mut self, ix: usize, phase: Phase) {
        match self.entries[ix].phase {
            Phase::Waiting => self.waiting -= 1,
            Phase::Asking => self.asking -= 1,
            Phase::Running => self.running -= 1,
            Phase::Done(_) => {}
        }
        match phase {
            Phase::Waiting => self.waiting += 1,
            Phase::Asking => self.asking += 1,
            Phase::Running => self.running += 1,
            Phase::Done(_) => {}
        }
        self.entries[ix].phase = phase;
    }

    pub(super) fn arrive(
        &mut self,
        id: CallId,
        call: Result<Arc<Call>, UnreadableCall>,
        parsed: Parsed,
        _now: Millis,
        out: &mut Vec<Action>,
    ) {
        if self.index.contains_key(&id) {
            return;
        }
        let ix = self.entries.len();
        self.index.insert(id, ix);
        match call {
            Err(reason) => {
                self.entries.push(Entry::new(id, None));
                let known = self.known_tools();
                self.refuse(ix, SchedulerError::Unreadable { reason, known }, out);
            }
            Ok(call) => {
                emit(out, id, EventKind::CallReceived { call: call.clone() });
                self.entries.push(Entry::new(id, Some(call)));
                self.accept(ix, parsed, out);
            }
        }
    }

    /// Validates the entry's current call and puts it in the graph, or refuses it. `parsed`
    /// is what the call's references and target parsed to, if that was done ahead.
    pub(super) fn accept(&mut self, ix: usize, parsed: Parsed, out: &mut Vec<Action>) {
        let id = self.entries[ix].id;
        let prepared = match self.entries[ix].current() {
            None => return,
            Some(call) => self.prepare(call, parsed),
        };
        let (tool, refs, target) = match prepared {
            Ok(p) => p,
            Err(e) => return self.refuse(ix, e, out),
        };
        // Interned once, in the run's table (the state's), which the graph and the state's
        // index both use.
        let mut paths: Vec<PathId> = Vec::new();
        for (_, x) in &refs {
            paths.extend(x.refs.iter().map(|r| self.state.intern(&r.path)));
        }
        let reads = paths.len();
        if let Some(t) = &target {
            paths.extend(t.refs.iter().map(|r| self.state.intern(&r.path)));
        }
        let table = self.state.paths();
        if let Err(e) = self
            .graph
            .insert_ids(table, id, &paths[..reads], &paths[reads..])
        {
            return self.refuse(ix, e.into(), out);
        }
        let e = &mut self.entries[ix];
        e.paths = paths;
        e.reads = reads;
        e.tool = Some(tool);
        e.target = target;
        e.refs = refs;
        self.set_phase(ix, Phase::Waiting);
        self.recheck.insert(id);
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn prepare(
        &self,
        call: &Call,
        parsed: Parsed,
    ) -> Result<
        (
            ToolEntry,
            resolve::Refs,
            Option<crate::protocol::Expression>,
        ),
        SchedulerError,
    > {
        let Some(tool) = self.tools.get(&call.tool) else {
            return Err(SchedulerError::UnknownTool {
                tool: call.tool.clone(),
                known: self.known_tools(),
            });
        };
        let (refs, target) = match parsed.0 {
            Some(p) => match Arc::try_unwrap(p) {
                Ok(p) => (p.refs?, p.target?),
                Err(p) => (p.refs.clone()?, p.target.clone()?),
            },
            None => (call.references()?, call.output_target()?),
        };
        if tool.tool.is_latent() && !call.params.contains_key("_output") {
            return Err(SchedulerError::MissingLatentOutput {
                tool: call.tool.clone(),
            });
        }
        Ok((tool.clone(), refs, target))
    }

    /// The tools' names, in order, comma separated.
    fn known_tools(&self) -> String {
        let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        known.join(", ")
    }

    pub(super) fn refuse(&mut self, ix: usize, err: SchedulerError, out: &mut Vec<Action>) {
        let cycle = match &err {
            SchedulerError::Cycle(GraphError::Cycle { cycle }) => cycle.clone(),
            _ => Vec::new(),
        };
        let id = self.entries[ix].id;
        emit(
            out,
            id,
            EventKind::CallRefused {
                reason: err.to_string(),
                cycle,
            },
        );
        self.entries[ix].value = Some(Arc::new(err.to_value()));
        self.set_phase(ix, Phase::Done(CallStatus::Refused));
    }

    /// Takes the call out of the graph and queues the waiting readers of what it could write.
    pub(super) fn release(&mut self, ix: usize) {
        let e = &self.entries[ix];
        let table = self.state.paths();
        self.graph.remove_ids(table, e.id, read_ids(e), write_ids(e));
        for &w in write_ids(e) {
            self.graph.readers_of_id(table, w, &mut self.recheck);
        }
    }

    pub(super) fn settle(&mut self, now: Millis, out: &mut Vec<Action>) {
        loop {
            while let Some(id) = self.recheck.pop_first() {
                self.check(id, now, out);
                // Eager: the launched call's activity can start before the rest are checked.
                if self.eager
                    && !self.recheck.is_empty()
                    && matches!(out.last(), Some(Action::Launch { .. }))
                {
                    return;
                }
            }
            if self.drained {
                return;
            }
            if self.cancelled {
                return self.drain(out);
            }
            if self.stream_open || self.asking > 0 || self.running > 0 {
                return;
            }
            if self.waiting == 0 {
                return self.drain(out);
            }
            // Defensive (rule 8): nothing can run any more, so whatever still waits never will.
            for ix in 0..self.entries.len() {
                if self.entries[ix].phase == Phase::Waiting {
                    let missing = std::mem::take(&mut self.entries[ix].waiting_on);
                    self.unresolve(ix, &missing, out);
                }
            }
        }
    }

    pub(super) fn drain(&mut self, out: &mut Vec<Action>) {
        self.drained = true;
        out.push(Action::Event {
            call: None,
            kind: EventKind::StepDrained,
        });
        out.push(Action::Drained);
    }

    /// True while one of the paths the call last waited on can still be written (rule 5): by
    /// another call, or, while the stream is open, because it holds no value yet. Resumes from
    /// the first path not yet seen free, and leaves `watch` where the old rule left it.
    ///
    /// Whether a path holds a value is asked only when a later path is still written by
    /// another call (then `watch` must stop at the first absent path before it). When every
    /// watched path is free of other writers, the full check's read answers it (a chain hop
    /// walks the state's index once, not twice), and [`Scheduler::still_absent`] keeps the
    /// call waiting on what it waited on if one of them turns out absent.
    pub(super) fn still_blocked(&mut self, ix: usize) -> bool {
        let open = self.stream_open;
        let e = &mut self.entries[ix];
        // The first path passed without asking whether it holds a value.
        let mut unseen: Option<usize> = None;
        while let Some(&at) = e.waiting_on.get(e.watch) {
            let Some(pid) = read_id(e, at) else {
                e.watch += 1;
                continue;
            };
            if self
                .graph
                .writable_by_other_id(self.state.paths(), pid, e.id)
            {
                let blocked_at = e.watch;
                for k in unseen.unwrap_or(blocked_at)..blocked_at {
                    let Some(&a) = e.waiting_on.get(k) else { break };
                    let (Some(p), Some(pid)) = (resolve::path_at(&e.refs, a), read_id(e, a))
                    else {
                        continue;
                    };
                    if !self.state.has_id(pid, p) {
                        e.watch = k;
                        return true;
                    }
                }
                return true;
            }
            if open && unseen.is_none() {
                unseen = Some(e.watch);
            }
            e.watch += 1;
        }
        if let Some(w) = unseen {
            e.watch = w;
        }
        false
    }

    /// After a full check found the call blocked on `at`: true (and `watch` moved to it) when
    /// one of the paths it already waited on, from `watch` on, is among them. No other call
    /// writes those ([`Scheduler::still_blocked`] just asked), so it is absent while the stream
    /// is open: the call keeps waiting on what it was told it waits on, as if that path's
    /// value had been asked for before the full check.
    fn still_absent(&mut self, ix: usize, at: &[RefAt]) -> bool {
        let e = &mut self.entries[ix];
        let from = e.watch.min(e.waiting_on.len());
        match e.waiting_on[from..].iter().position(|w| at.contains(w)) {
            Some(i) => {
                e.watch = from + i;
                true
            }
            None => false,
        }
    }

    pub(super) fn check(&mut self, id: CallId, now: Millis, out: &mut Vec<Action>) {
        let Some(ix) = self.ix(id) else { return };
        if self.entries[ix].phase != Phase::Waiting || self.still_blocked(ix) {
            return;
        }
        let open = self.stream_open;
        self.resolutions += 1;
        let resolved = {
            let e = &self.entries[ix];
            if e.current().is_none() {
                return;
            }
            let (graph, state) = (&self.graph, &self.state);
            let table = state.paths();
            // Whether another call may still write the path; whether it holds a value is the
            // read's own answer (one index walk per reference).
            let others_write = |pid: Option<PathId>, _: &Path| match pid {
                Some(pid) => graph.writable_by_other_id(table, pid, id),
                // Every reference path was interned at acceptance; this is not reached.
                None => false,
            };
            resolve::check(state, &e.refs, read_ids(e), &others_write, open)
        };
        match resolved {
            Err(e) => self.fail(
                ix,
                SchedulerError::State(e).to_value().into(),
                FailKind::Error,
                None,
                now,
                out,
            ),
            Ok(Check::Ready(overlay, read_from)) => {
                self.entries[ix].read_from = read_from;
                self.unblock(ix, overlay, now, out)
            }
            Ok(Check::Blocked(at)) => {
                if !self.still_absent(ix, &at) {
                    self.block(ix, at, &[], out)
                }
            }
            Ok(Check::Missing { missing, blocked }) if open => {
                self.block(ix, blocked, &missing, out)
            }
            Ok(Check::Missing { missing, .. }) => self.unresolve(ix, &missing, out),
        }
    }

    /// The call waits on the paths at `at` and (stream open only) on the `absent` paths, which
    /// no call writes yet; those are not watched, so the call is checked again in full when any
    /// write overlapping its reads lands or the stream closes.
    pub(super) fn block(
        &mut self,
        ix: usize,
        at: Vec<RefAt>,
        absent: &[RefAt],
        out: &mut Vec<Action>,
    ) {
        let e = &mut self.entries[ix];
        if !e.announced {
            e.announced = true;
            // The texts the run's table keeps (rendered once per path, then shared).
            let waiting_on = if absent.is_empty() {
                path_texts(e, &mut self.state, &at)
            } else {
                path_texts(e, &mut self.state, &[&at[..], absent].concat())
            };
            emit(out, e.id, EventKind::Blocked { waiting_on });
        }
        e.waiting_on = if absent.is_empty() { at } else { Vec::new() };
        e.watch = 0;
    }
}
