//! The scheduler's transitions: arrival, readiness, the approval gate, completion, stream close
//! and cancellation. Each keeps the graph, the counters and the recheck queue consistent.

use serde_json::{Map, Value};

use super::{Entry, Phase, Scheduler, ToolEntry};
use crate::approval::{DefaultDecision, Gate, assess};
use crate::graph::GraphError;
use crate::protocol::{Call, CallId, Decision, EventKind, FailKind, Millis, OutputMethod, Path};
use crate::scheduler::resolve::{self, Check, RefAt};
use crate::scheduler::{Action, CallStatus, Outcome, OutcomeKind, SchedulerError};
use crate::state::output_paths;

fn emit(out: &mut Vec<Action>, id: CallId, kind: EventKind) {
    out.push(Action::Event {
        call: Some(id),
        kind,
    });
}

/// Every path the entry's references may read (all alternatives).
fn read_paths(e: &Entry) -> impl Iterator<Item = &Path> {
    e.refs
        .iter()
        .flat_map(|(_, x)| x.refs.iter().map(|r| &r.path))
}

/// Every path the entry's output target may write (all alternatives).
fn write_paths(e: &Entry) -> impl Iterator<Item = &Path> {
    e.target.iter().flat_map(|t| t.refs.iter().map(|r| &r.path))
}

fn path_strings(paths: &[Path]) -> Vec<String> {
    let mut v: Vec<String> = paths.iter().map(Path::to_string).collect();
    v.sort();
    v.dedup();
    v
}

impl Entry {
    fn new(id: CallId, written: Option<Call>) -> Self {
        Entry {
            id,
            written: written.map(Box::new),
            revised: None,
            tool: None,
            target: None,
            phase: Phase::Done(CallStatus::Refused),
            approved: false,
            announced: false,
            waiting_on: Vec::new(),
            watch: 0,
            presented: None,
            refs: Vec::new(),
            value: None,
        }
    }
}

impl Scheduler {
    fn ix(&self, id: CallId) -> Option<usize> {
        let i = id.0.checked_sub(self.opts.first_call_id)? as usize;
        (i < self.entries.len()).then_some(i)
    }

    fn set_phase(&mut self, ix: usize, phase: Phase) {
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
        call: Result<Call, String>,
        _now: Millis,
        out: &mut Vec<Action>,
    ) {
        let id = CallId(self.next_call_id());
        let ix = self.entries.len();
        match call {
            Err(reason) => {
                self.entries.push(Entry::new(id, None));
                self.refuse(ix, SchedulerError::Unreadable { reason }, out);
            }
            Ok(call) => {
                emit(out, id, EventKind::CallReceived { call: call.clone() });
                self.entries.push(Entry::new(id, Some(call)));
                self.accept(ix, out);
            }
        }
    }

    /// Validates the entry's current call and puts it in the graph, or refuses it.
    fn accept(&mut self, ix: usize, out: &mut Vec<Action>) {
        let id = self.entries[ix].id;
        let prepared = match self.entries[ix].current() {
            None => return,
            Some(call) => self.prepare(call),
        };
        let (tool, refs, target) = match prepared {
            Ok(p) => p,
            Err(e) => return self.refuse(ix, e, out),
        };
        let reads: Vec<&Path> = refs
            .iter()
            .flat_map(|(_, x)| x.refs.iter().map(|r| &r.path))
            .collect();
        let writes: Vec<&Path> = target
            .iter()
            .flat_map(|t| t.refs.iter().map(|r| &r.path))
            .collect();
        if let Err(e) = self.graph.insert(id, &reads, &writes) {
            return self.refuse(ix, e.into(), out);
        }
        let e = &mut self.entries[ix];
        e.tool = Some(tool);
        e.target = target;
        e.refs = refs;
        self.set_phase(ix, Phase::Waiting);
        self.recheck.insert(id);
    }

    #[allow(clippy::type_complexity)]
    fn prepare(
        &self,
        call: &Call,
    ) -> Result<
        (
            ToolEntry,
            resolve::Refs,
            Option<crate::protocol::Expression>,
        ),
        SchedulerError,
    > {
        let Some(tool) = self.tools.get(&call.tool) else {
            let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            return Err(SchedulerError::UnknownTool {
                tool: call.tool.clone(),
                known: known.join(", "),
            });
        };
        let refs = call.references()?;
        let target = call.output_target()?;
        if tool.tool.is_latent() && !call.params.contains_key("_output") {
            return Err(SchedulerError::MissingLatentOutput {
                tool: call.tool.clone(),
            });
        }
        Ok((tool.clone(), refs, target))
    }

    fn refuse(&mut self, ix: usize, err: SchedulerError, out: &mut Vec<Action>) {
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
        self.entries[ix].value = Some(err.to_value());
        self.set_phase(ix, Phase::Done(CallStatus::Refused));
    }

    /// Takes the call out of the graph and queues the waiting readers of what it could write.
    fn release(&mut self, ix: usize) {
        let e = &self.entries[ix];
        self.graph.remove(e.id, read_paths(e), write_paths(e));
        for w in write_paths(e) {
            self.graph.readers_of(w, &mut self.recheck);
        }
    }

    pub(super) fn settle(&mut self, now: Millis, out: &mut Vec<Action>) {
        loop {
            while let Some(id) = self.recheck.pop_first() {
                self.check(id, now, out);
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
                    let e = &self.entries[ix];
                    let missing = e
                        .waiting_on
                        .iter()
                        .filter_map(|&at| resolve::path_at(&e.refs, at).cloned())
                        .collect();
                    self.unresolve(ix, missing, out);
                }
            }
        }
    }

    fn drain(&mut self, out: &mut Vec<Action>) {
        self.drained = true;
        out.push(Action::Event {
            call: None,
            kind: EventKind::StepDrained,
        });
        out.push(Action::Drained);
    }

    /// True while one of the paths the call last waited on can still be written (rule 5),
    /// resuming from the first path not yet seen free.
    fn still_blocked(&mut self, ix: usize) -> bool {
        let open = self.stream_open;
        let e = &mut self.entries[ix];
        while let Some(&at) = e.waiting_on.get(e.watch) {
            let Some(p) = resolve::path_at(&e.refs, at) else {
                e.watch += 1;
                continue;
            };
            if self.graph.writable_by_other(p, e.id) || (open && self.state.get(p).is_none()) {
                return true;
            }
            e.watch += 1;
        }
        false
    }

    fn check(&mut self, id: CallId, now: Millis, out: &mut Vec<Action>) {
        let Some(ix) = self.ix(id) else { return };
        if self.entries[ix].phase != Phase::Waiting || self.still_blocked(ix) {
            return;
        }
        let open = self.stream_open;
        self.resolutions += 1;
        let resolved = {
            let e = &self.entries[ix];
            let Some(call) = e.current() else {
                return;
            };
            let (graph, state) = (&self.graph, &self.state);
            let writable =
                |p: &Path| graph.writable_by_other(p, id) || (open && state.get(p).is_none());
            resolve::check(state, &call.params, &e.refs, &writable)
        };
        match resolved {
            Err(e) => self.fail(
                ix,
                SchedulerError::State(e).to_value(),
                FailKind::Error,
                None,
                now,
                out,
            ),
            Ok(Check::Ready(params)) => self.unblock(ix, params, now, out),
            Ok(Check::Blocked(at)) => self.block(ix, at, &[], out),
            Ok(Check::Missing { missing, blocked }) if open => {
                self.block(ix, blocked, &missing, out)
            }
            Ok(Check::Missing { missing, .. }) => self.unresolve(ix, missing, out),
        }
    }

    /// The call waits on the paths at `at` and (stream open only) on `absent` paths, which no
    /// call writes yet; those are not watched, so the call is checked again in full when any
    /// write overlapping its reads lands or the stream closes.
    fn block(&mut self, ix: usize, at: Vec<RefAt>, absent: &[Path], out: &mut Vec<Action>) {
        let e = &mut self.entries[ix];
        if !e.announced {
            e.announced = true;
            let mut paths: Vec<Path> = at
                .iter()
                .filter_map(|&a| resolve::path_at(&e.refs, a).cloned())
                .collect();
            paths.extend(absent.iter().cloned());
            let waiting_on = path_strings(&paths);
            emit(out, e.id, EventKind::Blocked { waiting_on });
        }
        e.waiting_on = if absent.is_empty() { at } else { Vec::new() };
        e.watch = 0;
    }

    fn unresolve(&mut self, ix: usize, missing: Vec<Path>, out: &mut Vec<Action>) {
        let missing = path_strings(&missing);
        let e = &mut self.entries[ix];
        emit(
            out,
            e.id,
            EventKind::Unresolved {
                missing: missing.clone(),
            },
        );
        e.value = Some(SchedulerError::Unresolved { missing }.to_value());
        e.waiting_on = Vec::new();
        self.set_phase(ix, Phase::Done(CallStatus::Unresolved));
        self.release(ix);
    }

    fn unblock(
        &mut self,
        ix: usize,
        params: Map<String, Value>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        self.graph.stop_reading(id, read_paths(&self.entries[ix]));
        let e = &mut self.entries[ix];
        e.waiting_on = Vec::new();
        if e.announced {
            e.announced = false;
            emit(out, id, EventKind::Unblocked);
        }
        let (Some(tool), Some(cur)) = (e.tool.clone(), e.current()) else {
            return;
        };
        let call = Call {
            tool: cur.tool.clone(),
            params,
            output_path: cur.output_path.clone(),
            output_method: cur.output_method,
            instance: cur.instance.clone(),
            scopes: cur.scopes.clone(),
        };
        let approved = e.approved;
        if let Some(validate) = &self.opts.validate
            && let Err(reason) = validate(&tool.tool, &call)
        {
            let err = SchedulerError::InvalidParams {
                tool: call.tool.clone(),
                reason,
            };
            self.refuse(ix, err, out);
            return self.release(ix);
        }
        if tool.tool.is_latent() {
            let value = call.params.get("_output").cloned().unwrap_or(Value::Null);
            return self.succeed(ix, value, None, now, out);
        }
        if approved || assess(&tool.tool, &self.policy) == Gate::Run {
            return self.launch(ix, call, tool, out);
        }
        emit(out, id, EventKind::ApprovalRequested { call: call.clone() });
        self.entries[ix].presented = Some(Box::new(call.clone()));
        self.set_phase(ix, Phase::Asking);
        out.push(Action::Ask {
            id,
            call,
            tool: tool.tool,
            timeout: self.policy.timeout,
        });
    }

    fn launch(&mut self, ix: usize, call: Call, tool: ToolEntry, out: &mut Vec<Action>) {
        let id = self.entries[ix].id;
        emit(
            out,
            id,
            EventKind::Started {
                tool: call.tool.clone(),
                params: call.params.clone(),
            },
        );
        let detached = tool.detached && self.entries[ix].target.is_none();
        if detached {
            self.set_phase(ix, Phase::Done(CallStatus::Detached));
            self.release(ix);
        } else {
            self.set_phase(ix, Phase::Running);
        }
        out.push(Action::Launch {
            id,
            call,
            tool: tool.tool,
            detached,
        });
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

    fn method(&self, ix: usize) -> OutputMethod {
        self.entries[ix]
            .current()
            .map(Call::method_or_default)
            .unwrap_or_default()
    }

    fn write_all(
        &mut self,
        ix: usize,
        paths: Vec<Path>,
        value: &Value,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        let method = self.method(ix);
        for p in paths {
            let path = p.to_string();
            let write_seq = self.state.write(p, value.clone(), method, Some(id), now);
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

    fn succeed(
        &mut self,
        ix: usize,
        value: Value,
        branch: Option<usize>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let paths = self.entries[ix]
            .target
            .as_ref()
            .map(|t| output_paths(t, true, branch))
            .unwrap_or_default();
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
    fn fail(
        &mut self,
        ix: usize,
        error: Value,
        kind: FailKind,
        branch: Option<usize>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let paths = self.entries[ix]
            .target
            .as_ref()
            .map(|t| output_paths(t, false, branch))
            .unwrap_or_default();
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

    pub(super) fn decided(
        &mut self,
        id: CallId,
        decision: Decision,
        timed_out: bool,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let Some(ix) = self.ix(id) else { return };
        if self.entries[ix].phase != Phase::Asking {
            return;
        }
        emit(
            out,
            id,
            EventKind::Decision {
                decision: decision.clone(),
                timed_out,
            },
        );
        let presented = self.entries[ix].presented.take();
        match decision {
            Decision::Approve => {
                if let (Some(call), Some(tool)) = (presented, self.entries[ix].tool.clone()) {
                    self.launch(ix, *call, tool, out);
                }
            }
            Decision::Reject { reason } => {
                let err = SchedulerError::Rejected { reason }.to_value();
                self.fail(ix, err, FailKind::Rejected, None, now, out);
            }
            Decision::Edit { params } => match self.edited(ix, params) {
                Ok(call) => self.rewrite(ix, call, out),
                Err(reason) => {
                    self.refuse(ix, SchedulerError::BadEdit { reason }, out);
                    self.release(ix);
                }
            },
            Decision::Replace { call } => self.rewrite(ix, call, out),
        }
    }

    /// The current call with `params` in place of its params; meta fields in `params` override.
    fn edited(&self, ix: usize, params: Map<String, Value>) -> Result<Call, String> {
        let cur = self.entries[ix].current().ok_or("no call to edit")?;
        let mut obj = Map::new();
        obj.insert("_tool".into(), Value::String(cur.tool.clone()));
        if let Some(p) = &cur.output_path {
            obj.insert("_outputPath".into(), Value::String(p.clone()));
        }
        if let Some(m) = cur.output_method {
            obj.insert("_outputMethod".into(), Value::String(m.as_str().into()));
        }
        if let Some(i) = &cur.instance {
            obj.insert("_instance".into(), Value::String(i.clone()));
        }
        if let Some(s) = &cur.scopes {
            obj.insert("_scopes".into(), serde_json::json!(s));
        }
        for (k, v) in params {
            if k != "_tool" {
                obj.insert(k, v);
            }
        }
        Call::try_from(Value::Object(obj)).map_err(|e| e.to_string())
    }

    /// Rule 13: an edited or replacing call takes the original's place (same id), its references
    /// resolved afresh; it waits again if it needs something not yet available, and is not
    /// presented again.
    fn rewrite(&mut self, ix: usize, call: Call, out: &mut Vec<Action>) {
        self.release(ix);
        let e = &mut self.entries[ix];
        e.revised = Some(Box::new(call));
        e.refs = Vec::new();
        e.approved = true;
        e.announced = false;
        e.waiting_on = Vec::new();
        e.watch = 0;
        e.tool = None;
        e.target = None;
        self.set_phase(ix, Phase::Done(CallStatus::Refused));
        self.accept(ix, out);
    }

    pub(super) fn timed_out(&mut self, id: CallId, now: Millis, out: &mut Vec<Action>) {
        let decision = match self.policy.default_decision {
            DefaultDecision::Approve => Decision::Approve,
            DefaultDecision::Reject => Decision::Reject {
                reason: format!(
                    "no reviewer answered within {} ms and the policy rejects by default",
                    self.policy.timeout.map_or(0, |t| t.as_millis())
                ),
            },
        };
        self.decided(id, decision, true, now, out);
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
            self.graph.remove(id, read_paths(e), write_paths(e));
        }
    }
}
