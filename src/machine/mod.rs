//! The outer loop as a sans-IO state machine (rules 15–21, DESIGN.md section 3.1).
//!
//! [`RunMachine::handle`] takes one [`RunInput`] (the run starts, the model streamed a call or
//! closed its stream, an activity finished, a reviewer decided, a timer fired, cancel) and the
//! current time, and returns [`Action`]s (ask the model, launch, abort, set a timer, publish a
//! numbered event, finished). It owns step counting, call-id allocation, output validation and
//! re-asks, the doom-loop and empty-turn rules, the token budget, deadlines, nested agents
//! (delegates run as frames of the same machine, under the same policy and id space) and
//! termination. It spawns nothing, reads no clock and iterates no hash map: the same inputs give
//! the same actions, so a journal of inputs rebuilds a run exactly.
//!
//! [`RunMachine::check_op`] says whether an [`Op`] applies right now (rule 21) without changing
//! anything; the engine journals only ops that apply.
//!
//! Deliberately not here: streaming from the model, running activities, sleeping, persisting or
//! delivering events (the engine performs the actions), and the inner loop's rules (the
//! scheduler's).

mod config;
mod frame;
mod grants;
mod ops;
mod overflow;
mod pending;
mod types;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

pub use config::{AgentConfig, CheckedLimits, ConfigError, MAX_SECONDS, checked_ms};
pub use pending::ModelKey;
pub use types::{
    Action, CallSummary, FrameKey, JournalEntry, RunError, RunInput, RunResult, RunStatus, Timer,
    Usage,
};

use crate::approval::Policy;
use crate::context::{SanitizeLimits, correction};
use crate::protocol::{CallId, Event, EventKind, Message, Millis};
use crate::scheduler::{self, Scheduler};
use frame::{Frame, Next, delegate_outcome};

/// Most nested agents deep a run may go (a delegate of a delegate of ...).
pub const MAX_DEPTH: u32 = 4;

/// A whole run: its agents (frames), ids and event numbering. See the module docs.
#[derive(Debug)]
pub struct RunMachine {
    run_id: Arc<str>,
    policy: Policy,
    sanitize: SanitizeLimits,
    root: Arc<AgentConfig>,
    frames: BTreeMap<FrameKey, Frame>,
    /// The frame that owns each call, by id - 1.
    owners: Vec<FrameKey>,
    seq: u64,
    started: bool,
    finished: Option<RunStatus>,
    /// Who cancelled the run, when its cancellation said so (put on its `run_finished`).
    cancelled_by: Option<crate::protocol::Actor>,
    keep_launched: bool,
    /// The grants given in the run, in order (`g1` first).
    grants: Vec<crate::approval::grant::ActiveGrant>,
    /// Who the decisions being applied by the current input came from (cleared after it).
    attribution: BTreeMap<CallId, grants::Attribution>,
    /// Timers pending and requests made, for a driver rebuilding the run.
    pending: pending::Pending,
    /// Scratch buffers (the work queue, a scheduler's actions), kept between inputs so that an
    /// input allocates nothing for them; see [`RunMachine::handle_into`].
    scratch: (Vec<Work>, Vec<scheduler::Action>),
}

/// Scratch buffers keep at most this much room between inputs: a burst (the root of a large
/// fan-out finishing) does not keep its memory.
const SCRATCH_KEPT: usize = 1024;

/// One scheduler input addressed to a frame (the machine's internal work queue).
type Work = (FrameKey, scheduler::Input);

impl RunMachine {
    /// A machine for a run of `root` under `policy`; events are stamped with `run_id`.
    pub fn new(
        run_id: impl Into<Arc<str>>,
        root: Arc<AgentConfig>,
        policy: Policy,
        sanitize: SanitizeLimits,
    ) -> Self {
        RunMachine {
            run_id: run_id.into(),
            policy,
            sanitize,
            root,
            frames: BTreeMap::new(),
            owners: Vec::new(),
            seq: 0,
            started: false,
            finished: None,
            cancelled_by: None,
            keep_launched: false,
            grants: Vec::new(),
            attribution: BTreeMap::new(),
            pending: Default::default(),
            scratch: Default::default(),
        }
    }

    /// Keeps a copy of each running call so that a rebuilt run can interrupt it, and of each
    /// turn's context so that a turn streaming at the stop is asked again as it was. Needed by
    /// every machine that replays a journal (see [`RunMachine::replaying`]): a journal with a
    /// `resumed` entry re-presents (or re-launches) the calls that were running, and without
    /// the copies a replay would silently skip that. A run that never stops needs none.
    pub fn keep_launched(&mut self, on: bool) {
        self.keep_launched = on;
    }

    /// A machine to replay a run's journal through: [`RunMachine::new`] keeping running calls,
    /// so that it takes exactly the steps the run took, across restarts too.
    pub fn replaying(
        run_id: impl Into<Arc<str>>,
        root: Arc<AgentConfig>,
        policy: Policy,
        sanitize: SanitizeLimits,
    ) -> Self {
        let mut m = RunMachine::new(run_id, root, policy, sanitize);
        m.keep_launched(true);
        m
    }

    /// The run id stamped on events.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The sequence number of the last event emitted (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.seq
    }

    /// The terminal status, once the run has finished.
    pub fn finished(&self) -> Option<RunStatus> {
        self.finished
    }

    /// The run's own agent.
    pub fn root(&self) -> &Arc<AgentConfig> {
        &self.root
    }

    /// The agents whose model turn is streaming right now, with the model list they use and
    /// the position in it of the model answering the turn.
    pub fn streaming_frames(&self) -> Vec<(FrameKey, Option<String>, usize)> {
        self.frames
            .values()
            .filter(|f| f.streaming)
            .map(|f| (f.key, f.cfg.model.clone(), f.turn.model))
            .collect()
    }

    /// The timers set and not yet fired or cleared, with when each is due: what a driver arms
    /// after replaying a journal (the journal's `timer_fired` entries already taken).
    pub fn timers(&self) -> impl Iterator<Item = (Timer, Millis)> + '_ {
        self.pending.timers()
    }

    /// When the earliest pending timer is due (None: no timer is set).
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.pending.timers().map(|(_, at)| at).min()
    }

    /// How many requests each model (its agent's model list, the position in it) has answered
    /// so far, retries, re-asks and fallbacks included: what a rebuilt run's models are told
    /// they already answered, so that a scripted or replayed model goes on where it was. A turn
    /// streaming now is not counted: it is asked again when the run is driven again.
    pub fn requests_answered(&self) -> Vec<(pending::ModelKey, usize)> {
        let mut counts = self.pending.requests().clone();
        for (_, list, index) in self.streaming_frames() {
            if let Some(n) = counts.get_mut(&(list, index)) {
                *n = n.saturating_sub(1);
            }
        }
        counts.into_iter().collect()
    }

    /// The approval policy of the run (every agent of it).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Handles one input at time `now`; returns what to do.
    pub fn handle(&mut self, input: RunInput, now: Millis) -> Vec<Action> {
        let mut out = Vec::new();
        self.handle_into(input, now, &mut out);
        out
    }

    /// Like [`RunMachine::handle`], appending to `out`.
    pub fn handle_into(&mut self, input: RunInput, now: Millis, out: &mut Vec<Action>) {
        if self.finished.is_some() {
            return;
        }
        let from = out.len();
        self.pending.input(&input);
        self.handle_input(input, now, out);
        self.pending.actions(out.get(from..).unwrap_or_default());
    }

    fn handle_input(&mut self, input: RunInput, now: Millis, out: &mut Vec<Action>) {
        let (mut work, buf) = std::mem::take(&mut self.scratch);
        match input {
            RunInput::Start => self.start(now, &mut work, out),
            RunInput::Call { frame, call } => {
                if let Some(f) = self.live(frame) {
                    f.turn.calls += 1;
                    let id = self.alloc(frame);
                    work.push((frame, scheduler::Input::CallArrived { id, call: Ok(call) }));
                }
            }
            RunInput::Unreadable { frame, raw, reason } => {
                if let Some(f) = self.live(frame) {
                    f.turn.calls += 1;
                    let id = self.alloc(frame);
                    let call = Err(format!("{reason}; received {}", correction::excerpt(&raw)));
                    work.push((frame, scheduler::Input::CallArrived { id, call }));
                }
            }
            RunInput::Output { frame, output } => {
                if let Some(f) = self.live(frame) {
                    f.turn.output = output;
                }
            }
            RunInput::Problem {
                frame,
                problem,
                code,
            } => {
                if let Some(f) = self.live(frame) {
                    f.turn.problems.push((code, problem));
                }
            }
            RunInput::Usage {
                frame,
                input_tokens,
                output_tokens,
                estimated,
                cache_read_tokens,
                cache_write_tokens,
                model,
            } => {
                if let Some(f) = self.live(frame) {
                    let usage = Usage {
                        input_tokens,
                        output_tokens,
                        cache_read_tokens,
                        cache_write_tokens,
                        estimated,
                        models: BTreeMap::new(),
                    };
                    f.turn.usage.add(usage.of_model(model));
                }
            }
            RunInput::Fallback {
                frame,
                from,
                to,
                index,
                code,
                error,
            } => {
                if self.streaming(frame) {
                    // The new model starts the turn over: what the failed one sent is dropped
                    // by the engine (none of it was content).
                    if let Some(f) = self.frames.get_mut(&frame) {
                        f.turn.model = index;
                        f.turn.attempt = 1;
                        f.turn.whole = false;
                    }
                    let kind = EventKind::ModelFallback {
                        from,
                        to,
                        code,
                        error,
                    };
                    self.turn_restarted(frame, kind, now, out);
                }
            }
            RunInput::Reask {
                frame,
                model,
                code,
                error,
            } => self.reask(frame, model, code, error, now, out),
            RunInput::Retry {
                frame,
                attempt,
                status,
                wait_ms,
                error,
            } => {
                if self.streaming(frame) {
                    let kind = EventKind::ModelRetry {
                        attempt,
                        status,
                        wait_ms,
                        error,
                    };
                    self.emit(frame, None, kind, now, out);
                    let next = attempt.saturating_add(1);
                    if let Some(f) = self.frames.get_mut(&frame) {
                        f.turn.attempt = next;
                    }
                    self.emit(
                        frame,
                        None,
                        EventKind::RequestStarted { attempt: next },
                        now,
                        out,
                    );
                }
            }
            RunInput::StreamClosed {
                frame, mut error, ..
            } => {
                if let Some(e) = error.as_mut()
                    && self.compact(frame, e, now, out)
                {
                    // Asked again with a smaller context: the turn goes on.
                } else if let Some(f) = self.frames.get_mut(&frame)
                    && f.streaming
                {
                    f.streaming = false;
                    if let Some(e) = error {
                        f.turn.fatal = Some(*e);
                    }
                    work.push((frame, scheduler::Input::StreamClosed));
                }
            }
            RunInput::Outcome { call, outcome } => {
                if let Some(frame) = self.owner(call) {
                    work.push((frame, scheduler::Input::Finished { id: call, outcome }));
                }
            }
            RunInput::Decided { call, decision, by } => {
                // The decision's author, put on the `decision` event the scheduler emits.
                let grant = None;
                self.attribution
                    .insert(call, grants::Attribution { by, grant });
                if let Some(frame) = self.owner(call) {
                    out.push(Action::ClearTimer {
                        timer: Timer::Approval { call },
                    });
                    work.push((frame, scheduler::Input::Decided { id: call, decision }));
                }
            }
            RunInput::Grant { grant, by } => self.grant(grant, by, now, &mut work, out),
            RunInput::Revoke { grant, by } => self.revoke(&grant, by, now, out),
            RunInput::TimerFired { timer } => match timer {
                Timer::Approval { call } => {
                    if let Some(frame) = self.owner(call) {
                        work.push((frame, scheduler::Input::ApprovalTimedOut { id: call }));
                    }
                }
                Timer::Deadline { frame } => {
                    self.stop(frame, RunStatus::Timeout, now, &mut work, out);
                }
            },
            RunInput::Cancel { by, .. } => {
                if self.cancelled_by.is_none() {
                    self.cancelled_by = by;
                }
                self.stop(None, RunStatus::Cancelled, now, &mut work, out)
            }
            RunInput::Resumed => self.resume(&mut work, out),
            RunInput::Interrupted { call } => {
                // A delegate's call is its nested agent, never an activity that can be lost.
                if let Some(frame) = self.owner(call)
                    && !self.frames.contains_key(&Some(call))
                {
                    work.push((frame, scheduler::Input::Interrupted { id: call }));
                }
            }
        }
        self.run_work(&mut work, buf, now, out);
        self.attribution.clear();
    }

    fn streaming(&self, frame: FrameKey) -> bool {
        self.frames.get(&frame).is_some_and(|f| f.streaming)
    }

    fn live(&mut self, frame: FrameKey) -> Option<&mut Frame> {
        self.frames.get_mut(&frame).filter(|f| f.streaming)
    }

    /// Where a call's events belong: its agent's current step, depth and parent call (the
    /// delegate call that runs the agent). None when the call or its agent is gone.
    pub fn call_origin(&self, call: CallId) -> Option<(u32, u32, Option<CallId>)> {
        let f = self.frames.get(&self.owner(call)?)?;
        Some((f.step, f.depth, f.key))
    }

    fn owner(&self, call: CallId) -> Option<FrameKey> {
        let i = usize::try_from(call.0.checked_sub(1)?).ok()?;
        let frame = *self.owners.get(i)?;
        self.frames.contains_key(&frame).then_some(frame)
    }

    fn alloc(&mut self, frame: FrameKey) -> CallId {
        self.owners.push(frame);
        CallId(self.owners.len() as u64)
    }

    fn emit(
        &mut self,
        frame: FrameKey,
        call: Option<CallId>,
        kind: EventKind,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let (step, depth, parent) = self
            .frames
            .get(&frame)
            .map_or((0, 0, None), |f| (f.step, f.depth, f.key));
        self.seq += 1;
        out.push(Action::Emit(Event {
            run_id: self.run_id.clone(),
            seq: self.seq,
            step,
            at: now,
            call,
            parent,
            depth,
            kind,
        }));
    }

    fn start(&mut self, now: Millis, work: &mut Vec<Work>, out: &mut Vec<Action>) {
        if self.started {
            return;
        }
        self.started = true;
        let cfg = self.root.clone();
        let input = cfg.input.as_ref().map(|(v, _)| v.clone());
        let frame = Frame::new(None, None, cfg, input, Vec::new());
        self.frames.insert(None, frame);
        self.begin_frame(None, now, work, out);
    }

    /// Starts an agent: its deadline, its initial state, then the plan (step 0) or step 1.
    fn begin_frame(
        &mut self,
        key: FrameKey,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let goal = f.cfg.goal.clone();
        let timeout = f.cfg.limits.timeout_ms;
        f.state = Some(f.initial_state(now));
        self.emit(key, None, EventKind::RunStarted { goal }, now, out);
        if let Some(ms) = timeout {
            out.push(Action::SetTimer {
                timer: Timer::Deadline { frame: key },
                at: now.saturating_add(ms),
            });
        }
        let plan = self
            .frames
            .get(&key)
            .map(|f| f.cfg.plan.clone())
            .unwrap_or_default();
        if plan.is_empty() {
            return self.begin_step(key, now, work, out);
        }
        self.open_scheduler(key, 0);
        for call in plan {
            let id = self.alloc(key);
            work.push((
                key,
                scheduler::Input::CallArrived {
                    id,
                    call: Ok(Arc::new(call)),
                },
            ));
        }
        work.push((key, scheduler::Input::StreamClosed));
    }

    fn open_scheduler(&mut self, key: FrameKey, step: u32) {
        let policy = self.policy.clone();
        let keep_launched = self.keep_launched;
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        f.step = step;
        let state = f.state.take().unwrap_or_default();
        f.sched = Some(AgentConfig::scheduler(
            &f.cfg,
            state,
            policy,
            step,
            keep_launched,
        ));
    }

    /// Asks the model for the agent's next step, or finishes it at `max_steps`.
    fn begin_step(
        &mut self,
        key: FrameKey,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let sanitize = self.sanitize;
        let keep = self.keep_launched;
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let step = f.step + 1;
        if step > f.cfg.limits.max_steps {
            return self.finish(key, RunStatus::MaxSteps, None, Value::Null, now, work, out);
        }
        let state = f.state.take();
        let messages = match &state {
            Some(state) => f.messages(state, sanitize),
            None => Vec::new(),
        };
        f.state = state;
        let config = f.cfg.clone();
        // Kept only by a machine that may be resumed (it asks the turn again as it was); a
        // fresh run's never is, and the context holds the whole plan and state.
        if keep {
            f.messages.clone_from(&messages);
        }
        self.open_scheduler(key, step);
        if let Some(f) = self.frames.get_mut(&key) {
            f.streaming = true;
            f.turn = frame::Turn {
                attempt: 1,
                ..Default::default()
            };
        }
        self.emit(
            key,
            None,
            EventKind::RequestStarted { attempt: 1 },
            now,
            out,
        );
        out.push(Action::Request {
            frame: key,
            step,
            messages,
            config,
            skip_calls: 0,
            model: 0,
            whole: false,
        });
    }

    /// After a restart: turns that were streaming are asked again, running calls interrupted.
    fn resume(&mut self, work: &mut Vec<Work>, out: &mut Vec<Action>) {
        for f in self.frames.values() {
            if f.streaming {
                out.push(Action::Request {
                    frame: f.key,
                    step: f.step,
                    messages: f.messages.clone(),
                    config: f.cfg.clone(),
                    skip_calls: f.turn.calls,
                    model: f.turn.model,
                    whole: f.turn.whole,
                });
            }
            if let Some(s) = &f.sched {
                for id in s.running() {
                    // A delegate's call is its nested agent, which resumes on its own.
                    if !self.frames.contains_key(&Some(id)) {
                        work.push((f.key, scheduler::Input::Interrupted { id }));
                    }
                }
            }
        }
    }

    /// Stops an agent with `status` (cancel, timeout): its step is cancelled, its model stream
    /// closed, and it finishes with that status.
    fn stop(
        &mut self,
        key: FrameKey,
        status: RunStatus,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        if f.stopping.is_some() {
            return;
        }
        f.stopping = Some(status);
        if f.streaming {
            f.streaming = false;
            out.push(Action::CloseStream { frame: key });
        }
        if f.sched.is_some() {
            work.push((key, scheduler::Input::Cancel));
        } else {
            self.finish(key, status, None, Value::Null, now, work, out);
        }
    }

    /// Handles the work queue in order, then keeps the (emptied) buffers for the next input.
    fn run_work(
        &mut self,
        work: &mut Vec<Work>,
        mut buf: Vec<scheduler::Action>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        self.run_queue(work, &mut buf, now, out);
        work.clear();
        buf.clear();
        work.shrink_to(SCRATCH_KEPT);
        buf.shrink_to(SCRATCH_KEPT);
        self.scratch = (std::mem::take(work), buf);
    }

    fn run_queue(
        &mut self,
        work: &mut Vec<Work>,
        buf: &mut Vec<scheduler::Action>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        // Processed in order: each input's consequences are appended and handled after it.
        let mut i = 0;
        while i < work.len() {
            let (key, input) = std::mem::replace(&mut work[i], (None, scheduler::Input::Cancel));
            i += 1;
            let Some(f) = self.frames.get_mut(&key) else {
                continue;
            };
            let Some(sched) = f.sched.as_mut() else {
                continue;
            };
            sched.handle_into(input, now, buf);
            let mut drained = false;
            for action in buf.drain(..) {
                match action {
                    scheduler::Action::Event { call, mut kind } => {
                        if let (EventKind::ApprovalRequested { path, .. }, Some(f)) =
                            (&mut kind, self.frames.get_mut(&key))
                        {
                            path.clone_from(&f.path);
                            path.extend(call);
                            // A new presentation (a replacement by another tool) awaits its own
                            // decision.
                            if let Some(id) = call {
                                f.decisions.remove(&id);
                            }
                        }
                        if let (
                            EventKind::Decision {
                                decision,
                                by,
                                grant,
                                ..
                            },
                            Some(id),
                        ) = (&mut kind, call)
                        {
                            if let Some(a) = self.attribution.remove(&id) {
                                if a.by.is_some() {
                                    *by = a.by;
                                }
                                *grant = a.grant;
                            }
                            if let Some(f) = self.frames.get_mut(&key) {
                                f.decisions.insert(id, decision.clone());
                            }
                        }
                        self.emit(key, call, kind, now, out);
                    }
                    scheduler::Action::Ask {
                        id, timeout, call, ..
                    } => {
                        // A grant in force approves the call at once (no reviewer, no timer).
                        if let Some(g) = self.covering_grant(key, id, &call) {
                            self.approve_by_grant(key, id, g, work);
                        } else if let Some(t) = timeout {
                            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
                            out.push(Action::SetTimer {
                                timer: Timer::Approval { call: id },
                                at: now.saturating_add(ms),
                            });
                        }
                    }
                    scheduler::Action::Launch {
                        id,
                        call,
                        tool,
                        detached,
                    } => self.launch(key, id, call, tool, detached, now, work, out),
                    scheduler::Action::Abort { id } => {
                        if self.frames.contains_key(&Some(id)) {
                            self.abandon(Some(id), now, out);
                        } else {
                            out.push(Action::Abort { id });
                        }
                    }
                    scheduler::Action::Drained => drained = true,
                }
            }
            if drained {
                self.end_step(key, now, work, out);
            }
            if self.finished.is_some() {
                return;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        key: FrameKey,
        id: CallId,
        call: Box<crate::protocol::Call>,
        tool: Arc<crate::protocol::Tool>,
        detached: bool,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get(&key) else {
            return;
        };
        let Some(child_cfg) = f.cfg.delegate(&tool.name).cloned() else {
            out.push(Action::Launch {
                id,
                call,
                tool,
                detached,
                timeout_ms: f.cfg.limits.call_timeout_ms,
            });
            return;
        };
        if f.depth + 1 > MAX_DEPTH {
            let err = crate::protocol::error_object(
                "activity.config",
                format!("delegates nest deeper than {MAX_DEPTH} levels"),
                None,
            );
            work.push((
                key,
                scheduler::Input::Finished {
                    id,
                    outcome: scheduler::Outcome::error(err),
                },
            ));
            return;
        }
        // The delegate's input is the call's params; its context, the parent data it may see.
        let input: Map<String, Value> = call
            .params
            .iter()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut extra = Vec::new();
        if let (Some(scopes), Some(state)) = (&call.scopes, f.sched.as_ref().map(Scheduler::state))
        {
            for kind in state.kinds() {
                if scopes.contains(&kind)
                    && let Some(data) = state.view(&kind)
                {
                    extra.push(Message::Data {
                        kind,
                        data,
                        schema: None,
                        instance: None,
                        extra: Map::new(),
                    });
                }
            }
        }
        let child = Frame::new(
            Some(id),
            Some(f),
            child_cfg,
            Some(Value::Object(input)),
            extra,
        );
        self.frames.insert(Some(id), child);
        self.begin_frame(Some(id), now, work, out);
    }

    /// Drops a delegate (and its own delegates) whose parent call was aborted: no outcome goes
    /// back, its timers and streams are stopped.
    fn abandon(&mut self, key: FrameKey, now: Millis, out: &mut Vec<Action>) {
        let children: Vec<FrameKey> = self
            .frames
            .values()
            .filter(|f| f.parent == Some(key))
            .map(|f| f.key)
            .collect();
        for c in children {
            self.abandon(c, now, out);
        }
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        if f.streaming {
            out.push(Action::CloseStream { frame: key });
        }
        if f.cfg.limits.timeout_ms.is_some() {
            out.push(Action::ClearTimer {
                timer: Timer::Deadline { frame: key },
            });
        }
        let mut buf = Vec::new();
        if let Some(sched) = f.sched.as_mut() {
            sched.handle_into(scheduler::Input::Cancel, now, &mut buf);
        }
        for a in buf {
            match a {
                scheduler::Action::Event { call, kind } => self.emit(key, call, kind, now, out),
                scheduler::Action::Abort { id } => out.push(Action::Abort { id }),
                _ => {}
            }
        }
        self.frames.remove(&key);
    }

    fn end_step(
        &mut self,
        key: FrameKey,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let Some(sched) = f.sched.take() else {
            return;
        };
        if f.streaming {
            // Cancelled while the model still streamed (the stop already closed the stream).
            f.streaming = false;
        }
        let step = f.step;
        let (state, report) = sched.finish();
        f.state = Some(state);
        f.absorb(step, &report);
        if step == 0 && f.stopping.is_none() {
            return self.begin_step(key, now, work, out);
        }
        let mut events = Vec::new();
        let next = f.after_step(&report, &mut |k| events.push(k));
        for kind in events {
            self.emit(key, None, kind, now, out);
        }
        match next {
            Next::Step => self.begin_step(key, now, work, out),
            Next::Finish(status, err, output) => {
                self.finish(key, status, err.map(|e| *e), output, now, work, out)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        key: FrameKey,
        status: RunStatus,
        error: Option<RunError>,
        output: Value,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let timed = f.cfg.limits.timeout_ms.is_some();
        let result = f.result(status, error, output);
        let parent = f.parent;
        if timed {
            out.push(Action::ClearTimer {
                timer: Timer::Deadline { frame: key },
            });
        }
        let kind = EventKind::RunFinished {
            status: status.as_str().to_string(),
            by: if key.is_none() && status == RunStatus::Cancelled {
                self.cancelled_by.clone()
            } else {
                None
            },
        };
        self.emit(key, None, kind, now, out);
        self.frames.remove(&key);
        match (key, parent) {
            (Some(call), Some(parent)) => {
                if let Some(p) = self.frames.get_mut(&parent) {
                    p.usage.add(result.usage.clone());
                }
                let tool = self
                    .frames
                    .get(&parent)
                    .and_then(|p| p.sched.as_ref())
                    .and_then(|s| s.call_of(call))
                    .map(|c| c.tool.clone())
                    .unwrap_or_default();
                let outcome = delegate_outcome(&tool, &result);
                work.push((parent, scheduler::Input::Finished { id: call, outcome }));
            }
            _ => {
                let mut result = result;
                // Per-model figures say something only when more than one model answered.
                if result.usage.models.len() < 2 {
                    result.usage.models.clear();
                }
                self.finished = Some(status);
                out.push(Action::Finished(Box::new(result)));
            }
        }
    }
}

/// Replays a journal through a fresh machine: the events the run published, in order (wall
/// clock included: each input carries the time it was consumed).
pub fn replay(
    run_id: &str,
    root: Arc<AgentConfig>,
    policy: Policy,
    sanitize: SanitizeLimits,
    journal: &[JournalEntry],
) -> Vec<Event> {
    let mut r = Replayer::new(run_id, root, policy, sanitize);
    r.feed(journal);
    r.events
}

/// A journal replayed as it grows: each [`Replayer::feed`] consumes only the entries after
/// those it has seen, so following a long run costs one replay in all, not one per catch-up.
pub struct Replayer {
    machine: RunMachine,
    fed: usize,
    /// Every event the replayed entries produced, in order.
    pub events: Vec<Event>,
}

impl Replayer {
    /// A fresh machine for the run.
    pub fn new(
        run_id: &str,
        root: Arc<AgentConfig>,
        policy: Policy,
        sanitize: SanitizeLimits,
    ) -> Self {
        Replayer {
            machine: RunMachine::replaying(run_id, root, policy, sanitize),
            fed: 0,
            events: Vec::new(),
        }
    }

    /// How many journal entries have been replayed.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// Replays `entries`, the journal's entries from position [`Replayer::fed`] on.
    pub fn feed(&mut self, entries: &[JournalEntry]) {
        let mut out = Vec::new();
        for e in entries {
            self.machine.handle_into(e.input.clone(), e.at, &mut out);
            self.events.extend(out.drain(..).filter_map(|a| match a {
                Action::Emit(ev) => Some(ev),
                _ => None,
            }));
        }
        self.fed += entries.len();
    }
}
