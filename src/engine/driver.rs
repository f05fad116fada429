//! The one async driver of a run: it performs the [`RunMachine`]'s actions and feeds it what
//! happens, journaling every input first.
//!
//! One loop selects over the external cancel token, the batch being committed, submitted ops,
//! the agents' model streams, running activities and the earliest timer. Each occurrence becomes
//! machine inputs; the inputs are appended to the durable journal sink, and only once the sink
//! has committed them are they appended to the in-memory journal, handled, and their events
//! published, in that order. One batch is committed at a time: what happens meanwhile (with a
//! sink, also model output already received) waits in a bounded queue and forms the next batch,
//! whose commit starts before the machine handles the batch just committed. Ops are checked
//! against the machine once every committed batch is handled, and journaled only when they
//! apply.
//!
//! Deliberately not here: any decision about the run (the machine's), or how events are shown
//! (subscribers').

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::activities::{Activities, Executor};
use super::bus::Clock;
use super::handle::{OpRequest, Shared};
use super::journal::{Commit, JournalError, JournalSink, RunNote, append_caught};
use super::timers::Alarm;
use super::turns::{Models, Read, Turns};
use crate::llm::Settings;
use crate::machine::{Action, JournalEntry, RunError, RunInput, RunMachine, RunResult};
use crate::protocol::{CallId, Event, EventKind, Op, OpError};
use crate::scheduler::Outcome;
use crate::tools::{Progress, ProgressSink};

pub(super) struct Driver {
    pub machine: RunMachine,
    pub shared: Arc<Shared>,
    pub ops: mpsc::UnboundedReceiver<OpRequest>,
    pub models: Models,
    pub settings: Settings,
    /// The run's workspace memory, searched before each step ([`Action::Recall`]).
    pub recall: Option<Arc<crate::context::memory::Recall>>,
    pub executor: Arc<dyn Executor>,
    pub sink: Option<Arc<dyn JournalSink>>,
    pub clock: Clock,
    pub cancel: CancellationToken,
    /// Tasks that live exactly as long as the run (reviewer adapters).
    pub aux: JoinSet<()>,
    pub activities: Activities,
    pub turns: Turns,
    /// Sleeps until the machine's earliest timer is due.
    pub alarm: Alarm,
    pub result: Option<RunResult>,
    pub journal_seq: u64,
    /// Inputs waiting for the commit in flight to end; they form the next batch.
    pub queue: Vec<RunInput>,
    /// The batch being committed.
    pub commit: Option<Commit>,
    /// Scratch buffers for the machine's actions, kept between batches (see [`Driver::apply`]).
    pub scratch: (Vec<Action>, Vec<Action>),
    /// Renews the run's lease while the run is driven (when the sink leases runs).
    pub lease: LeaseKeeper,
}

type Renewing =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), JournalError>> + Send>>;

/// Keeps the run's lease in the sink (a store's): a renewal every [`JournalSink::lease_every`],
/// one at a time. A renewal that finds the lease lost stops the run.
#[derive(Default)]
pub(super) struct LeaseKeeper {
    every: Option<Duration>,
    /// When the next renewal is due (made when the run starts: it needs the runtime's timer).
    due: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    renewing: Option<Renewing>,
    /// What the sink was last told about the run ([`JournalSink::note`]).
    noted: Option<RunNote>,
    /// The count of calls awaiting a decision may have changed since it was last noted.
    recount: bool,
}

enum LeaseEvent {
    Due,
    Renewed(Result<(), JournalError>),
}

impl LeaseKeeper {
    /// A keeper for `sink`'s leases (idle when it has none).
    pub fn new(sink: Option<&Arc<dyn JournalSink>>) -> Self {
        LeaseKeeper {
            every: sink.and_then(|s| s.lease_every()).filter(|d| !d.is_zero()),
            due: None,
            renewing: None,
            noted: None,
            recount: true,
        }
    }

    fn start(&mut self) {
        if let Some(every) = self.every {
            self.due = Some(Box::pin(tokio::time::sleep(every)));
        }
    }

    fn active(&self) -> bool {
        self.due.is_some()
    }

    /// The next renewal falling due, or the one in flight answering. Cancel-safe.
    async fn next(&mut self) -> LeaseEvent {
        if let Some(r) = &mut self.renewing {
            let out = r.as_mut().await;
            self.renewing = None;
            return LeaseEvent::Renewed(out);
        }
        match &mut self.due {
            Some(due) => {
                due.as_mut().await;
                LeaseEvent::Due
            }
            None => std::future::pending().await,
        }
    }

    fn again(&mut self) {
        if let (Some(due), Some(every)) = (&mut self.due, self.every) {
            due.as_mut().reset(tokio::time::Instant::now() + every);
        }
    }
}

/// Scratch buffers keep at most this many actions' room between batches: a burst (the root of
/// a large fan-out finishing) does not keep its memory for the rest of the run.
const SCRATCH_KEPT: usize = 4096;

/// At most this many inputs wait while a commit is in flight; past it, the driver waits.
const MAX_QUEUED: usize = 1024;

/// A commit carries at most this many inputs, so that the machine handles one batch while the
/// next is committed rather than waiting for one big commit.
const BATCH: usize = 256;

enum Next {
    Cancel,
    Committed(Vec<JournalEntry>, Result<(), JournalError>),
    Op(OpRequest),
    Turn(Read),
    Done(crate::protocol::CallId, Outcome),
    Timer,
    Lease(LeaseEvent),
    Idle,
}

impl Driver {
    /// Runs to the end; publishes the result on the shared `done` channel. With `journal`, the
    /// run is rebuilt from it first (a resumed run) and told so with [`RunInput::Resumed`].
    /// A new run's `standing` approvals are journaled with its start.
    pub async fn run(
        mut self,
        journal: Option<Vec<JournalEntry>>,
        standing: Vec<RunInput>,
    ) -> RunResult {
        match journal {
            Some(entries) if !entries.is_empty() => {
                self.rebuild(entries);
                self.feed(vec![RunInput::Resumed]).await;
            }
            _ => {
                let mut first = vec![RunInput::Start];
                first.extend(standing);
                self.feed(first).await;
            }
        }
        self.lease.start();
        let mut cancel_seen = false;
        while self.result.is_none() {
            // What the machine's last actions queued at once (a workspace memory search's
            // answer) is committed before the driver waits.
            self.pump();
            self.update_idle();
            let now = (self.clock)();
            let wake_at = self.alarm.next_at(&self.machine);
            // While a commit is in flight, what happens next waits in the queue (bounded).
            let read = self.queue.len() < MAX_QUEUED;
            let next = tokio::select! {
                biased;
                _ = self.cancel.cancelled(), if !cancel_seen => Next::Cancel,
                (entries, r) = committed(&mut self.commit), if self.commit.is_some() => {
                    Next::Committed(entries, r)
                }
                Some(op) = self.ops.recv() => Next::Op(op),
                Some(item) = self.turns.next(), if read && !self.turns.is_empty() => Next::Turn(item),
                Some((id, o)) = self.activities.next(), if read && !self.activities.is_empty() => {
                    Next::Done(id, o)
                }
                _ = self.alarm.wait(wake_at.unwrap_or(now), now), if read && wake_at.is_some() => {
                    Next::Timer
                }
                ev = self.lease.next(), if self.lease.active() => Next::Lease(ev),
                else => Next::Idle,
            };
            match next {
                Next::Cancel => {
                    cancel_seen = true;
                    self.queue.push(RunInput::Cancel {
                        reason: "cancelled by the caller".into(),
                        by: None,
                    });
                }
                Next::Committed(entries, r) => {
                    self.commit = None;
                    self.committed(entries, r);
                }
                Next::Op(req) => self.op(req).await,
                Next::Turn(read) => {
                    self.read(read);
                    self.read_ready();
                }
                Next::Done(call, outcome) => {
                    self.queue.push(RunInput::Outcome { call, outcome });
                    self.read_ready();
                }
                Next::Timer => {
                    let now = (self.clock)();
                    let fired = self.alarm.fire(&self.machine, now);
                    self.queue.extend(
                        fired
                            .into_iter()
                            .map(|timer| RunInput::TimerFired { timer }),
                    );
                }
                Next::Lease(ev) => self.lease_event(ev),
                Next::Idle => break,
            }
            self.pump();
        }
        // A batch committed after the run's end is kept in memory too, so the in-memory journal
        // and the store's agree (the machine ignores inputs after its end).
        self.settle().await;
        self.turns = Turns::default();
        self.activities.shutdown().await;
        self.aux.shutdown().await;
        // Nothing runs and nothing here can decide what waits: the run stops, resumable (a
        // decision recorded later, then `resume`, moves it on). Not an ending.
        // The run's spans are made on the span worker: all of them, before anyone hears it ended.
        let drained = match self.shared.log.lock() {
            Ok(mut log) => log.spans.as_mut().map(|s| s.drained()),
            Err(p) => p.into_inner().spans.as_mut().map(|s| s.drained()),
        };
        if let Some(drained) = drained {
            let _ = drained.await;
        }
        let result = self.result.take().unwrap_or_else(|| {
            RunResult::stopped(RunError::new(
                "run.stalled",
                "the run stopped and can be resumed: nothing was running and nobody could decide",
            ))
        });
        self.shared
            .done
            .send_replace(Some(Arc::new(result.clone())));
        result
    }

    /// A lease renewal fell due (it starts) or answered: a lost lease stops the run at once,
    /// without a result (another process drives it now); any other failure is tried again at
    /// the next renewal.
    fn lease_event(&mut self, ev: LeaseEvent) {
        match ev {
            LeaseEvent::Due => match &self.sink {
                Some(sink) => {
                    let sink = sink.clone();
                    let run_id = self.shared.run_id.clone();
                    self.lease.renewing =
                        Some(Box::pin(async move { sink.renew_lease(&run_id).await }));
                }
                None => self.lease.again(),
            },
            LeaseEvent::Renewed(Ok(())) => self.lease.again(),
            LeaseEvent::Renewed(Err(e)) if e.code() == JournalError::LEASE_LOST => {
                tracing::warn!(run = %self.shared.run_id, "the run's lease was lost: {e}");
                if self.result.is_none() {
                    self.result = Some(stopped(e));
                }
            }
            LeaseEvent::Renewed(Err(e)) => {
                tracing::warn!(run = %self.shared.run_id, "the run's lease could not be renewed: {e}");
                self.lease.again();
            }
        }
    }

    /// Replays a stored journal through the machine without performing anything (its events are
    /// published); then tells each model how many requests it already answered
    /// (`RunMachine::requests_answered`). The timers still pending are the machine's: the alarm
    /// sleeps for them as it does for any other.
    fn rebuild(&mut self, entries: Vec<JournalEntry>) {
        self.machine.keep_launched(true);
        let mut actions = Vec::new();
        let mut log = match self.shared.log.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        for e in entries {
            self.journal_seq = self.journal_seq.max(e.seq);
            self.machine
                .handle_into(e.input.clone(), e.at, &mut actions);
            log.journal.push(e);
            for a in actions.drain(..) {
                match a {
                    // Published, not only counted: a subscriber that came before the rebuild
                    // (an in-process reviewer, the events file) caught up from an empty
                    // journal and would otherwise never see the run's past, such as a call
                    // that was waiting for a decision when the process stopped.
                    Action::Emit(ev) => self.shared.publish(&mut log, ev),
                    Action::Finished(r) => self.result = Some(*r),
                    _ => {}
                }
            }
        }
        self.shared.flush(&mut log);
        if let Some(spans) = &mut log.spans {
            spans.flush();
        }
        drop(log);
        for ((list, index), r) in self.machine.requests() {
            if let Some(m) = self.models.get(list.as_deref()).models().get(index) {
                m.resume_after(r.answered());
            }
        }
    }

    /// Publishes what a turn's reader read: a live `model_delta` event per text delta (never
    /// journaled), then its inputs join the queue.
    fn read(&mut self, read: Read) {
        let Read {
            frame,
            step,
            deltas,
            inputs,
        } = read;
        if !deltas.is_empty() {
            let shared = &self.shared;
            let mut log = match shared.log.lock() {
                Ok(l) => l,
                Err(p) => p.into_inner(),
            };
            for text in deltas {
                let chars = text.chars().count() as u64;
                let event = Event {
                    run_id: shared.run_id.clone(),
                    seq: log.last_seq,
                    step,
                    at: (self.clock)(),
                    call: None,
                    parent: frame,
                    depth: 0,
                    kind: EventKind::ModelDelta { chars, text },
                };
                shared.publish(&mut log, event);
            }
            shared.flush(&mut log);
        }
        self.queue.extend(inputs);
    }

    /// Where a launched call reports progress: each report is published at once as a live
    /// `call_progress` event (never journaled, like `model_delta`), tagged like the call's events.
    fn progress_sink(&self, call: CallId) -> ProgressSink {
        let (step, depth, parent) = self.machine.call_origin(call).unwrap_or((0, 0, None));
        let shared = self.shared.clone();
        let clock = self.clock.clone();
        ProgressSink::new(move |p: Progress| {
            let Ok(mut log) = shared.log.lock() else {
                return;
            };
            let event = Event {
                run_id: shared.run_id.clone(),
                seq: log.last_seq,
                step,
                at: clock(),
                call: Some(call),
                parent,
                depth,
                kind: EventKind::CallProgress {
                    progress: p.progress,
                    total: p.total,
                    message: p.message,
                },
            };
            shared.publish(&mut log, event);
            shared.flush(&mut log);
        })
    }

    /// Nothing streams, runs or is being committed, and no timer is due: only an op (a
    /// reviewer's decision, cancel) or one of the machine's timers (a deadline, a reviewer's
    /// time limit) later can move the run on. Such a run can be parked: its timers are the
    /// machine's, rebuilt from the journal, and fire when the run is next driven, at the time
    /// they were set for.
    fn update_idle(&mut self) {
        self.note();
        let idle = self.result.is_none()
            && self.turns.is_empty()
            && self.activities.is_empty()
            && self.commit.is_none()
            && self.queue.is_empty()
            && self
                .alarm
                .next_at(&self.machine)
                .is_none_or(|at| at > (self.clock)());
        self.shared
            .idle
            .send_if_modified(|v| std::mem::replace(v, idle) != idle);
    }

    /// Tells the sink how many calls await a decision and when the earliest timer is due,
    /// when either changed (the count is taken again only after events that can change it).
    fn note(&mut self) {
        let Some(sink) = &self.sink else { return };
        let awaiting = match (self.lease.recount, self.lease.noted) {
            (false, Some(n)) => n.awaiting,
            _ => self.machine.awaiting().len() as u64,
        };
        self.lease.recount = false;
        let note = RunNote {
            awaiting: if self.result.is_some() { 0 } else { awaiting },
            wake_at: self.machine.poll_timeout(),
        };
        if self.lease.noted != Some(note) {
            self.lease.noted = Some(note);
            sink.note(&self.shared.run_id, note);
        }
    }

    async fn op(&mut self, req: OpRequest) {
        // The op is checked against the run as journaled so far, and bound to the presentation
        // the check saw.
        self.settle().await;
        // A queued decision that names no presentation (an older dagloop queued it) was checked
        // before the call was presented again: it never answers a re-presentation.
        let unbound_for_interrupted = match &req.op {
            Op::Decide {
                call,
                presentation: None,
                ..
            } if req.queued && self.machine.is_interrupted(*call) => {
                Some(OpError::StalePresentation {
                    call: *call,
                    presented: 0,
                    current: self.machine.presentation(*call).unwrap_or(0),
                })
            }
            _ => None,
        };
        let bound = match unbound_for_interrupted {
            Some(e) => Err(e),
            None => self.machine.bind_op(req.op.clone()),
        };
        let op = match bound {
            Ok(op) => op,
            Err(e) => {
                if req.queued {
                    self.drop_queued(req.op, &e).await;
                }
                let _ = req.reply.send(Err(e));
                return;
            }
        };
        // A decision holds its presentation in the store first: of decisions recorded by
        // several processes at once, one is applied (DESIGN.md 3.6).
        if let (
            Some(sink),
            Op::Decide {
                call,
                presentation: Some(p),
                ..
            },
        ) = (&self.sink, &op)
        {
            match sink
                .claim_decision(&self.shared.run_id, *p, &op, req.queued)
                .await
            {
                Ok(None) => {}
                Ok(Some(winner)) => {
                    let _ = req.reply.send(Err(OpError::decided_first(*call, &winner)));
                    return;
                }
                Err(e) => {
                    let _ = req.reply.send(Err(OpError::Unavailable {
                        reason: e.to_string(),
                    }));
                    // The store could not be written (a full disk): no decision can be
                    // recorded, so the run stops resumable, as when its journal fails, rather
                    // than wait for decisions it cannot take while it holds its lease.
                    if self.result.is_none() {
                        self.result = Some(stopped(e));
                    }
                    return;
                }
            }
        }
        let input = RunInput::from_op(op);
        let ok = self.feed(vec![input]).await;
        self.update_idle();
        let verdict = if ok {
            Ok(())
        } else {
            Err(crate::protocol::OpError::Unavailable {
                reason: "the run's journal failed".into(),
            })
        };
        let _ = req.reply.send(verdict);
    }

    /// Journals a decision taken from the store's queue that no longer applies as dropped: it
    /// leaves the queue with that entry and shows in the audit. Other ops are only refused.
    async fn drop_queued(&mut self, op: Op, why: &OpError) {
        let Op::Decide {
            call,
            decision,
            by,
            presentation,
            ..
        } = op
        else {
            return;
        };
        if matches!(
            why,
            OpError::RunFinished { .. } | OpError::Unavailable { .. }
        ) {
            return;
        }
        let input = RunInput::Dropped {
            call,
            decision,
            by,
            presentation,
            code: why.code().to_string(),
        };
        self.feed(vec![input]).await;
        self.update_idle();
    }

    /// What has already happened joins the queue: completions that are in and, with a sink
    /// (every batch costs a commit), model output already received.
    fn read_ready(&mut self) {
        while self.queue.len() < MAX_QUEUED
            && let Some((call, outcome)) = self.activities.try_next()
        {
            self.queue.push(RunInput::Outcome { call, outcome });
        }
        if self.sink.is_none() {
            return;
        }
        while self.queue.len() < MAX_QUEUED
            && let Some(read) = self.turns.try_next()
        {
            self.read(read);
        }
    }

    /// Numbers `inputs` as the journal's next entries.
    fn entries(&mut self, inputs: Vec<RunInput>) -> Vec<JournalEntry> {
        let at = (self.clock)();
        inputs
            .into_iter()
            .map(|input| {
                self.journal_seq += 1;
                JournalEntry {
                    seq: self.journal_seq,
                    at,
                    input,
                }
            })
            .collect()
    }

    /// Journals `inputs` (after the batch in flight, if any), hands them to the machine and
    /// performs what it says, awaiting the commit. False when the journal failed (the run is
    /// then over).
    async fn feed(&mut self, inputs: Vec<RunInput>) -> bool {
        self.settle().await;
        if inputs.is_empty() || self.result.is_some() {
            return self.result.is_none();
        }
        let entries = self.entries(inputs);
        if let Some(sink) = &self.sink
            && let Err(e) = append_caught(sink.as_ref(), &self.shared.run_id, &entries).await
        {
            self.result = Some(stopped(e));
            return false;
        }
        self.apply(entries);
        true
    }

    /// Starts committing what waits in the queue, unless a commit is in flight (without a sink
    /// the queue is handed to the machine at once, and what that queues in turn, such as a
    /// workspace memory search's answer, after it).
    fn pump(&mut self) {
        while self.commit.is_none() && !self.queue.is_empty() && self.result.is_none() {
            self.pump_once();
        }
    }

    fn pump_once(&mut self) {
        let inputs = if self.sink.is_some() && self.queue.len() > BATCH {
            let rest = self.queue.split_off(BATCH);
            std::mem::replace(&mut self.queue, rest)
        } else {
            std::mem::take(&mut self.queue)
        };
        let entries = self.entries(inputs);
        match &self.sink {
            Some(sink) => {
                let run_id = self.shared.run_id.clone();
                self.commit = Some(Commit::start(sink.clone(), run_id, entries));
            }
            None => self.apply(entries),
        }
    }

    /// Waits for the batch in flight, if any, and hands it to the machine.
    async fn settle(&mut self) {
        if let Some(mut c) = self.commit.take() {
            let (entries, r) = c.done().await;
            self.committed(entries, r);
        }
    }

    /// A batch is committed: the next one starts committing while the machine handles this one.
    fn committed(&mut self, entries: Vec<JournalEntry>, r: Result<(), JournalError>) {
        match r {
            Ok(()) => {
                self.pump();
                self.apply(entries);
            }
            Err(e) => {
                if self.result.is_none() {
                    self.result = Some(stopped(e));
                }
                self.queue.clear();
            }
        }
    }

    /// Hands journaled `entries` to the machine, publishing its events and performing the rest.
    /// Each input is handled eagerly ([`RunMachine::handle_eager`]): the activity of a call the
    /// input launched starts before the input's other calls are checked.
    fn apply(&mut self, entries: Vec<JournalEntry>) {
        let (mut actions, mut rest) = std::mem::take(&mut self.scratch);
        let last = entries.len();
        for (i, mut entry) in entries.into_iter().enumerate() {
            let input = entry.input.split_for_machine();
            let at = entry.at;
            if let RunInput::TimerFired { timer } = &input {
                self.alarm.handed(*timer);
            }
            let mut next = Some((entry, input));
            loop {
                let more = {
                    let mut log = match self.shared.log.lock() {
                        Ok(l) => l,
                        Err(p) => p.into_inner(),
                    };
                    let more = match next.take() {
                        Some((entry, input)) => {
                            log.journal.push(entry);
                            self.machine.handle_eager(input, at, &mut actions)
                        }
                        None => self.machine.resume_into(&mut actions),
                    };
                    for a in actions.drain(..) {
                        match a {
                            Action::Emit(ev) => {
                                // A call asked for a decision, or one that may have been
                                // waiting for one moved on: count again before the next note.
                                self.lease.recount |=
                                    matches!(ev.kind, EventKind::ApprovalRequested { .. })
                                        || (ev.call.is_some()
                                            && self.lease.noted.is_some_and(|n| n.awaiting > 0));
                                self.shared.publish(&mut log, ev)
                            }
                            other => rest.push(other),
                        }
                    }
                    // The batch's events go out together: one send to the subscribers
                    // (`handle::Shared::flush`), one hand-over to the span worker
                    // (`telemetry::feed`).
                    if i + 1 == last && !more {
                        self.shared.flush(&mut log);
                        if let Some(spans) = &mut log.spans {
                            spans.flush();
                        }
                    }
                    more
                };
                for a in rest.drain(..) {
                    self.perform(a);
                }
                if !more {
                    break;
                }
            }
        }
        actions.shrink_to(SCRATCH_KEPT);
        rest.shrink_to(SCRATCH_KEPT);
        self.scratch = (actions, rest);
    }

    fn perform(&mut self, action: Action) {
        match action {
            Action::Request {
                frame,
                step,
                messages,
                config,
                skip_calls,
                model: first,
                whole,
            } => {
                let model = self.models.get(config.model.as_deref());
                let req = super::turns::request(&self.settings, &config, messages);
                let stream = model.stream_turn(req.clone(), first, whole);
                let name = model.name_at(first);
                self.turns
                    .open(frame, step, skip_calls, config, &req, stream, name);
            }
            Action::Recall { frame, step, query } => {
                // A search of an index in memory: answered at once, journaled before the
                // machine takes it (the step's context is rebuilt from the journal).
                let chunks = self
                    .recall
                    .as_ref()
                    .map(|r| r.chunks(&query))
                    .unwrap_or_default();
                // A resumed run whose folder is gone (or no longer granted) says so.
                let note = self
                    .recall
                    .as_ref()
                    .filter(|r| r.index.is_none())
                    .map(|r| crate::context::memory::unreadable_note(&r.source));
                self.queue.push(RunInput::Recalled {
                    frame,
                    step,
                    chunks,
                    note,
                });
            }
            Action::CloseStream { frame } => self.turns.close(frame),
            Action::Launch {
                id,
                call,
                tool,
                detached,
                timeout_ms,
            } => {
                let limit = timeout_ms.map(Duration::from_millis);
                let progress = self.progress_sink(id);
                self.activities.launch_reporting(
                    &self.executor,
                    id,
                    call,
                    tool,
                    detached,
                    limit,
                    progress,
                );
            }
            Action::Abort { id } => self.activities.abort(id),
            Action::Emit(_) => {}
            Action::Finished(result) => self.result = Some(*result),
        }
    }
}

/// The batch in flight, once committed (pending without one).
async fn committed(commit: &mut Option<Commit>) -> (Vec<JournalEntry>, Result<(), JournalError>) {
    match commit {
        Some(c) => c.done().await,
        None => std::future::pending().await,
    }
}

/// The run stopped, resumable, because its journal could not be written or its lease was lost:
/// not an ending the machine decided, so nothing is recorded as the run's result.
fn stopped(e: JournalError) -> RunResult {
    let mut err = RunError::new(e.code(), format!("the run stopped and can be resumed: {e}"));
    err.cause = Some(serde_json::json!({"code": e.code(), "message": e.reason}));
    RunResult::stopped(err)
}
