//! The approval gate's transitions (rules 13-14): presenting an unblocked call, launching it,
//! and applying a reviewer's decision (approve, edit, replace, reject) or the policy default.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::core::{emit, read_ids};
use super::{Phase, Scheduler, ToolEntry, is_idempotent};
use crate::approval::{DefaultDecision, RuleDecision, evaluate};
use crate::protocol::{
    Call, CallId, Decision, EventKind, FailKind, LaunchedParams, LaunchedTool, Millis, params_hash,
};
use crate::scheduler::{
    Action, CallStatus, EditError, Parsed, SchedulerError, ValidationError, resolve,
};

/// A validator's verdict, when it ran.
type Checked = Option<Result<(), ValidationError>>;

impl Scheduler {
    pub(super) fn unblock(
        &mut self,
        ix: usize,
        overlay: resolve::Overlay,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        self.graph
            .stop_reading_ids(self.state.paths(), id, read_ids(&self.entries[ix]));
        let e = &mut self.entries[ix];
        e.waiting_on = Vec::new();
        if e.announced {
            e.announced = false;
            emit(out, id, EventKind::Unblocked);
        }
        let (Some(tool), Some(cur)) = (e.tool.clone(), e.current()) else {
            return;
        };
        // The call as it goes on: the written call itself, shared, when it has no references
        // and no reviewer revised it; else the resolved call, built once.
        let shared = match (&e.written, &e.revised) {
            (Some(written), None) if overlay.is_empty() => Some(written.clone()),
            _ => None,
        };
        let built = shared.is_none().then(|| Call {
            tool: cur.tool.clone(),
            params: resolve::apply(&cur.params, &e.refs, overlay).into(),
            output_path: cur.output_path.clone(),
            output_method: cur.output_method,
            instance: cur.instance.clone(),
            scopes: cur.scopes.clone(),
        });
        let latent = tool.tool.is_latent();
        let Some(call) = shared.or_else(|| built.map(Arc::new)) else {
            return;
        };
        let (checked, latent_checked) = self.checked(&tool, &call, latent);
        let e = &self.entries[ix];
        let approved = e.approved;
        if let Some(Err(reason)) = checked {
            let err = SchedulerError::InvalidParams {
                tool: call.tool.clone(),
                reason,
            };
            self.refuse(ix, err, out);
            return self.release(ix);
        }
        if latent {
            if let Some(Err(reason)) = latent_checked {
                let err = SchedulerError::InvalidLatentOutput {
                    tool: call.tool.clone(),
                    reason,
                };
                return self.fail(ix, err.to_value().into(), FailKind::Error, None, now, out);
            }
            let value = call.params.get("_output").cloned().unwrap_or(Value::Null);
            return self.succeed(ix, value.into(), None, now, out);
        }
        if approved {
            return self.launch(ix, call, tool, out);
        }
        // The approval rules (first match wins; the old forms come last).
        let verdict = evaluate(&tool.tool, &call, &self.policy);
        match verdict.decision {
            RuleDecision::Allow => self.launch(ix, call, tool, out),
            RuleDecision::Ask => {
                let rule = verdict.label(&self.policy);
                self.present(ix, call, tool, false, Some(rule), out);
            }
            RuleDecision::Deny => {
                let reason = verdict.reason(&self.policy, &tool.tool);
                let rule = verdict.label(&self.policy);
                self.entries[ix].decided = true;
                emit(
                    out,
                    id,
                    EventKind::Decision {
                        decision: Decision::Reject {
                            reason: reason.clone(),
                        },
                        timed_out: false,
                        by: Some(crate::protocol::Actor::new(
                            "dagloop",
                            crate::protocol::Actor::POLICY,
                        )),
                        rule: Some(rule),
                        standing: None,
                    },
                );
                let err = SchedulerError::Rejected { reason }.to_value();
                self.fail(ix, err.into(), FailKind::Rejected, None, now, out);
            }
        }
    }

    /// The params check and (a latent call whose params passed) the `_output` check, of the
    /// call's params in place: the validators read its JSON object, shared or built, uncopied.
    fn checked(&self, tool: &ToolEntry, call: &Call, latent: bool) -> (Checked, Checked) {
        let (validate, latent_check) = (
            self.opts.validate.as_ref(),
            self.opts.validate_latent.as_ref().filter(|_| latent),
        );
        if validate.is_none() && latent_check.is_none() {
            return (None, None);
        }
        let checked = validate.map(|v| v(&tool.tool, call.params.as_value()));
        // The latent `_output` check runs only for params that passed.
        let latent_checked = match (latent_check, &checked) {
            (Some(check), None | Some(Ok(()))) => Some(check(&tool.tool, call.params.as_value())),
            _ => None,
        };
        (checked, latent_checked)
    }

    /// Puts the call before a reviewer: the event (with the params hash decisions quote), the
    /// Ask action, and the call kept as presented.
    fn present(
        &mut self,
        ix: usize,
        call: Arc<Call>,
        tool: ToolEntry,
        interrupted: bool,
        rule: Option<String>,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        emit(
            out,
            id,
            EventKind::ApprovalRequested {
                params_hash: params_hash(&call),
                call: call.clone(),
                path: Vec::new(),
                interrupted,
                rule,
                read_from: self.entries[ix].read_from.clone(),
            },
        );
        // The goal's deadline, or the floor's for a call the operator's floor asks about.
        let (timeout, _) = self.policy.on_timeout(&tool.tool, &call);
        self.entries[ix].presented = Some(call.clone());
        self.entries[ix].interrupted = interrupted;
        self.set_phase(ix, Phase::Asking);
        out.push(Action::Ask {
            id,
            call,
            tool: tool.tool,
            timeout,
            interrupted,
        });
    }

    pub(super) fn launch(
        &mut self,
        ix: usize,
        call: Arc<Call>,
        tool: ToolEntry,
        out: &mut Vec<Action>,
    ) {
        let id = self.entries[ix].id;
        // One call, shared by the `started` event and the activity (and, for a call without
        // references, with the call as written): neither the params nor the tool name is copied.
        emit(
            out,
            id,
            EventKind::Started {
                tool: LaunchedTool::of(call.clone()),
                params: LaunchedParams::of(call.clone()),
                read_from: std::mem::take(&mut self.entries[ix].read_from),
            },
        );
        let detached = tool.detached && self.entries[ix].target.is_none();
        if detached {
            self.set_phase(ix, Phase::Done(CallStatus::Detached));
            self.release(ix);
        } else {
            self.set_phase(ix, Phase::Running);
            // Kept to re-present (or re-launch) the call if the run stops while it runs.
            if self.opts.keep_launched {
                self.entries[ix].presented = Some(call.clone());
            }
        }
        out.push(Action::Launch {
            id,
            call,
            tool: tool.tool,
            detached,
        });
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
        self.entries[ix].decided = true;
        let interrupted = std::mem::take(&mut self.entries[ix].interrupted);
        emit(
            out,
            id,
            EventKind::Decision {
                decision: decision.clone(),
                timed_out,
                // A reviewer's time ran out: the policy's default decided (the machine names a
                // reviewer's decision itself, and the standing approval it came from).
                by: timed_out.then(|| {
                    crate::protocol::Actor::new("dagloop", crate::protocol::Actor::TIMEOUT)
                }),
                rule: None,
                standing: None,
            },
        );
        let presented = self.entries[ix].presented.take();
        match decision {
            Decision::Approve => {
                if let (Some(call), Some(tool)) = (presented, self.entries[ix].tool.clone()) {
                    self.launch(ix, call, tool, out);
                }
            }
            Decision::Reject { reason } => {
                let err = SchedulerError::Rejected { reason }.to_value();
                self.fail(ix, err.into(), FailKind::Rejected, None, now, out);
            }
            Decision::SendBack { feedback } => {
                let err = SchedulerError::SentBack { feedback }.to_value();
                self.fail(ix, err.into(), FailKind::Rejected, None, now, out);
            }
            Decision::Edit { params } => match self.edited(ix, params) {
                Ok(call) => self.rewrite(ix, Box::new(call), true, out),
                Err(reason) => {
                    self.refuse(ix, SchedulerError::BadEdit { reason }, out);
                    self.release(ix);
                }
            },
            // Only an interrupted call can be marked done (the machine refuses it otherwise).
            Decision::Done { result } if interrupted => {
                self.succeed(ix, result.into(), None, now, out);
            }
            Decision::Done { .. } => {
                let err = SchedulerError::Rejected {
                    reason: "only an interrupted call can be marked done".into(),
                }
                .to_value();
                self.fail(ix, err.into(), FailKind::Rejected, None, now, out);
            }
            Decision::Replace { call } => {
                // Rule 21: a replacement by another tool goes through that tool's own gate.
                let same_tool = self.entries[ix]
                    .current()
                    .is_some_and(|c| c.tool == call.tool);
                self.rewrite(ix, call, same_tool, out)
            }
        }
    }

    /// The run stopped while this call ran and nobody knows whether it finished: an idempotent
    /// tool's call is launched again; any other goes back through the approval gate, flagged
    /// `interrupted`, whatever the policy.
    pub(super) fn interrupted(&mut self, id: CallId, out: &mut Vec<Action>) {
        let Some(ix) = self.ix(id) else { return };
        if self.entries[ix].phase != Phase::Running {
            return;
        }
        let (Some(call), Some(tool)) = (
            self.entries[ix].presented.clone(),
            self.entries[ix].tool.clone(),
        ) else {
            return;
        };
        if is_idempotent(&tool.tool) {
            return self.launch(ix, call, tool, out);
        }
        self.entries[ix].decided = false;
        self.entries[ix].approved = false;
        self.present(ix, call, tool, true, None, out);
    }

    /// True once a decision (or the timeout default) was applied to the call.
    pub fn was_decided(&self, id: CallId) -> bool {
        self.ix(id).is_some_and(|ix| self.entries[ix].decided)
    }

    /// True while the call awaits a decision because it was interrupted by a restart (it may
    /// be marked done).
    pub fn is_interrupted(&self, id: CallId) -> bool {
        self.ix(id).is_some_and(|ix| {
            self.entries[ix].phase == Phase::Asking && self.entries[ix].interrupted
        })
    }

    /// The calls that wait, directly or through others, on what `id` writes: blocked calls
    /// reading a path it (or one of them) may write, sorted.
    pub fn downstream(&self, id: CallId) -> Vec<CallId> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![id];
        while let Some(c) = todo.pop() {
            let Some(ix) = self.ix(c) else { continue };
            let mut readers = std::collections::BTreeSet::new();
            for &p in super::core::write_ids(&self.entries[ix]) {
                self.graph
                    .readers_of_id(self.state.paths(), p, &mut readers);
            }
            for r in readers {
                if r != id && seen.insert(r) {
                    todo.push(r);
                }
            }
        }
        seen.into_iter().collect()
    }

    /// The current call with `params` in place of its params; meta fields in `params` override.
    /// An edit keeps the tool (rule 21): a `_tool` naming another tool is refused.
    pub(super) fn edited(&self, ix: usize, params: Map<String, Value>) -> Result<Call, EditError> {
        let cur = self.entries[ix].current().ok_or(EditError::NoCall)?;
        if let Some(t) = params.get("_tool")
            && t.as_str() != Some(cur.tool.as_str())
        {
            return Err(EditError::ChangesTool {
                tool: cur.tool.clone(),
                requested: t.as_str().map_or_else(|| t.to_string(), String::from),
            });
        }
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
        Ok(Call::try_from(Value::Object(obj))?)
    }

    /// Rule 13: an edited or replacing call takes the original's place (same id), its references
    /// resolved afresh; it waits again if it needs something not yet available. It is presented
    /// again only when `approved` is false (a replacement by another tool whose own policy asks).
    pub(super) fn rewrite(
        &mut self,
        ix: usize,
        call: Box<Call>,
        approved: bool,
        out: &mut Vec<Action>,
    ) {
        self.release(ix);
        let e = &mut self.entries[ix];
        e.revised = Some(call);
        e.refs = Vec::new();
        e.paths = Vec::new();
        e.reads = 0;
        e.approved = approved;
        e.announced = false;
        e.waiting_on = Vec::new();
        e.watch = 0;
        e.tool = None;
        e.target = None;
        self.set_phase(ix, Phase::Done(CallStatus::Refused));
        self.accept(ix, Parsed::default(), out);
    }

    pub(super) fn timed_out(&mut self, id: CallId, now: Millis, out: &mut Vec<Action>) {
        // A call the operator's floor asks about is never approved by a default it did not set.
        let (timeout, default) = match self.ix(id).map(|ix| &self.entries[ix]) {
            Some(e) => match (&e.presented, &e.tool) {
                (Some(call), Some(tool)) => self.policy.on_timeout(&tool.tool, call),
                _ => (self.policy.timeout, self.policy.default_decision),
            },
            None => (self.policy.timeout, self.policy.default_decision),
        };
        let decision = match default {
            DefaultDecision::Approve => Decision::Approve,
            DefaultDecision::Reject => Decision::Reject {
                reason: format!(
                    "no reviewer answered within {} ms and the policy rejects by default",
                    timeout.map_or(0, |t| t.as_millis())
                ),
            },
        };
        self.decided(id, decision, true, now, out);
    }
}
