//! The outer loop as a sans-IO state machine (rules 15–21, DESIGN.md section 3.1).
//!
//! [`RunMachine::handle`] takes one [`RunInput`] (the run starts, the model streamed a call or
//! closed its stream, an activity finished, a reviewer decided, a timer fired, cancel) and the
//! current time, and returns [`Action`]s (ask the model, launch, abort, publish a numbered event,
//! finished). It owns step counting, call-id allocation, output validation and
//! re-asks, the doom-loop and empty-turn rules, the token budget, deadlines, nested agents
//! (delegates run as frames of the same machine, under the same policy and id space), its
//! timers (set and cleared where it decides to, kept by it alone: no action announces one) and
//! termination. It spawns nothing, reads no clock and iterates no hash map: the same inputs give
//! the same actions, so a journal of inputs rebuilds a run exactly.
//!
//! [`RunMachine::check_op`] says whether an [`Op`] applies right now (rule 21) without changing
//! anything; the engine journals only ops that apply.
//!
//! ## The call order a driver follows
//!
//! 1. Get the machine from the run's definition (`runs::RunDef::machine`, or `replay` for a
//!    stored run; the engine's `MachineDef::machine`): nothing outside this module and the
//!    core's tests builds one by hand.
//! 2. [`RunMachine::handle`] `RunInput::Start`, then every input as it happens, each with the
//!    time it happened, in the order the driver journals them (journal first, then hand it
//!    over: a replay of the journal is the same calls in the same order). An op goes through
//!    [`RunMachine::check_op`] first; only one that applies is journaled and handed over.
//! 3. Perform the returned [`Action`]s in order (ask a model, launch or abort a call, publish
//!    an event) before the next input.
//! 4. After every call of step 2, ask [`RunMachine::poll_timeout`] (the earliest timer due,
//!    quinn-proto's shape) and sleep until then, or until the next input; when it is reached,
//!    journal and hand over `RunInput::TimerFired` for each timer [`RunMachine::timers_by_due`]
//!    lists as due (that is the machine's `handle_timeout`: a timer's firing is an input like
//!    any other, so a journal replays it). One no longer set by the time it arrives is
//!    ignored, so a driver keeps no timer table and one sleep is enough. (Temporal's workflows
//!    recorded before the `timers-in-machine` patch armed one workflow timer per setting; they
//!    replay through [`RunMachine::take_timer_settings`].)
//! 5. Stop after `Action::Finished`. Counting what a model answered is the machine's too
//!    ([`RunMachine::requests`]).
//!
//! Deliberately not here: streaming from the model, running activities, sleeping, persisting or
//! delivering events (the engine performs the actions), and the inner loop's rules (the
//! scheduler's).

mod config;
mod frame;
mod standing;
mod ops;
mod overflow;
mod pending;
mod reader;
mod replay;
mod steps;
mod types;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod eager_tests;
#[cfg(test)]
mod recall_tests;
#[cfg(test)]
mod timer_tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

pub use config::{AgentConfig, AgentSpec, CheckedLimits, ConfigError, MAX_SECONDS, checked_ms};
pub use pending::{ModelKey, Requests, TimerSetting};
pub(crate) use reader::TurnReader;
pub use replay::{Replayer, replay};
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
    /// The run's agent recalls workspace memory before each step ([`Action::Recall`]).
    recall: bool,
    /// The model's window, once a provider's "too long" answer named it (`context::fit`):
    /// later turns are compacted before they are asked when they would not fit.
    window: Option<crate::context::fit::Window>,
    /// The standing approvals given in the run, in order (`g1` first).
    standing: Vec<crate::approval::standing::ActiveStanding>,
    /// Who the decisions being applied by the current input came from (cleared after it).
    attribution: BTreeMap<CallId, standing::Attribution>,
    /// Timers pending and requests made, for a driver rebuilding the run.
    pending: pending::Pending,
    /// Scratch buffers (the work queue, a scheduler's actions), kept between inputs so that an
    /// input allocates nothing for them; see [`RunMachine::handle_into`]. After an eager stop
    /// ([`RunMachine::handle_eager`]) the queue holds the input's work still to do.
    scratch: (Vec<Work>, Vec<scheduler::Action>),
    /// The input being handled stops after each launch ([`RunMachine::handle_eager`]).
    eager: bool,
    /// The time of the input being handled: what is left of it after an eager stop is handled
    /// at that time, whenever it is resumed.
    at: Millis,
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
            recall: false,
            window: None,
            standing: Vec::new(),
            attribution: BTreeMap::new(),
            pending: Default::default(),
            scratch: Default::default(),
            eager: false,
            at: 0,
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

    /// Has the run's own agent search the workspace memory before each step: it asks the
    /// engine ([`Action::Recall`]) and shows the chunks the engine journals
    /// ([`RunInput::Recalled`]) in that step's context. A run defined with memory per step is
    /// replayed with it on too (`runs::DefRecord::recall`).
    pub fn recall_memory(&mut self, on: bool) {
        self.recall = on;
    }

    /// The context window the run's model list states, in tokens (None: unknown until a
    /// provider's refusal names it). Each step whose context would not fit is compacted before
    /// it is asked, as after a refusal that named the window (`context::fit`); a refusal
    /// naming another window replaces it.
    pub fn stated_window(&mut self, tokens: Option<u64>) {
        self.window = tokens.map(crate::context::fit::Window::stated);
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
        self.pending.by_due().next().map(|(at, _)| at)
    }

    /// The pending timers, earliest due first: what a driver sleeps for. A driver fires a timer
    /// by handing the machine [`RunInput::TimerFired`] once its time has come; the machine
    /// ignores one for a timer that is no longer set (cleared, or fired already), so a driver
    /// needs no table of its own.
    pub fn timers_by_due(&self) -> impl Iterator<Item = (Millis, Timer)> + '_ {
        self.pending.by_due()
    }

    /// When `timer` is due, if it is set.
    pub fn timer_at(&self, timer: Timer) -> Option<Millis> {
        self.pending.timer_at(timer)
    }

    /// True when `timer` was ever set in this run, whether it is still set, fired or was
    /// cleared: a replay admits a late `timer_fired` of such a timer (it raced with the
    /// clearing, and the machine ignores it).
    pub fn timer_ever_set(&self, timer: Timer) -> bool {
        self.pending.ever_set(timer)
    }

    /// From now on, logs each setting of a timer for [`RunMachine::take_timer_settings`]. Off
    /// by default. Only for a driver that must replay a history recorded when the machine
    /// announced each setting as an action: Temporal's workflows started before its
    /// `timers-in-machine` patch armed one workflow timer per setting, at the setting's place
    /// among the actions.
    pub fn log_timer_settings(&mut self) {
        self.pending.log_settings();
    }

    /// The timer settings logged since the last call, in the order they were made, each with
    /// its place among the actions returned ([`TimerSetting::position`]: counted in the buffer
    /// the driver handed over).
    pub fn take_timer_settings(&mut self) -> Vec<TimerSetting> {
        self.pending.take_settings()
    }

    /// How many requests each model (its agent's model list, the position in it) has had, and
    /// how many of them stream now ([`Requests`]): the one count a driver reads. The engine
    /// tells a rebuilt run's models what they [answered](Requests::answered); Temporal's turn
    /// activity, which asks each turn of a fresh model, sums what a list's models `made` (the
    /// request being asked included).
    pub fn requests(&self) -> Vec<(ModelKey, Requests)> {
        let mut out: BTreeMap<ModelKey, Requests> = self
            .pending
            .requests()
            .iter()
            .map(|(k, n)| (k.clone(), Requests { made: *n, streaming: 0 }))
            .collect();
        for (_, list, index) in self.streaming_frames() {
            if let Some(r) = out.get_mut(&(list, index)) {
                r.streaming += 1;
            }
        }
        out.into_iter().collect()
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
        self.handle_with(input, now, out, false);
        while self.resume_into(out) {}
    }

    /// [`RunMachine::handle_into`], stopping after each call launched while other calls still
    /// wait to be checked: the driver starts that activity, then calls
    /// [`RunMachine::resume_into`] until it returns false. True when there is more to do. The
    /// events and actions are the same, in the same order, as `handle_into` gives at once: a
    /// fan-out's first activity starts before the hundredth call is checked, not after.
    pub fn handle_eager(&mut self, input: RunInput, now: Millis, out: &mut Vec<Action>) -> bool {
        self.handle_with(input, now, out, true);
        self.has_more()
    }

    /// Goes on with the input an eager stop left unfinished (at that input's time), appending
    /// to `out`; true when it stopped again. Does nothing, and returns false, when nothing is
    /// left.
    pub fn resume_into(&mut self, out: &mut Vec<Action>) -> bool {
        if !self.has_more() {
            return false;
        }
        let now = self.at;
        let from = out.len();
        let (mut work, buf) = std::mem::take(&mut self.scratch);
        self.run_work(&mut work, buf, now, out);
        self.pending.actions(out.get(from..).unwrap_or_default());
        let more = self.has_more();
        if !more {
            self.attribution.clear();
        }
        more
    }

    /// True after an eager stop, until [`RunMachine::resume_into`] has finished the input.
    pub fn has_more(&self) -> bool {
        !self.scratch.0.is_empty()
    }

    fn handle_with(&mut self, input: RunInput, now: Millis, out: &mut Vec<Action>, eager: bool) {
        // An input never starts while another is unfinished.
        while self.resume_into(out) {}
        if self.finished.is_some() {
            return;
        }
        // A timer fires once, and only while it is set: one cleared or fired already while
        // the driver's `timer_fired` waited to be journaled changes nothing.
        if let RunInput::TimerFired { timer } = &input
            && self.pending.timer_at(*timer).is_none()
        {
            return;
        }
        self.eager = eager;
        self.at = now;
        let from = out.len();
        self.pending.input(&input);
        self.handle_input(input, now, out);
        self.pending.actions(out.get(from..).unwrap_or_default());
    }

    fn handle_input(&mut self, input: RunInput, now: Millis, out: &mut Vec<Action>) {
        let (mut work, buf) = std::mem::take(&mut self.scratch);
        match input {
            RunInput::Start => self.start(now, &mut work, out),
            RunInput::Call {
                frame,
                call,
                parsed,
            } => {
                if let Some(f) = self.live(frame) {
                    f.turn.calls += 1;
                    let id = self.alloc(frame);
                    let call = Ok(call);
                    work.push((frame, scheduler::Input::CallArrived { id, call, parsed }));
                }
            }
            RunInput::Unreadable { frame, raw, reason } => {
                if let Some(f) = self.live(frame) {
                    f.turn.calls += 1;
                    let id = self.alloc(frame);
                    let call =
                        Err(scheduler::UnreadableCall::new(reason)
                            .received(correction::excerpt(&raw)));
                    let parsed = scheduler::Parsed::default();
                    work.push((frame, scheduler::Input::CallArrived { id, call, parsed }));
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
            RunInput::Decided {
                call,
                decision,
                by,
                presentation,
            } => {
                // A decision answers one presentation: one for a presentation that is not
                // the call's current one changes nothing (a driver never journals one; old
                // journals name none).
                let answers = presentation.is_none_or(|p| self.presentation(call) == Some(p));
                // The decision's author, put on the `decision` event the scheduler emits.
                if answers {
                    self.attribution
                        .insert(call, standing::Attribution { by, standing: None });
                }
                if answers && let Some(frame) = self.owner(call) {
                    self.pending.clear(Timer::Approval { call });
                    work.push((frame, scheduler::Input::Decided { id: call, decision }));
                }
            }
            // Read by the run's readers only (the page shows them beside the calls).
            RunInput::Thoughts { frame, thoughts } => {
                if self.recall
                    && let Some(f) = self.live(frame)
                {
                    f.thoughts = Some(thoughts);
                }
            }
            RunInput::Recalled {
                frame,
                step,
                chunks,
                ..
            } => self.recalled(frame, step, chunks, now, out),
            RunInput::Shown { call, presentation } => {
                // The reviewer's clock starts at the call's first showing (of this
                // presentation); a later showing changes nothing.
                if self.presentation(call) == Some(presentation)
                    && let Some(f) = self.owner(call).and_then(|k| self.frames.get_mut(&k))
                    && let Some(ms) = f.unshown.remove(&call)
                {
                    let at = now.saturating_add(ms);
                    self.pending.set(Timer::Approval { call }, at, out.len());
                }
            }
            RunInput::Dropped {
                call,
                decision,
                by,
                presentation,
                code,
            } => {
                // On the call's agent, or the run's own when that agent is gone.
                let frame = self.owner(call).unwrap_or(None);
                let kind = EventKind::DecisionDropped {
                    decision,
                    by,
                    presentation,
                    code,
                };
                self.emit(frame, Some(call), kind, now, out);
            }
            RunInput::Allow { standing, by } => self.allow(standing, by, now, &mut work, out),
            RunInput::Revoke { standing, by } => self.revoke(&standing, by, now, out),
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
        if !self.has_more() {
            self.attribution.clear();
        }
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
}
