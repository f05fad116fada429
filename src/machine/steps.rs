//! The lifecycle of a run's agents inside the machine: starting the run, a frame (the run's
//! agent or a nested one) and its steps, the work queue that carries scheduler inputs between
//! frames and launches calls, and every way an agent stops or the run finishes.
//!
//! Deliberately not here: reading inputs (`RunMachine::handle_into`) and the inner loop's
//! rules (the scheduler's).

use super::*;

impl RunMachine {
    pub(super) fn start(&mut self, now: Millis, work: &mut Vec<Work>, out: &mut Vec<Action>) {
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
    pub(super) fn begin_frame(
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
            let at = now.saturating_add(ms);
            self.pending.set(Timer::Deadline { frame: key }, at, out.len());
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
                    parsed: scheduler::Parsed::default(),
                },
            ));
        }
        work.push((key, scheduler::Input::StreamClosed));
    }

    pub(super) fn open_scheduler(&mut self, key: FrameKey, step: u32) {
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
    pub(super) fn begin_step(
        &mut self,
        key: FrameKey,
        now: Millis,
        work: &mut Vec<Work>,
        out: &mut Vec<Action>,
    ) {
        let recall = self.recall && key.is_none();
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let step = f.step + 1;
        if step > f.cfg.limits.max_steps {
            return self.finish(key, RunStatus::MaxSteps, None, Value::Null, now, work, out);
        }
        if recall {
            // The engine searches the workspace memory; the step is asked once its answer
            // (`RunInput::Recalled`) is journaled.
            let query = crate::context::memory::step_query(
                &f.cfg.goal,
                if step == 1 { f.input.as_ref() } else { None },
                &f.plan,
                f.thoughts.take().as_ref(),
            );
            f.recall = Some((step, query.clone()));
            out.push(Action::Recall {
                frame: key,
                step,
                query,
            });
            return;
        }
        self.ask(key, now, out);
    }

    /// The engine's answer to [`Action::Recall`]: the chunks are kept for the step's context,
    /// which is then asked. An answer for a step not awaiting one (the agent stopped meanwhile)
    /// changes nothing.
    pub(super) fn recalled(
        &mut self,
        key: FrameKey,
        step: u32,
        chunks: Vec<crate::context::memory::Chunk>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        if f.recall.as_ref().map(|(s, _)| *s) != Some(step) || f.stopping.is_some() {
            return;
        }
        f.recall = None;
        f.recalled = chunks;
        self.ask(key, now, out);
    }

    /// Asks the model for the agent's next step (its memory, if any, already recalled).
    fn ask(&mut self, key: FrameKey, now: Millis, out: &mut Vec<Action>) {
        let sanitize = self.sanitize;
        let keep = self.keep_launched;
        let window = self.window;
        let Some(f) = self.frames.get_mut(&key) else {
            return;
        };
        let step = f.step + 1;
        let state = f.state.take();
        let mut messages = match &state {
            Some(state) => f.messages(state, sanitize),
            None => Vec::new(),
        };
        f.state = state;
        // A window learned from an earlier refusal: a context that would not fit is compacted
        // before it is asked (the least compaction that fits, else the most).
        let mut compacted = None;
        if let Some(w) = window {
            let chars = crate::llm::wire::json_chars(&messages) as u64;
            if !w.fits(chars) {
                let (level, m, c) = f.fitting_level(1, &w, sanitize);
                messages = m;
                compacted = Some((level, c));
            }
        }
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
                compaction: compacted.map_or(0, |(level, _)| level),
                ..Default::default()
            };
        }
        if let Some((level, chars)) = compacted {
            let kind = EventKind::ContextCompacted {
                chars,
                level,
                refused_chars: None,
            };
            self.emit(key, None, kind, now, out);
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
    pub(super) fn resume(&mut self, work: &mut Vec<Work>, out: &mut Vec<Action>) {
        for f in self.frames.values() {
            if let Some((step, query)) = &f.recall {
                out.push(Action::Recall {
                    frame: f.key,
                    step: *step,
                    query: query.clone(),
                });
            }
            if f.streaming {
                self.pending.reasked(&(f.cfg.model.clone(), f.turn.model));
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
    pub(super) fn stop(
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

    /// Handles the work queue in order, then keeps the (emptied) buffers for the next input;
    /// after an eager stop the queue keeps what is left to do.
    pub(super) fn run_work(
        &mut self,
        work: &mut Vec<Work>,
        mut buf: Vec<scheduler::Action>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        if !self.run_queue(work, &mut buf, now, out) {
            work.clear();
        }
        buf.clear();
        work.shrink_to(SCRATCH_KEPT);
        buf.shrink_to(SCRATCH_KEPT);
        self.scratch = (std::mem::take(work), buf);
    }

    pub(super) fn run_queue(
        &mut self,
        work: &mut Vec<Work>,
        buf: &mut Vec<scheduler::Action>,
        now: Millis,
        out: &mut Vec<Action>,
    ) -> bool {
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
            sched.set_eager(self.eager);
            sched.handle_into(input, now, buf);
            let unsettled = sched.unsettled();
            let mut drained = false;
            for action in buf.drain(..) {
                match action {
                    scheduler::Action::Event { call, mut kind } => {
                        // The seq the event is about to get.
                        let seq = self.seq + 1;
                        if let (EventKind::ApprovalRequested { path, .. }, Some(f)) =
                            (&mut kind, self.frames.get_mut(&key))
                        {
                            path.clone_from(&f.path);
                            path.extend(call);
                            // A new presentation (a replacement by another tool, a call
                            // interrupted by a restart) awaits its own decision: none given
                            // before it answers it.
                            if let Some(id) = call {
                                f.unshown.remove(&id);
                                f.decisions.remove(&id);
                                f.decided_by.remove(&id);
                                f.presented.insert(id, seq);
                            }
                        }
                        if let (
                            EventKind::Decision {
                                decision,
                                by,
                                standing,
                                ..
                            },
                            Some(id),
                        ) = (&mut kind, call)
                        {
                            if let Some(a) = self.attribution.remove(&id) {
                                if a.by.is_some() {
                                    *by = a.by;
                                }
                                *standing = a.standing;
                            }
                            if let Some(f) = self.frames.get_mut(&key) {
                                f.decisions.insert(id, decision.clone());
                                f.presented.remove(&id);
                                f.unshown.remove(&id);
                                match by {
                                    Some(b) => f.decided_by.insert(id, b.clone()),
                                    None => f.decided_by.remove(&id),
                                };
                            }
                        }
                        self.emit(key, call, kind, now, out);
                    }
                    scheduler::Action::Ask {
                        id, timeout, call, ..
                    } => {
                        // A standing approval in force approves the call at once (no reviewer, no timer).
                        if let Some(g) = self.covering_standing(key, id, &call) {
                            self.approve_by_standing(key, id, g, work);
                        } else if let Some(t) = timeout
                            && let Some(f) = self.frames.get_mut(&key)
                        {
                            // The clock starts when somebody is shown the call.
                            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
                            f.unshown.insert(id, ms);
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
                return false;
            }
            if unsettled {
                // An eager stop after a launch: the scheduler goes on first, then the rest.
                work.drain(..i);
                work.insert(0, (key, scheduler::Input::Settle));
                return true;
            }
        }
        false
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch(
        &mut self,
        key: FrameKey,
        id: CallId,
        call: Arc<crate::protocol::Call>,
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
        let input: Map<String, Value> = call.plain_params();
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
    pub(super) fn abandon(&mut self, key: FrameKey, now: Millis, out: &mut Vec<Action>) {
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
            self.pending.clear(Timer::Deadline { frame: key });
        }
        let mut buf = Vec::new();
        if let Some(sched) = f.sched.as_mut() {
            sched.set_eager(false);
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

    pub(super) fn end_step(
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
    pub(super) fn finish(
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
            self.pending.clear(Timer::Deadline { frame: key });
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
