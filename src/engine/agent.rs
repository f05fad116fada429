//! The outer loop (protocol chapter 010, DESIGN.md rules 15–18): one Request per step, its calls
//! streamed into the inner loop, until a valid output or a limit.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::bus::EventBus;
use super::exec::{Hooks, RegistryExecutor};
use super::inner::{DriveOptions, drive};
use crate::approval::{Approver, Policy};
use crate::context::{self, ContextInput, PlanEntry, SanitizeLimits, Stop, TurnTracker};
use crate::goal::Goal;
use crate::llm::{Model, Request, Settings, StreamEvent, ToolCallOutcome, call_from_tool_call};
use crate::plan::{ParseEvent, SolutionParser};
use crate::protocol::{Call, CallId, EventKind, Millis, OutputMethod, Path, Tool};
use crate::scheduler::{CallStatus, Scheduler, SchedulerOptions, StepReport};
use crate::schema::{self, OutputValidator, ToolValidators};
use crate::state::State;
use crate::tools::Registry;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// A valid output was produced.
    Succeeded,
    /// `max_steps` Requests without a valid output.
    MaxSteps,
    /// The same calls in too many consecutive steps.
    DoomLoop,
    /// Too many consecutive steps with neither calls nor output.
    EmptyTurns,
    /// The token budget was spent.
    TokenBudget,
    /// The run's time limit passed.
    Timeout,
    /// Cancelled by the caller (API, Ctrl-C, library).
    Cancelled,
    /// The output stayed invalid after the allowed retries.
    InvalidOutput,
    /// The model could not be reached or kept failing after retries.
    ModelError,
}

impl RunStatus {
    /// The status as written in results and events.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Succeeded => "succeeded",
            RunStatus::MaxSteps => "max_steps",
            RunStatus::DoomLoop => "doom_loop",
            RunStatus::EmptyTurns => "empty_turns",
            RunStatus::TokenBudget => "token_budget",
            RunStatus::Timeout => "timeout",
            RunStatus::Cancelled => "cancelled",
            RunStatus::InvalidOutput => "invalid_output",
            RunStatus::ModelError => "model_error",
        }
    }

    /// The stable error code of a failed run (None for success).
    pub fn code(self) -> Option<&'static str> {
        match self {
            RunStatus::Succeeded => None,
            RunStatus::MaxSteps => Some("run.max_steps"),
            RunStatus::DoomLoop => Some("run.doom_loop"),
            RunStatus::EmptyTurns => Some("run.empty_turns"),
            RunStatus::TokenBudget => Some("run.token_budget"),
            RunStatus::Timeout => Some("run.timeout"),
            RunStatus::Cancelled => Some("run.cancelled"),
            RunStatus::InvalidOutput => Some("run.invalid_output"),
            RunStatus::ModelError => Some("run.model_error"),
        }
    }
}

/// Tokens used over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// One call of the run, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallSummary {
    /// The call's id.
    pub id: CallId,
    /// The step it belonged to (0 = the goal's initial plan).
    pub step: u32,
    /// Its tool.
    pub tool: String,
    /// What became of it.
    pub status: CallStatus,
}

/// The result of a run: what `dagloop run` prints and `Agent::run` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// How the run ended.
    pub status: RunStatus,
    /// The validated output (null unless succeeded).
    pub output: Value,
    /// The final merged state.
    pub state: Value,
    /// Requests made.
    pub steps: u32,
    /// Tokens used.
    pub usage: Usage,
    /// Every call of the run.
    pub calls: Vec<CallSummary>,
    /// For a failed run: a stable code, a message and details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

impl RunResult {
    /// True when the run produced a valid output.
    pub fn succeeded(&self) -> bool {
        self.status == RunStatus::Succeeded
    }
}

/// Everything one run needs. Build it with [`super::AgentBuilder`].
pub struct Agent {
    pub(super) goal: Goal,
    pub(super) tools: Vec<Tool>,
    pub(super) registry: Registry,
    pub(super) model: Arc<dyn Model>,
    pub(super) approver: Arc<dyn Approver>,
    pub(super) policy: Policy,
    pub(super) bus: Arc<EventBus>,
    pub(super) hooks: Hooks,
    pub(super) cancel: CancellationToken,
    pub(super) settings: Settings,
    pub(super) sanitize: SanitizeLimits,
    pub(super) validators: Arc<ToolValidators>,
}

/// What one model turn produced, besides the calls streamed to the scheduler.
#[derive(Default)]
struct Turn {
    output: Value,
    usage: Usage,
    problems: Vec<String>,
    fatal: Option<Value>,
}

fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Agent {
    /// The bus this run publishes events on (subscribe before `run`).
    pub fn events(&self) -> &EventBus {
        &self.bus
    }

    /// A token that cancels the run when triggered.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs to a terminal status. Never panics on bad model output or failing tools.
    pub async fn run(self) -> RunResult {
        let timeout = self.goal.limits.timeout_s.map(Duration::from_secs_f64);
        let run_cancel = self.cancel.child_token();
        let timed_out = CancellationToken::new();
        let watchdog = timeout.map(|t| {
            let (c, flag) = (run_cancel.clone(), timed_out.clone());
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                flag.cancel();
                c.cancel();
            })
        });
        let mut result = self.run_inner(run_cancel).await;
        if let Some(w) = watchdog {
            w.abort();
        }
        if timed_out.is_cancelled() && result.status == RunStatus::Cancelled {
            result.status = RunStatus::Timeout;
            result.error =
                Some(json!({"code": "run.timeout", "message": "the run's time limit passed"}));
        }
        self.bus.publish(
            0,
            None,
            EventKind::RunFinished {
                status: result.status.as_str().to_string(),
            },
        );
        result
    }

    async fn run_inner(&self, cancel: CancellationToken) -> RunResult {
        let goal = &self.goal;
        self.bus.publish(
            0,
            None,
            EventKind::RunStarted {
                goal: goal.goal.clone(),
            },
        );
        let mut state = State::new();
        if let Some(input) = &goal.input {
            state.write(
                Path::root("input"),
                input.clone(),
                OutputMethod::Set,
                None,
                now_ms(),
            );
        }
        state.write(
            Path::root("state"),
            goal.state.clone().unwrap_or_else(|| json!({})),
            OutputMethod::Set,
            None,
            now_ms(),
        );
        let mut run = RunLog::default();
        let validator = match OutputValidator::new(&goal.output_schema) {
            Ok(v) => v,
            Err(e) => {
                return run.finish(
                    RunStatus::InvalidOutput,
                    state,
                    Some(json!({"code": e.code(), "message": e.to_string()})),
                );
            }
        };
        let composed = match schema::compose(&self.tools, &goal.output_schema) {
            Ok(s) => s,
            Err(e) => {
                return run.finish(
                    RunStatus::InvalidOutput,
                    state,
                    Some(json!({"code": e.code(), "message": e.to_string()})),
                );
            }
        };
        let mut plan: Vec<PlanEntry> = Vec::new();
        let mut next_id = 1u64;
        if !goal.plan.is_empty() {
            let calls = goal.plan.clone();
            let (s, report) = self
                .step(
                    state,
                    0,
                    next_id,
                    futures::stream::iter(calls.into_iter().map(Ok)),
                    &cancel,
                )
                .await;
            state = s;
            next_id += report.calls.len() as u64;
            plan = run.absorb(0, &report);
        }
        let mut tracker = TurnTracker::default();
        let mut output_errors: Vec<String> = Vec::new();
        let mut problems: Vec<String> = Vec::new();
        let mut retries_left = goal.limits.max_output_retries;
        for step in 1..=goal.limits.max_steps {
            if cancel.is_cancelled() {
                return run.finish(RunStatus::Cancelled, state, None);
            }
            run.steps = step;
            let input_view = goal.input.as_ref();
            let state_view = state.view("state").unwrap_or(Value::Null);
            let messages = context::assemble(&ContextInput {
                goal: &goal.goal,
                tools: &self.tools,
                extra: &goal.context,
                input: input_view.map(|v| (v, goal.input_schema.as_ref())),
                state: Some((&state_view, goal.state_schema.as_ref())),
                plan: &plan,
                output_errors: &output_errors,
                model_errors: &problems,
                limits: self.sanitize,
            });
            let req = Request {
                messages,
                schema: composed.clone(),
                tools: self.tools.clone(),
                settings: self.settings.clone(),
            };
            self.bus
                .publish(step, None, EventKind::RequestStarted { attempt: 1 });
            let (tx, rx) = mpsc::unbounded_channel();
            let mut model_task = tokio::spawn(stream_turn(
                self.model.clone(),
                req,
                tx,
                self.bus.clone(),
                step,
            ));
            let calls = tokio_stream_adapter(rx);
            let (s, report) = self.step(state, step, next_id, calls, &cancel).await;
            state = s;
            next_id += report.calls.len() as u64;
            // A cancelled (or timed-out) run does not wait for the model to finish streaming.
            let joined = tokio::select! {
                biased;
                t = &mut model_task => Some(t),
                _ = cancel.cancelled() => {
                    model_task.abort();
                    None
                }
            };
            let turn = match joined {
                None => Turn::default(),
                Some(Ok(t)) => t,
                Some(Err(e)) => Turn {
                    fatal: Some(json!({"code": "run.model_task", "message": e.to_string()})),
                    ..Turn::default()
                },
            };
            run.usage.input_tokens += turn.usage.input_tokens;
            run.usage.output_tokens += turn.usage.output_tokens;
            plan = run.absorb(step, &report);
            if cancel.is_cancelled() {
                return run.finish(RunStatus::Cancelled, state, None);
            }
            if let Some(err) = turn.fatal {
                return run.finish(RunStatus::ModelError, state, Some(err));
            }
            problems = turn.problems;
            let has_output = !turn.output.is_null();
            self.bus.publish(
                step,
                None,
                EventKind::Solution {
                    output_present: has_output,
                },
            );
            output_errors.clear();
            if has_output {
                let violations = validator.validate(&turn.output);
                if violations.is_empty() {
                    let mut r = run.finish(RunStatus::Succeeded, state, None);
                    r.output = turn.output;
                    return r;
                }
                output_errors = violations.iter().map(|v| v.to_string()).collect();
                self.bus.publish(
                    step,
                    None,
                    EventKind::OutputInvalid {
                        errors: output_errors.clone(),
                    },
                );
                if retries_left == 0 {
                    let err = json!({"code": "run.invalid_output", "message": "the output did not match the output schema", "errors": output_errors});
                    return run.finish(RunStatus::InvalidOutput, state, Some(err));
                }
                retries_left -= 1;
            }
            if let Some(budget) = goal.limits.token_budget {
                if run.usage.input_tokens + run.usage.output_tokens > budget {
                    return run.finish(RunStatus::TokenBudget, state, None);
                }
            }
            let written: Vec<Value> = report
                .calls
                .iter()
                .filter_map(|c| c.call.as_ref().map(Call::to_value))
                .collect();
            match tracker.record(
                &written,
                has_output,
                goal.limits.doom_loop,
                goal.limits.empty_turns,
            ) {
                Some(Stop::DoomLoop) => return run.finish(RunStatus::DoomLoop, state, None),
                Some(Stop::EmptyTurns) => return run.finish(RunStatus::EmptyTurns, state, None),
                None => {}
            }
        }
        run.finish(RunStatus::MaxSteps, state, None)
    }

    async fn step<S>(
        &self,
        state: State,
        step: u32,
        first_id: u64,
        calls: S,
        cancel: &CancellationToken,
    ) -> (State, StepReport)
    where
        S: futures::Stream<Item = Result<Call, String>> + Unpin + Send,
    {
        // What delegates may see through `_scopes`: each kind as of the start of the step.
        let mut scoped = Map::new();
        for kind in state.kinds() {
            if let Some(v) = state.view(&kind) {
                scoped.insert(kind, v);
            }
        }
        let validators = self.validators.clone();
        let validate: crate::scheduler::Validator = Arc::new(move |tool: &Tool, call: &Call| {
            match validators.validate(&tool.name, &call.params) {
                Ok(v) if v.is_empty() => Ok(()),
                Ok(v) => Err(v
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")),
                Err(e) => Err(e.to_string()),
            }
        });
        let sched = Scheduler::new(
            state,
            self.tools.clone(),
            self.policy.clone(),
            SchedulerOptions {
                first_call_id: first_id,
                step,
                validate: Some(validate),
            },
        );
        let executor = Arc::new(RegistryExecutor::new(
            self.registry.clone(),
            self.hooks.clone(),
            scoped,
        ));
        let opts = DriveOptions {
            call_timeout: self.goal.limits.call_timeout_s.map(Duration::from_secs_f64),
        };
        drive(
            sched,
            calls,
            executor,
            self.approver.clone(),
            &self.bus,
            cancel.clone(),
            opts,
        )
        .await
    }
}

fn tokio_stream_adapter(
    mut rx: mpsc::UnboundedReceiver<Result<Call, String>>,
) -> futures::stream::BoxStream<'static, Result<Call, String>> {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// Streams one model turn: text into the incremental parser, calls out to the scheduler as soon
/// as each closes.
async fn stream_turn(
    model: Arc<dyn Model>,
    req: Request,
    tx: mpsc::UnboundedSender<Result<Call, String>>,
    bus: Arc<EventBus>,
    step: u32,
) -> Turn {
    let mut turn = Turn::default();
    let mut parser = SolutionParser::new();
    let mut saw_text = false;
    let mut stream = model.stream(&req);
    let handle = |events: Vec<ParseEvent>, turn: &mut Turn| {
        for ev in events {
            match ev {
                ParseEvent::Call { call: Ok(c), .. } => {
                    let _ = tx.send(Ok(c));
                }
                ParseEvent::Call {
                    call: Err(e), raw, ..
                } => {
                    let _ = tx.send(Err(format!("{e} (in {raw})")));
                }
                ParseEvent::Output(v) => turn.output = v,
                ParseEvent::Solution(_) => {}
            }
        }
    };
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(StreamEvent::TextDelta(t)) => {
                saw_text = true;
                bus.publish(
                    step,
                    None,
                    EventKind::ModelDelta {
                        chars: t.chars().count() as u64,
                    },
                );
                let evs = parser.feed(&t);
                handle(evs, &mut turn);
            }
            Ok(StreamEvent::ToolCallDone {
                name, arguments, ..
            }) => match call_from_tool_call(&name, &arguments) {
                Ok(ToolCallOutcome::Call(c)) => {
                    let _ = tx.send(Ok(c));
                }
                Ok(ToolCallOutcome::Output(v)) => turn.output = v,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                }
            },
            Ok(StreamEvent::Usage {
                input_tokens,
                output_tokens,
            }) => {
                turn.usage.input_tokens += input_tokens;
                turn.usage.output_tokens += output_tokens;
            }
            Ok(StreamEvent::Finish { .. }) => break,
            Ok(_) => {}
            Err(e) => {
                turn.fatal = Some(json!({
                    "code": "run.model_error",
                    "message": format!("the model failed: {e}"),
                    "cause": {"code": e.code(), "message": e.to_string()},
                }));
                break;
            }
        }
    }
    if saw_text {
        match parser.finish() {
            Ok(evs) => handle(evs, &mut turn),
            Err(e) => turn.problems.push(format!("{e} [{}]", e.code())),
        }
    }
    turn
}

/// Bookkeeping across steps: every call's summary, usage, step count.
#[derive(Default)]
struct RunLog {
    calls: Vec<CallSummary>,
    usage: Usage,
    steps: u32,
}

impl RunLog {
    fn absorb(&mut self, step: u32, report: &StepReport) -> Vec<PlanEntry> {
        report
            .calls
            .iter()
            .map(|c| {
                let call = c.revised.as_ref().or(c.call.as_ref());
                self.calls.push(CallSummary {
                    id: c.id,
                    step,
                    tool: call.map(|x| x.tool.clone()).unwrap_or_default(),
                    status: c.status,
                });
                PlanEntry {
                    id: c.id,
                    call: call.map(Call::to_value).unwrap_or(Value::Null),
                    status: serde_json::to_value(c.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    result: call
                        .filter(|x| x.output_path.is_none())
                        .and(c.result.clone()),
                    error: c.error.clone(),
                    missing: c.missing.clone(),
                }
            })
            .collect()
    }

    fn finish(&mut self, status: RunStatus, state: State, error: Option<Value>) -> RunResult {
        let error = error.or_else(|| {
            status.code().map(|code| json!({"code": code, "message": format!("the run ended: {}", status.as_str())}))
        });
        RunResult {
            status,
            output: Value::Null,
            state: state.view("state").unwrap_or(Value::Null),
            steps: self.steps,
            usage: self.usage,
            calls: std::mem::take(&mut self.calls),
            error,
        }
    }
}
