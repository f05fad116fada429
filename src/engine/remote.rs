//! The pieces of a run for an engine that drives the machine somewhere else (a Temporal
//! workflow): the run's agent configuration, one model turn as a stream of machine inputs, and
//! one call's activity. They are the code the embedded driver runs, so a run behaves the same
//! whichever engine drives it.
//!
//! Deliberately not here: journaling, timers, approvals and ordering (the remote engine's), and
//! anything about a particular remote engine.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use super::activities::{Executor, panic_message, run_call};
use super::agent::Agent;
use super::turns::{Models, Turns};
use crate::llm::Settings;
use crate::machine::{AgentConfig, FrameKey, RunInput};
use crate::protocol::{Call, CallId, Message, Tool};
use crate::scheduler::Outcome;
use crate::tools::{ProgressSink, ResultBudget};

/// An [`Agent`] taken apart for a remote engine. See the module docs.
pub struct Parts {
    config: Arc<AgentConfig>,
    models: Models,
    settings: Settings,
    executor: Arc<dyn Executor>,
}

impl Agent {
    /// Takes the agent apart for an engine that drives the run elsewhere.
    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            config: self.config,
            models: self.models,
            settings: self.settings,
            executor: self.executor,
        }
    }
}

impl Parts {
    /// The run's own agent (delegates inside).
    pub fn config(&self) -> &Arc<AgentConfig> {
        &self.config
    }

    /// Asks `config`'s model for one turn and yields the machine inputs its answer makes, ending
    /// with [`RunInput::StreamClosed`]. `asked_before` is how many requests the run already made
    /// of that model (a script answers the next of its turns), and the first `skip_calls` calls
    /// are dropped, as for a turn asked again after a restart.
    pub fn turn(
        &self,
        frame: FrameKey,
        step: u32,
        config: Arc<AgentConfig>,
        messages: Vec<Message>,
        asked_before: usize,
        skip_calls: usize,
    ) -> BoxStream<'static, RunInput> {
        let model = self.models.get(config.model.as_deref());
        crate::llm::Model::resume_after(model.as_ref(), asked_before);
        let req = super::turns::request(&self.settings, &config, messages);
        let stream = model.stream_from(req.clone(), 0);
        let name = model.name_at(0);
        let mut turns = Turns::default();
        turns.open(frame, step, skip_calls, config, &req, stream, name);
        futures::stream::unfold(
            (turns, VecDeque::new()),
            |(mut turns, mut queue): (Turns, VecDeque<RunInput>)| async move {
                loop {
                    if let Some(input) = queue.pop_front() {
                        return Some((input, (turns, queue)));
                    }
                    if turns.is_empty() {
                        return None;
                    }
                    queue.extend(turns.next().await?.inputs);
                }
            },
        )
        .boxed()
    }

    /// Runs one call's activity under `timeout_ms`, as the embedded engine does: a panic is the
    /// call's failure, the time limit its timeout; with the run's `budget` (what it could still
    /// keep of results when the call was launched), the activity is told it and its result is
    /// bounded by the run's rule ([`super::ResultBound::admit`]), so a result over the bound
    /// leaves the worker as its `run.result_bound` record, never whole.
    pub async fn execute(
        &self,
        id: CallId,
        call: Arc<Call>,
        tool: Arc<Tool>,
        timeout_ms: Option<u64>,
        budget: Option<ResultBudget>,
    ) -> Outcome {
        let limit = timeout_ms.map(Duration::from_millis);
        let task = run_call(
            self.executor.clone(),
            id,
            call,
            tool,
            limit,
            ProgressSink::none(),
            budget,
        );
        let outcome = match tokio::spawn(task).await {
            Ok(o) => o,
            Err(e) if e.is_panic() => Outcome::panic(panic_message(e.into_panic())),
            Err(_) => Outcome::error(serde_json::json!({
                "code": "activity.cancelled",
                "message": "the activity was cancelled",
            })),
        };
        match budget {
            Some(b) => super::ResultBound::within(b).admit(outcome),
            None => outcome,
        }
    }
}

/// The path of delegate tool names from `root` to `target` (empty for the root itself).
pub fn config_path(root: &Arc<AgentConfig>, target: &Arc<AgentConfig>) -> Option<Vec<String>> {
    if Arc::ptr_eq(root, target) {
        return Some(Vec::new());
    }
    for (name, d) in &root.delegates {
        if let Some(mut p) = config_path(d, target) {
            p.insert(0, name.clone());
            return Some(p);
        }
    }
    None
}

/// The agent at `path` below `root` (see [`config_path`]).
pub fn config_at(root: &Arc<AgentConfig>, path: &[String]) -> Option<Arc<AgentConfig>> {
    let mut at = root.clone();
    for name in path {
        at = at.delegates.get(name)?.clone();
    }
    Some(at)
}
