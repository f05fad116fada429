//! One agent of a run (the run's own, or a delegate's): its state, its current step's
//! scheduler, the model turn being read, and the outer-loop bookkeeping between steps.
//!
//! The machine moves frames through their steps; this file holds the per-agent data and the
//! pure decisions made at the end of a step (rules 15, 16, 19), including what the model is
//! told about an answer that was not a Solution and what a run that ends on a limit says
//! about the last such answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::config::AgentConfig;
use super::types::{CallSummary, FrameKey, RunError, RunResult, RunStatus, Usage};
use crate::context::{
    self, ContextInput, PlanEntry, SanitizeLimits, Stop, TurnTracker, compact, correction,
};
use crate::protocol::{Call, CallId, Decision, Message, Path};
use crate::scheduler::{CallStatus, Scheduler, StepReport};
use crate::state::{Resolved, State};

/// What one model turn produced besides its calls.
#[derive(Debug, Default)]
pub(super) struct Turn {
    pub output: Value,
    pub usage: Usage,
    /// What was wrong with the response as a whole: (code, words), as journaled.
    pub problems: Vec<(Option<String>, String)>,
    pub fatal: Option<RunError>,
    pub attempt: u32,
    /// Calls (readable or not) streamed so far in this turn.
    pub calls: usize,
    /// The position, in the agent's model list, of the model answering the turn (moved on by
    /// a journaled fallback).
    pub model: usize,
    /// The compaction level the turn is asked at (0: not compacted; one level more after each
    /// context overflow the provider answered).
    pub compaction: u8,
    /// The sizes (characters of the messages as JSON) of the contexts the provider refused as
    /// too long, in order.
    pub refused: Vec<u64>,
    /// The turn is asked without streaming (a journaled re-ask after a broken stream).
    pub whole: bool,
}

#[derive(Debug)]
pub(super) struct Frame {
    pub key: FrameKey,
    /// The agent above this one (None for the run's own agent).
    pub parent: Option<FrameKey>,
    /// The delegate calls above this agent, outermost first.
    pub path: Vec<CallId>,
    pub depth: u32,
    pub cfg: Arc<AgentConfig>,
    /// This agent's input (a delegate's is the call's params).
    pub input: Option<Value>,
    /// Context messages added for this agent (a delegate's granted scopes).
    pub extra: Vec<Message>,
    pub step: u32,
    pub state: Option<State>,
    pub sched: Option<Scheduler>,
    pub streaming: bool,
    /// The context of the current turn (asked again as is after a restart; kept only by a
    /// machine that may be resumed: `RunMachine::keep_launched`).
    pub messages: Vec<Message>,
    pub turn: Turn,
    pub tracker: TurnTracker,
    pub output_errors: Vec<String>,
    /// What the next Request tells the model about its previous response.
    pub problems: Vec<String>,
    /// What was wrong with the last step's answer, if anything: the error of a run that ends
    /// on a limit names it.
    pub last_fault: Option<Fault>,
    pub retries_left: u32,
    pub plan: Vec<PlanEntry>,
    /// The previous step's calls, kept for a compacted context, which shows each by its tool,
    /// status and output path (`context::compact::brief`, made only when a context is
    /// compacted).
    pub brief: Vec<(CallId, Option<Arc<Call>>, CallStatus)>,
    pub calls: Vec<CallSummary>,
    pub decisions: BTreeMap<CallId, Decision>,
    /// Who made each decision in `decisions` (when its op said).
    pub decided_by: BTreeMap<CallId, crate::protocol::Actor>,
    /// The presentation each call awaiting a decision answers to: the `seq` of its latest
    /// `approval_requested` event (DESIGN.md 3.6).
    pub presented: BTreeMap<CallId, u64>,
    /// The reviewer timeout (ms) of each call awaiting a decision whose clock has not started:
    /// it starts when the call is first shown to somebody (`RunInput::Shown`), not when it
    /// was asked about (issue 48: a call prompted after another one gets its whole time).
    pub unshown: BTreeMap<CallId, u64>,
    pub usage: Usage,
    /// Set when the agent must stop at the end of the current step (cancel, timeout).
    pub stopping: Option<RunStatus>,
    /// The step whose workspace memory was asked for and the query, until the engine answers
    /// (`RunInput::Recalled`).
    pub recall: Option<(u32, String)>,
    /// The workspace memory chunks recalled for the current step (shown in its context).
    pub recalled: Vec<crate::context::memory::Chunk>,
    /// The model's `thoughts` in the current turn (part of the next step's memory query).
    pub thoughts: Option<Value>,
}

/// What was wrong with one step's answer: a stable code and the problem in words.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub step: u32,
    pub code: String,
    /// "was not a valid Solution" or "had a call refused".
    pub kind: &'static str,
    /// The problem, as the model was told.
    pub message: String,
}

impl Fault {
    /// The first problem of the answer as a whole, else its first refused call (one that was
    /// not a call, named no known tool, or could not be accepted for another reason).
    fn of(step: u32, problems: &[(Option<String>, String)], report: &StepReport) -> Option<Fault> {
        if let Some((code, message)) = problems.first() {
            return Some(Fault {
                step,
                code: code.clone().unwrap_or_else(|| "plan.problem".into()),
                kind: "was not a valid Solution",
                message: message.clone(),
            });
        }
        let refused = report
            .calls
            .iter()
            .find(|c| c.status == crate::scheduler::CallStatus::Refused)?;
        let error = refused.error.as_ref();
        let text = |k: &str| error.and_then(|e| e.get(k)).and_then(Value::as_str);
        Some(Fault {
            step,
            code: text("code").unwrap_or("scheduler.refused").to_string(),
            kind: "had a call refused",
            message: text("message")
                .unwrap_or("the call was refused")
                .to_string(),
        })
    }
}

/// What to do once a step has drained.
pub(super) enum Next {
    Step,
    Finish(RunStatus, Option<Box<RunError>>, Value),
}

impl Frame {
    pub fn new(
        key: FrameKey,
        parent: Option<&Frame>,
        cfg: Arc<AgentConfig>,
        input: Option<Value>,
        extra: Vec<Message>,
    ) -> Frame {
        let retries_left = cfg.limits.max_output_retries;
        Frame {
            key,
            parent: parent.map(|p| p.key),
            path: parent
                .map(|p| {
                    let mut v = p.path.clone();
                    v.extend(key);
                    v
                })
                .unwrap_or_default(),
            depth: parent.map_or(0, |p| p.depth + 1),
            cfg,
            input,
            extra,
            step: 0,
            state: None,
            sched: None,
            streaming: false,
            messages: Vec::new(),
            turn: Turn::default(),
            tracker: TurnTracker::default(),
            output_errors: Vec::new(),
            problems: Vec::new(),
            last_fault: None,
            retries_left,
            plan: Vec::new(),
            brief: Vec::new(),
            calls: Vec::new(),
            decisions: BTreeMap::new(),
            decided_by: BTreeMap::new(),
            presented: BTreeMap::new(),
            unshown: BTreeMap::new(),
            usage: Usage::default(),
            stopping: None,
            recall: None,
            recalled: Vec::new(),
            thoughts: None,
        }
    }

    /// The initial state log: input and state, written at `now`.
    pub fn initial_state(&self, now: u64) -> State {
        self.cfg.initial_state(self.input.as_ref(), now)
    }

    /// The messages of the next Request (the plan moves into them).
    pub fn messages(&mut self, state: &State, sanitize: SanitizeLimits) -> Vec<Message> {
        let cfg = &self.cfg;
        let state_view = state.view("state").unwrap_or(Value::Null);
        let input_schema = cfg.input.as_ref().and_then(|(_, s)| s.as_ref());
        let mut extra = cfg.context.clone();
        extra.extend(context::memory::message(&self.recalled));
        extra.extend(self.extra.iter().cloned());
        context::assemble(ContextInput {
            goal: &cfg.goal,
            tools: &cfg.tools,
            extra: &extra,
            input: self.input.as_ref().map(|v| (v, input_schema)),
            state: Some((state_view, cfg.state.1.as_ref())),
            plan: std::mem::take(&mut self.plan),
            output_errors: &self.output_errors,
            model_errors: &self.problems,
            limits: sanitize,
        })
    }

    /// The least compaction level from `from` whose context fits `window`, or the most
    /// compacted level when none does; with that context and its size.
    pub fn fitting_level(
        &self,
        from: u8,
        window: &crate::context::fit::Window,
        usual: SanitizeLimits,
    ) -> (u8, Vec<Message>, u64) {
        let mut level = from.clamp(1, compact::MAX_LEVEL);
        loop {
            let messages = self.compacted_messages(level, usual);
            let chars = crate::llm::wire::json_chars(&messages) as u64;
            if level >= compact::MAX_LEVEL || window.fits(chars) {
                return (level, messages, chars);
            }
            level += 1;
        }
    }

    /// The current turn's context compacted to `level` (after the provider said
    /// `llm.context_overflow`; see `context::compact` for what each level drops).
    /// Deterministic: a replay of the same journal compacts the same way.
    pub fn compacted_messages(&self, level: u8, usual: SanitizeLimits) -> Vec<Message> {
        let limits = compact::limits(level, usual);
        let cfg = &self.cfg;
        let state = self
            .sched
            .as_ref()
            .map(Scheduler::state)
            .or(self.state.as_ref());
        let state_view = match state {
            Some(s) => compact::state(s.view("state").unwrap_or(Value::Null), s.log(), level),
            None => Value::Null,
        };
        let input = self
            .input
            .as_ref()
            .map(|v| context::sanitize_owned(compact::input(v.clone(), level), &limits));
        let input_schema = cfg.input.as_ref().and_then(|(_, s)| s.as_ref());
        let mut extra = cfg.context.clone();
        extra.extend(context::memory::message(&self.recalled));
        let mut extra = compact::context(&extra, level);
        extra.extend(self.extra.iter().cloned());
        let mut out = context::assemble(ContextInput {
            goal: &cfg.goal,
            tools: &cfg.tools,
            extra: &extra,
            input: input.as_ref().map(|v| (v, input_schema)),
            state: Some((state_view, cfg.state.1.as_ref())),
            plan: self
                .brief
                .iter()
                .map(|(id, call, status)| {
                    compact::brief(&PlanEntry {
                        id: *id,
                        call: call.clone(),
                        status: status.as_str().into(),
                        result: None,
                        error: None,
                        missing: Vec::new(),
                    })
                })
                .collect(),
            output_errors: &self.output_errors,
            model_errors: &self.problems,
            limits,
        });
        out.push(Message::Text {
            role: crate::protocol::Role::User,
            text: compact::note(level),
            extra: Map::new(),
        });
        out
    }

    /// Folds a drained step's report into the plan the next Request shows and the run's call
    /// list.
    pub fn absorb(&mut self, step: u32, report: &StepReport) {
        self.brief.clear();
        self.plan = report
            .calls
            .iter()
            .map(|c| {
                let call = c.revised.as_ref().or(c.call.as_deref());
                self.calls.push(CallSummary {
                    id: c.id,
                    step,
                    tool: call.map(|x| x.tool.clone()).unwrap_or_default(),
                    status: c.status,
                    decision: self.decisions.get(&c.id).map(|d| d.name().to_string()),
                    error: c.error.as_deref().cloned(),
                });
                let shown = match &c.revised {
                    Some(r) => Some(Arc::new(r.clone())),
                    None => c.call.clone(),
                };
                let entry = PlanEntry {
                    id: c.id,
                    call: shown.clone(),
                    status: c.status.as_str().into(),
                    result: call
                        .filter(|x| x.output_path.is_none())
                        .and(c.result.as_deref().cloned()),
                    error: c.error.as_deref().cloned(),
                    missing: c.missing.clone(),
                };
                self.brief.push((c.id, shown, c.status));
                entry
            })
            .collect();
    }

    /// The outer loop's decision once step `self.step` has drained (rules 15, 16, 19).
    /// Returns the events to publish (`solution`, `output_invalid`) through `emit`.
    pub fn after_step(
        &mut self,
        report: &StepReport,
        emit: &mut dyn FnMut(crate::protocol::EventKind),
    ) -> Next {
        use crate::protocol::EventKind;
        let turn = std::mem::take(&mut self.turn);
        self.usage.add(turn.usage);
        if let Some(status) = self.stopping {
            return Next::Finish(status, None, Value::Null);
        }
        if let Some(err) = turn.fatal {
            let status = if err.code == "run.context_overflow" {
                RunStatus::ContextOverflow
            } else {
                RunStatus::ModelError
            };
            return Next::Finish(status, Some(Box::new(err)), Value::Null);
        }
        self.last_fault = Fault::of(self.step, &turn.problems, report);
        self.problems = turn
            .problems
            .iter()
            .map(|(code, message)| correction::render(code.as_deref(), message))
            .collect();
        let has_output = !turn.output.is_null();
        emit(EventKind::Solution {
            output_present: has_output,
        });
        self.output_errors.clear();
        if has_output {
            let errors = match self.resolve_output(&turn.output) {
                Ok(output) => {
                    let violations = self.cfg.output.validate(&output);
                    if violations.is_empty() {
                        return Next::Finish(RunStatus::Succeeded, None, output);
                    }
                    violations.iter().map(ToString::to_string).collect()
                }
                Err(errors) => errors,
            };
            self.output_errors = errors;
            emit(EventKind::OutputInvalid {
                errors: self.output_errors.clone(),
            });
            if self.retries_left == 0 {
                let mut err = RunError::new(
                    "run.invalid_output",
                    "the output did not match the output schema",
                );
                err.errors = self.output_errors.clone();
                return Next::Finish(RunStatus::InvalidOutput, Some(Box::new(err)), Value::Null);
            }
            self.retries_left -= 1;
        }
        if let Some(budget) = self.cfg.limits.token_budget
            && self.usage.total() > budget
        {
            return Next::Finish(RunStatus::TokenBudget, None, Value::Null);
        }
        let written: Vec<Arc<Call>> = report
            .calls
            .iter()
            .filter_map(|c| c.call.clone())
            .collect();
        let limits = &self.cfg.limits;
        match self
            .tracker
            .record(&written, has_output, limits.doom_loop, limits.empty_turns)
        {
            Some(Stop::DoomLoop) => Next::Finish(RunStatus::DoomLoop, None, Value::Null),
            Some(Stop::EmptyTurns) => Next::Finish(RunStatus::EmptyTurns, None, Value::Null),
            None => Next::Step,
        }
    }

    /// Rule 19: references inside the output are replaced by what state holds; a reference to
    /// nothing is a validation error for the model.
    fn resolve_output(&self, output: &Value) -> Result<Value, Vec<String>> {
        let Some(state) = &self.state else {
            return Ok(output.clone());
        };
        let mut wrapper = Map::new();
        wrapper.insert("output".into(), output.clone());
        let nothing_pending = |_: &Path| false;
        match state.resolve_params(&wrapper, &nothing_pending) {
            Ok(Resolved::Ready(mut m)) => Ok(m.remove("output").unwrap_or(Value::Null)),
            Ok(Resolved::Missing { missing, .. }) | Ok(Resolved::Blocked(missing)) => Err(missing
                .iter()
                .map(|p| format!("the output refers to `†{p}`, which holds nothing"))
                .collect()),
            Err(e) => Err(vec![format!("the output has a bad reference: {e}")]),
        }
    }

    /// `err` with the validation errors of the model's last output when it was invalid and the
    /// run then ended otherwise (the model failed, a limit ran out): `cause.output_errors`, so
    /// the result says why the run never got a valid output (`run.invalid_output` has its own
    /// `errors`).
    fn with_output_errors(&self, mut err: RunError) -> RunError {
        if self.output_errors.is_empty() || !err.errors.is_empty() {
            return err;
        }
        let errors = json!(self.output_errors);
        match &mut err.cause {
            Some(Value::Object(m)) => {
                m.insert("output_errors".into(), errors);
            }
            Some(_) => {}
            None => {
                err.cause = Some(json!({
                    "code": "run.invalid_output",
                    "message": "the model's last output did not match the output schema",
                    "output_errors": errors,
                }));
            }
        }
        err
    }

    /// The frame's result.
    pub fn result(
        &mut self,
        status: RunStatus,
        error: Option<RunError>,
        output: Value,
    ) -> RunResult {
        let error = error.or_else(|| {
            let code = status.code()?;
            let mut err = RunError::new(code, format!("the run ended: {}", status.as_str()));
            let on_limit = matches!(
                status,
                RunStatus::MaxSteps
                    | RunStatus::DoomLoop
                    | RunStatus::EmptyTurns
                    | RunStatus::TokenBudget
                    | RunStatus::Timeout
            );
            if let (true, Some(f)) = (on_limit, &self.last_fault) {
                err.message = format!(
                    "{}; the model's last response (step {}) {}: {}",
                    err.message, f.step, f.kind, f.message
                );
                err.cause = Some(json!({"code": f.code, "step": f.step, "message": f.message}));
            }
            Some(err)
        });
        let error = error.map(|e| self.with_output_errors(e));
        let state = self
            .state
            .as_ref()
            .or_else(|| self.sched.as_ref().map(Scheduler::state))
            .and_then(|s| s.view("state"))
            .unwrap_or(Value::Null);
        RunResult {
            status,
            output,
            state,
            steps: self.step,
            usage: std::mem::take(&mut self.usage),
            calls: std::mem::take(&mut self.calls),
            error,
        }
    }
}

/// The outcome a delegate's result gives its parent call.
pub(super) fn delegate_outcome(tool: &str, r: &RunResult) -> crate::scheduler::Outcome {
    use crate::scheduler::Outcome;
    if r.succeeded() {
        return Outcome::ok(r.output.clone());
    }
    Outcome::error(crate::protocol::error_object(
        "activity.failed",
        format!("delegate `{tool}` ended with status {}", r.status.as_str()),
        r.error.as_ref().map(|e| e.to_value()),
    ))
}
